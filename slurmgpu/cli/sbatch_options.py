"""sbatch's own command-line options, so that ``sgpu submit`` can tell them from a typo.

Taken from the OPTIONS section of ``sbatch(1)`` of Slurm 22.05 (the Debian 12 package this
project runs on), plus the options later releases added (``--container-id``, ``--extra``,
``--oom-kill-step``, ``--tres-per-task``, as their documentation lists). sbatch parses
them with ``getopt_long``, so an unambiguous prefix of a long option is that option.

The list is used only to decide whether an unknown ``--name`` that looks like one of
slurmgpu's own options is a typo of it; anything else still goes to sbatch unchanged (a
newer sbatch may know more options than this list).
"""

from __future__ import annotations

# Long options that need a value: ``--name=VALUE`` or ``--name VALUE``.
LONG_WITH_VALUE = frozenset(
    {
        "--account",
        "--acctg-freq",
        "--array",
        "--batch",
        "--bb",
        "--bbf",
        "--begin",
        "--chdir",
        "--cluster-constraint",
        "--clusters",
        "--comment",
        "--constraint",
        "--container",
        "--container-id",
        "--core-spec",
        "--cores-per-socket",
        "--cpu-freq",
        "--cpus-per-gpu",
        "--cpus-per-task",
        "--deadline",
        "--delay-boot",
        "--dependency",
        "--distribution",
        "--error",
        "--exclude",
        "--export",
        "--export-file",
        "--extra",
        "--extra-node-info",
        "--gid",
        "--gpu-bind",
        "--gpu-freq",
        "--gpus",
        "--gpus-per-node",
        "--gpus-per-socket",
        "--gpus-per-task",
        "--gres",
        "--gres-flags",
        "--hint",
        "--input",
        "--job-name",
        "--kill-on-invalid-dep",
        "--licenses",
        "--mail-type",
        "--mail-user",
        "--mcs-label",
        "--mem",
        "--mem-bind",
        "--mem-per-cpu",
        "--mem-per-gpu",
        "--mincpus",
        "--network",
        "--nodefile",
        "--nodelist",
        "--nodes",
        "--ntasks",
        "--ntasks-per-core",
        "--ntasks-per-gpu",
        "--ntasks-per-node",
        "--ntasks-per-socket",
        "--open-mode",
        "--output",
        "--partition",
        "--power",
        "--prefer",
        "--priority",
        "--profile",
        "--qos",
        "--reservation",
        "--signal",
        "--sockets-per-node",
        "--switches",
        "--thread-spec",
        "--threads-per-core",
        "--time",
        "--time-min",
        "--tmp",
        "--tres-per-task",
        "--uid",
        "--wait-all-nodes",
        "--wckey",
        "--wrap",
    }
)

# Long options without a value, or whose value is optional (then only ``--name=VALUE``).
LONG_WITHOUT_VALUE = frozenset(
    {
        "--contiguous",
        "--exclusive",
        "--get-user-env",
        "--help",
        "--hold",
        "--ignore-pbs",
        "--nice",
        "--no-kill",
        "--no-requeue",
        "--oom-kill-step",
        "--overcommit",
        "--oversubscribe",
        "--parsable",
        "--propagate",
        "--quiet",
        "--reboot",
        "--requeue",
        "--spread-job",
        "--test-only",
        "--usage",
        "--use-min-nodes",
        "--verbose",
        "--version",
        "--wait",
    }
)

LONG_OPTIONS = LONG_WITH_VALUE | LONG_WITHOUT_VALUE

# Short options that need a value (``-N2`` or ``-N 2``); the others take none.
SHORT_WITH_VALUE = frozenset("ABCDFGJLMNSabcdeimnopqtwx")
SHORT_WITHOUT_VALUE = frozenset("HOQVWhksv")


def long_option(name: str) -> str | None:
    """The sbatch long option ``name`` stands for (exact, or a unique prefix), else None."""
    if name in LONG_OPTIONS:
        return name
    matches = [o for o in LONG_OPTIONS if o.startswith(name)] if len(name) > 3 else []
    return matches[0] if len(matches) == 1 else None

"""How big a request should be for what a job used: the one set of sizing rules.

Rightsizing (:mod:`slurmgpu.policy.rightsize`, pending jobs), the submit-time export
(:mod:`slurmgpu.policy.recommend`, read by ``plugins/job_submit.lua``) and ``sgpu eff``'s
"next time ask for" notes (:mod:`slurmgpu.report.eff_advice`) all size from usage with the
functions below, so one usage gives one suggested size whichever of them a user meets.
Pure arithmetic: numbers in, numbers out.

The rules, one per quantity (the defaults are the module constants, :class:`SizingRules`
holds a site's):

- **Time limit** = ``TIME_HEADROOM`` (1.3) * the run time, at least ``MIN_TIME_LIMIT``
  (15 min), rounded up to ``TIME_ROUND`` (5 min). The run time is the 0.95 quantile of
  past runs for rightsizing and the export, and the run itself for ``sgpu eff``; none
  where a run was restarted (:func:`limit_from_history`: Slurm's start time is the last
  start, so the run time seen is the last run's only). Five
  minutes, not fifteen: the headroom is the safety margin, the rounding only keeps limits
  tidy, and a limit 14 min too long is 14 min of backfill lost on every run. ``sgpu eff``
  rounded to 15 min before and so told users a longer limit than the daemon would set.
- **Memory per node** = ``ceil(MEMORY_HEADROOM (1.2) * peak MiB of the busiest node)``
  (jobstats' rule), rounded up to ``MEMORY_ROUND_MIB`` (256 MiB), at least one step.
  ``sgpu eff`` rounded to whole GiB before (``--mem=3G`` where rightsizing set 2560 MiB);
  it now prints the same figure, in ``G`` when it is whole GiB and in ``M`` otherwise.
- **CPUs** = ``ceil(CPU_HEADROOM (1.2) * busy cores)``, at least 1: per task for ``-c``
  (``sgpu eff``), for the whole job for ``NumCPUs`` (rightsizing, which then keeps
  ``target_cores_per_gpu`` per GPU, one per task and one per node on top; a rule about
  feeding GPUs, not about what was used). The export carries no CPU figure: that floor
  needs the submitted job's GPU count, which a per-key file cannot know.
- **GPUs** = the most GPUs a run kept busy, at least 1.
- **Shards** of a GPU of ``S`` shards for a job that needs ``m`` MiB of GPU memory on a
  device of ``D`` MiB = ``max(ceil(S * m / (D - MEMORY_MARGIN_MIB)), ceil(S /
  MAX_JOBS_PER_GPU), 1)``: shards are memory budgets, so whatever Slurm puts together on
  one GPU declares at most the device less the margin (2 GiB), and no GPU holds more than
  ``MAX_JOBS_PER_GPU`` (2) such jobs. ``N >= S`` is no sharing. Co-location
  (:mod:`slurmgpu.policy.colocate`) narrows pending jobs to it and ``sgpu eff`` advises
  it; until issue 37 ``sgpu eff`` said ``ceil(16 * 1.2 * used / total)`` of a fixed 16.

The knobs of all five are one frozen :class:`SizingRules`, the site's from the
configuration (``PolicySettings.sizing``: the time, memory and CPU knobs are written in
``[policy.rightsize]``, the margin and jobs per GPU in ``[policy.colocate]``); rightsizing,
co-location, the export and ``sgpu eff`` all take that one object.

Every rounding-up ignores float noise below 1e-6 of a step (1.2 * 5120 MiB is 6144, not
one step more): each rule used its own tolerance before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # annotations only (priors.py imports nothing from here)
    from slurmgpu.policy.priors import Estimate

__all__ = [
    "CPU_HEADROOM",
    "MAX_JOBS_PER_GPU",
    "MEMORY_HEADROOM",
    "MEMORY_MARGIN_MIB",
    "MEMORY_ROUND_MIB",
    "MIN_TIME_LIMIT",
    "TIME_HEADROOM",
    "TIME_ROUND",
    "KeySizes",
    "SizingRules",
    "ceil_whole",
    "cores_needed",
    "gpus_needed",
    "key_sizes",
    "limit_from_history",
    "memory_mib",
    "round_up",
    "shards_needed",
    "time_limit_s",
]

TIME_HEADROOM = 1.3
TIME_ROUND = timedelta(minutes=5)
MIN_TIME_LIMIT = timedelta(minutes=15)
MEMORY_HEADROOM = 1.2
MEMORY_ROUND_MIB = 256
CPU_HEADROOM = 1.2
MEMORY_MARGIN_MIB = 2048
MAX_JOBS_PER_GPU = 2

_TIME_ROUND_S = TIME_ROUND.total_seconds()
_MIN_TIME_S = MIN_TIME_LIMIT.total_seconds()


def ceil_whole(x: float) -> int:
    """``ceil`` that ignores float noise below 1e-6.

    >>> ceil_whole(1.2 * 5120 / 1024), ceil_whole(6.01)
    (6, 7)

    ``round(x, 6)`` formats the float to decimal digits (about 0.3 µs, most of a
    rightsizing first cycle's sizing work), so it is left to the values it can change:
    those within 1e-6 above a whole number. ``x - floor(x)`` is exact; a whole ``x`` is
    itself, and one more than 1e-6 above ``floor(x)`` rounds to a value above it.
    """
    whole = math.floor(x)
    frac = x - whole
    if frac > 1e-6:
        return whole + 1
    if frac == 0:
        return whole
    return math.ceil(round(x, 6))


def round_up(value: float, step: float) -> int:
    """``value`` rounded up to a whole number of ``step`` (> 0), as an int.

    >>> round_up(601, 300), round_up(600, 300), round_up(0, 300)
    (900, 600, 0)
    """
    return int(ceil_whole(value / step) * step)


def time_limit_s(
    run_s: float,
    headroom: float = TIME_HEADROOM,
    step_s: float = _TIME_ROUND_S,
    minimum_s: float = _MIN_TIME_S,
) -> int:
    """The time limit (seconds) for runs of ``run_s`` seconds.

    >>> time_limit_s(3600), time_limit_s(60), time_limit_s(3600, step_s=900)
    (4800, 900, 5400)
    """
    return round_up(max(run_s * headroom, minimum_s), step_s)


def memory_mib(
    peak_mib: float, headroom: float = MEMORY_HEADROOM, step_mib: int = MEMORY_ROUND_MIB
) -> int:
    """The memory per node (MiB) for a busiest node that peaked at ``peak_mib``.

    >>> memory_mib(5120), memory_mib(2000), memory_mib(0)
    (6144, 2560, 256)
    """
    return max(step_mib, round_up(ceil_whole(headroom * peak_mib), step_mib))


def cores_needed(busy_cores: float, headroom: float = CPU_HEADROOM) -> int:
    """The cores for ``busy_cores`` cores kept busy on average (100 % = one core).

    >>> cores_needed(2.5), cores_needed(5.0), cores_needed(0.0)
    (3, 6, 1)
    """
    return max(1, ceil_whole(headroom * busy_cores))


def gpus_needed(busy_gpus: int) -> int:
    """The GPUs for a run that kept ``busy_gpus`` busy: never none.

    >>> gpus_needed(0), gpus_needed(3)
    (1, 3)
    """
    return max(1, busy_gpus)


def shards_needed(
    memory_mib: float,
    device_mib: float,
    shards_per_gpu: int,
    margin_mib: float = MEMORY_MARGIN_MIB,
    max_jobs_per_gpu: int = MAX_JOBS_PER_GPU,
) -> int:
    """The shards of a ``shards_per_gpu``-shard GPU of ``device_mib`` for a job needing
    ``memory_mib`` of its memory (``>= shards_per_gpu``: no sharing; ``device_mib`` must
    exceed the margin).

    >>> shards_needed(4096, 40960, 16), shards_needed(4096, 40960, 4)
    (8, 2)
    >>> shards_needed(20000, 24576, 4)  # 20000 of 22528 usable MiB: no sharing
    4
    """
    by_memory = math.ceil(shards_per_gpu * memory_mib / (device_mib - margin_mib) - 1e-9)
    return max(by_memory, math.ceil(shards_per_gpu / max_jobs_per_gpu), 1)


@dataclass(frozen=True, slots=True)
class SizingRules:
    """A site's sizing knobs and the rules that use them: one object for rightsizing,
    co-location, the export and ``sgpu eff`` (the module docstring gives the rules).

    >>> rules = SizingRules()
    >>> rules.time_limit_s(3600), SizingRules(time_round=timedelta(minutes=15)).time_limit_s(3600)
    (4800, 5400)
    >>> rules.shards(4096, 40960, 16), SizingRules(max_jobs_per_gpu=4).shards(4096, 40960, 16)
    (8, 4)
    """

    time_headroom: float = TIME_HEADROOM
    time_round: timedelta = TIME_ROUND
    min_time_limit: timedelta = MIN_TIME_LIMIT
    memory_headroom: float = MEMORY_HEADROOM
    memory_round_mib: int = MEMORY_ROUND_MIB
    cpu_headroom: float = CPU_HEADROOM
    memory_margin_mib: int = MEMORY_MARGIN_MIB  # kept free on a shared GPU
    max_jobs_per_gpu: int = MAX_JOBS_PER_GPU  # sets the fewest shards a job is given

    def time_limit_s(self, run_s: float) -> int:
        """The time limit (seconds) for runs of ``run_s`` seconds."""
        return time_limit_s(
            run_s,
            self.time_headroom,
            self.time_round.total_seconds(),
            self.min_time_limit.total_seconds(),
        )

    def memory_mib(self, peak_mib: float) -> int:
        """The memory per node (MiB) for a busiest node that peaked at ``peak_mib``."""
        return memory_mib(peak_mib, self.memory_headroom, self.memory_round_mib)

    def cores(self, busy_cores: float) -> int:
        """The cores for ``busy_cores`` cores kept busy on average."""
        return cores_needed(busy_cores, self.cpu_headroom)

    def shards(self, memory_mib: float, device_mib: float, shards_per_gpu: int) -> int:
        """The shards for ``memory_mib`` of GPU memory (:func:`shards_needed`)."""
        return shards_needed(
            memory_mib, device_mib, shards_per_gpu, self.memory_margin_mib, self.max_jobs_per_gpu
        )


class KeySizes(NamedTuple):
    """What one history key's runs need besides time (None: no suggestion)."""

    memory_mib: int | None
    cores: int | None
    gpus: int | None


def own_history(est: Estimate) -> bool:
    """Whether a history key's runs are the job's own: its level names its script or its
    name (not the user's other jobs, ``user+partition`` / ``user``)."""
    return "script" in est.level or "name" in est.level


def limit_from_history(est: Estimate, from_other_jobs: bool = False) -> bool:
    """Whether a history key's run times may set a time limit: runs of the job's own
    script or name (its level names one), or any key when ``from_other_jobs``
    (``time_from_other_jobs``: the user's other jobs say little about this one's run
    time); and no run of them restarted (``Estimate.restarted_runs``): a resized,
    preempted or requeued job's run time is its last run's, which may be a fraction of
    what it needed (a limit too short is a killed run)."""
    return (from_other_jobs or own_history(est)) and not est.restarted_runs


def key_sizes(
    est: Estimate,
    rules: SizingRules,
    *,
    memory: bool = True,
    cpus: bool = True,
    gpus: bool = True,
    min_history: int = 3,
) -> KeySizes:
    """Memory per node, cores and GPUs for a history key's estimate under ``rules``; a
    quantity switched off (``memory``, ``cpus``, ``gpus``: rightsizing's switches) gets
    none.

    Memory: none after a run ran out of memory (its peak is no measure of its need); a
    run without a per-node figure counts with its total (only errs high), never total /
    nodes (an uneven job would starve its busiest node). Cores: none when a run kept >= 90 %
    of its cores busy (its demand is unknown). GPUs: only from ``min_history`` runs with
    GPU samples of the job's own script or name (:func:`own_history`): how many GPUs
    the user's other programs kept busy says nothing of this one's (on the trace replay,
    a 4-GPU yolov3 was cut to 1 GPU from its user's ncf and cifar10 runs, and ran 4x
    longer).
    """
    peak = est.peak_node_memory_mib
    memory_size = None
    if memory and peak is not None and not est.oom_runs:
        memory_size = rules.memory_mib(peak)
    cores = None
    if cpus and est.max_cpu_pct is not None and not est.cpu_saturated:
        cores = rules.cores(est.max_cpu_pct / 100.0)
    gpu_count = None
    if (
        gpus
        and est.gpus_used is not None
        and est.gpus_used_samples >= min_history
        and own_history(est)
    ):
        gpu_count = gpus_needed(est.gpus_used)
    return KeySizes(memory_size, cores, gpu_count)

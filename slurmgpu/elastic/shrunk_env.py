"""The batch script's Slurm environment after a shrink in place (``NumNodes=`` on a
running job).

Slurm does not change a running batch script's environment when the job loses nodes,
and ``srun`` refuses a step whose ``SLURM_JOB_NUM_NODES`` disagrees with the allocation
("environment variable conflicts with allocated node count (2 != 1)"). ``scontrol
update`` writes a ``slurm_job_<id>_resize.sh`` for this, but in the directory of
whoever ran it (the daemon), so the launcher rewrites the variables itself: the node
count and lists, and the per-node lists (``2(x3),1`` form) cut to the nodes kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from slurmgpu.slurm.parse import HostlistError, expand_hostlist

__all__ = ["compress_counts", "expand_counts", "shrunk_env"]

_RUN = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_COUNT_VARS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
_LIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
_PER_NODE_VARS = ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE")
_TASK_VARS = ("SLURM_NTASKS", "SLURM_NPROCS")


def expand_counts(text: str) -> list[int] | None:
    """``2(x3),1`` → ``[2, 2, 2, 1]``; None when it is not that form."""
    out: list[int] = []
    for part in text.split(","):
        match = _RUN.match(part.strip())
        if match is None:
            return None
        out.extend([int(match.group(1))] * int(match.group(2) or 1))
    return out


def compress_counts(counts: Sequence[int]) -> str:
    """``[2, 2, 2, 1]`` → ``2(x3),1`` (Slurm's form)."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(parts)


def _hosts(nodelist: str) -> list[str] | None:
    try:
        return list(expand_hostlist(nodelist))
    except HostlistError:
        return None


def shrunk_env(env: Mapping[str, str], nodes: int, nodelist: str) -> dict[str, str]:
    """``env`` with Slurm's job variables for ``nodes`` nodes, ``nodelist``.

    Per-node lists keep the entries of the nodes kept (by name in the old list; the
    first ``nodes`` entries when the lists cannot be read); task counts follow them.
    """
    out = dict(env)
    old = _hosts(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")))
    new = _hosts(nodelist)
    if old and new and set(new) <= set(old):
        kept = [old.index(h) for h in new]
    else:
        kept = list(range(nodes))
    for name in _COUNT_VARS:
        out[name] = str(nodes)
    for name in _LIST_VARS:
        out[name] = nodelist
    tasks: list[int] | None = None
    for name in _PER_NODE_VARS:
        counts = expand_counts(env[name]) if name in env else None
        if counts is None or max(kept, default=0) >= len(counts):
            continue
        cut = [counts[i] for i in kept]
        out[name] = compress_counts(cut)
        if name == "SLURM_TASKS_PER_NODE":
            tasks = cut
    for name in _TASK_VARS:
        if name not in env:
            continue
        if tasks is not None:
            out[name] = str(sum(tasks))
        elif env[name].isdigit():
            count = env.get("SLURM_JOB_NUM_NODES", "")
            before = int(count) if count.isdigit() and int(count) > 0 else max(len(old or []), 1)
            out[name] = str(max(int(env[name]) * nodes // before, 1))
    return out

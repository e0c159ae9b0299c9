"""GPU-type speeds for type-aware placement (the malleable policy's ``type_aware``).

A site's ``type_speed`` table maps job-name patterns (fnmatch, tried in the order
written; ``"*"`` only when no other matches) to each GPU type's relative speed for such
jobs -- Gavel's throughput matrix (Narayanan et al., OSDI'20), by job name because a
Slurm job carries no model name. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

__all__ = ["SpeedTable", "slowest", "speeds_for"]

SpeedTable = tuple[tuple[str, tuple[tuple[str, float], ...]], ...]


def speeds_for(table: SpeedTable, job_name: str) -> dict[str, float]:
    """Each GPU type's relative speed for a job called ``job_name`` ({}: no rule matches).

    >>> t = (("ncf*", (("p100", 2.0), ("v100", 1.0))), ("*", (("p100", 0.8), ("v100", 1.0))))
    >>> speeds_for(t, "ncf-7"), speeds_for(t, "bert")
    ({'p100': 2.0, 'v100': 1.0}, {'p100': 0.8, 'v100': 1.0})
    """
    fallback: dict[str, float] = {}
    for pattern, speeds in table:
        if pattern == "*":
            fallback = dict(speeds)
        elif fnmatchcase(job_name, pattern):
            return dict(speeds)
    return fallback


def slowest(speeds: Mapping[str, float], types: Iterable[str]) -> float | None:
    """The speed of the slowest of ``types`` (a job over several runs at that one's pace);
    None when a type has no speed."""
    out: float | None = None
    for t in types:
        v = speeds.get(t)
        if v is None:
            return None
        out = v if out is None else min(out, v)
    return out

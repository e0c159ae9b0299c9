"""The flat figures of an end-of-job summary, stored beside its JSON for the reports.

Reports aggregate over every finished job in SQL; reading figures out of nested JSON
(per node, per GPU) cannot be done portably or fast on SQLite and PostgreSQL alike, so
each summary row also carries the few job-level numbers the reports need. They are
relative figures (percentages), so a report multiplies them by the GPU-hours it
computes from the job row, whatever the allocation was (whole GPUs or shards).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENERGY_COLUMNS", "SUMMARY_COLUMNS", "energy_columns", "summary_columns"]

SUMMARY_COLUMNS = (
    "gpus_reported",
    "gpus_busy",
    "gpu_util_pct",
    "gpu_idle_pct",
    "gpu_memory_max_mib",
    "cpu_memory_max_mib",
)


# Kept apart from SUMMARY_COLUMNS: migration 0005 adds exactly those; these came in 0007.
ENERGY_COLUMNS = ("energy_j", "idle_energy_j")


def energy_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Return the job's GPU energy and its idle part in J (None: not measured).

    >>> energy_columns({"energy": {"energy_j": 3600.0, "idle_energy_j": 600.0}})
    {'energy_j': 3600.0, 'idle_energy_j': 600.0}
    >>> energy_columns({})
    {'energy_j': None, 'idle_energy_j': None}
    """
    energy = summary.get("energy")
    if not isinstance(energy, Mapping):
        return dict.fromkeys(ENERGY_COLUMNS)
    return {name: _num(energy.get(name)) for name in ENERGY_COLUMNS}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def summary_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Return the flat figures of ``summary`` (a :func:`~slurmgpu.daemon.summary.build_summary`).

    - ``gpu_util_pct``: mean utilisation over the job's GPUs, a requested GPU that sent no
      sample counted as 0 % (as ``sgpu eff`` does); None when no GPU sent anything.
    - ``gpu_idle_pct``: the share of the job's GPU-time spent idle: a GPU never busy is
      idle for the whole run, a busy one from its last busy sample to the end (the
      summary's trailing idle), a silent one for the whole run.
    - A GPU whose util is unknown (``util_pct_mean`` None: an MPS client sharing its GPU,
      a MIG slice without GPM) counts in neither figure; a job whose every GPU is
      unknown has both None (its GPU-hours are allocated, not known to be used or idle).
    - ``gpus_reported`` / ``gpus_busy``: GPUs with samples / ever busy.
    - ``gpu_memory_max_mib``: the largest peak of one GPU; ``cpu_memory_max_mib``: the sum
      of the nodes' peaks (``memory_mib`` of a job is a total over its nodes too).

    >>> gpu = {"util_pct_mean": 80.0, "idle_trailing_s": 0, "never_busy": False}
    >>> one = {"elapsed_s": 100, "gpus_requested": 2, "nodes": {"n1": {"gpus": {"0": gpu}}}}
    >>> summary_columns(one)["gpu_util_pct"], summary_columns(one)["gpu_idle_pct"]
    (40.0, 50.0)
    """
    util: list[float] = []
    idle: list[float] = []
    busy = 0
    unknown = 0
    gpu_mem: float | None = None
    cpu_mem: float | None = None
    elapsed = _num(summary.get("elapsed_s")) or 0.0
    nodes = summary.get("nodes")
    for node in (nodes or {}).values() if isinstance(nodes, Mapping) else ():
        if not isinstance(node, Mapping):
            continue
        host = node.get("host")
        if isinstance(host, Mapping) and (m := _num(host.get("memory_max_mib"))) is not None:
            cpu_mem = (cpu_mem or 0.0) + m
        gpus = node.get("gpus")
        for gpu in (gpus or {}).values() if isinstance(gpus, Mapping) else ():
            if not isinstance(gpu, Mapping):
                continue
            if (m := _num(gpu.get("memory_max_mib"))) is not None:
                gpu_mem = m if gpu_mem is None else max(gpu_mem, m)
            mean = _num(gpu.get("util_pct_mean"))
            if mean is None:  # util unknown (MPS client, MIG without GPM): neither 0 nor idle
                unknown += 1
                continue
            never = bool(gpu.get("never_busy"))
            busy += 0 if never else 1
            util.append(mean)
            trailing = _num(gpu.get("idle_trailing_s")) or 0.0
            share = 1.0 if never or elapsed <= 0 else min(trailing / elapsed, 1.0)
            idle.append(100.0 * share)
    requested = _num(summary.get("gpus_requested")) or 0.0
    silent = max(int(requested) - len(util) - unknown, 0)
    count = len(util) + silent
    return {
        "gpus_reported": len(util),
        "gpus_busy": busy,
        "gpu_util_pct": sum(util) / count if util else None,
        "gpu_idle_pct": (sum(idle) + 100.0 * silent) / count if util else None,
        "gpu_memory_max_mib": gpu_mem,
        "cpu_memory_max_mib": cpu_mem,
    }

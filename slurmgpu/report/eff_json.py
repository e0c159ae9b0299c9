"""One job's efficiency report as stable JSON (``version`` 1): ``sgpu eff --json``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from slurmgpu.report.eff import JobEfficiency, job_nodes
from slurmgpu.report.eff_advice import Note, gpu_diagnosis
from slurmgpu.report.energy import energy_to_json

JSON_VERSION = 1


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def to_json(eff: JobEfficiency, job_notes: Sequence[Note]) -> dict[str, Any]:
    """Return the report as JSON-ready data; keys are stable (``version`` 1).

    Top level: ``version``, ``job`` (job_id, display_id, name, user, account, partition,
    state, nodes, node_count, cores, memory_requested_mib, gpus_requested,
    shards_requested, gpu_type, gpu_allocations [{node, gpus, shard_gpus, shards}],
    start_time, end_time, time_limit_s), ``source`` (samples | summary | none), ``running``,
    ``elapsed_s``, ``time_use_pct``, ``cpu`` (util_pct, cores, memory_max_mib,
    memory_node_max_mib, memory_requested_mib, memory_use_pct), ``nodes`` [{node, samples,
    cores, cpu_pct_mean, cpu_util_pct, memory_max_mib, reported, iowait_pct_mean}], ``gpu``
    (allocated, busy, util_pct, memory_max_mib, memory_use_pct, diagnosis), ``gpus``
    [{node, index, role, status, samples, util_pct_mean, util_pct_max, memory_max_mib,
    memory_total_mib, idle_trailing_min, ever_busy, shared, error_samples,
    counted_as_zero}], ``silent_nodes``, ``energy`` (energy_j, idle_energy_j, kwh,
    idle_pct, method, extrapolated_j, gpus; null when not measured), ``notes`` [{kind,
    severity, text, option}]. Percentages and MiB are rounded to 0.1; absent figures are
    ``null``.
    """
    job = eff.job
    return {
        "version": JSON_VERSION,
        "job": {
            "job_id": job.job_id,
            "display_id": job.display_id,
            "name": job.name,
            "user": job.user,
            "account": job.account,
            "partition": job.partition,
            "state": job.state.value,
            "nodes": job_nodes(job),
            "node_count": job.node_count,
            "cores": job.cpus,
            "memory_requested_mib": job.memory_mib,
            "gpus_requested": job.gpus.gpus,
            "shards_requested": job.gpus.shards,
            "gpu_type": job.gpus.gpu_type,
            "gpu_allocations": [
                {
                    "node": a.node,
                    "gpus": list(a.gpu_indices),
                    "shard_gpus": list(a.shard_indices),
                    "shards": a.shards,
                }
                for a in job.gpu_allocations
            ],
            "start_time": _iso(job.start_time),
            "end_time": _iso(job.end_time) if job.state.is_terminal else None,
            "time_limit_s": int(job.time_limit.total_seconds()) if job.time_limit else None,
        },
        "source": eff.source,
        "running": eff.running,
        "elapsed_s": int(eff.elapsed.total_seconds()) if eff.elapsed is not None else None,
        "time_use_pct": _r(eff.time_use_pct),
        "cpu": {
            "util_pct": _r(eff.cpu_util_pct),
            "cores": eff.cores,
            "memory_max_mib": _r(eff.cpu_memory_max_mib),
            "memory_node_max_mib": _r(eff.cpu_memory_node_max_mib),
            "memory_requested_mib": eff.cpu_memory_requested_mib,
            "memory_use_pct": _r(eff.cpu_memory_use_pct),
        },
        "nodes": [
            {
                "node": n.node,
                "samples": n.samples,
                "cores": n.cores,
                "cpu_pct_mean": _r(n.mean_cpu_pct),
                "cpu_util_pct": _r(n.cpu_util_pct),
                "memory_max_mib": _r(n.max_memory_mib),
                "reported": n.reported,
                "iowait_pct_mean": _r(n.mean_iowait_pct),
            }
            for n in eff.nodes
        ],
        "gpu": {
            "allocated": eff.gpus_allocated,
            "sharing": eff.sharing,
            "equivalents": round(eff.gpu_equivalents, 3),
            "busy": eff.gpus_busy,
            "util_pct": _r(eff.gpu_util_pct),
            "memory_max_mib": _r(eff.gpu_memory_max_mib),
            "memory_use_pct": _r(eff.gpu_memory_use_pct),
            "diagnosis": gpu_diagnosis(job_notes),
        },
        "gpus": [
            {
                "node": g.node,
                "index": g.index,
                "role": g.role,
                "status": g.status,
                "samples": g.samples,
                "util_pct_mean": _r(g.mean_util_pct),
                "util_pct_max": _r(g.max_util_pct),
                "memory_max_mib": _r(g.max_memory_mib),
                "memory_total_mib": _r(g.memory_total_mib),
                "idle_trailing_min": (
                    None if g.trailing_idle is None else _r(g.trailing_idle.total_seconds() / 60)
                ),
                "ever_busy": g.ever_busy,
                "shared": g.shared,
                "error_samples": g.error_samples,
                "counted_as_zero": g.counted_as_zero,
            }
            for g in eff.gpus
        ],
        "silent_nodes": list(eff.silent_nodes),
        "energy": energy_to_json(eff.energy),
        "notes": [
            {"kind": n.kind, "severity": n.severity, "text": n.text, "option": n.option}
            for n in job_notes
        ],
    }

"""The figures a comparison reports for one simulated run.

- JCT (job completion time): end of the job's last run minus its first submission (a
  job its user resubmitted after a timeout counts once, to its final end).
- Queueing delay: first start minus submission.
- Makespan: last end minus first submission.
- GPU-hours: GPUs held times time held, every run (a shard counts as its share of a GPU).
- Allocated utilisation: GPU-hours / (cluster GPUs x makespan); used utilisation: the
  GPU-time spent computing (not checkpointing or starting up), weighted by the
  application's GPU utilisation and, for a job sharing a GPU, by its co-location speed
  (a shard job computes on its one GPU; its util counts in full there, not scaled by its
  share of the shards), over the same capacity. It is productive GPU time: a job's total
  is its util times its run time alone, however it ran, so sharing raises it only by
  finishing the same work sooner (a shorter makespan).
- Restarts: requeues (resizes and preemptions); timeouts: runs killed at their limit.
- Energy (kWh): the cluster's GPUs over the makespan under the simulated probe's linear
  power model (``telemetry.gpupower``; the simulated GPUs are V100-32GB-like, as in
  Pollux's testbed): every GPU draws its idle power the whole makespan, plus
  (busy - idle) power times the used (util-weighted) GPU-time. Idle GPUs count: a
  policy set that finishes sooner also spends less on idle hardware. kWh per job: that
  over the trace's jobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from slurmgpu.model import JobState
from slurmgpu.sim.run import SimRun
from slurmgpu.telemetry.gpupower import GPU_POWER, GpuPowerModel

__all__ = ["SIM_GPU_POWER", "RunSummary", "percentile", "summarise"]

SIM_GPU_POWER: GpuPowerModel = GPU_POWER["v100"]  # sim/run.py's DEVICE_MEMORY_MIB: V100-32GB


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class RunSummary:
    policy_set: str
    jobs: int
    completed: int
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    p99_queue_s: float
    makespan_s: float
    gpu_hours: float
    allocated_util_pct: float
    used_util_pct: float
    restarts: int
    timeouts: int
    resubmits: int
    never_ran: int
    actions: int
    failed_actions: int
    sim_seconds: float = 0.0
    energy_kwh: float = math.nan
    kwh_per_job: float = math.nan

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def summarise(run: SimRun, sim_seconds: float = 0.0) -> RunSummary:
    """Return the comparison figures of one run (see the module docstring)."""
    jobs = run.jobs
    jct = [j.end_s - j.origin_s for j in jobs]
    queue = [j.first_start_s - j.origin_s for j in jobs if not math.isnan(j.first_start_s)]
    gpu_s = used_s = 0.0
    timeouts = 0
    for j in run.all_jobs:
        for r in j.runs:
            end = r.end_s if not math.isnan(r.end_s) else run.end_s
            gpu_s += (end - r.start_s) * r.gpus
            used_s += r.used_gpu_s
        if j.state is JobState.TIMEOUT:
            timeouts += 1
    first = min((j.origin_s for j in jobs), default=0.0)
    last = max((j.end_s for j in jobs), default=0.0)
    makespan = max(0.0, last - first)
    capacity = run.shape.gpus * makespan
    power = SIM_GPU_POWER
    energy_j = power.idle_w * capacity + (power.busy_w - power.idle_w) * used_s
    return RunSummary(
        policy_set=run.policy_set,
        jobs=len(jobs),
        completed=sum(1 for j in jobs if j.state is JobState.COMPLETED),
        avg_jct_s=sum(jct) / len(jct) if jct else math.nan,
        p50_jct_s=percentile(jct, 50),
        p99_jct_s=percentile(jct, 99),
        avg_queue_s=sum(queue) / len(queue) if queue else math.nan,
        p99_queue_s=percentile(queue, 99),
        makespan_s=makespan,
        gpu_hours=gpu_s / 3600.0,
        allocated_util_pct=100.0 * gpu_s / capacity if capacity else math.nan,
        used_util_pct=100.0 * used_s / capacity if capacity else math.nan,
        restarts=sum(j.restarts for j in jobs),
        timeouts=timeouts,
        resubmits=sum(j.resubmits for j in jobs),
        never_ran=run.never_ran,
        actions=run.executed,
        failed_actions=run.failed,
        sim_seconds=sim_seconds,
        energy_kwh=energy_j / 3.6e6,
        kwh_per_job=energy_j / 3.6e6 / len(jobs) if jobs else math.nan,
    )

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
  ``preemptions`` and ``resizes`` count the transactions a policy (or the Tiresias
  baseline) started, per job in ``*_per_job``.
- Energy (kWh): the cluster's GPUs over the makespan under the simulated probe's linear
  power model (``telemetry.gpupower``; an untyped cluster's GPUs draw a T4's power:
  the Pollux throughput profiles were measured on T4s, AWS g4dn.12xlarge, as Sia's
  artifact shows; the co-location model keeps its 32 GiB device memory): every GPU
  draws its idle power the whole makespan, plus
  (busy - idle) power times the used (util-weighted) GPU-time. Idle GPUs count: a
  policy set that finishes sooner also spends less on idle hardware. kWh per job: that
  over the trace's jobs. On a heterogeneous cluster (``--cluster 8xa100:4,8xv100:4``)
  each type's GPUs draw that model's power (``gpupower.power_model``): idle over the
  makespan, plus busy - idle over the used GPU-time on that type.
- Per GPU type (:func:`type_use`): GPU-hours held, used GPU-hours, and energy as above.
- Finish-time fairness (Themis, NSDI'20): ``rho = JCT / T_id``, where ``T_id`` is the
  job's run time alone on a 1/N share of the cluster, N the time-averaged number of jobs
  in the system (submitted, not finished) over the job's life: at its requested size when
  the share holds it, at the share (whole GPUs) when smaller, time-sliced below one GPU.
  ``rho <= 1`` is fair. Reported: the worst (``rho_max``) and the share of jobs above
  1.05 (Themis' tolerance for throughput noise).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from slurmgpu.model import JobState
from slurmgpu.sim.run import SimRun
from slurmgpu.sim.workload import JobModel
from slurmgpu.telemetry.gpupower import GPU_POWER, GpuPowerModel, power_model

__all__ = [
    "SIM_GPU_POWER",
    "RunSummary",
    "TypeUse",
    "ci95",
    "finish_time_fairness",
    "mean_summary",
    "percentile",
    "rho_values",
    "summarise",
    "type_use",
]

# Student's t at 97.5 % by degrees of freedom (a 95 % two-sided interval)
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}

# The Pollux profiles' GPU (T4, g4dn.12xlarge); not DEVICE_MEMORY_MIB's V100-32GB-like memory
SIM_GPU_POWER: GpuPowerModel = GPU_POWER["t4"]


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
    preemptions: int = 0
    resizes: int = 0
    preemptions_per_job: float = 0.0
    resizes_per_job: float = 0.0
    rho_max: float = math.nan
    rho_over_pct: float = math.nan

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
    rho = finish_time_fairness(run)
    first = min((j.origin_s for j in jobs), default=0.0)
    last = max((j.end_s for j in jobs), default=0.0)
    makespan = max(0.0, last - first)
    capacity = run.shape.gpus * makespan
    if run.shape.types:
        energy_j = sum(u.energy_kwh for u in type_use(run).values()) * 3.6e6
    else:
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
        preemptions=run.preemptions,
        resizes=run.resizes,
        preemptions_per_job=run.preemptions / len(jobs) if jobs else 0.0,
        resizes_per_job=run.resizes / len(jobs) if jobs else 0.0,
        rho_max=max(rho) if rho else math.nan,
        rho_over_pct=100.0 * sum(1 for r in rho if r > 1.05) / len(rho) if rho else math.nan,
    )


@dataclass(frozen=True, slots=True)
class TypeUse:
    """What one GPU type of a heterogeneous cluster did over a run."""

    gpu_type: str
    gpus: int
    gpu_hours: float
    used_gpu_hours: float
    energy_kwh: float

    @property
    def allocated_pct(self) -> float:
        return 100.0 * self.gpu_hours / self.capacity_h if self.capacity_h else math.nan

    capacity_h: float = 0.0


def type_use(run: SimRun) -> dict[str, TypeUse]:
    """Per GPU type: GPU-hours held and used, and kWh (see the module docstring).

    Empty for an untyped cluster. A run over several types splits its GPU time and its
    used time by the GPUs it held on each.
    """
    if not run.shape.types:
        return {}
    held: dict[str, float] = {}
    used: dict[str, float] = {}
    for j in run.all_jobs:
        for r in j.runs:
            total = sum(r.by_type.values())
            if total <= 0:
                continue
            end = r.end_s if not math.isnan(r.end_s) else run.end_s
            for t, g in r.by_type.items():
                held[t] = held.get(t, 0.0) + (end - r.start_s) * g
                used[t] = used.get(t, 0.0) + r.used_gpu_s * g / total
    first = min((j.origin_s for j in run.jobs), default=0.0)
    last = max((j.end_s for j in run.jobs), default=0.0)
    makespan = max(0.0, last - first)
    out: dict[str, TypeUse] = {}
    for t, gpus in run.shape.gpus_by_type().items():
        p = power_model(t)
        energy_j = p.idle_w * gpus * makespan + (p.busy_w - p.idle_w) * used.get(t, 0.0)
        out[t] = TypeUse(
            gpu_type=t,
            gpus=gpus,
            gpu_hours=held.get(t, 0.0) / 3600.0,
            used_gpu_hours=used.get(t, 0.0) / 3600.0,
            energy_kwh=energy_j / 3.6e6,
            capacity_h=gpus * makespan / 3600.0,
        )
    return out


def finish_time_fairness(run: SimRun) -> list[float]:
    """Themis' rho of every finished job of ``run`` (see the module docstring)."""
    jobs = [j for j in run.jobs if not math.isnan(j.end_s)]
    return rho_values(
        [(j.origin_s, j.end_s, j.spec.gpus, j.model) for j in jobs],
        run.shape.gpus,
        run.shape.gpus_per_node,
    )


def rho_values(
    jobs: Sequence[tuple[float, float, int, JobModel]], gpus: int, per_node: int
) -> list[float]:
    """Themis' rho of finished jobs given as (first submission, end, GPUs asked, work
    model), on a cluster of ``gpus`` GPUs, ``per_node`` a node (any scheduler's run)."""
    if not jobs:
        return []
    # jobs in the system over time: +1 at first submission, -1 at the final end
    events = sorted([(j[0], 1) for j in jobs] + [(j[1], -1) for j in jobs])
    times: list[float] = []
    area: list[float] = []  # integral of the count up to times[i]
    counts: list[int] = []  # the count right after times[i]
    count = 0
    total = 0.0
    last = events[0][0]
    for t, d in events:
        total += count * (t - last)
        last = t
        count += d
        times.append(t)
        area.append(total)
        counts.append(count)

    def integral(t: float) -> float:
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return 0.0
        return area[i] + counts[i] * (t - times[i])

    out = []
    for origin, end, asked, model in jobs:
        jct = end - origin
        if jct <= 0:
            continue
        n = max(1.0, (integral(end) - integral(origin)) / jct)
        share = gpus / n
        want = max(1, asked)
        if share >= want:
            alone = model.run_time(want, per_node)
        elif share >= 1:
            alone = model.run_time(int(share), per_node)
        else:
            alone = model.run_time(1, per_node) / share
        if alone > 0 and math.isfinite(alone):
            out.append(jct / alone)
    return out


def ci95(values: Sequence[float]) -> float:
    """Half-width of the 95 % confidence interval of the mean (Student's t); NaN for < 2."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return _T975.get(n - 1, 1.96) * sd / math.sqrt(n)


def mean_summary(runs: Sequence[RunSummary]) -> RunSummary:
    """One summary of several runs of a set (seeds): every figure's mean, the worst rho."""
    if not runs:
        raise ValueError("no runs to average")
    first = runs[0]
    values: dict[str, float | int | str] = {}
    for key, value in first.as_dict().items():
        if isinstance(value, str):
            values[key] = value
            continue
        xs = [float(r.as_dict()[key]) for r in runs]
        if key == "rho_max":
            values[key] = max(xs)
        elif isinstance(value, int):
            values[key] = round(sum(xs) / len(xs))
        else:
            values[key] = sum(xs) / len(xs)
    return RunSummary(**values)  # type: ignore[arg-type]

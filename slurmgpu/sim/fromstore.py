"""The daemon's own history as a trace: what ``sgpu whatif`` replays.

Pure conversion, no I/O: :func:`to_trace` takes the finished jobs the store reader
(:func:`slurmgpu.store.whatif.read_window`) returns -- any objects with the
:class:`StoredJobLike` attributes -- and makes rigid
:class:`~slurmgpu.sim.workload.TraceJob` values: each job runs its real elapsed time at
the GPUs it asked for, is submitted when it really was, keeps its user, partition and
time limit, and uses its GPUs as its end-of-job summary says (mean util, GPU memory
peak). A job with no summary runs at 100 % util (nothing to rightsize: the conservative
guess) and is counted by the caller. :func:`savings` compares each policy set's figures
with plain Slurm's. The cluster is built from the stored nodes by
:meth:`slurmgpu.sim.run.ClusterShape.of_nodes` (each node at its own GPU count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from slurmgpu.policy.base import HistoryRecord
from slurmgpu.sim.clock import EPOCH
from slurmgpu.sim.metrics import RunSummary
from slurmgpu.sim.run import seeded
from slurmgpu.sim.workload import RigidJob, TimeLimitModel, TraceJob
from slurmgpu.whatif_figures import Savings

__all__ = ["Savings", "StoredJobLike", "priors", "savings", "to_trace"]

MAX_SPAN_S = 1e9


class StoredJobLike(Protocol):
    @property
    def job_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def account(self) -> str: ...
    @property
    def partition(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def shards(self) -> int: ...
    @property
    def time_limit_s(self) -> float | None: ...
    @property
    def submit_s(self) -> float: ...
    @property
    def start_s(self) -> float: ...
    @property
    def end_s(self) -> float: ...
    @property
    def util_pct(self) -> float | None: ...
    @property
    def gpu_memory_max_mib(self) -> float | None: ...
    @property
    def gpus_busy(self) -> int | None: ...
    @property
    def memory_mib(self) -> float | None: ...


def to_trace(
    jobs: Sequence[StoredJobLike], *, seed: int = 1, gpus_per_node: int = 4, max_gpus: int = 0
) -> list[TraceJob]:
    """Rigid trace jobs, submit times in seconds from the first job's submit.

    A job without a stored time limit gets one drawn from the seeded
    :class:`~slurmgpu.sim.workload.TimeLimitModel` (so seeds differ only there); a job
    asking for more GPUs than ``max_gpus`` (when > 0) is capped to fit the cluster.
    """
    out: list[TraceJob] = []
    for j in sorted(jobs, key=lambda j: (j.submit_s, j.job_id)):
        gpus = max(0, j.gpus)
        if max_gpus > 0:
            gpus = min(gpus, max_gpus)
        shards = 0 if gpus else max(1, j.shards)
        elapsed = max(1.0, j.end_s - j.start_s)
        busy = j.gpus_busy
        # A job that kept fewer GPUs busy than it asked for gains nothing from the rest:
        # no speed-up with size (so rightsizing it to its busy GPUs costs no time).
        idle_extra = busy is not None and 0 < busy < gpus
        model = RigidJob(elapsed, max(1, gpus), parallel_fraction=0.0 if idle_extra else 0.95)
        model.util_pct = 100.0 if j.util_pct is None else max(0.0, min(100.0, j.util_pct))
        model.memory_mib = j.gpu_memory_max_mib or 0.0
        limit = j.time_limit_s
        if limit is not None and limit < elapsed:
            limit = elapsed  # the job ran that long: its limit was at least that
        out.append(
            TraceJob(
                submit_s=j.submit_s,
                name=j.name or f"job{j.job_id}",
                user=j.user or "unknown",
                account=j.account,
                partition=j.partition or "gpu",
                model=model,
                gpus=gpus,
                shards=shards,
                time_limit_s=limit,
                line=j.job_id,
            )
        )
    if not out:
        return out
    t0 = out[0].submit_s
    for t in out:
        t.submit_s = min(MAX_SPAN_S, t.submit_s - t0)
    rng = seeded(seed, "whatif-limit")
    limits = TimeLimitModel()
    for t in out:
        if t.time_limit_s is None:
            t.time_limit_s = limits.limit(t.model.run_time(max(1, t.gpus), gpus_per_node), rng)
    return out


def priors(jobs: Sequence[StoredJobLike]) -> tuple[HistoryRecord, ...]:
    """The window's jobs with usage as the priors' history, ended before the replay starts.

    The daemon that ran through the window would have learnt from runs like these (the
    same user and name) before; the simulator's own history records every GPU a job held
    as busy, so without these the rightsize set never sees an over-asked GPU count. An
    approximation (a job's own run informs its own replay) that docs/simulator.md states.
    """
    out: list[HistoryRecord] = []
    for j in jobs:
        if j.util_pct is None:
            continue
        elapsed = max(1.0, j.end_s - j.start_s)
        mem = j.memory_mib
        out.append(
            HistoryRecord(
                user=j.user or "unknown",
                name=j.name or f"job{j.job_id}",
                partition=j.partition or "gpu",
                script_hash=None,
                state="COMPLETED",
                run_time=timedelta(seconds=elapsed),
                time_limit=None if j.time_limit_s is None else timedelta(seconds=j.time_limit_s),
                gpus_requested=j.gpus,
                gpus_used=j.gpus_busy if j.gpus_busy is not None and j.gpus_busy > 0 else None,
                cpus=0,
                memory_requested_mib=None if mem is None else int(mem),
                peak_memory_mib=None,
                mean_cpu_pct=None,
                mean_gpu_util_pct=j.util_pct,
                peak_gpu_memory_mib=j.gpu_memory_max_mib,
                ended_at=EPOCH - timedelta(hours=1),
                restarts=0,
            )
        )
    return tuple(out)


def _mean(xs: Sequence[float]) -> float:
    good = [x for x in xs if not math.isnan(x)]
    return sum(good) / len(good) if good else math.nan


def savings(
    baseline: Sequence[RunSummary], runs: Sequence[RunSummary], touched: Sequence[int]
) -> Savings:
    """``runs`` (one per seed) of a set against ``baseline`` (plain Slurm, same seeds)."""
    pairs = list(zip(baseline, runs, strict=True))
    returned = [b.gpu_hours - r.gpu_hours for b, r in pairs]
    r_mean = _mean(returned)
    return Savings(
        policy_set=runs[0].policy_set,
        gpu_hours=_mean([r.gpu_hours for r in runs]),
        gpu_hours_returned=r_mean,
        avg_queue_s=_mean([r.avg_queue_s for r in runs]),
        avg_queue_saved_s=_mean([b.avg_queue_s - r.avg_queue_s for b, r in pairs]),
        avg_jct_s=_mean([r.avg_jct_s for r in runs]),
        avg_jct_saved_s=_mean([b.avg_jct_s - r.avg_jct_s for b, r in pairs]),
        p99_jct_s=_mean([r.p99_jct_s for r in runs]),
        p99_jct_saved_s=_mean([b.p99_jct_s - r.p99_jct_s for b, r in pairs]),
        energy_kwh=_mean([r.energy_kwh for r in runs]),
        energy_saved_kwh=_mean([b.energy_kwh - r.energy_kwh for b, r in pairs]),
        jobs_touched=round(_mean([float(t) for t in touched])) if touched else 0,
        actions=round(_mean([float(r.actions) for r in runs])),
        gpu_hours_spread=(max(returned) - min(returned)) / 2.0 if len(returned) > 1 else 0.0,
    )

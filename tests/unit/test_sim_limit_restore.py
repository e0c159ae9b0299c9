"""Rightsizing never costs a job its run: a job rightsized into a timeout is requeued
with the limit it asked for, at its place in the queue, and its key's margin grows."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from slurmgpu.model import JobState
from slurmgpu.policy.base import HistoryRecord
from slurmgpu.sim.run import ClusterShape, SimOptions, SimRun, simulate
from slurmgpu.sim.state import SimJob
from slurmgpu.sim.workload import RigidJob, TraceJob
from slurmgpu.tokens import rightsize_opted_out

HOUR = 3600.0


def _record(run_s: float, state: str = "COMPLETED") -> HistoryRecord:
    return HistoryRecord(
        user="alice",
        name="train",
        partition="gpu",
        script_hash=None,
        state=state,
        run_time=timedelta(seconds=run_s),
        time_limit=timedelta(hours=8),
        gpus_requested=1,
        gpus_used=1,
        cpus=0,
        memory_requested_mib=None,
        peak_memory_mib=None,
        mean_cpu_pct=None,
        mean_gpu_util_pct=100.0,
        peak_gpu_memory_mib=None,
        ended_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _job(run_s: float, at: float = 0.0, name: str = "train") -> TraceJob:
    return TraceJob(at, name, "alice", RigidJob(run_s, 1), 1, time_limit_s=8 * HOUR)


def _run(restore: bool) -> tuple[SimRun, dict[str, list[SimJob]]]:
    # history says 1 h; this run needs 3 h: rightsizing lowers 8 h to 1 h 20 min
    history = tuple(_record(HOUR) for _ in range(3))
    # one GPU; bob's job waits from t=10 (it takes the GPU while the requeued job waits
    # out Slurm's requeue delay), carol's from t=100
    trace = [
        _job(3 * HOUR),
        replace(_job(HOUR, at=10.0, name="other"), user="bob"),
        replace(_job(HOUR, at=100.0, name="later"), user="carol"),
    ]
    options = SimOptions(history=history, restore_lowered_limits=restore)
    run = simulate(trace, ClusterShape(1, 1), "rightsize", options)
    attempts: dict[str, list[SimJob]] = {}
    for j in run.all_jobs:
        attempts.setdefault(j.name, []).append(j)
    return run, attempts


def test_a_job_rightsized_into_a_timeout_is_requeued_with_its_old_limit_at_its_place() -> None:
    run, attempts = _run(restore=True)
    first, second = attempts["train"]
    assert first.state is JobState.TIMEOUT
    assert first.time_limit_s == 80 * 60  # 1 h * 1.3 -> 80 min
    # requeued with the 8 h it asked for, not rightsized again, at its submit time
    assert second.state is JobState.COMPLETED
    assert second.time_limit_s == 8 * HOUR
    assert rightsize_opted_out(second.comment)
    assert second.submit_s == first.submit_s == 0.0
    # it kept its place: it restarts before carol's job, submitted after it
    (later,) = attempts["later"]
    assert second.first_start_s < later.first_start_s
    assert run.limit_restores == 1
    # the same job to Slurm, started once more (the daemon's requeue counts it so)
    assert second.restarts == first.restarts + 1
    # it resumed from its checkpoint: it ran 3 h of work in all, not 80 min + 3 h
    assert second.end_s - second.first_start_s < 3 * HOUR - 70 * 60


def test_without_the_restore_the_user_resubmits_behind_the_queue() -> None:
    run, attempts = _run(restore=False)
    _, second = attempts["train"]
    (later,) = attempts["later"]
    assert run.limit_restores == 0
    assert second.first_start_s > later.first_start_s

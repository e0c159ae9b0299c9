"""The daemon's history loader (store/history.py) reads back what the observer stored,
including how many times Slurm restarted each job (the priors set no time limit from a
restarted job's runs: its run time is the last run's only)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from slurmgpu.daemon.observer import Observer
from slurmgpu.model import Job, JobState
from slurmgpu.store import open_store
from slurmgpu.store.history import load_history
from tests.fakes import FakeSlurm

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _finished(job_id: int, restarts: int) -> Job:
    start = NOW - timedelta(hours=2)
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=JobState.COMPLETED,
        partition="gpu",
        submit_time=start - timedelta(hours=5),
        start_time=start,  # Slurm's start time: the last run's
        end_time=start + timedelta(minutes=40),
        time_limit=timedelta(hours=8),
        cpus=4,
        restart_count=restarts,
    )


def test_history_carries_each_jobs_restart_count(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        Observer(FakeSlurm([_finished(1, 0), _finished(2, 3)]), store, clock=lambda: NOW).cycle()
        records = load_history(store.engine, store.cluster, NOW - timedelta(days=1))
        assert sorted((r.run_time, r.restarts) for r in records) == [
            (timedelta(minutes=40), 0),
            (timedelta(minutes=40), 3),
        ]
    finally:
        store.engine.dispose()

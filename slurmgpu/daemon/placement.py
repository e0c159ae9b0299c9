"""Where and when jobs ran and which GPUs nodes have: what agents' samples are checked against.

An agent is authenticated as its node, but what it reports is only its word: a node
(compromised, misconfigured or buggy) could post samples for another node's jobs, for
GPUs its job does not hold, for times its job did not run, or for a job id not submitted
yet, and so make a busy job look idle (or an idle one busy) to the reports and to the
idle-GPU and rightsizing policies. The ingest keeps a sample only when it fits its job's
run (store/sample_check.py: the posting node, the job's GPUs there, its start to end);
the runs come from the daemon's latest snapshot, else the job's stored rows, so samples
spooled while the daemon was away still count. A job not known to have run anywhere
(never seen, pending in the last snapshot, or started since the daemon's last good
cycle) proves nothing either way: its samples are held until it is listed
(store/sample_hold.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.model import ClusterSnapshot, Job
from slurmgpu.store import schema
from slurmgpu.store.rows import row_to_job
from slurmgpu.store.sample_check import JobRun, job_run

__all__ = ["SnapshotPlacement"]

_CACHE_JOBS = 100_000  # stored runs kept in memory (jobs that left the snapshot)


class SnapshotPlacement:
    """Answers :class:`slurmgpu.store.sample_ingest.Placement` from the snapshot and the store."""

    def __init__(
        self,
        snapshot: Callable[[], ClusterSnapshot | None],
        engine: Engine,
        cluster: str = "",
    ) -> None:
        self.snapshot = snapshot
        self.engine = engine
        self.cluster = cluster
        self._stored: dict[int, tuple[JobRun, ...]] = {}
        self._lock = threading.Lock()  # the API serves agents from several threads

    def node_gpus(self, node: str) -> int | None:
        """GPUs Slurm lists on ``node`` (None: the node or the snapshot is not known)."""
        snap = self.snapshot()
        if snap is None:
            return None
        match = next((n for n in snap.nodes if n.name == node), None)
        return None if match is None else match.gpus

    def job_runs(self, job_id: int) -> tuple[JobRun, ...] | None:
        """Where and when ``job_id`` ran: one run per incarnation of the id; ``()`` when
        every incarnation ended without running; None when not known to have run (never
        seen, or pending: it may have started since, the snapshot is stale while Slurm or
        the store is away, and a stored row without nodes says nothing either).
        """
        snap = self.snapshot()
        if snap is not None:
            job = snap.jobs_by_id().get(job_id)
            if job is not None:
                return _runs([job])
        with self._lock:
            if job_id in self._stored:
                return self._stored[job_id]
        runs = self._from_store(job_id)
        if runs is not None:
            with self._lock:
                if len(self._stored) >= _CACHE_JOBS:
                    self._stored.clear()
                self._stored[job_id] = runs
        return runs

    def _from_store(self, job_id: int) -> tuple[JobRun, ...] | None:
        j = schema.jobs
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(j).where(j.c.cluster == self.cluster, j.c.job_id == job_id)
                ).mappings()
                jobs = [row_to_job(row) for row in rows]
        except (SQLAlchemyError, ValueError, TypeError, KeyError):
            return None  # the store's trouble is reported by the ingest itself
        return _runs(jobs) if jobs else None


def _runs(jobs: list[Job]) -> tuple[JobRun, ...] | None:
    runs = tuple(run for job in jobs if (run := job_run(job)) is not None)
    if runs:
        return runs
    return () if all(job.state.is_terminal for job in jobs) else None

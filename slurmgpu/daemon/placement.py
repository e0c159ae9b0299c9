"""Where jobs ran and which GPUs nodes have: what an agent's samples are checked against.

An agent is authenticated as its node, but what it reports is only its word: a node
(compromised, misconfigured or buggy) could post samples for another node's jobs or GPU
indices its node does not have, and so make a busy job look idle (or an idle one busy)
to the idle-GPU and rightsizing policies. The ingest keeps a sample only when its job
ran on the posting node (the daemon's latest snapshot, else the job's stored node list,
so samples spooled while the daemon was away still count) and its GPU index is one of
the node's GPUs. A job not known to have run anywhere (pending in the last snapshot,
or started since the daemon's last good cycle, during a Slurm or store outage) is no
proof of anything: its samples are kept, and only a job placed elsewhere is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.model import ClusterSnapshot
from slurmgpu.store import schema

__all__ = ["SnapshotPlacement"]

_CACHE_JOBS = 100_000  # stored node lists kept in memory (jobs that left the snapshot)


class SnapshotPlacement:
    """Answers :class:`slurmgpu.store.usage.Placement` from the snapshot and the store."""

    def __init__(
        self,
        snapshot: Callable[[], ClusterSnapshot | None],
        engine: Engine,
        cluster: str = "",
    ) -> None:
        self.snapshot = snapshot
        self.engine = engine
        self.cluster = cluster
        self._stored: dict[int, frozenset[str]] = {}
        self._lock = threading.Lock()  # the API serves agents from several threads

    def node_gpus(self, node: str) -> int | None:
        """GPUs Slurm lists on ``node`` (None: the node or the snapshot is not known)."""
        snap = self.snapshot()
        if snap is None:
            return None
        match = next((n for n in snap.nodes if n.name == node), None)
        return None if match is None else match.gpus

    def job_nodes(self, job_id: int) -> frozenset[str] | None:
        """Nodes ``job_id`` ran on (None: not known, a job never seen or not placed yet).

        A job the snapshot lists without nodes was pending when it was taken: it may
        have started since (the snapshot is stale while Slurm or the store is away), so
        that says nothing; nor does a stored row without nodes, which is not cached.
        """
        snap = self.snapshot()
        if snap is not None:
            job = snap.jobs_by_id().get(job_id)
            if job is not None:
                return frozenset(job.nodes) if job.nodes else None
        with self._lock:
            if job_id in self._stored:
                return self._stored[job_id]
        nodes = self._from_store(job_id)
        if nodes is not None:
            with self._lock:
                if len(self._stored) >= _CACHE_JOBS:
                    self._stored.clear()
                self._stored[job_id] = nodes
        return nodes

    def _from_store(self, job_id: int) -> frozenset[str] | None:
        j = schema.jobs
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(j.c.nodes).where(j.c.cluster == self.cluster, j.c.job_id == job_id)
                ).all()
        except SQLAlchemyError:
            return None  # the store's trouble is reported by the ingest itself
        names = {n for (value,) in rows for n in (value or "").split(",") if n}
        return frozenset(names) if names else None

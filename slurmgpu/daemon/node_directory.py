"""The nodes the API knows, from the daemon's latest snapshot: their addresses (what a MUNGE
credential's host must be) and the running jobs on each (what an agent asks for)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from slurmgpu.model import ClusterSnapshot, JobState
from slurmgpu.wire import NodeJob, NodeJobs


@dataclass
class NodeDirectory:
    """Which nodes exist and their addresses, from the daemon's latest snapshot."""

    snapshot: Callable[[], ClusterSnapshot | None]
    _resolved: dict[str, set[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def addresses(self, node: str) -> set[str] | None:
        snap = self.snapshot()
        if snap is None:
            return None
        match = next((n for n in snap.nodes if n.name == node), None)
        if match is None:
            return None
        key = match.address or match.name
        with self._lock:
            if key not in self._resolved:
                try:
                    addrs = {str(ai[4][0]) for ai in socket.getaddrinfo(key, None)}
                except OSError:
                    addrs = set()
                self._resolved[key] = addrs | {key}
            return set(self._resolved[key])

    def jobs_on(self, node: str) -> NodeJobs:
        snap = self.snapshot()
        jobs: list[NodeJob] = []
        if snap is not None:
            for job in snap.jobs:
                if job.state is not JobState.RUNNING or node not in job.nodes:
                    continue
                alloc = next((a for a in job.gpu_allocations if a.node == node), None)
                per_node_cpus = job.cpus // max(job.node_count or len(job.nodes), 1)
                jobs.append(
                    NodeJob(
                        job_id=job.job_id,
                        gpu_indices=list(alloc.gpu_indices) if alloc else [],
                        shard_indices=list(alloc.shard_indices) if alloc else [],
                        shards=alloc.shards if alloc else 0,
                        cpus=per_node_cpus,
                        user=job.user,
                        mps_indices=list(alloc.mps_indices) if alloc else [],
                    )
                )
        return NodeJobs(node=node, jobs=jobs)

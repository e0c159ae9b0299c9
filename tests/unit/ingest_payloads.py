"""The cluster an ingest API serves, its site secret, and sample batches an agent posts."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from slurmgpu.model import ClusterSnapshot, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch, encode

SECRET = b"s" * 64


def snapshot() -> ClusterSnapshot:
    job = Job(
        job_id=42,
        name="train",
        user="alice",
        state=JobState.RUNNING,
        cpus=4,
        node_count=1,
        nodes=("gpu1",),
        gpu_allocations=(NodeGpuAllocation("gpu1", (0, 1)),),
    )
    nodes = (Node("gpu1", "mixed", address="127.0.0.1"), Node("gpu2", "idle", address="127.0.0.1"))
    return ClusterSnapshot(taken_at=datetime.now(UTC), jobs=(job,), nodes=nodes)


def batch(node: str = "gpu1", n: int = 3, uid: str = "u") -> bytes:
    now = time.time()
    return encode(
        SampleBatch(
            node=node,
            gpu=[
                GpuSampleIn(
                    sample_uid=f"{uid}{i}",
                    at=now - 10 * (n - i),
                    gpu_index=0,
                    job_id=42,
                    util_pct=80.0,
                    memory_used_mib=1000.0,
                    memory_total_mib=81920.0,
                    processes=1,
                    source="device",
                )
                for i in range(n)
            ],
            host=[
                HostSampleIn(
                    sample_uid=f"{uid}h", at=now, job_id=42, cpu_pct=150.0, cpus_allocated=4
                )
            ],
        )
    )

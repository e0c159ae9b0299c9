"""End-of-job summaries: built from the samples, stored, and AdminComment-encoded."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from slurmgpu.daemon.summary import (
    Summarizer,
    build_summary,
    decode_admin_comment,
    encode_admin_comment,
)
from slurmgpu.intent import SetAdminComment
from slurmgpu.model import GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch
from tests.fakes import FakeSlurm


def _job() -> Job:
    start = datetime(2026, 12, 1, 10, tzinfo=UTC)
    return Job(
        job_id=5,
        name="train",
        user="alice",
        state=JobState.COMPLETED,
        cpus=4,
        start_time=start,
        end_time=start + timedelta(hours=1),
        time_limit=timedelta(hours=4),
        gpus=GpuRequest(gpus=2, per_node=2),
        nodes=("gpu1",),
        gpu_allocations=(NodeGpuAllocation("gpu1", (0, 1)),),
    )


def _usage(tmp_path: Path) -> UsageStore:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    usage = UsageStore(store.engine)
    t0 = time.time() - 100
    gpu = [
        GpuSampleIn(
            sample_uid=f"g{i}{g}",
            at=t0 + i,
            gpu_index=g,
            job_id=5,
            util_pct=90.0 if g == 0 else 0.0,
            memory_used_mib=4096.0 if g == 0 else 0.0,
            memory_total_mib=81920.0,
            processes=1 if g == 0 else 0,
            source="device" if g == 0 else "idle",
        )
        for i in range(10)
        for g in (0, 1)
    ]
    host = [
        HostSampleIn(
            sample_uid=f"h{i}", at=t0 + i, job_id=5, cpu_pct=100.0, cpus_allocated=4, rss_mib=512.0
        )
        for i in range(10)
    ]
    usage.ingest(SampleBatch(node="gpu1", gpu=gpu, host=host))
    return usage


def test_summary_has_per_node_and_per_gpu_figures(tmp_path: Path) -> None:
    summary = build_summary(_job(), _usage(tmp_path))
    assert summary["elapsed_s"] == 3600
    node = summary["nodes"]["gpu1"]
    assert node["host"]["cpu_efficiency_pct"] == 25.0
    assert node["host"]["memory_max_mib"] == 512.0
    assert node["gpus"]["0"]["util_pct_mean"] == 90.0
    assert node["gpus"]["0"]["memory_max_mib"] == 4096.0
    assert node["gpus"]["1"]["never_busy"] is True


def test_summarizer_stores_the_summary_and_writes_admin_comment(tmp_path: Path) -> None:
    usage = _usage(tmp_path)
    slurm = FakeSlurm([_job()])
    Summarizer(usage, slurm, admin_comment=True).job_ended(_job(), datetime.now(UTC))
    stored = usage.summary(5)
    assert stored is not None
    assert stored["nodes"]["gpu1"]["gpus"]["0"]["util_pct_mean"] == 90.0
    assert slurm.updates == [(5, (SetAdminComment(encode_admin_comment(stored)),))]
    assert slurm.jobs()[0].admin_comment == encode_admin_comment(stored)


def test_admin_comment_round_trips_and_foreign_comments_are_ignored() -> None:
    summary = {"version": 1, "job_id": 3, "nodes": {}}
    text = encode_admin_comment(summary)
    assert text.startswith("SGPU1:")
    assert decode_admin_comment(text) == summary
    assert decode_admin_comment("JS1:abc") is None
    assert decode_admin_comment("SGPU1:not-base64!!") is None

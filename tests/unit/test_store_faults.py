"""The running daemon's pieces when its SQLite database turns read-only or fills up.

The database is a real SQLite file on a real ext4 file system (a 32 MiB loop image,
``errors=remount-ro``). Read-only mid-run is what production sees when the disk has an
error: the kernel remounts the file system read-only under the open database
(``/sys/fs/ext4/<dev>/trigger_fs_error`` does exactly that; ``mount -o remount,ro``
is refused while a writer is open). Disk full is the file system filled by another file.

The daemon's observe loop, policy cycle (built as ``sgpu daemon`` builds it, enforce
mode), ingest store and lease run in-process against the in-memory Slurm fake. Each
fault must give: no exception out of the loop, failed cycles that keep the previous
state, one WARNING line for the whole outage, no Slurm action, no partial write (after
the fault the database holds exactly what the last good cycle stored, checked with
``integrity_check`` and a dump of every table), and recovery: by itself once space is
freed; after an fsck and a remount (an operator's job for a failing disk) for read-only.

Needs root and loop devices (mount, losetup); skipped with the reason otherwise.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from slurmgpu.config import Settings
from slurmgpu.daemon.lease import DaemonLease, LeaseError
from slurmgpu.daemon.loop import DaemonLoop
from slurmgpu.daemon.observer import CycleResult, Observer
from slurmgpu.daemon.policy_cycle import build_policy_cycle
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.policy.base import Mode
from slurmgpu.store import JobStore, open_store, schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, SampleBatch
from tests.fakes import FakeSlurm
from tests.unit.store_damage import Ext4, ext4_unavailable

pytestmark = pytest.mark.skipif(ext4_unavailable() is not None, reason=ext4_unavailable() or "")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Ext4]:
    fs = Ext4(tmp_path)
    try:
        yield fs
    finally:
        fs.close()


T0 = datetime(2026, 1, 5, 8, tzinfo=UTC)


def gpu_job(job_id: int, state: JobState = JobState.RUNNING) -> Job:
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=state,
        requeue=True,
        submit_time=T0 - timedelta(hours=4),
        start_time=T0 - timedelta(hours=4) if state is JobState.RUNNING else None,
        time_limit=timedelta(hours=12),
        cpus=4,
        node_count=1,
        nodes=("gpu1",) if state is JobState.RUNNING else (),
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
        gpu_allocations=(
            (NodeGpuAllocation("gpu1", (job_id % 4,)),) if state is JobState.RUNNING else ()
        ),
    )


NODES = [Node("gpu1", "mixed", cpus=32, memory_mib=128000, gpus=4, partitions=("gpu",))]


class Daemon:
    """``sgpu daemon``'s loop in-process: observe, then policies on each good cycle."""

    def __init__(self, url: str, slurm: FakeSlurm, clock: list[datetime]) -> None:
        settings = Settings().with_database(url)
        settings = replace(
            settings,
            policy=replace(
                settings.policy,
                idle_gpu=replace(settings.policy.idle_gpu, mode=Mode.ENFORCE),
                rightsize=replace(settings.policy.rightsize, mode=Mode.ENFORCE),
            ),
        )
        self.store: JobStore = open_store(url)
        self.usage = UsageStore(self.store.engine)
        self.lease = DaemonLease(self.store.engine, ttl=timedelta(seconds=60))
        self.lease.acquire()
        self.observer = Observer(slurm, self.store, clock=lambda: clock[0])
        self.policies = build_policy_cycle(settings, self.store, slurm)
        self.loop = DaemonLoop(
            self.observer,
            interval=timedelta(seconds=30),
            max_backoff=timedelta(minutes=5),
            on_cycle=self.on_cycle,
        )

    def on_cycle(self, result: CycleResult) -> None:
        if result.snapshot is not None and self.lease.valid():
            self.policies.run(result.snapshot, result.at)

    def close(self) -> None:
        self.store.engine.dispose()


def idle_samples(job: Job, start: datetime, minutes: int) -> SampleBatch:
    gpu = [
        GpuSampleIn(
            sample_uid=f"{job.job_id}-{uuid.uuid4().hex}",
            at=(start + timedelta(minutes=m)).timestamp(),
            gpu_index=job.gpu_allocations[0].gpu_indices[0],
            job_id=job.job_id,
            util_pct=0.0,
            memory_used_mib=100.0,
            processes=1,
            source="device",
        )
        for m in range(minutes)
    ]
    return SampleBatch(node="gpu1", gpu=gpu)


def dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, sorted (the lease row's heartbeat left out)."""
    store = open_store(url, migrate=False)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
            out = {}
            for table in schema.metadata.sorted_tables:
                rows = [tuple(r) for r in conn.execute(select(table))]
                if table.name == "meta":
                    rows = [r for r in rows if r[0] != "daemon_lease"]
                out[table.name] = sorted(rows, key=repr)
            return out
    finally:
        store.engine.dispose()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _good_start(disk: Ext4) -> tuple[str, FakeSlurm, list[datetime], Daemon, Job]:
    url = f"sqlite:///{disk.mnt / 'state.db'}"
    job = gpu_job(1)
    slurm = FakeSlurm([job, gpu_job(2, JobState.PENDING)], NODES)
    clock = [T0]
    d = Daemon(url, slurm, clock)
    d.usage.ingest(idle_samples(job, T0 - timedelta(minutes=30), 30))
    for _ in range(2):
        assert d.loop.run_once().ok
        clock[0] += timedelta(seconds=30)
    return url, slurm, clock, d, job


def _outage(
    d: Daemon, slurm: FakeSlurm, clock: list[datetime], job: Job, cycles: int = 6
) -> list[CycleResult]:
    """Cycles while the database refuses writes; Slurm's listing keeps changing."""
    results = []
    for i in range(cycles):
        slurm.set_jobs([job, gpu_job(2), gpu_job(10 + i, JobState.PENDING)])
        results.append(d.loop.run_once())  # must not raise
        with pytest.raises(StoreError):
            d.usage.ingest(idle_samples(job, clock[0], 2))
        clock[0] += timedelta(hours=1)  # far past every idle threshold: policies would act
    return results


def test_database_turned_read_only_under_the_running_daemon(
    disk: Ext4, caplog: pytest.LogCaptureFixture
) -> None:
    url, slurm, clock, d, job = _good_start(disk)
    d.store.engine.dispose()  # the WAL checkpointed: the dump below reads the same file
    before = dump(url)
    assert before["jobs"], "the good cycles stored nothing"
    caplog.set_level(logging.INFO)
    caplog.clear()

    disk.fail()
    results = _outage(d, slurm, clock, job)
    assert not any(r.ok for r in results)
    assert d.loop.failures == len(results)
    with pytest.raises(LeaseError) as lease_error:
        d.lease.renew()
    assert "\n" not in str(lease_error.value)
    warnings = [w for w in _warnings(caplog) if "keeping previous state" in w]
    assert len(warnings) == 1, _warnings(caplog)
    assert "Traceback" not in caplog.text
    assert set(slurm.calls) <= {"jobs", "nodes", "finished_jobs"}, slurm.calls
    assert not slurm.updates

    d.close()
    disk.repair()
    assert dump(url) == before  # nothing of the failed cycles, nothing half-written

    # The daemon is restarted on the repaired disk (in-process: the old lease is let go,
    # as the stopped daemon's would be taken over) and carries on.
    d.lease.release()
    d2 = Daemon(url, slurm, clock)
    assert d2.loop.run_once().ok
    assert {10 + i for i in range(6)} & set(d2.observer.store.active_jobs())
    d2.close()


def test_database_disk_full_under_the_running_daemon_recovers_by_itself(
    disk: Ext4, caplog: pytest.LogCaptureFixture
) -> None:
    url, slurm, clock, d, job = _good_start(disk)
    caplog.set_level(logging.INFO)
    caplog.clear()

    filler = disk.mnt / "filler"
    with filler.open("wb") as f:  # every free block, as a runaway log would take them
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    # Small writes may still fit in the last partial blocks: fill those too.
    with (disk.mnt / "filler2").open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass
    results = _outage(d, slurm, clock, job)
    assert not any(r.ok for r in results)
    warnings = [w for w in _warnings(caplog) if "keeping previous state" in w]
    assert len(warnings) == 1, _warnings(caplog)
    assert set(slurm.calls) <= {"jobs", "nodes", "finished_jobs"}, slurm.calls

    filler.unlink()
    (disk.mnt / "filler2").unlink()
    slurm.set_jobs([job, gpu_job(2), gpu_job(42, JobState.PENDING)])
    assert d.loop.run_once().ok  # no restart, no operator
    assert "observe cycles stored again after 6 failed cycle(s)" in caplog.messages
    assert 42 in d.store.active_jobs()
    d.usage.ingest(idle_samples(job, clock[0], 2))
    d.close()
    assert dump(url)["jobs"]

"""What a node may report: its own jobs, its own GPUs, ids in its own namespace.

Also: samples from a node whose clock is behind are stored and reported, those from one
ahead refused and reported; an agent's spool drops are a warning and a metric; MUNGE is
re-checked while the daemon runs. All against a real SQLite store and the daemon's real
placement lookup. Held samples of jobs not seen yet: tests/unit/test_ingest_hold.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurmgpu.daemon.munge_watch import MungeWatch
from slurmgpu.daemon.placement import SnapshotPlacement
from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.sample_ingest import node_scoped_uid
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch

NOW = time.time()
T0 = datetime.fromtimestamp(NOW, UTC)


def _job(job_id: int, node: str, state: JobState = JobState.RUNNING) -> Job:
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=state,
        start_time=T0 - timedelta(hours=1),
        end_time=T0 if state.is_terminal else None,
        cpus=4,
        node_count=1,
        nodes=(node,),
        gpus=GpuRequest(gpus=1),
        gpu_allocations=(NodeGpuAllocation(node, (0,)),),
    )


NODES = (Node("gpu1", "mixed", gpus=4), Node("gpu2", "mixed", gpus=4))


class World:
    def __init__(self, tmp: Path) -> None:
        self.store: JobStore = open_store(f"sqlite:///{tmp / 's.db'}")
        self.snapshot: ClusterSnapshot | None = None
        self.usage = UsageStore(
            self.store.engine,
            placement=SnapshotPlacement(lambda: self.snapshot, self.store.engine),
            clock=lambda: NOW,
        )

    def observe(self, jobs: list[Job], stored: list[Job] | None = None) -> None:
        self.store.apply_cycle(diff_jobs({}, stored or jobs), {}, [], T0)
        self.snapshot = ClusterSnapshot(taken_at=T0, jobs=tuple(jobs), nodes=NODES)

    def gpu(self, node: str, uid: str, job: int | None, index: int = 0, at: float = NOW) -> int:
        sample = GpuSampleIn(sample_uid=uid, at=at, gpu_index=index, job_id=job, util_pct=50.0)
        return self.usage.ingest(SampleBatch(node=node, gpu=[sample]))[0]

    def host(self, node: str, uid: str, job: int) -> int:
        sample = HostSampleIn(sample_uid=uid, at=NOW, job_id=job, cpu_pct=100.0)
        return self.usage.ingest(SampleBatch(node=node, host=[sample]))[0]


def test_a_node_cannot_report_for_another_nodes_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = World(tmp_path)
    w.observe([_job(5, "gpu1")])
    with caplog.at_level(logging.WARNING, logger="slurmgpu.store"):
        assert w.gpu("gpu2", "gpu2:r:1:0:5", 5) == 0
        assert w.host("gpu2", "gpu2:r:1:h:5", 5) == 0
    assert w.usage.refused["job not on node"] == 2
    assert "node gpu2: 1 sample(s) refused: job not on node (jobs [5])" in caplog.text
    assert w.gpu("gpu1", "gpu1:r:1:0:5", 5) == 1
    assert [u.samples for u in w.usage.gpu_usage(5)] == [1]


def test_a_gpu_the_node_does_not_have_is_refused(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.observe([_job(5, "gpu1")])
    assert w.gpu("gpu1", "gpu1:r:1:7:5", 5, index=7) == 0
    assert w.gpu("gpu1", "gpu1:r:1:4:-", None, index=4) == 0
    assert w.usage.refused["no such GPU"] == 2
    assert w.gpu("gpu1", "gpu1:r:1:3:-", None, index=3) == 1


def test_a_job_the_daemon_has_not_seen_yet_is_held_not_counted(tmp_path: Path) -> None:
    # It started since the daemon's last good cycle (Slurm or the store away), or its id
    # is not given out yet: the batch is acknowledged and the samples held, counted by no
    # reader until Slurm lists the job (test_ingest_hold.py).
    w = World(tmp_path)
    w.observe([_job(5, "gpu1")])
    assert w.gpu("gpu1", "gpu1:r:1:0:999", 999) == 1
    assert not w.usage.refused and w.usage.gpu_usage(999) == []
    assert w.usage.unverified["gpu1"] == 1
    w.snapshot = None  # the daemon has no snapshot at all
    assert w.gpu("gpu1", "gpu1:r:2:0:998", 998) == 1
    assert w.usage.gpu_usage(998) == [] and w.usage.count_samples() == 0
    assert w.gpu("gpu2", "gpu2:r:1:0:5", 5) == 0  # a job positively elsewhere still is not


def test_a_job_pending_in_a_stale_snapshot_is_held_not_refused(tmp_path: Path) -> None:
    # The snapshot (and the store) still show the job pending, without nodes: Slurm or
    # the store is away and the job has started since. Its samples are held.
    w = World(tmp_path)
    pending = replace(_job(7, "gpu1", JobState.PENDING), nodes=(), gpu_allocations=())
    w.observe([pending])
    assert w.gpu("gpu1", "gpu1:r:1:0:7", 7) == 1
    w.snapshot = ClusterSnapshot(taken_at=T0, jobs=(), nodes=NODES)  # left the listing
    assert w.gpu("gpu1", "gpu1:r:2:0:7", 7) == 1
    assert not w.usage.refused and w.usage.unverified["gpu1"] == 2
    w.observe([_job(7, "gpu1")])  # once placed, another node is refused again
    assert w.gpu("gpu2", "gpu2:r:1:0:7", 7) == 0
    assert w.gpu("gpu1", "gpu1:r:3:0:7", 7) == 1
    assert [u.samples for u in w.usage.gpu_usage(7)] == [1]  # the held two wait for release


def test_samples_of_a_job_that_has_left_the_listing_still_count(tmp_path: Path) -> None:
    # An agent's spool empties after an outage: the job ended and left squeue meanwhile.
    w = World(tmp_path)
    w.observe([], stored=[_job(6, "gpu2", JobState.COMPLETED)])
    assert w.gpu("gpu2", "gpu2:r:9:0:6", 6, at=NOW - 3600) == 1
    assert w.gpu("gpu1", "gpu1:r:9:0:6", 6) == 0


def test_a_node_cannot_take_another_nodes_sample_id(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.observe([_job(5, "gpu1")])
    squatted = "gpu1:r:1:1:-"
    assert w.gpu("gpu2", squatted, None, index=1) == 1  # kept, in gpu2's namespace
    assert w.gpu("gpu1", squatted, None, index=1) == 1  # gpu1's own sample is not a duplicate
    assert w.gpu("gpu1", squatted, None, index=1) == 0  # a resend still is
    assert node_scoped_uid("gpu1", squatted) == squatted
    assert len(node_scoped_uid("n" * 128, "x" * 128)) <= 128


def test_samples_from_a_clock_ahead_are_refused_counted_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = World(tmp_path)
    w.observe([_job(5, "gpu1")])
    with caplog.at_level(logging.WARNING, logger="slurmgpu.store"):
        assert w.gpu("gpu1", "gpu1:r:2:0:5", 5, at=NOW + 900) == 0
    assert w.usage.skewed["gpu1"] == 1 and w.usage.refused["stamped in the future"] == 1
    assert "node gpu1: 1 sample(s) stamped up to +900s ahead" in caplog.text
    assert w.gpu("gpu1", "gpu1:r:3:0:5", 5, at=NOW - 900) == 1  # late: a spool emptied
    assert w.usage.skewed["gpu1"] == 2


def test_spool_drops_are_a_warning_and_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = World(tmp_path)
    w.observe([])
    with caplog.at_level(logging.WARNING, logger="slurmgpu.store"):
        w.usage.ingest(SampleBatch(node="gpu1", dropped=40))
        w.usage.ingest(SampleBatch(node="gpu1", dropped=40))
        w.usage.ingest(SampleBatch(node="gpu1", dropped=55))
    assert w.usage.spool_dropped["gpu1"] == 55
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    # One line for the fault; the rise to 55 is the same fault (no fresh batch between).
    assert len(said) == 1 and "dropped 40 sample(s)" in said[0]


def test_a_full_spool_drained_after_an_outage_is_one_line_and_one_when_it_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36 item 6: after space returned to a full database disk, the drain of a
    full spool logged one WARNING per batch (each carries a higher drop count), which
    refilled the disk just freed. Now: one line when the drops start, one when they stop.
    """
    w = World(tmp_path)
    w.observe([_job(5, "gpu1")])

    def batch(i: int, dropped: int, at: float) -> SampleBatch:
        sample = GpuSampleIn(sample_uid=f"gpu1:r:{i}:0:5", at=at, gpu_index=0, job_id=5)
        return SampleBatch(node="gpu1", gpu=[sample], dropped=dropped)

    with caplog.at_level(logging.DEBUG, logger="slurmgpu.store"):
        caplog.clear()
        for i in range(300):  # the spool's batches, oldest first, each after one more drop
            w.usage.ingest(batch(i, 40 + i, NOW - 7200 + 10 * i))
        w.usage.ingest(batch(300, 339, NOW))  # a fresh batch: the spool is drained
        w.usage.ingest(batch(301, 339, NOW))
        w.usage.ingest(batch(302, 350, NOW))  # a later outage: a new fault
    lines = [r for r in caplog.records if "dropp" in r.getMessage()]
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in lines if r.levelno == logging.INFO]
    assert len(warnings) == 2, warnings
    assert "dropped 40 sample(s)" in warnings[0] and "dropped 350" in warnings[1]
    assert infos == [
        "node gpu1: its agent stopped dropping samples (339 so far, +339 in this outage)"
    ]
    assert w.usage.spool_dropped["gpu1"] == 350


def test_munge_going_and_coming_back_is_said_once_each_and_reaches_the_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = iter([True, False, False, True, True])
    seen: list[bool] = []
    watch = MungeWatch(up=True, on_change=seen.append, check=lambda: next(answers))
    with caplog.at_level(logging.WARNING, logger="slurmgpu.daemon"):
        states = [watch.poll() for _ in range(5)]
    assert states == [True, False, False, True, True]
    assert seen == [False, True] and watch.changes == 2
    assert "MUNGE is not available" in caplog.text and "MUNGE is available again" in caplog.text
    assert len(caplog.records) == 2


def test_the_counts_reach_metrics(tmp_path: Path) -> None:
    from slurmgpu.daemon.metrics import DaemonMetrics

    w = World(tmp_path)
    w.observe([_job(5, "gpu1")])
    w.gpu("gpu2", "gpu2:r:1:0:5", 5)
    w.gpu("gpu1", "gpu1:r:2:0:5", 5, at=NOW + 900)
    # three samples (two GPUs, one host) of a job the daemon has not seen, one batch
    unseen = [
        GpuSampleIn(sample_uid=f"gpu1:r:3:{i}:77", at=NOW, gpu_index=i, job_id=77, util_pct=9.0)
        for i in (0, 1)
    ]
    host = [HostSampleIn(sample_uid="gpu1:r:3:h:77", at=NOW, job_id=77, cpu_pct=50.0)]
    assert w.usage.ingest(SampleBatch(node="gpu1", gpu=unseen, host=host))[0] == 3
    metrics = DaemonMetrics(w.store.engine)
    metrics.watch_usage(w.usage)  # as the daemon does (daemon/app.py)
    metrics.watch("sgpu_munge_up", "h", lambda: 0.0, kind="gauge")
    text = metrics.exposition().decode()
    assert 'sgpu_samples_refused_total{reason="job not on node"} 1.0' in text
    assert 'sgpu_samples_skewed_total{node="gpu1"} 1.0' in text
    assert 'sgpu_samples_refused_total{reason="stamped in the future"} 1.0' in text
    assert 'sgpu_ingest_samples_unverified_total{node="gpu1"} 3.0' in text
    assert "sgpu_munge_up 0.0" in text

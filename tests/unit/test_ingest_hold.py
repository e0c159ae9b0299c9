"""Samples of jobs the daemon has not seen are held, then kept or dropped (issue 36, item 5).

The finding: a node's token posted 1,200 idle samples for the next job id; that job then
ran 40 s on another node, and ``sgpu eff`` listed both nodes and 69.95 Wh, 95 % idle.
Here the same, against the real store (SQLite and PostgreSQL), the daemon's observer,
placement lookup, hold release and summaries, and ``sgpu eff --json`` itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import func, inspect, select

from slurmgpu.cli.context import AppContext
from slurmgpu.cli.eff import eff as eff_command
from slurmgpu.daemon.hold_release import HoldRelease
from slurmgpu.daemon.metrics import DaemonMetrics
from slurmgpu.daemon.observer import CycleResult, Observer
from slurmgpu.daemon.placement import SnapshotPlacement
from slurmgpu.daemon.summary import Summarizer
from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.store import JobStore, create_store_engine, open_store, schema, upgrade
from slurmgpu.store.database import StoreError, alembic_config, current_revision
from slurmgpu.store.sample_hold import SampleHold
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch
from tests.fakes import FakeSlurm

NOW = float(int(time.time()))
NODES = (Node("gpu1", "mixed", gpus=4), Node("gpu2", "mixed", gpus=4))
T_START = NOW - 200  # the job of the finding starts here and runs 40 s


def _job(
    job_id: int,
    node: str = "gpu1",
    state: JobState = JobState.COMPLETED,
    *,
    start: float = T_START,
    seconds: float = 40,
    gpus: tuple[int, ...] = (0,),
) -> Job:
    placed = state is not JobState.PENDING
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        account="ml",
        partition="gpu",
        state=state,
        submit_time=datetime.fromtimestamp(start - 5, UTC),
        start_time=datetime.fromtimestamp(start, UTC) if placed else None,
        end_time=datetime.fromtimestamp(start + seconds, UTC) if state.is_terminal else None,
        time_limit=timedelta(hours=1),
        cpus=4,
        node_count=1,
        nodes=(node,) if placed else (),
        gpus=GpuRequest(gpus=len(gpus)),
        gpu_allocations=(NodeGpuAllocation(node, gpus),) if placed else (),
    )


def _gpu(
    node: str, job: int, at: float, *, uid: str, util: float, power: float, index: int = 0
) -> GpuSampleIn:
    return GpuSampleIn(
        sample_uid=f"{node}:{uid}",
        at=at,
        gpu_index=index,
        job_id=job,
        util_pct=util,
        memory_used_mib=2000.0 if util else 0.0,
        memory_total_mib=81559.0,
        power_w=power,
        processes=1 if util else 0,
        source="process" if util else "idle",
    )


def _real_run(job: int = 1001) -> SampleBatch:
    """What gpu1's agent sends for the job's 40 s on GPU 0: busy, 300 W, every 10 s."""
    gpu = [
        _gpu("gpu1", job, T_START + t, uid=f"r:{t}:0:{job}", util=90.0, power=300.0)
        for t in range(0, 41, 10)
    ]
    host = [
        HostSampleIn(
            sample_uid=f"gpu1:r:{t}:h:{job}",
            at=T_START + t,
            job_id=job,
            cpu_pct=380.0,
            cpus_allocated=4,
            rss_mib=1024.0,
        )
        for t in range(0, 41, 10)
    ]
    return SampleBatch(node="gpu1", gpu=gpu, host=host)


def _forged(job: int = 1001, n: int = 1200) -> SampleBatch:
    """gpu2's 1,200 idle samples for the job id before it was given out: 1 s apart, up
    to the job's end, at 100 W."""
    return SampleBatch(
        node="gpu2",
        gpu=[
            _gpu("gpu2", job, T_START + 40 - n + i, uid=f"x:{i}:0:{job}", util=0.0, power=100.0)
            for i in range(n)
        ],
    )


class Daemon:
    """The daemon's ingest and cycle, in-process: observe, release held samples, then
    summarise the jobs that ended (daemon/app.py's order)."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.store: JobStore = open_store(url)
        self.slurm = FakeSlurm([], NODES)
        self.clock = [datetime.fromtimestamp(NOW, UTC)]
        self.observer = Observer(self.slurm, self.store, clock=lambda: self.clock[0])
        self.usage = UsageStore(self.store.engine, clock=lambda: NOW)
        self.placement = SnapshotPlacement(lambda: self.observer.latest, self.store.engine)
        self.usage.placement = self.placement
        self.summarizer = Summarizer(self.usage)
        self.release = HoldRelease(self.usage, self.placement, self.store, self.summarizer)
        self.tmp = tmp_path

    def cycle(self, jobs: list[Job]) -> CycleResult:
        self.slurm.set_jobs(jobs)
        result = self.observer.cycle()
        assert result.ok, result.error
        self.release.after_cycle(result)
        assert result.snapshot is not None
        for job in result.snapshot.jobs:
            if job.job_id in result.ended:
                self.summarizer.job_ended(job, result.at)
        self.clock[0] += timedelta(seconds=30)
        return result

    def eff(self, job_id: int) -> dict[str, Any]:
        config = self.tmp / "config.toml"
        config.write_text("")
        app = AppContext(config_path=config, db_override=self.url)
        result = CliRunner().invoke(eff_command, [str(job_id), "--json"], obj=app)
        assert result.exit_code == 0, result.output
        data: dict[str, Any] = json.loads(result.output)
        return data

    def held(self) -> int:
        with self.store.engine.connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(schema.held_samples)).scalar() or 0
            )

    def close(self) -> None:
        self.store.engine.dispose()


@pytest.fixture
def daemon(store_url: str, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(store_url, tmp_path)
    yield d
    d.close()


def _eff_figures(data: dict[str, Any]) -> dict[str, Any]:
    return {k: data[k] for k in ("nodes", "gpu", "gpus", "cpu", "energy", "silent_nodes")}


def test_samples_forged_for_the_next_job_id_are_dropped_when_it_runs_elsewhere(
    daemon: Daemon, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = daemon
    d.cycle([_job(1000, state=JobState.RUNNING, start=NOW - 3600)])  # 1001 not given out
    assert d.usage.ingest_batch(_forged()).held == 1200
    assert d.usage.gpu_usage(1001) == [] and d.usage.gpu_energy(1001) == []
    d.cycle([_job(1000, state=JobState.RUNNING, start=NOW - 3600)])
    assert d.held() == 1200  # 1001 still not in Slurm's listing: held, counted nowhere
    # The job runs 40 s on gpu1 and ends between two cycles: its own samples are held too.
    assert d.usage.ingest_batch(_real_run()).held == 10
    with caplog.at_level(logging.WARNING, logger="slurmgpu.store"):
        d.cycle([_job(1001)])
    assert d.held() == 0
    assert d.usage.hold.dropped["unverified_job"] == 1200
    said = [r.getMessage() for r in caplog.records if "held sample" in r.getMessage()]
    assert said == [
        "node gpu2: 1200 held sample(s) of job 1001 dropped once Slurm listed it "
        "(1200 job not on node)"
    ]

    data = d.eff(1001)
    assert [n["node"] for n in data["nodes"]] == ["gpu1"]
    assert [(g["node"], g["index"]) for g in data["gpus"]] == [("gpu1", 0)]
    assert data["energy"]["idle_energy_j"] == 0.0
    # Exactly what a store that only ever had gpu1's samples says (no hold involved).
    clean = open_store(f"sqlite:///{tmp_path / 'clean.db'}")
    clean.apply_cycle(diff_jobs({}, [_job(1001)]), {}, [], d.clock[0])
    UsageStore(clean.engine, clock=lambda: NOW).ingest(_real_run())
    config = tmp_path / "clean.toml"
    config.write_text("")
    app = AppContext(config_path=config, db_override=f"sqlite:///{tmp_path / 'clean.db'}")
    result = CliRunner().invoke(eff_command, ["1001", "--json"], obj=app)
    assert _eff_figures(data) == _eff_figures(json.loads(result.output))
    # The summary written when the job ended has only gpu1, and the right energy.
    summary = d.usage.summary(1001)
    assert summary is not None and list(summary["nodes"]) == ["gpu1"]
    assert summary["energy"]["energy_j"] == pytest.approx(data["energy"]["energy_j"])

    metrics = DaemonMetrics(d.store.engine)
    metrics.watch_usage(d.usage)
    text = metrics.exposition().decode()
    assert 'sgpu_samples_dropped_total{reason="unverified_job"} 1200.0' in text
    assert 'sgpu_samples_dropped_total{reason="hold_expired"} 0.0' in text
    assert 'sgpu_ingest_samples_unverified_total{node="gpu2"} 1200.0' in text
    assert "sgpu_samples_held 0.0" in text


def test_held_samples_of_a_job_that_runs_there_are_kept_and_counted_by_eff(
    daemon: Daemon,
) -> None:
    d = daemon
    d.cycle([])
    run = _real_run(1002)
    out = d.usage.ingest_batch(run)
    assert (out.accepted, out.held, out.refused) == (10, 10, 0)
    assert d.usage.ingest_batch(run).duplicates == 10  # a resend is a duplicate, held or not
    d.cycle([_job(1002, state=JobState.RUNNING)])
    assert d.held() == 0 and not d.usage.hold.dropped["unverified_job"]
    (g,) = d.usage.gpu_usage(1002)
    assert (g.node, g.gpu_index, g.samples, g.mean_util_pct) == ("gpu1", 0, 5, 90.0)
    data = d.eff(1002)
    assert data["source"] == "samples" and data["gpu"]["util_pct"] == pytest.approx(90.0)
    assert d.usage.ingest_batch(run).duplicates == 10  # and after the release too


class _NotSeenYet:
    """The placement as the API thread read it before the cycle listing the job was stored."""

    def job_runs(self, job_id: int) -> None:
        return None

    def node_gpus(self, node: str) -> int:
        return 4


def test_a_summary_written_before_held_samples_were_released_is_written_again(
    daemon: Daemon,
) -> None:
    # The samples reach the hold while the cycle that lists the job as ended is being
    # stored: that cycle's summary has no usage; the next cycle releases them and writes
    # the summary again, which is the one reports read.
    d = daemon
    d.cycle([_job(1003)])
    first = d.usage.summary(1003)
    assert first is not None and first["nodes"] == {}
    d.usage.placement = _NotSeenYet()
    assert d.usage.ingest_batch(_real_run(1003)).held == 10
    d.usage.placement = d.placement
    d.cycle([_job(1003)])
    summary = d.usage.summary(1003)
    assert summary is not None and list(summary["nodes"]) == ["gpu1"]
    assert summary["nodes"]["gpu1"]["gpus"]["0"]["util_pct_mean"] == pytest.approx(90.0)
    assert d.eff(1003)["source"] == "samples"


def test_held_samples_of_a_job_cancelled_before_it_ran_are_dropped(daemon: Daemon) -> None:
    d = daemon
    d.cycle([])
    d.usage.ingest_batch(_forged(1004, n=30))
    cancelled = replace(_job(1004, state=JobState.PENDING), state=JobState.CANCELLED)
    d.cycle([cancelled])
    assert d.held() == 0 and d.usage.hold.dropped["unverified_job"] == 30
    assert d.usage.gpu_usage(1004) == []


def test_a_job_pending_in_a_stale_snapshot_is_held_then_released_once_placed(
    daemon: Daemon,
) -> None:
    d = daemon
    d.cycle([_job(1005, state=JobState.PENDING)])
    assert d.usage.ingest_batch(_real_run(1005)).held == 10
    d.cycle([_job(1005, state=JobState.PENDING)])
    assert d.held() == 10
    d.cycle([_job(1005, state=JobState.RUNNING)])
    assert d.held() == 0 and [g.samples for g in d.usage.gpu_usage(1005)] == [5]


def test_a_far_future_sample_is_refused_and_the_rest_of_the_batch_stored(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    d = daemon
    d.cycle([_job(1006, state=JobState.RUNNING)])
    run = _real_run(1006)
    ahead = [
        _gpu("gpu1", 1006, NOW + 301, uid="r:f:0:1006", util=50.0, power=200.0),
        _gpu("gpu1", 1006, 3_993_000_000.0, uid="r:2096:0:1006", util=0.0, power=100.0),
    ]
    batch = SampleBatch(node="gpu1", gpu=[*run.gpu, *ahead], host=run.host)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.store"):
        out = d.usage.ingest_batch(batch)
    assert (out.accepted, out.duplicates, out.held, out.refused) == (10, 0, 0, 2)
    assert d.usage.refused["stamped in the future"] == 2 and d.usage.skewed["gpu1"] == 2
    assert "node gpu1: 2 sample(s) stamped up to +" in caplog.text
    (g,) = d.usage.gpu_usage(1006)
    assert g.samples == 5 and g.last_at == datetime.fromtimestamp(T_START + 40, UTC)
    # Within the bound a fast clock is still taken.
    near = _gpu("gpu1", 1006, NOW + 299, uid="r:n:0:1006", util=50.0, power=200.0)
    assert d.usage.ingest_batch(SampleBatch(node="gpu1", gpu=[near])).accepted == 1


def test_samples_of_known_jobs_are_checked_by_the_same_rule(daemon: Daemon) -> None:
    # Node, allocated GPU and run window, at ingest for a listed job exactly as for a
    # held one once listed.
    d = daemon
    d.cycle([_job(1007, state=JobState.RUNNING, gpus=(1,))])

    def one(node: str, index: int, at: float, uid: str) -> int:
        s = _gpu(node, 1007, at, uid=uid, util=50.0, power=200.0, index=index)
        return d.usage.ingest_batch(SampleBatch(node=node, gpu=[s])).refused

    assert one("gpu1", 1, T_START + 5, "a") == 0
    assert one("gpu1", 0, T_START + 5, "b") == 1  # not its GPU
    assert one("gpu2", 1, T_START + 5, "c") == 1  # not its node
    assert one("gpu1", 1, T_START - 3600, "d") == 1  # an hour before it started
    assert one("gpu1", 1, T_START - 30, "e") == 0  # within the clock allowance
    assert dict(d.usage.refused) == {
        "GPU not allocated to job": 1,
        "job not on node": 1,
        "outside the job's run": 1,
    }
    # The same four samples for a job held, then listed with the same run.
    for uid, (node, index, at) in {
        "f": ("gpu1", 1, T_START + 5),
        "g": ("gpu1", 0, T_START + 5),
        "h": ("gpu2", 1, T_START + 5),
        "i": ("gpu1", 1, T_START - 3600),
    }.items():
        s = _gpu(node, 1008, at, uid=uid, util=50.0, power=200.0, index=index)
        assert d.usage.ingest_batch(SampleBatch(node=node, gpu=[s])).held == 1
    d.cycle(
        [
            _job(1007, state=JobState.RUNNING, gpus=(1,)),
            _job(1008, state=JobState.RUNNING, gpus=(1,)),
        ]
    )
    assert d.usage.hold.dropped["unverified_job"] == 3
    assert [g.samples for g in d.usage.gpu_usage(1008)] == [1]


def test_a_requeued_job_keeps_its_first_runs_late_samples(daemon: Daemon) -> None:
    d = daemon
    again = replace(_job(1009, state=JobState.RUNNING, start=NOW - 60), restart_count=1)
    d.cycle([again])
    late = _gpu("gpu1", 1009, NOW - 3000, uid="r:old:0:1009", util=80.0, power=250.0)
    assert d.usage.ingest_batch(SampleBatch(node="gpu1", gpu=[late])).accepted == 1


def test_the_hold_is_bounded_per_node_and_by_age(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(store_url)
    clock = [NOW]
    usage = UsageStore(store.engine, clock=lambda: clock[0])
    usage.hold = SampleHold(
        store.engine, max_per_node=50, ttl=timedelta(hours=1), clock=usage.clock
    )
    snap = ClusterSnapshot(taken_at=datetime.fromtimestamp(NOW, UTC), jobs=(), nodes=NODES)
    placement = SnapshotPlacement(lambda: snap, store.engine)
    usage.placement = placement
    with caplog.at_level(logging.WARNING, logger="slurmgpu.store"):
        first = usage.ingest_batch(_forged(2000, n=40))
        second = usage.ingest_batch(_forged(2001, n=40))
    assert (first.held, first.refused) == (40, 0)
    assert (second.held, second.refused) == (10, 30)  # gpu2's hold is full at 50
    assert usage.hold.dropped["hold_full"] == 30
    assert usage.ingest_batch(_real_run(2002)).held == 10  # another node has its own room
    assert sum("dropped" in r.getMessage() for r in caplog.records) == 1
    # Nothing lists these jobs for longer than the age limit: dropped, counted, said once.
    clock[0] += 1800
    assert usage.hold.release(placement).dropped == 0
    clock[0] += 1801
    with caplog.at_level(logging.WARNING, logger="slurmgpu.store"):
        gone = usage.hold.release(placement)
    assert (gone.kept, gone.dropped) == (0, 60)
    assert usage.hold.dropped["hold_expired"] == 60 and usage.hold.held_now == 0
    assert "node gpu2: 50 held sample(s) dropped: their job(s) (ids 2000 to 2001)" in caplog.text
    assert usage.count_samples() == 0
    store.engine.dispose()


def test_migration_0010_goes_down_and_up_again_to_the_declared_schema(store_url: str) -> None:
    engine = create_store_engine(store_url)
    upgrade(engine)
    cfg = alembic_config(engine)
    command.downgrade(cfg, "0009")
    assert current_revision(engine) == "0009"
    assert "held_samples" not in inspect(engine).get_table_names()
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), schema.metadata) == []
    engine.dispose()


def test_a_failing_release_is_said_once_and_the_cycle_goes_on(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    d = daemon
    d.cycle([])
    assert d.usage.ingest_batch(_real_run(1010)).held == 10
    real = d.usage.hold.release
    failures = iter([StoreError("database is locked"), StoreError("database is locked")])

    def flaky(*args: Any, **kwargs: Any) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real(*args, **kwargs)

    monkeypatch.setattr(d.usage.hold, "release", flaky)
    with caplog.at_level(logging.DEBUG, logger="slurmgpu.daemon"):
        d.cycle([_job(1010)])
        d.cycle([_job(1010)])
        assert d.held() == 10
        d.cycle([_job(1010)])
    said = [r.getMessage() for r in caplog.records if "held samples" in r.getMessage()]
    assert said == [
        "held samples not checked this cycle: database is locked",
        "held samples are checked again",
        "held samples: 10 released to 1 job(s), 0 dropped",
    ]
    assert d.held() == 0
    summary = d.usage.summary(1010)  # written when it ended, again once released
    assert summary is not None and list(summary["nodes"]) == ["gpu1"]

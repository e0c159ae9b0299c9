"""The store on a real PostgreSQL server (the ``postgres_url`` fixture), against SQLite.

Migrations, exact job round trips with timezone-aware times, requeues, idempotent sample
ingest and the usage aggregates must behave on PostgreSQL exactly as on SQLite.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import HealthCheck, given, settings
from sqlalchemy import DateTime, inspect, text

from slurmgpu.daemon.observer import Observer
from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.store import JobStore, create_store_engine, open_store, upgrade
from slurmgpu.store.database import current_revision, head_revision
from slurmgpu.store.schema import metadata
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.usage_query import GpuUsage, HostUsage
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch
from tests.fakes import FakeSlurm
from tests.hypothesis_profiles import examples
from tests.unit.job_strategies import jobs as job_strategy

T0 = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
CEST = timezone(timedelta(hours=2))


@pytest.fixture
def pg_url(empty_postgres_url: str) -> str:
    return empty_postgres_url


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[JobStore]:
    store = open_store(pg_url)
    yield store
    store.engine.dispose()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> JobStore:
    return open_store(f"sqlite:///{tmp_path / 'state.db'}")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=30)
        return self.now


def _datetimes(job: Job) -> list[datetime]:
    return [v for f in fields(job) if isinstance(v := getattr(job, f.name), datetime)]


def _aware_utc(moment: datetime) -> bool:
    return moment.tzinfo is not None and moment.utcoffset() == timedelta(0)


# --------------------------------------------------------------------------- schema


def test_migrations_produce_exactly_the_declared_schema(pg_url: str) -> None:
    engine = create_store_engine(pg_url)
    assert engine.dialect.name == "postgresql"
    upgrade(engine)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    assert current_revision(engine) == head_revision()
    upgrade(engine)  # a no-op the second time
    columns = {c["name"]: c for c in inspect(engine).get_columns("jobs")}
    submit_type = columns["submit_time"]["type"]
    assert isinstance(submit_type, DateTime) and submit_type.timezone  # timestamptz
    assert set(inspect(engine).get_table_names()) == {*metadata.tables, "alembic_version"}
    engine.dispose()


# --------------------------------------------------------------------------- jobs


def _gpu_job(job_id: int, **kw: object) -> Job:
    base = Job(
        job_id=job_id,
        name=f"trän-{job_id} ✓",
        user="alice",
        state=JobState.PENDING,
        uid=1000,
        account="ml",
        partition="gpu",
        qos="normal",
        submit_time=T0,
        eligible_time=T0 + timedelta(microseconds=7),
        time_limit=timedelta(hours=2),
        cpus=8,
        memory_mib=64_000,
        node_count=2,
        tasks=2,
        gpus=GpuRequest(gpus=4, per_node=2, gpu_type="a100", sources=("tres_per_node",)),
        requeue=True,
        comment='it\'s 100% "quoted"',
        work_dir="/home/alice",
        command="/home/alice/train.sh",
        batch=True,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _running(job: Job, start: datetime) -> Job:
    return replace(
        job,
        state=JobState.RUNNING,
        start_time=start,
        end_time=start + timedelta(hours=2),
        nodes=("gpu1", "gpu2"),
        gpu_allocations=(
            NodeGpuAllocation("gpu1", (0, 1)),
            NodeGpuAllocation("gpu2", (2, 3), shard_indices=(3,), shards=4),
        ),
        exit_code=0,
    )


def test_observe_cycles_round_trip_jobs_exactly(pg_store: JobStore) -> None:
    array_task = _gpu_job(
        21, array_job_id=20, array_task_id=1, array_max_tasks=2, state_flags=frozenset()
    )
    held = _gpu_job(22, reason="JobHeldUser", gpus=GpuRequest(shards=4, sources=("tres_per_job",)))
    slurm = FakeSlurm(
        [_gpu_job(1), array_task, held],
        [Node("gpu1", "mixed", cpus=64, gpus=4, shards=16, gpu_type="a100", partitions=("gpu",))],
    )
    obs = Observer(slurm, pg_store, clock=Clock())
    assert obs.cycle().ok
    # a start time given in another zone is the same instant, read back in UTC
    started = _running(_gpu_job(1), datetime(2026, 12, 1, 14, 1, 2, 345678, tzinfo=CEST))
    slurm.set_jobs([started, array_task, held])
    assert obs.cycle().ok
    done = replace(
        started,
        state=JobState.FAILED,
        end_time=T0 + timedelta(minutes=5, microseconds=1),
        exit_code=3,
        reason="NonZeroExitCode",
    )
    slurm.set_jobs([done, array_task, held])
    assert obs.cycle().ok

    stored = {s.job.job_id: s for s in pg_store.jobs()}
    assert stored[1].job == done
    assert stored[1].job.start_time == datetime(2026, 12, 1, 12, 1, 2, 345678, tzinfo=UTC)
    assert stored[21].job == array_task
    assert stored[22].job == held
    for s in stored.values():
        for moment in (*_datetimes(s.job), s.first_seen, s.last_seen):
            assert _aware_utc(moment), (s.job.job_id, moment)
    kinds = [(e["kind"], e["from_state"], e["to_state"]) for e in pg_store.events(1)]
    assert kinds == [
        ("submitted", None, "PENDING"),
        ("state", "PENDING", "RUNNING"),
        ("state", "RUNNING", "FAILED"),
    ]
    assert all(_aware_utc(e["at"]) for e in pg_store.events(1))
    assert pg_store.known_nodes()["gpu1"].gpu_type == "a100"
    # a restarted daemon reloads exactly what it stored (gone IS false on PostgreSQL)
    again = Observer(slurm, pg_store, clock=Clock())
    assert again.cycle().changed == 0


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(job_strategy.filter(lambda j: "\x00" not in j.name + j.user + j.comment))
def test_any_job_survives_a_postgres_round_trip(pg_store: JobStore, job: Job) -> None:
    # one cluster label per example: rows of earlier examples are not reattached
    store = JobStore(pg_store.engine, cluster=uuid.uuid4().hex)
    store.apply_cycle(diff_jobs({}, [job]), {}, [], T0)
    (stored,) = store.jobs(job_ids=[job.job_id])
    assert stored.job == job


def test_requeue_is_an_event_of_the_same_row(pg_store: JobStore) -> None:
    slurm = FakeSlurm([_running(_gpu_job(7), T0 + timedelta(minutes=1))])
    obs = Observer(slurm, pg_store, clock=Clock())
    obs.cycle()
    slurm.requeue(7)
    result = obs.cycle()
    assert (result.new, result.transitions) == (0, 1)
    events = pg_store.events(7)
    assert [(e["kind"], e["from_state"], e["to_state"], e["restart_count"]) for e in events] == [
        ("submitted", None, "RUNNING", 0),
        ("requeue", "RUNNING", "PENDING", 1),
    ]
    (stored,) = pg_store.jobs(job_ids=[7])
    assert stored.job.restart_count == 1 and stored.job.start_time is None
    assert pg_store.count_jobs() == 1
    # it finishes, ages out, and a resubmission with the same id is a new row
    slurm.set_jobs([replace(stored.job, state=JobState.COMPLETED)])
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    slurm.set_jobs([_gpu_job(7, submit_time=T0 + timedelta(days=1))])
    obs.cycle()
    assert pg_store.count_jobs() == 2
    assert len(pg_store.jobs(job_ids=[7], include_gone=False)) == 1


def test_sacct_resolved_vanish_is_stored_on_postgres(pg_store: JobStore) -> None:
    job = _running(_gpu_job(9), T0)
    end = T0 + timedelta(minutes=9)
    acct = replace(job, state=JobState.TIMEOUT, end_time=end, exit_code=None, gpu_allocations=())
    slurm = FakeSlurm([job], accounting={9: acct})
    obs = Observer(slurm, pg_store, clock=Clock())
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    obs.cycle()
    (stored,) = pg_store.jobs(job_ids=[9])
    assert stored.gone
    assert stored.job == replace(job, state=JobState.TIMEOUT, end_time=end, exit_code=None)
    assert [e["kind"] for e in pg_store.events(9)] == ["submitted", "state", "gone"]


# --------------------------------------------------------------------------- samples


def _batch(
    node: str, uids: range, *, job_id: int = 42, t0: float = 1_796_000_000.25
) -> SampleBatch:
    gpu = [
        GpuSampleIn(
            sample_uid=f"{node}-{job_id}-g{i}",
            at=t0 + 10 * i,
            gpu_index=i % 2,
            job_id=job_id,
            util_pct=0.0 if i % 5 == 0 else 40.0 + i % 7,
            memory_used_mib=1000.0 + i,
            memory_total_mib=81920.0,
            power_w=250.5,
            temperature_c=61.0,
            processes=1 if i % 5 else 0,
            shared=i % 11 == 0,
            source="error" if i % 13 == 0 else "process",
        )
        for i in uids
    ]
    host = [
        HostSampleIn(
            sample_uid=f"{node}-{job_id}-h{i}",
            at=t0 + 10 * i + 0.5,
            job_id=job_id,
            cpu_pct=150.0 + i,
            cpus_allocated=4,
            rss_mib=2048.0 + i,
            cgroup_memory_mib=None if i % 3 else 4096.0,
        )
        for i in uids
        if i % 2 == 0
    ]
    return SampleBatch(node=node, gpu=gpu, host=host)


def test_sample_ingest_is_idempotent_and_counts_right(pg_store: JobStore) -> None:
    usage = UsageStore(pg_store.engine)
    first = _batch("gpu1", range(0, 40))
    n = len(first.gpu) + len(first.host)
    assert usage.ingest(first) == (n, 0)
    assert usage.ingest(first) == (0, n)
    overlap = _batch("gpu1", range(30, 50))  # 10 GPU + 5 host samples already stored
    assert usage.ingest(overlap) == (15, 15)
    assert usage.ingest(SampleBatch(node="gpu1")) == (0, 0)
    assert usage.count_samples() == n + 15


def _fill(store: JobStore) -> UsageStore:
    usage = UsageStore(store.engine)
    usage.ingest(_batch("gpu1", range(0, 60)))
    usage.ingest(_batch("gpu2", range(0, 30), t0=1_796_000_300.0))
    usage.ingest(_batch("gpu1", range(0, 20), job_id=43, t0=1_796_001_000.0))
    usage.ingest(_batch("gpu1", range(60, 70)))  # idle tail of job 42 on gpu1
    return usage


def _same_gpu(a: GpuUsage, b: GpuUsage) -> None:
    assert a.mean_util_pct == pytest.approx(b.mean_util_pct)
    assert replace(a, mean_util_pct=None) == replace(b, mean_util_pct=None)


def _same_host(a: HostUsage, b: HostUsage) -> None:
    assert a.mean_cpu_pct == pytest.approx(b.mean_cpu_pct)
    assert replace(a, mean_cpu_pct=None) == replace(b, mean_cpu_pct=None)


def test_aggregates_match_sqlite(pg_store: JobStore, sqlite_store: JobStore) -> None:
    pg, lite = _fill(pg_store), _fill(sqlite_store)
    since = datetime.fromtimestamp(1_796_000_100, UTC)
    for job_id in (42, 43, 44):
        for start in (None, since):
            got, want = pg.gpu_usage(job_id, since=start), lite.gpu_usage(job_id, since=start)
            assert len(got) == len(want)
            assert (not want) == (job_id == 44)
            for a, b in zip(got, want, strict=True):
                _same_gpu(a, b)
                assert _aware_utc(a.first_at) and _aware_utc(a.last_at)
        got_h, want_h = pg.host_usage(job_id), lite.host_usage(job_id)
        assert len(got_h) == len(want_h)
        for ha, hb in zip(got_h, want_h, strict=True):
            _same_host(ha, hb)
    many_pg, many_lite = pg.gpu_usage_many([42, 43, 44]), lite.gpu_usage_many([42, 43, 44])
    assert set(many_pg) == set(many_lite) == {42, 43}
    for job_id, rows in many_pg.items():
        for a, b in zip(rows, many_lite[job_id], strict=True):
            _same_gpu(a, b)
    (first,) = [g for g in pg.gpu_usage(42) if (g.node, g.gpu_index) == ("gpu2", 0)]
    assert first.samples == 15 and first.shared and first.error_samples == 2
    # the windowed energy query (lag, epoch seconds, shared split) agrees too
    energy_pg, energy_lite = pg.gpu_energy_many([42, 43]), lite.gpu_energy_many([42, 43])
    assert set(energy_pg) == set(energy_lite) == {42, 43}
    for job_id, energies in energy_pg.items():
        for e, f in zip(energies, energy_lite[job_id], strict=True):
            assert (e.node, e.gpu_index, e.samples) == (f.node, f.gpu_index, f.samples)
            assert e.energy_j == pytest.approx(f.energy_j) and e.energy_j > 0
            assert e.idle_energy_j == pytest.approx(f.idle_energy_j)
            assert (e.power_intervals, e.covered_s) == (f.power_intervals, f.covered_s)


def test_summaries_round_trip_json(pg_store: JobStore) -> None:
    usage = UsageStore(pg_store.engine)
    summary = {"gpus": [{"node": "gpu1", "index": 0, "mean": 12.5}], "note": "ü", "ok": True}
    usage.save_summary(42, summary, T0)
    assert usage.summary(42) == summary
    assert usage.summary(41) is None


# --------------------------------------------------------------------------- refused rows


def _awkward_jobs() -> list[Job]:
    many = ",".join(f"partition{i}" for i in range(60))  # 649 characters, column is 512
    return [
        _gpu_job(31, name="nul\x00in\x00name"),
        _gpu_job(32, partition=many),
        _gpu_job(33, name="n" * 300, reason="r" * 300),
        _gpu_job(34, uid=3_000_000_000),  # an AD/sssd-mapped uid above 2^31: fits BIGINT
        _gpu_job(36, uid=2**64),  # no uid is this large: stored as unknown
    ]


def test_rows_postgres_refuses_are_fitted_not_fatal(
    pg_store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    slurm = FakeSlurm(_awkward_jobs())
    obs = Observer(slurm, pg_store, clock=Clock())
    with caplog.at_level("WARNING", logger="slurmgpu.store"):
        assert obs.cycle().ok  # one bad row must not fail every cycle
        slurm.set_jobs([replace(j, state=JobState.CANCELLED) for j in _awkward_jobs()])
        assert obs.cycle().ok  # the update path too
    stored = {s.job.job_id: s.job for s in pg_store.jobs()}
    assert stored[31].name == "nulinname"
    assert stored[32].partition == ",".join(f"partition{i}" for i in range(60))[:512]
    assert (len(stored[33].name), len(stored[33].reason)) == (256, 256)
    assert stored[34].uid == 3_000_000_000
    assert stored[36].uid is None and stored[36].user == "alice"
    assert all(j.state is JobState.CANCELLED for j in stored.values())
    assert "jobs.partition: a value did not fit the column (cut to 512 characters)" in caplog.text
    pg_store.record_submission(
        35, at=T0, uid=2**64, user="bob\x00", cwd="/tmp", argv=["sbatch", "x\x00"]
    )
    (sub,) = pg_store.submissions(35)
    assert (sub["uid"], sub["user"]) == (2**63 - 1, "bob")  # NOT NULL: clamped


def test_sqlite_stores_the_same_rows_untouched(sqlite_store: JobStore) -> None:
    slurm = FakeSlurm(_awkward_jobs())
    assert Observer(slurm, sqlite_store, clock=Clock()).cycle().ok
    stored = {s.job.job_id: s.job for s in sqlite_store.jobs()}
    # Only an integer no database column can hold (past 64 bits) is dropped on SQLite.
    expected = {j.job_id: (replace(j, uid=None) if j.job_id == 36 else j) for j in _awkward_jobs()}
    assert stored == expected


def test_bare_postgresql_url_uses_psycopg_when_psycopg2_is_missing(postgres_url: str) -> None:
    bare = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    engine = create_store_engine(bare)
    assert engine.dialect.driver in {"psycopg", "psycopg2"}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
    engine.dispose()

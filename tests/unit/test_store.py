"""The store: migrations match the schema, SQLite is WAL and private, rows round-trip."""

from __future__ import annotations

import os
import shutil
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import given, settings
from sqlalchemy import text

from slurmgpu.model import GpuRequest, Job, JobState
from slurmgpu.store import StoreError, create_store_engine, open_store, upgrade
from slurmgpu.store.database import current_revision, head_revision
from slurmgpu.store.rows import job_to_row, row_to_job
from slurmgpu.store.schema import metadata
from tests.hypothesis_profiles import examples
from tests.unit.job_strategies import jobs


def test_migrations_produce_exactly_the_declared_schema(tmp_path: Path) -> None:
    engine = create_store_engine(f"sqlite:///{tmp_path / 's.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []
    assert current_revision(engine) == head_revision()


def test_sqlite_database_is_wal_and_only_readable_by_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.db"
    engine = create_store_engine(f"sqlite:///{path}")
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_upgrade_twice_is_a_no_op(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    open_store(url)
    store = open_store(url)
    assert store.count_jobs() == 0


def test_bad_url_is_one_clear_error() -> None:
    with pytest.raises(StoreError, match="not a valid SQLAlchemy URL"):
        create_store_engine("not a url")


def test_opening_a_missing_database_without_create_says_so(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        create_store_engine(f"sqlite:///{tmp_path / 'none.db'}", create=False)


@settings(max_examples=examples(200))
@given(jobs)
def test_job_rows_round_trip_in_memory(job: Job) -> None:
    assert row_to_job(job_to_row(job)) == job


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty store at the newest schema, migrated once: examples copy it (a migration
    per example took most of the test's time)."""
    path = tmp_path_factory.mktemp("template") / "s.db"
    store = open_store(f"sqlite:///{path}")
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    store.engine.dispose()
    return path


@settings(max_examples=examples(50), deadline=None)
@given(jobs)
def test_job_survives_a_database_round_trip(
    tmp_path_factory: pytest.TempPathFactory, migrated_db: Path, job: Job
) -> None:
    from slurmgpu.jobdiff import diff_jobs

    path = tmp_path_factory.mktemp("db") / "s.db"
    shutil.copy2(migrated_db, path)
    store = open_store(f"sqlite:///{path}", migrate=False)
    ids: dict[int, int] = {}
    store.apply_cycle(diff_jobs({}, [job]), ids, [], datetime(2026, 1, 1, tzinfo=UTC))
    (stored,) = store.jobs(job_ids=[job.job_id])
    assert stored.job == job


def test_a_pending_mps_request_survives_the_store(tmp_path: Path, migrated_db: Path) -> None:
    """Issue 39: a pending ``--gres=mps:50`` job read back from the store asked for
    nothing (the jobs table had no MPS column), so reports and policies lost it."""
    from slurmgpu.jobdiff import diff_jobs

    path = tmp_path / "s.db"
    shutil.copy2(migrated_db, path)
    store = open_store(f"sqlite:///{path}", migrate=False)
    job = Job(
        job_id=41,
        name="mps",
        user="alice",
        state=JobState.PENDING,
        gpus=GpuRequest(mps=50, mps_per_node=50, sources=("tres_per_node",)),
    )
    store.apply_cycle(diff_jobs({}, [job]), {}, [], datetime(2026, 1, 1, tzinfo=UTC))
    (stored,) = store.jobs(job_ids=[41])
    assert stored.job.gpus.mps == 50 and stored.job.gpus.mps_per_node == 50
    assert stored.job.gpus.wants_gpu


def test_an_sqlite_uri_is_opened_as_a_uri_not_created_as_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "uri.db"
    open_store(f"sqlite:///{db}").engine.dispose()  # made and migrated as a plain path
    monkeypatch.chdir(tmp_path)
    store = open_store(f"sqlite:///file:{db}?mode=ro&uri=true", migrate=False)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("select count(*) from jobs").scalar() == 0
    store.engine.dispose()
    assert not (tmp_path / "file:").exists(), "a URI must not become a relative directory"


def test_migration_0012_goes_down_and_up_again_to_the_declared_schema(store_url: str) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from slurmgpu.store.database import alembic_config

    engine = create_store_engine(store_url)
    upgrade(engine)
    cfg = alembic_config(engine)
    command.downgrade(cfg, "0011")
    assert current_revision(engine) == "0011"
    assert "mps" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    engine.dispose()

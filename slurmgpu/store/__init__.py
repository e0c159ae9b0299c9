"""State: SQLAlchemy 2 schema, Alembic migrations, SQLite (WAL) by default, any URL."""

from __future__ import annotations

from slurmgpu.store.database import StoreError, check_schema, create_store_engine, upgrade
from slurmgpu.store.jobstore import JobStore, StoredJob

__all__ = ["JobStore", "StoreError", "StoredJob", "create_store_engine", "open_store", "upgrade"]


def open_store(url: str, cluster: str = "", *, migrate: bool = True) -> JobStore:
    """Return a JobStore on ``url``, migrated to the newest schema when ``migrate``."""
    engine = create_store_engine(url, create=migrate)
    if migrate:
        upgrade(engine)
    else:
        check_schema(engine)
    return JobStore(engine, cluster)

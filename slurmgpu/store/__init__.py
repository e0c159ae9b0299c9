"""State: SQLAlchemy 2 schema, Alembic migrations, SQLite (WAL) by default, any URL."""

from __future__ import annotations

from slurmgpu.store.database import (
    StoreDamagedError,
    StoreError,
    check_schema,
    create_store_engine,
    upgrade,
    verify,
)
from slurmgpu.store.jobstore import JobStore, StoredJob

__all__ = [
    "JobStore",
    "StoreDamagedError",
    "StoreError",
    "StoredJob",
    "create_store_engine",
    "open_store",
    "upgrade",
]


def open_store(
    url: str, cluster: str = "", *, migrate: bool = True, check: bool = False
) -> JobStore:
    """Return a JobStore on ``url``, migrated to the newest schema when ``migrate``.

    ``check``: run the integrity check first (health.check_store; the daemon and
    ``sgpu db upgrade`` do), so a damaged store is refused before anything writes to it."""
    engine = create_store_engine(url, create=migrate)
    if check:
        verify(engine)
    if migrate:
        upgrade(engine)
    else:
        check_schema(engine)
    return JobStore(engine, cluster)

"""Alembic environment: runs against the Engine slurmgpu hands over in ``config.attributes``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from slurmgpu.store.schema import metadata

engine = context.config.attributes.get("engine")
if not isinstance(engine, Engine):
    raise RuntimeError("run migrations through slurmgpu.store.database.upgrade()")

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    context.run_migrations()

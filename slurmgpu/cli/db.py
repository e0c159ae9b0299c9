"""``sgpu db``: create or migrate the database and say which schema it has."""

from __future__ import annotations

import click

from slurmgpu.cli.context import EXIT_STORE, AppContext, fail, pass_app
from slurmgpu.store import StoreError, create_store_engine, upgrade
from slurmgpu.store.database import current_revision, head_revision


@click.group()
def db() -> None:
    """Manage the slurmgpu database."""


@db.command("upgrade")
@pass_app
def db_upgrade(app: AppContext) -> None:
    """Create the database if needed and migrate it to the newest schema."""
    url = app.settings.daemon.database
    try:
        engine = create_store_engine(url)
        before = current_revision(engine)
        upgrade(engine)
        after = current_revision(engine)
    except StoreError as exc:
        fail(str(exc), EXIT_STORE)
    if before != after:
        from slurmgpu.cli.token import audit_admin_action

        audit_admin_action(app, "db_upgrade", f"schema {before or 'none'} → {after}")
    click.echo(f"database {url}: schema {before or 'none'} → {after}")


@db.command("current")
@pass_app
def db_current(app: AppContext) -> None:
    """Print the database's schema revision and the newest one."""
    url = app.settings.daemon.database
    try:
        engine = create_store_engine(url, create=False)
        rev = current_revision(engine)
    except StoreError as exc:
        fail(str(exc), EXIT_STORE)
    head = head_revision()
    click.echo(f"database {url}: schema {rev or 'none'} (newest {head})")

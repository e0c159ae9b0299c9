"""``sgpu db``: create or migrate the database, say which schema it has, check it."""

from __future__ import annotations

import click

from slurmgpu.cli.context import AppContext, fail, pass_app, store_exit_code
from slurmgpu.store import StoreError, create_store_engine, upgrade
from slurmgpu.store.database import current_revision, head_revision, verify


@click.group()
def db() -> None:
    """Manage the slurmgpu database."""


@db.command("upgrade")
@pass_app
def db_upgrade(app: AppContext) -> None:
    """Create the database if needed and migrate it to the newest schema.

    The database's integrity is checked first: a damaged one is never migrated (exit 6).
    """
    url = app.settings.daemon.database
    try:
        engine = create_store_engine(url)
        verify(engine)
        before = current_revision(engine)
        upgrade(engine)
        after = current_revision(engine)
    except StoreError as exc:
        fail(str(exc), store_exit_code(exc))
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
        fail(str(exc), store_exit_code(exc))
    head = head_revision()
    click.echo(f"database {url}: schema {rev or 'none'} (newest {head})")


@db.command("check")
@pass_app
def db_check(app: AppContext) -> None:
    """Check the database's integrity (SQLite: PRAGMA quick_check, reads every page).

    One line: "ok", or the cause. Exit 0 intact; 6 corrupt or not a database (restore
    it from a backup: docs/admin-guide.md); 4 it cannot be checked (permission denied,
    read-only, locked, ...). Safe while the daemon runs; on a large file it takes about
    a second per few hundred MiB.
    """
    url = app.settings.daemon.database
    try:
        engine = create_store_engine(url, create=False)
        verify(engine)
    except StoreError as exc:
        fail(str(exc), store_exit_code(exc))
    click.echo(f"database {url}: ok (integrity check passed)")

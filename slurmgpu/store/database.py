"""Engine creation, SQLite pragmas, file permissions and Alembic migrations."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported where a migration is read or run: importing it costs ~0.5 s, paid by
# every sgpu command otherwise (sgpu report has a 5 s budget on a million jobs).

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class StoreError(Exception):
    """The database cannot be opened, migrated or written; one line for the user."""


class StoreDamagedError(StoreError):
    """The database is corrupt or not a database file: only a restore helps (exit 6)."""


def _sqlite_path(url: str) -> Path | None:
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:") or u.query.get("uri") == "true":
        # An SQLite URI names its file itself (and its mode: ro, memory); it is not a
        # path to create (that made a directory named "file:" in the working directory).
        return None
    return Path(u.database)


def _prepare_sqlite_file(path: Path) -> None:
    """Create the directory and an empty 0600 database file so no one else can read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)


def _with_installed_driver(u: URL) -> URL:
    """A bare ``postgresql://`` URL means psycopg2 to SQLAlchemy; slurmgpu's ``postgres``
    extra installs psycopg (3), so use that when psycopg2 is missing."""
    if (
        u.drivername == "postgresql"
        and importlib.util.find_spec("psycopg2") is None
        and importlib.util.find_spec("psycopg") is not None
    ):
        return u.set(drivername="postgresql+psycopg")
    return u


def create_store_engine(url: str, *, create: bool = True) -> Engine:
    """Return an Engine for ``url``; SQLite gets WAL, foreign keys and a busy timeout.

    ``postgresql://`` uses psycopg (3) when psycopg2 is not installed.
    """
    try:
        u = _with_installed_driver(make_url(url))
    except ArgumentError:
        raise StoreError(f"database URL {url!r} is not a valid SQLAlchemy URL") from None
    path = _sqlite_path(url)
    if path is not None:
        if create:
            try:
                _prepare_sqlite_file(path)
            except OSError as exc:
                from slurmgpu.store.health import classify_os_error

                raise StoreError(
                    f"cannot create database {path}: {classify_os_error(exc)}"
                ) from None
        else:
            try:
                exists = path.exists()
            except OSError as exc:  # e.g. a user's sgpu and root's database directory
                raise StoreError(f"cannot open database {path}: {exc.strerror}") from None
            if not exists:
                raise StoreError(f"database {path} does not exist (start the daemon first)")
            if not path.is_file():
                raise StoreError(f"database {path} is not a file: check --db or daemon.database")
    try:
        engine = create_engine(u)
    except Exception as exc:  # missing driver, bad options
        raise StoreError(f"cannot open database {url!r}: {exc}") from None
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=10000")
            cur.close()

    return engine


@contextmanager
def durable_begin(engine: Engine) -> Iterator[Connection]:
    """A write transaction whose commit survives power loss, not only a process crash.

    SQLite connections run with ``synchronous=NORMAL`` (WAL): a commit is safe from a
    crash of the process but may be lost with the last moments before a power cut. A
    resize journal row must not be: the row says a job was requeued held, and without it
    a restarted daemon would not know to release the job. Such writes take
    ``synchronous=FULL`` (the WAL is synced at each commit) for their transaction only,
    and so does a sample batch (an agent deletes it from its spool on the daemon's reply,
    so the reply must mean it is on disk); cycles keep NORMAL's speed. Other databases: a plain
    transaction (PostgreSQL commits durably by default).
    """
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            conn.exec_driver_sql("PRAGMA synchronous=FULL")
            conn.commit()
        try:
            with conn.begin():
                yield conn
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA synchronous=NORMAL")
                conn.commit()


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise store_error(engine.url, exc, "cannot be read") from None


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(MIGRATIONS))
    return script.get_current_head()


_REVISION_LINE = re.compile(r"""^revision\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.MULTILINE)


def known_revisions() -> frozenset[str]:
    """Every schema revision this version of slurmgpu has a migration for.

    Read from the migration files' ``revision = "..."`` lines, not through Alembic, so a
    read-only command checks the schema without paying Alembic's import."""
    found: set[str] = set()
    for script in (MIGRATIONS / "versions").glob("*.py"):
        found.update(_REVISION_LINE.findall(script.read_text(encoding="utf-8")))
    return frozenset(found)


def _revision_in(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def stored_revision(engine: Engine) -> str | None:
    """Return the schema revision stored in the database (None: no slurmgpu schema)."""
    try:
        with engine.connect() as conn:
            return _revision_in(conn)
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read database {engine.url!r}: {_reason(exc)}") from None


def store_error(url: URL | str, exc: BaseException, doing: str = "") -> StoreError:
    """One line for an error met on ``engine``, naming its cause (permission denied,
    read-only, disk full, corrupt, not a database, locked) and what to do next; a
    :class:`StoreDamagedError` when the file is not a database. A corrupt page met by one
    query is reported as "may be corrupt" with the check to run: only the whole-file
    check (:func:`verify`, ``sgpu db check``) says the store is corrupt."""
    from slurmgpu.store.health import RESTORE_DOC, Cause, Diagnosis, classify, sqlite_file

    u = make_url(url)
    found = classify(exc, sqlite_file(u)) or Diagnosis(Cause.ERROR, _reason(exc))
    where = database_name(u)
    if found.cause is Cause.CORRUPT:
        head = f"database {where} {doing}".rstrip()
        return StoreError(
            f"{head}: may be corrupt ({found.detail}): run `sgpu db check`; if it says "
            f"corrupt, restore the database from a backup ({RESTORE_DOC})"
        )
    error = StoreDamagedError if found.cause is Cause.NOT_A_DATABASE else StoreError
    return error(found.sentence(where, doing))


def verify(engine: Engine) -> None:
    """Raise (one line) unless the store passes its integrity check (health.check_store):
    :class:`StoreDamagedError` when corrupt or not a database, :class:`StoreError` for
    any other cause (permission denied, read-only, ...)."""
    from slurmgpu.store.health import FATAL, check_store

    found = check_store(engine)
    if found.ok:
        return
    error = StoreDamagedError if found.cause in FATAL else StoreError
    raise error(found.sentence(database_name(engine)))


def database_name(target: Engine | URL) -> str:
    """The database as error lines name it: the SQLite file, else the URL sans password."""
    url = target.url if isinstance(target, Engine) else target
    path = _sqlite_path(url.render_as_string(hide_password=False))
    return str(path or url.render_as_string(hide_password=True))


def check_schema(engine: Engine) -> None:
    """Raise StoreError (one line) unless the database holds a schema this sgpu can read.

    A corrupt file, another program's database (no slurmgpu revision) and a database a
    newer slurmgpu has migrated (a revision this one does not know) each get their own
    line, instead of a traceback from the first query.
    """
    where = database_name(engine)
    try:
        with engine.connect() as conn:
            revision = _revision_in(conn)
    except SQLAlchemyError as exc:
        raise store_error(engine.url, exc, "cannot be read") from None
    if revision is None:
        raise StoreError(
            f"database {where} is not a slurmgpu database (no schema revision): check --db "
            "or daemon.database, or create it with `sgpu db upgrade` (the daemon does so at start)"
        )
    known = known_revisions()
    if revision not in known:
        raise StoreError(
            f"database {where} has schema revision {revision!r}, which this slurmgpu does not "
            f"know (newest known: {max(known, default='none')}): a newer slurmgpu wrote it; "
            "upgrade sgpu"
        )


def upgrade(engine: Engine) -> None:
    """Migrate the database to the newest schema (no-op when already there)."""
    from alembic import command

    current = current_revision(engine)
    if current == head_revision():
        return
    if current is not None and current not in known_revisions():
        check_schema(engine)  # raises: a newer slurmgpu's schema is never "upgraded" back
    try:
        command.upgrade(alembic_config(engine), "head")
    except SQLAlchemyError as exc:
        raise store_error(engine.url, exc, "cannot be migrated") from None

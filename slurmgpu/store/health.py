"""The store's health in words an operator can act on: what a database error means, an
integrity check, and the outcome of the last write (for ``/healthz``).

A driver's words often hide the cause: SQLite says "unable to open database file" for a
file the user may not read, "disk I/O error" when the kernel remounted the file system
read-only, and "corrupt, or not a database" was once the guess for all of these, which
could push an operator to delete a good file. :func:`classify` turns an error into a
:class:`Cause` from the driver's own error code (SQLite's result code, PostgreSQL's
SQLSTATE) and, where that code is ambiguous, from the file system: mounted read-only, no
permission for this uid, no space left. :func:`check_store` runs SQLite's
``PRAGMA quick_check`` (reads every page: about a second per few hundred MiB), the only
way to tell a corrupt page in the middle of the file, which opens and reads fine until a
query reaches it.

The file system is only inspected (``statvfs``, ``access``, ``stat``), never opened:
closing any descriptor of the database file would drop the POSIX locks SQLite holds on it
in this process.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from http import HTTPStatus
from pathlib import Path

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.exc import OperationalError, SQLAlchemyError

log = logging.getLogger("slurmgpu.store")

# Where the operator reads how to restore (docs/admin-guide.md's section of that name).
RESTORE_DOC = 'docs/admin-guide.md, "Restore the database"'


class Cause(StrEnum):
    """Why the store failed, as /healthz and the error lines name it."""

    OK = "ok"
    CORRUPT = "corrupt"
    NOT_A_DATABASE = "not_a_database"
    PERMISSION_DENIED = "permission_denied"
    READ_ONLY = "read_only"
    FULL = "full"
    LOCKED = "locked"
    UNREACHABLE = "unreachable"
    IO_ERROR = "io_error"
    ERROR = "error"


_LABEL = {
    Cause.OK: "ok",
    Cause.CORRUPT: "corrupt",
    Cause.NOT_A_DATABASE: "not a database",
    Cause.PERMISSION_DENIED: "permission denied",
    Cause.READ_ONLY: "read-only",
    Cause.FULL: "disk full",
    Cause.LOCKED: "locked",
    Cause.UNREACHABLE: "server unreachable",
    Cause.IO_ERROR: "disk I/O error",
    Cause.ERROR: "database error",
}

# The store is damaged: no restart helps, only a restore (exit 6, docs/configuration.md).
FATAL = frozenset({Cause.CORRUPT, Cause.NOT_A_DATABASE})
# An error with one of these causes may be a damaged page: the daemon checks the store.
NEEDS_CHECK = frozenset({Cause.CORRUPT, Cause.NOT_A_DATABASE, Cause.IO_ERROR})

_NEXT_STEP = {
    Cause.CORRUPT: (
        f"restore it from a backup ({RESTORE_DOC}); restarting the daemon does not help"
    ),
    Cause.NOT_A_DATABASE: (
        f"check --db or daemon.database, or restore it from a backup ({RESTORE_DOC})"
    ),
    Cause.PERMISSION_DENIED: "run sgpu as the database's owner, or fix its permissions",
    Cause.READ_ONLY: (
        "make it writable again (after a disk error: stop the daemon, fsck, remount "
        "read-write), then start the daemon"
    ),
    Cause.FULL: "free space on its file system; the daemon carries on by itself",
    Cause.LOCKED: "another process holds a lock on it; it is retried",
    Cause.UNREACHABLE: "check that the database server runs and is reachable",
    Cause.IO_ERROR: "check the disk (dmesg), then run `sgpu db check`",
    Cause.ERROR: "run `sgpu db check`",
}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A cause and one line of what was seen (the driver's words, the file system's state)."""

    cause: Cause
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.cause is Cause.OK

    def __str__(self) -> str:
        """``read-only (disk I/O error; its file system is mounted read-only)``."""
        label = _LABEL[self.cause]
        return f"{label} ({self.detail})" if self.detail and self.detail != label else label

    def sentence(self, where: str, doing: str = "") -> str:
        """One line for the operator: the database (and what failed), the cause, what was
        seen, what to do next."""
        head = f"database {where} {doing}".rstrip()
        return f"{head}: {self}: {_NEXT_STEP.get(self.cause, 'see the log')}"


OK = Diagnosis(Cause.OK)


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip() and not line.startswith("***"):
            return line.strip()[:300]
    return ""


# SQLite's primary result codes (https://sqlite.org/rescode.html); 14 (CANTOPEN) and 10
# (IOERR) say too little and are looked into on the file system.
_SQLITE_CODES = {
    3: Cause.PERMISSION_DENIED,  # SQLITE_PERM
    5: Cause.LOCKED,  # SQLITE_BUSY
    6: Cause.LOCKED,  # SQLITE_LOCKED
    8: Cause.READ_ONLY,  # SQLITE_READONLY
    10: Cause.IO_ERROR,  # SQLITE_IOERR
    11: Cause.CORRUPT,  # SQLITE_CORRUPT
    13: Cause.FULL,  # SQLITE_FULL
    14: Cause.ERROR,  # SQLITE_CANTOPEN
    23: Cause.PERMISSION_DENIED,  # SQLITE_AUTH
    26: Cause.NOT_A_DATABASE,  # SQLITE_NOTADB
}

# PostgreSQL's SQLSTATEs (https://www.postgresql.org/docs/current/errcodes-appendix.html).
_PG_CODES = {
    "XX001": Cause.CORRUPT,  # data_corrupted
    "XX002": Cause.CORRUPT,  # index_corrupted
    "53100": Cause.FULL,  # disk_full
    "42501": Cause.PERMISSION_DENIED,  # insufficient_privilege
    "28000": Cause.PERMISSION_DENIED,  # invalid_authorization_specification
    "28P01": Cause.PERMISSION_DENIED,  # invalid_password
    "25006": Cause.READ_ONLY,  # read_only_sql_transaction (a hot standby, a read-only role)
    "55P03": Cause.LOCKED,  # lock_not_available
    "40P01": Cause.LOCKED,  # deadlock_detected
    "53300": Cause.UNREACHABLE,  # too_many_connections
    "57P01": Cause.UNREACHABLE,  # admin_shutdown
    "57P02": Cause.UNREACHABLE,  # crash_shutdown
    "57P03": Cause.UNREACHABLE,  # cannot_connect_now
    "58030": Cause.IO_ERROR,  # io_error
}

_OS_ERRNO = {
    errno.EACCES: Cause.PERMISSION_DENIED,
    errno.EPERM: Cause.PERMISSION_DENIED,
    errno.EROFS: Cause.READ_ONLY,
    errno.ENOSPC: Cause.FULL,
    errno.EDQUOT: Cause.FULL,
    errno.EIO: Cause.IO_ERROR,
}

# Less free space than this on the database's file system, next to a write error: full.
_NEARLY_FULL_BYTES = 1 << 20


def _mode(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return ""
    return f"mode {st.st_mode & 0o7777:04o}, owner uid {st.st_uid}"


def probe_file(path: Path, *, write: bool = True) -> Diagnosis | None:
    """What the file system says about using ``path`` (None: nothing wrong seen).

    Read-only mount, no permission for this process (its effective uid; root passes the
    mode bits but not an immutable file), a directory SQLite cannot create its ``-wal``
    and ``-shm`` files in, no space left."""
    directory = path.parent
    try:
        vfs = os.statvfs(directory)
    except OSError as exc:
        return Diagnosis(_OS_ERRNO.get(exc.errno or 0, Cause.ERROR), f"{directory}: {exc.strerror}")
    if write and vfs.f_flag & os.ST_RDONLY:
        return Diagnosis(
            Cause.READ_ONLY, f"the file system holding {directory} is mounted read-only"
        )
    if write and (after_error := _emergency_read_only(directory)) is not None:
        return Diagnosis(
            Cause.READ_ONLY,
            f"the file system holding {directory} ({after_error}) went read-only after a "
            "disk error",
        )
    uid = os.geteuid()
    siblings = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
    for file in siblings:
        if not file.exists():
            continue
        if not os.access(file, os.R_OK, effective_ids=os.access in os.supports_effective_ids):
            return Diagnosis(
                Cause.PERMISSION_DENIED, f"uid {uid} may not read {file} ({_mode(file)})"
            )
        if write and not os.access(
            file, os.W_OK, effective_ids=os.access in os.supports_effective_ids
        ):
            st_mode = file.stat().st_mode
            if not st_mode & 0o222:
                return Diagnosis(Cause.READ_ONLY, f"{file} is a read-only file ({_mode(file)})")
            extra = "" if uid else "; an immutable file? see lsattr"
            return Diagnosis(
                Cause.PERMISSION_DENIED, f"uid {uid} may not write {file} ({_mode(file)}{extra})"
            )
    missing = [f for f in siblings[1:] if not f.exists()]
    if write and missing and not os.access(directory, os.W_OK | os.X_OK):
        return Diagnosis(
            Cause.PERMISSION_DENIED,
            f"uid {uid} may not create {missing[0].name} in {directory} ({_mode(directory)})",
        )
    if write and vfs.f_bavail * vfs.f_frsize < _NEARLY_FULL_BYTES:
        free = vfs.f_bavail * vfs.f_frsize
        return Diagnosis(Cause.FULL, f"{free} bytes free on the file system holding {directory}")
    return None


def _emergency_read_only(
    directory: Path, mountinfo: Path = Path("/proc/self/mountinfo")
) -> str | None:
    """The mount point holding ``directory`` when its file system went read-only after an
    error although the mount still says ``rw``: Linux 6.x's ext4 marks this
    ``emergency_ro`` in the super block's options only, which ``statvfs`` does not show."""
    try:
        where = directory.resolve()
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, str, bool] | None = None
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 6:
            continue
        point = fields[4].replace("\\040", " ")
        if where != Path(point) and Path(point) not in where.parents:
            continue
        super_options = tail.split()[2].split(",") if len(tail.split()) > 2 else []
        if best is None or len(point) > best[0]:
            best = (len(point), point, "emergency_ro" in super_options)
    return best[1] if best is not None and best[2] else None


def classify_os_error(exc: OSError, path: Path | None = None) -> Diagnosis:
    """An OS error on the database's file or directory (creating it, statting it)."""
    cause = _OS_ERRNO.get(exc.errno or 0, Cause.ERROR)
    where = f"{path}: " if path is not None else ""
    return Diagnosis(cause, f"{where}{exc.strerror or exc}")


def classify(exc: BaseException, path: Path | None = None) -> Diagnosis | None:
    """What ``exc`` (a SQLAlchemy error or the driver's own) says about the store.

    None for errors about one statement or row (a constraint, a bad value): those say
    nothing of the store's health. ``path``: the SQLite file, looked at when SQLite's
    code is ambiguous (CANTOPEN, IOERR, READONLY)."""
    orig = getattr(exc, "orig", None) or exc
    words = _first_line(str(orig)) or type(orig).__name__
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        if code is None:
            return Diagnosis(Cause.ERROR, words)
        cause = _SQLITE_CODES.get(code & 0xFF)
        if cause is None:
            # A constraint, a mismatch, an interrupt: about a statement, not the store;
            # but SQLITE_ERROR ("no such table") is a store another program changed.
            return Diagnosis(Cause.ERROR, words) if code & 0xFF == 1 else None
        if cause in (Cause.ERROR, Cause.IO_ERROR, Cause.READ_ONLY) and path is not None:
            seen = probe_file(path)
            if seen is not None:
                return Diagnosis(seen.cause, f"{words}; {seen.detail}")
        if cause is Cause.READ_ONLY:
            return Diagnosis(cause, f"{words}; the connection was opened read-only")
        return Diagnosis(cause, words)
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate:
        found = _PG_CODES.get(sqlstate)
        if found is None and sqlstate.startswith("08"):
            found = Cause.UNREACHABLE  # connection_exception
        if found is None and sqlstate.startswith("XX"):
            found = Cause.ERROR  # internal_error: not known to be corruption
        if found is not None:
            return Diagnosis(found, f"{words} (SQLSTATE {sqlstate})")
        return Diagnosis(Cause.ERROR, words) if isinstance(exc, OperationalError) else None
    if isinstance(orig, OSError):
        return classify_os_error(orig, path)
    if isinstance(exc, OperationalError) or type(orig).__name__ == "OperationalError":
        # A server driver's connection failure carries no SQLSTATE.
        return Diagnosis(Cause.UNREACHABLE if sqlstate is None else Cause.ERROR, words)
    return None


def one_line(exc: BaseException, path: Path | None = None) -> str:
    """A store error as one log line: its cause and the driver's first line, never the
    statement and its parameters SQLAlchemy appends."""
    found = classify(exc, path)
    if found is not None:
        return str(found)
    orig = getattr(exc, "orig", None) or exc
    return _first_line(str(orig)) or type(orig).__name__


def sqlite_file(target: Engine | URL) -> Path | None:
    """The SQLite file behind an engine or URL (None: another database, memory)."""
    url = target.url if isinstance(target, Engine) else target
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    if url.database.startswith("file:"):
        return Path(url.database[5:].split("?", 1)[0])
    return Path(url.database)


def check_store(engine: Engine) -> Diagnosis:
    """Check the store's integrity: SQLite's ``PRAGMA quick_check`` (every page read; no
    index compared with its table, which ``integrity_check`` adds at several times the
    cost); on PostgreSQL a query (the server checks its own pages as it reads them and
    says so with SQLSTATE XX001/XX002). An error on the way is classified."""
    path = sqlite_file(engine)
    try:
        with engine.connect() as conn:
            if engine.dialect.name != "sqlite":
                conn.exec_driver_sql("SELECT 1").scalar()
                return OK
            rows = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA quick_check(1)")]
    except SQLAlchemyError as exc:
        return classify(exc, path) or Diagnosis(Cause.ERROR, _first_line(str(exc)))
    if rows == ["ok"]:
        return OK
    return Diagnosis(Cause.CORRUPT, f"quick_check: {_first_line(rows[0]) if rows else 'no answer'}")


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else None


class StoreHealth:
    """The store as the running daemon meets it: the last write's outcome, and whether an
    error since the last look may mean a damaged store.

    Failures come from the engine itself (:meth:`watch` hooks SQLAlchemy's
    ``handle_error``, so no error on any thread is missed: a cycle, an agent's upload,
    the lease, a policy's read); successes from the writers (:meth:`wrote`, after a
    commit). Thread-safe."""

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.clock = clock
        self.path: Path | None = None
        self.failures = 0  # store errors seen, ever (a cycle compares before and after)
        self.last_error: Diagnosis | None = None  # the latest, kept after writes resume
        self._lock = threading.Lock()
        self._last_write: datetime | None = None
        self._failing: Diagnosis | None = None
        self._failing_since: datetime | None = None
        self._suspect: Diagnosis | None = None

    def watch(self, engine: Engine) -> None:
        """Record every store error raised on ``engine``."""
        self.path = sqlite_file(engine)
        event.listen(engine, "handle_error", self._on_error)

    def _on_error(self, context: ExceptionContext) -> None:
        try:
            found = classify(context.original_exception, self.path)
        except Exception:  # a listener must never replace the driver's error
            log.debug("store error not classified", exc_info=True)
            return
        if found is not None:
            self.failed(found)

    def failed(self, found: Diagnosis) -> None:
        with self._lock:
            self.failures += 1
            self.last_error = found
            if self._failing is None:
                self._failing_since = self.clock()
            self._failing = found
            if found.cause in NEEDS_CHECK:
                self._suspect = found

    def wrote(self) -> None:
        """A write committed: the store takes writes (again)."""
        with self._lock:
            self._last_write = self.clock()
            self._failing = None
            self._failing_since = None

    @property
    def failing(self) -> Diagnosis | None:
        """The last error, while no write has succeeded since."""
        with self._lock:
            return self._failing

    def take_suspect(self) -> Diagnosis | None:
        """The last error since the previous call that may mean a damaged store."""
        with self._lock:
            found, self._suspect = self._suspect, None
            return found

    def healthz(self) -> tuple[int, bytes]:
        """``GET /healthz``: 200 while writes succeed, 503 with the cause while they fail.
        Only the cause and times: no path, no query, no job."""
        with self._lock:
            failing, since, last = self._failing, self._failing_since, self._last_write
        body: dict[str, object] = {
            "ok": failing is None,
            "store": str(failing.cause if failing is not None else Cause.OK),
            "last_write": _iso(last),
        }
        if failing is not None:
            body["failing_since"] = _iso(since)
            status = HTTPStatus.SERVICE_UNAVAILABLE
        else:
            status = HTTPStatus.OK
        return status.value, json.dumps(body).encode()

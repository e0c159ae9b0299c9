"""The daemon lease: one writer per database, and an optional standby that takes over.

One row of the ``meta`` table (key ``daemon_lease``) names the daemon that may write:
its host, pid, pid namespace, process start time and a random token, with the time of
its last heartbeat and when the lease expires. Every change of the row is a
compare-and-swap (``UPDATE … WHERE value = <what we read>``), so two daemons starting at
the same instant cannot both win, on SQLite or PostgreSQL.

- **Active**: ``sgpu daemon`` takes the lease before it reads any state, renews it every
  ``ttl / 3`` from a heartbeat thread (the main loop may sleep up to ``max_backoff`` while
  slurmctld is away), and releases it on a clean stop.
- **Refusal**: a second ``sgpu daemon`` on the same database while the lease is live stops
  with one line naming the holder (exit 1).
- **Takeover**: an expired lease (no heartbeat for ``ttl``) is taken over. So is the lease
  of a daemon on *this* host (same pid namespace) whose process is gone, at once: a
  daemon restarted after a crash or SIGKILL does not wait for the expiry.
- **Passive**: ``sgpu daemon --standby`` waits, without touching any state, until the
  lease is free or expired, then becomes the active daemon (for PostgreSQL shared by two
  hosts). Expiry is judged on each daemon's own clock: keep the hosts' clocks within a
  small fraction of ``ttl`` (NTP).
- **Losing it**: a daemon whose renewal finds another holder stops after the current
  cycle; one that cannot renew (database read-only, disk full) for a whole ``ttl``
  considers the lease lapsed and takes no policy action until a renewal succeeds.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import psutil
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from slurmgpu.stop_flag import StopFlag
from slurmgpu.store import schema
from slurmgpu.store.health import one_line

log = logging.getLogger("slurmgpu.daemon")

LEASE_KEY = "daemon_lease"


class LeaseError(Exception):
    """The lease cannot be taken or kept; one line for the operator."""


class LeaseHeld(LeaseError):
    """Another live daemon holds the lease."""


class LeaseLost(LeaseError):
    """This daemon's lease was taken over by another one."""


def _now() -> datetime:
    return datetime.now(UTC)


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _process_started(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return 0.0


def process_alive(pid: int, started: float) -> bool:
    """True when ``pid`` runs and is the process that started at ``started`` (not a reuse)."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True  # cannot tell: assume alive, the expiry still frees the lease
    return abs(created - started) < 2.0 or started == 0.0


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds the lease and until when (the ``meta`` row's value, decoded)."""

    host: str
    pid: int
    pidns: int
    started: float
    token: str
    heartbeat: datetime
    expires: datetime

    @property
    def name(self) -> str:
        return f"{self.host}:{self.pid}"

    def encode(self) -> str:
        doc = asdict(self)
        doc["heartbeat"] = self.heartbeat.isoformat()
        doc["expires"] = self.expires.isoformat()
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> LeaseHolder | None:
        """The holder in ``text``, or None when the row is not a lease we can read."""
        try:
            doc = json.loads(text)
            return cls(
                host=str(doc["host"]),
                pid=int(doc["pid"]),
                pidns=int(doc.get("pidns", 0)),
                started=float(doc.get("started", 0.0)),
                token=str(doc["token"]),
                heartbeat=datetime.fromisoformat(doc["heartbeat"]),
                expires=datetime.fromisoformat(doc["expires"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


class DaemonLease:
    """This daemon's claim on the database; ``acquire`` once, then ``renew`` regularly."""

    def __init__(
        self,
        engine: Engine,
        *,
        ttl: timedelta = timedelta(seconds=60),
        clock: Callable[[], datetime] = _now,
        host: str | None = None,
        pid: int | None = None,
        alive: Callable[[int, float], bool] = process_alive,
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError("the lease ttl must be positive")
        self.engine = engine
        self.ttl = ttl
        self.clock = clock
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.pidns = _pid_namespace()
        self.started = _process_started(self.pid)
        self.alive = alive
        self.token = secrets.token_hex(16)
        self._value: str | None = None  # the row as we last wrote it
        self._renewed_at: datetime | None = None
        self.lost = False

    # -- reading ----------------------------------------------------------------------

    def _read(self) -> tuple[str | None, LeaseHolder | None]:
        m = schema.meta
        with self.engine.connect() as conn:
            value = conn.execute(select(m.c.value).where(m.c.key == LEASE_KEY)).scalar()
        if value is None:
            return None, None
        return str(value), LeaseHolder.decode(str(value))

    def current(self) -> LeaseHolder | None:
        """The holder recorded in the database (live or not), or None."""
        try:
            return self._read()[1]
        except SQLAlchemyError as exc:
            raise LeaseError(f"cannot read the daemon lease: {_one_line(exc)}") from None

    def _free(self, holder: LeaseHolder | None, at: datetime) -> str | None:
        """Why ``holder``'s lease may be taken now, or None when it is live."""
        if holder is None:
            return "unreadable lease row"
        if holder.token == self.token:
            return "ours"
        if holder.expires <= holder.heartbeat:
            return "released"
        if holder.expires <= at:
            return f"expired {(at - holder.expires).total_seconds():.0f}s ago"
        same_host = holder.host == self.host and holder.pidns == self.pidns
        if same_host and not self.alive(holder.pid, holder.started):
            return f"pid {holder.pid} on this host is gone"
        return None

    # -- writing ----------------------------------------------------------------------

    def _mine(self, at: datetime) -> LeaseHolder:
        return LeaseHolder(
            host=self.host,
            pid=self.pid,
            pidns=self.pidns,
            started=self.started,
            token=self.token,
            heartbeat=at,
            expires=at + self.ttl,
        )

    def _swap(self, old: str | None, new: str, at: datetime) -> bool:
        """Write ``new`` if the row still holds ``old`` (None: no row yet); True if we did."""
        m = schema.meta
        with self.engine.begin() as conn:
            if old is None:
                try:
                    conn.execute(insert(m).values(key=LEASE_KEY, value=new, updated_at=at))
                except IntegrityError:
                    return False
                return True
            result = conn.execute(
                update(m)
                .where(m.c.key == LEASE_KEY, m.c.value == old)
                .values(value=new, updated_at=at)
            )
            return bool(result.rowcount == 1)

    def try_acquire(self) -> LeaseHolder | None:
        """Take the lease if it is free; return the live holder that keeps it, else None."""
        for _ in range(5):
            at = self.clock()
            try:
                old, holder = self._read()
                why = "no lease yet" if old is None else self._free(holder, at)
                if why is None:
                    assert holder is not None
                    return holder
                new = self._mine(at).encode()
                if self._swap(old, new, at):
                    self._value, self._renewed_at, self.lost = new, at, False
                    if holder is not None and why not in ("ours", "released"):
                        log.warning("took over the daemon lease from %s (%s)", holder.name, why)
                    return None
            except SQLAlchemyError as exc:
                raise LeaseError(f"cannot take the daemon lease: {_one_line(exc)}") from None
        raise LeaseError("the daemon lease changed hands 5 times while taking it; retry")

    def acquire(self) -> None:
        """Take the lease or raise LeaseHeld with one line naming the live holder."""
        holder = self.try_acquire()
        if holder is not None:
            raise LeaseHeld(_held_message(holder, self.clock()))

    def wait_acquire(
        self, stop: threading.Event | StopFlag, *, poll_s: float | None = None
    ) -> bool:
        """Standby: wait until the lease is ours (True) or ``stop`` is set (False)."""
        said: str | None = None
        while not stop.is_set():
            try:
                holder = self.try_acquire()
            except LeaseError as exc:
                log.warning("standby: %s", exc)
                holder = None
                if stop.wait(poll_s or self.ttl.total_seconds() / 3):
                    return False
                continue
            if holder is None:
                log.info("standby over: this daemon holds the lease now")
                return True
            if said != holder.token:
                log.info(
                    "standby: daemon %s holds the lease; taking over if it stops renewing",
                    holder.name,
                )
                said = holder.token
            remaining = (holder.expires - self.clock()).total_seconds()
            wait = poll_s or max(0.2, min(self.ttl.total_seconds() / 3, remaining + 0.1))
            stop.wait(wait)
        return False

    def renew(self) -> None:
        """Extend the lease; raise LeaseLost if another daemon has it, LeaseError on I/O."""
        at = self.clock()
        new = self._mine(at).encode()
        try:
            if self._value is not None and self._swap(self._value, new, at):
                self._value, self._renewed_at = new, at
                return
            old, holder = self._read()
            # Our own earlier write, committed although we saw an error: adopt it.
            mine = holder is not None and holder.token == self.token
            if mine and old is not None and self._swap(old, new, at):
                self._value, self._renewed_at = new, at
                return
            if holder is None and old is None and self._swap(None, new, at):
                self._value, self._renewed_at = new, at  # the row was deleted by hand
                return
        except SQLAlchemyError as exc:
            raise LeaseError(f"cannot renew the daemon lease: {_one_line(exc)}") from None
        self.lost = True
        who = holder.name if holder is not None else "an unreadable row"
        raise LeaseLost(f"the daemon lease was taken over by {who}; this daemon stops")

    def release(self) -> None:
        """Give the lease up (expire it now) if we still hold it; never raises."""
        if self._value is None or self.lost:
            return
        at = self.clock()
        gone = LeaseHolder(**{**asdict(self._mine(at)), "expires": at}).encode()
        try:
            self._swap(self._value, gone, at)
        except SQLAlchemyError as exc:
            log.warning("could not release the daemon lease: %s", _one_line(exc))
        self._value = None

    def valid(self) -> bool:
        """True while the lease is ours as far as this daemon knows (renewed within ttl)."""
        if self.lost or self._renewed_at is None:
            return False
        return self.clock() - self._renewed_at < self.ttl


class LeaseKeeper:
    """Renews a lease every ``ttl / 3`` from a thread; calls ``on_lost`` if it is taken."""

    def __init__(self, lease: DaemonLease, on_lost: Callable[[], None]) -> None:
        self.lease = lease
        self.on_lost = on_lost
        self.stop_event = threading.Event()
        self.failing = False
        self.thread = threading.Thread(target=self._run, name="sgpu-lease", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        period = self.lease.ttl.total_seconds() / 3
        while not self.stop_event.wait(period):
            try:
                self.lease.renew()
            except LeaseLost as exc:
                log.error("%s", exc)
                self.on_lost()
                return
            except LeaseError as exc:
                if not self.failing:
                    log.error("%s; policies pause once the lease lapses", exc)
                    self.failing = True
                continue
            if self.failing:
                log.info("daemon lease renewed again")
                self.failing = False


def _held_message(holder: LeaseHolder, at: datetime) -> str:
    beat = (at - holder.heartbeat).total_seconds()
    left = (holder.expires - at).total_seconds()
    return (
        f"another daemon ({holder.name}) holds the database lease: heartbeat {beat:.0f}s ago, "
        f"expires in {left:.0f}s; stop it, or start this one with --standby to take over "
        "when it stops"
    )


def _one_line(exc: BaseException) -> str:
    """The store error in one line, its cause named (disk full, read-only, ...)."""
    return one_line(exc)

"""The running daemon's look at its store after each cycle.

Every store error on the daemon's engine is recorded by :class:`StoreHealth` (any
thread: the cycle, an agent's upload, the lease). After each cycle, when one of them may
mean a damaged store (SQLite said corrupt, not a database, or a disk I/O error that the
file system does not explain), the store is checked once (``PRAGMA quick_check``):

- corrupt: the daemon stops with one line that says to restore from a backup (exit 6);
  running on would print the same error every cycle and store nothing where it matters;
- intact: one WARNING, and the daemon carries on as for any transient error (the same
  error is not checked again until a write has succeeded since: a disk that keeps
  failing costs one check and one line, not one per cycle that met it).

On PostgreSQL the server checks its own pages as it reads them: SQLSTATE XX001/XX002
(data or index corrupted) is its verdict, and the daemon stops on it.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine

from slurmgpu.store.database import database_name
from slurmgpu.store.health import FATAL, Cause, Diagnosis, StoreHealth, check_store

log = logging.getLogger("slurmgpu.daemon")


class StoreWatch:
    """Decides, after a cycle, whether the daemon may go on with its store."""

    def __init__(self, engine: Engine, health: StoreHealth) -> None:
        self.engine = engine
        self.health = health
        self.checks = 0  # integrity checks run (for tests and the log)
        self._cleared: str | None = None  # the error last found harmless by a check

    def after_cycle(self) -> str | None:
        """None to go on; else the one line the daemon stops with."""
        suspect = self.health.take_suspect()
        if suspect is None:
            if self.health.failing is None:
                self._cleared = None  # writes work again: the next error is news
            return None
        if suspect.detail == self._cleared:
            return None
        verdict = self._verdict(suspect)
        if verdict.cause in FATAL:
            return verdict.sentence(database_name(self.engine))
        self._cleared = suspect.detail
        log.warning(
            "database error (%s), but the integrity check finds the store %s: carrying on",
            suspect,
            "intact" if verdict.ok else f"unchecked: {verdict}",
        )
        return None

    def _verdict(self, suspect: Diagnosis) -> Diagnosis:
        if self.engine.dialect.name != "sqlite":
            # PostgreSQL said XX001/XX002 after checking the page itself.
            return suspect if suspect.cause is Cause.CORRUPT else check_store(self.engine)
        self.checks += 1
        return check_store(self.engine)

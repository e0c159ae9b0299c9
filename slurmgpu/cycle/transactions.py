"""Where resize transactions live: the protocol the resize executor
(``cycle.resize.ResizeExecutor``) writes through, and an in-memory store for the
simulator and tests.

The daemon's store is SQL (``store.transactions.TransactionStore``: durable, so a
restarted daemon recovers every open transaction); :class:`MemoryTransactions` keeps the
same rules (one open transaction per job, compare-and-set on the state) in a dict, for
a process that never restarts (the simulator).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from slurmgpu.elastic.spec import Ack

__all__ = [
    "AckReader",
    "GuardedAckReader",
    "MemoryTransactions",
    "TransactionRow",
    "Transactions",
]

log = logging.getLogger("slurmgpu.cycle")


@dataclass(frozen=True, slots=True)
class TransactionRow:
    """One transaction as every store keeps it: a kind (``resize``, ``pool``), a state
    moved by compare-and-set, a deadline for the current step and a JSON payload."""

    id: int
    job_id: int
    kind: str
    state: str
    created_at: datetime
    updated_at: datetime
    deadline: datetime | None
    attempts: int
    payload: dict[str, Any]
    error: str | None

    def advanced(
        self,
        state: str,
        at: datetime,
        deadline: datetime | None,
        payload: Mapping[str, Any] | None,
        error: str | None,
    ) -> TransactionRow:
        """This row moved to ``state`` at ``at`` (one more attempt, ``payload`` merged in):
        what every store returns from ``advance``."""
        return replace(
            self,
            state=state,
            updated_at=at,
            deadline=deadline,
            attempts=self.attempts + 1,
            payload={**self.payload, **(payload or {})},
            error=error,
        )

    def noted(self, payload: Mapping[str, Any], at: datetime) -> TransactionRow:
        """This row with ``payload`` merged in at ``at``, its state unchanged."""
        return replace(self, updated_at=at, payload={**self.payload, **payload})


class AckReader(Protocol):
    """Reads a job's newest checkpoint acknowledgement (``elastic.spec.read_ack``: the
    ``ack.json`` its runtime writes in ``state_dir``; the simulator: SimSlurm's record)."""

    def __call__(self, state_dir: str, job_id: int) -> Ack | None: ...


class GuardedAckReader:
    """An :class:`AckReader` that never raises: whatever the wrapped reader raises on
    one job (a bug, a record no one foresaw) is that job's "no acknowledgement yet", so
    one job's ack never stops the others' transactions; logged once per job, with its
    traceback. (``elastic.spec.read_ack`` itself refuses a bad file without raising.)"""

    def __init__(self, reader: AckReader) -> None:
        self.reader = reader
        self._failed: set[int] = set()

    def __call__(self, state_dir: str, job_id: int) -> Ack | None:
        try:
            ack = self.reader(state_dir, job_id)
        except Exception:
            if job_id not in self._failed:
                if len(self._failed) > 10_000:
                    self._failed.clear()
                self._failed.add(job_id)
                log.exception("job %d: acknowledgement not read; treated as none", job_id)
            return None
        self._failed.discard(job_id)
        return ack


class Transactions(Protocol):
    """What the resize executor needs of a transaction store."""

    def create(
        self,
        job_id: int,
        kind: str,
        state: str,
        *,
        at: datetime,
        deadline: datetime | None,
        payload: Mapping[str, Any],
        open_states: Collection[str],
    ) -> TransactionRow | None:
        """Insert a transaction unless ``job_id`` already has one in ``open_states``."""
        ...

    def advance(
        self,
        row: TransactionRow,
        state: str,
        *,
        at: datetime,
        deadline: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> TransactionRow | None:
        """Move ``row`` to ``state`` if it is still in ``row.state``; None when it was not."""
        ...

    def in_states(self, kinds: Collection[str], states: Collection[str]) -> list[TransactionRow]:
        """Rows of ``kinds`` in ``states``, oldest first."""
        ...

    def note(self, row: TransactionRow, payload: Mapping[str, Any], at: datetime) -> TransactionRow:
        """Merge ``payload`` into the row without changing its state (progress bookkeeping)."""
        ...

    def recent(
        self, kinds: Collection[str], *, job_id: int | None = None, limit: int = 100
    ) -> list[TransactionRow]:
        """Rows of ``kinds`` (of ``job_id`` if given), newest first, at most ``limit``."""
        ...


class MemoryTransactions:
    """Transactions in memory, with the SQL store's rules."""

    def __init__(self) -> None:
        self._rows: dict[int, TransactionRow] = {}
        # row ids by state: a long simulation keeps thousands of closed rows, and the
        # executors ask for the few open ones every observation
        self._by_state: dict[str, dict[int, None]] = {}
        self._next = 1
        self.version = 0  # grows with every write: a reader's cache key

    def _put(self, row: TransactionRow) -> None:
        self.version += 1
        old = self._rows.get(row.id)
        if old is not None and old.state != row.state:
            self._by_state[old.state].pop(row.id, None)
        self._rows[row.id] = row
        self._by_state.setdefault(row.state, {})[row.id] = None

    def create(
        self,
        job_id: int,
        kind: str,
        state: str,
        *,
        at: datetime,
        deadline: datetime | None,
        payload: Mapping[str, Any],
        open_states: Collection[str],
    ) -> TransactionRow | None:
        if any(r.job_id == job_id for r in self._in(open_states)):
            return None
        row = TransactionRow(
            self._next, job_id, kind, state, at, at, deadline, 0, dict(payload), None
        )
        self._put(row)
        self._next += 1
        return row

    def _in(self, states: Collection[str]) -> list[TransactionRow]:
        ids = sorted(i for st in set(states) for i in self._by_state.get(st, ()))
        return [self._rows[i] for i in ids]

    def advance(
        self,
        row: TransactionRow,
        state: str,
        *,
        at: datetime,
        deadline: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> TransactionRow | None:
        current = self._rows.get(row.id)
        if current is None or current.state != row.state:
            return None
        new = row.advanced(state, at, deadline, payload, error)
        self._put(new)
        return new

    def in_states(self, kinds: Collection[str], states: Collection[str]) -> list[TransactionRow]:
        return [r for r in self._in(states) if r.kind in kinds]

    def note(self, row: TransactionRow, payload: Mapping[str, Any], at: datetime) -> TransactionRow:
        current = self._rows.get(row.id)
        new = row.noted(payload, at)
        if current is not None and current.state == row.state:
            self._put(new)
        return new

    def recent(
        self, kinds: Collection[str], *, job_id: int | None = None, limit: int = 100
    ) -> list[TransactionRow]:
        out: list[TransactionRow] = []
        for row_id in reversed(self._rows):  # ids grow with insertion
            r = self._rows[row_id]
            if r.kind in kinds and (job_id is None or r.job_id == job_id):
                out.append(r)
                if len(out) >= limit:
                    break
        return out

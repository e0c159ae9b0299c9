"""Persisted multi-step actions (the ``transactions`` table): resize and pool transactions.

Every step moves a row from one state to the next with a compare-and-set on the state,
so two writers (a daemon and its successor during a takeover) can never both take the
same step, and a daemon killed between a Slurm call and the write finds the row where
it left it and re-checks Slurm before acting again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cycle.transactions import TransactionRow
from slurmgpu.store import schema
from slurmgpu.store.database import StoreError, durable_begin
from slurmgpu.store.health import one_line

__all__ = ["TransactionStore"]


def _row(r: Any) -> TransactionRow:
    return TransactionRow(
        id=r.id,
        job_id=int(r.job_id),
        kind=r.kind,
        state=r.state,
        created_at=r.created_at,
        updated_at=r.updated_at,
        deadline=r.deadline,
        attempts=r.attempts,
        payload=dict(r.payload or {}),
        error=r.error,
    )


class TransactionStore:
    """Rows of ``transactions`` for one cluster."""

    def __init__(self, engine: Engine, cluster: str = "") -> None:
        self.engine = engine
        self.cluster = cluster

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
        t = schema.transactions
        try:
            with durable_begin(self.engine) as conn:
                busy = conn.execute(
                    select(t.c.id).where(
                        and_(
                            t.c.cluster == self.cluster,
                            t.c.job_id == job_id,
                            t.c.state.in_(list(open_states)),
                        )
                    )
                ).first()
                if busy is not None:
                    return None
                row = {
                    "cluster": self.cluster,
                    "job_id": job_id,
                    "kind": kind,
                    "state": state,
                    "created_at": at,
                    "updated_at": at,
                    "deadline": deadline,
                    "attempts": 0,
                    "payload": dict(payload),
                    "error": None,
                }
                new_id = conn.execute(insert(t).values(**row)).inserted_primary_key
                assert new_id is not None
                stored = conn.execute(select(t).where(t.c.id == new_id[0])).one()
        except SQLAlchemyError as exc:
            raise StoreError(f"could not record a {kind} transaction: {one_line(exc)}") from exc
        return _row(stored)

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
        t = schema.transactions
        merged = {**row.payload, **(payload or {})}
        values: dict[str, Any] = {
            "state": state,
            "updated_at": at,
            "deadline": deadline,
            "attempts": row.attempts + 1,
            "payload": merged,
            "error": error,
        }
        try:
            with durable_begin(self.engine) as conn:
                done = conn.execute(
                    update(t).where(and_(t.c.id == row.id, t.c.state == row.state)).values(**values)
                )
                if done.rowcount != 1:
                    return None
        except SQLAlchemyError as exc:
            raise StoreError(f"could not advance transaction {row.id}: {one_line(exc)}") from exc
        return row.advanced(state, at, deadline, payload, error)

    def note(self, row: TransactionRow, payload: Mapping[str, Any], at: datetime) -> TransactionRow:
        """Merge ``payload`` into the row without changing its state (progress bookkeeping)."""
        t = schema.transactions
        merged = {**row.payload, **payload}
        try:
            with durable_begin(self.engine) as conn:
                conn.execute(
                    update(t)
                    .where(and_(t.c.id == row.id, t.c.state == row.state))
                    .values(payload=merged, updated_at=at)
                )
        except SQLAlchemyError as exc:
            raise StoreError(f"could not update transaction {row.id}: {one_line(exc)}") from exc
        return row.noted(payload, at)

    def in_states(self, kinds: Collection[str], states: Collection[str]) -> list[TransactionRow]:
        t = schema.transactions
        stmt = (
            select(t)
            .where(
                and_(
                    t.c.cluster == self.cluster,
                    t.c.kind.in_(list(kinds)),
                    t.c.state.in_(list(states)),
                )
            )
            .order_by(t.c.id)
        )
        try:
            with self.engine.connect() as conn:
                return [_row(r) for r in conn.execute(stmt)]
        except SQLAlchemyError as exc:
            raise StoreError(f"could not read transactions: {one_line(exc)}") from exc

    def recent(
        self, kinds: Collection[str], *, job_id: int | None = None, limit: int = 100
    ) -> list[TransactionRow]:
        """Newest first."""
        t = schema.transactions
        cond = and_(t.c.cluster == self.cluster, t.c.kind.in_(list(kinds)))
        if job_id is not None:
            cond = and_(cond, t.c.job_id == job_id)
        stmt = select(t).where(cond).order_by(t.c.id.desc()).limit(limit)
        try:
            with self.engine.connect() as conn:
                return [_row(r) for r in conn.execute(stmt)]
        except SQLAlchemyError as exc:
            raise StoreError(f"could not read transactions: {one_line(exc)}") from exc

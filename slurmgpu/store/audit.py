"""The audit: every policy decision, taken or suppressed, with its reason and numbers.

Also answers what policies need to remember between cycles: warnings already issued,
when a job was last acted on, how many actions a user got in the last hour.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, bindparam, func, insert, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from slurmgpu.cycle.guardrails import Taken
from slurmgpu.intent import SetTimeLimit
from slurmgpu.policy.base import ORDERING_ALERT, Decision, PriorAlert
from slurmgpu.policy.limit_restore import LIMIT_RESTORE_ALERT, LimitChanges
from slurmgpu.policy.rightsize_undo import RIGHTSIZE_UNDO_ALERT, RightsizeChanges
from slurmgpu.slurm.update import audit_fields, field_name
from slurmgpu.store import schema
from slurmgpu.store.database import StoreError
from slurmgpu.store.health import one_line
from slurmgpu.store.schema import as_utc

_TIME_LIMIT = field_name(SetTimeLimit(0))  # the audit's field of a time limit change

# A decision that no guardrail held back counts as issued for escalation (warn → act) in
# every mode, observe included (else an observe-mode policy would never get past its
# first warning); cooldowns and per-user rate limits count executed changes ("done") only.
ISSUED = ("done", "notified", "skipped")


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One row of the audit, as ``sgpu actions`` shows it."""

    id: int
    at: datetime
    job_id: int | None
    user: str
    policy: str
    kind: str
    mode: str
    outcome: str
    reason: str
    suppressed: str
    numbers: dict[str, Any]
    fields: dict[str, str]
    error: str | None
    caller_uid: int | None


class AuditStore:
    """Writes decisions and their outcomes; reads the policy memory back."""

    def __init__(self, engine: Engine, cluster: str = "") -> None:
        self.engine = engine
        self.cluster = cluster

    def record(
        self, decisions: Sequence[Decision], at: datetime, *, slurm_version: str = ""
    ) -> list[int]:
        """Store decisions before anything is done about them; return their ids.

        ``fields`` holds each action's intents as ``slurm_version`` spells them
        (:func:`~slurmgpu.slurm.update.audit_fields`: the ``scontrol update`` fields, a
        resize's ``from_gpus``/``to_gpus``), the format every row has had.
        """
        if not decisions:
            return []
        a = schema.actions
        uid = os.geteuid()
        rows = [
            {
                "at": at,
                "cluster": self.cluster,
                "job_id": d.action.job_id,
                "user": d.action.user,
                "policy": d.action.policy,
                "kind": d.action.kind,
                "mode": d.mode.value,
                "taken": False,
                "reason": d.action.reason,
                "numbers": dict(d.action.numbers),
                "alert": d.action.alert,
                "fields": audit_fields(d.action.intents, slurm_version) or None,
                "execute": d.execute,
                "notify": d.notify,
                "suppressed": d.suppressed,
                "outcome": "pending" if (d.execute or d.notify) else "skipped",
                "caller_uid": uid,
            }
            for d in decisions
        ]
        try:
            with self.engine.begin() as conn:
                result = conn.execute(
                    insert(a).returning(a.c.id, sort_by_parameter_order=True), rows
                )
                return [int(r[0]) for r in result]
        except SQLAlchemyError as exc:
            raise StoreError(f"could not record policy decisions: {one_line(exc)}") from exc

    def record_admin(
        self,
        kind: str,
        reason: str,
        *,
        at: datetime,
        caller_uid: int,
        user: str = "",
        job_id: int | None = None,
    ) -> int:
        """Store an administrator's action (policy ``admin``, outcome ``done``); return its id.

        Called before the action's effect is handed out, so nothing is done unaudited.
        """
        a = schema.actions
        row = {
            "at": at,
            "cluster": self.cluster,
            "job_id": job_id,
            "user": user,
            "policy": "admin",
            "kind": kind,
            "mode": "enforce",
            "taken": True,
            "reason": reason,
            "execute": True,
            "outcome": "done",
            "caller_uid": caller_uid,
        }
        try:
            with self.engine.begin() as conn:
                return int(conn.execute(insert(a).values(row).returning(a.c.id)).scalar_one())
        except SQLAlchemyError as exc:
            raise StoreError(f"could not audit the admin action {kind}: {one_line(exc)}") from exc

    def link_transaction(self, action_id: int, transaction_id: int) -> None:
        """Point a decision's row at the transaction that carries it out (a resize)."""
        a = schema.actions
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    update(a).where(a.c.id == action_id).values(transaction_id=transaction_id)
                )
        except SQLAlchemyError as exc:
            raise StoreError(f"could not link action {action_id} to its transaction") from exc

    def set_outcome(self, action_id: int, outcome: str, error: str | None = None) -> None:
        a = schema.actions
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    update(a)
                    .where(a.c.id == action_id)
                    .values(outcome=outcome, error=error, taken=outcome == "done")
                )
        except SQLAlchemyError as exc:
            why = one_line(exc)
            raise StoreError(f"could not record the outcome of action {action_id}: {why}") from exc

    def set_outcomes(self, outcomes: Sequence[tuple[int, str, str | None]]) -> None:
        """Record many ``(action id, outcome, error)`` in one transaction."""
        if not outcomes:
            return
        a = schema.actions
        stmt = (
            update(a)
            .where(a.c.id == bindparam("_id"))
            .values(
                outcome=bindparam("_outcome"), error=bindparam("_error"), taken=bindparam("_taken")
            )
        )
        rows = [
            {"_id": i, "_outcome": outcome, "_error": error, "_taken": outcome == "done"}
            for i, outcome, error in outcomes
        ]
        try:
            with self.engine.begin() as conn:
                conn.execute(stmt, rows)
        except SQLAlchemyError as exc:
            why = one_line(exc)
            raise StoreError(f"could not record the outcome of {len(rows)} actions: {why}") from exc

    def pending(self) -> list[int]:
        """Ids of decisions recorded but never carried out (a daemon died in between)."""
        return [r.id for r in self.pending_records()]

    def pending_records(self) -> list[AuditRecord]:
        """Decisions recorded but never carried out, oldest first."""
        a = schema.actions
        stmt = (
            select(a)
            .where(and_(a.c.cluster == self.cluster, a.c.outcome == "pending"))
            .order_by(a.c.id)
        )
        try:
            with self.engine.connect() as conn:
                return [_record(r) for r in conn.execute(stmt).mappings()]
        except SQLAlchemyError as exc:
            raise StoreError(f"could not read interrupted decisions: {one_line(exc)}") from exc

    # -- policy memory -----------------------------------------------------------

    def alerts(self, job_ids: Sequence[int]) -> list[PriorAlert]:
        """Warnings and actions issued (not held back by a guardrail), oldest first."""
        a = schema.actions
        out: list[PriorAlert] = []
        ids = list(job_ids)
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):
                stmt = (
                    select(a.c.job_id, a.c.policy, a.c.kind, a.c.alert, a.c.at)
                    .where(
                        and_(
                            a.c.cluster == self.cluster,
                            a.c.job_id.in_(ids[i : i + 500]),
                            a.c.outcome.in_(ISSUED),
                            a.c.suppressed == "",
                        )
                    )
                    .order_by(a.c.at, a.c.id)
                )
                for job_id, policy, kind, alert, at in conn.execute(stmt):
                    out.append(PriorAlert(int(job_id), policy, alert or kind, at))
        out.sort(key=lambda p: p.at)
        return out

    def _changes_since(self, since: datetime) -> ColumnElement[bool]:
        """The executed changes after ``since``: what cooldowns and rate limits count
        (reordering the queue is no change)."""
        a = schema.actions
        return and_(
            a.c.cluster == self.cluster,
            a.c.at >= since,
            a.c.outcome == "done",
            a.c.alert != ORDERING_ALERT,
        )

    def taken_since(self, since: datetime) -> list[Taken]:
        """Changes made since ``since``, oldest first: what seeds the daemon's guardrail
        records (``cycle.guardrails``): cooldowns, each job's last policy, each user's rate."""
        a = schema.actions
        stmt = (
            select(a.c.job_id, a.c.user, a.c.policy, a.c.at)
            .where(self._changes_since(since))
            .order_by(a.c.at, a.c.id)
        )
        with self.engine.connect() as conn:
            return [
                Taken(None if j is None else int(j), str(u), str(p), as_utc(at))
                for j, u, p, at in conn.execute(stmt)
            ]

    def failed_since(self, since: datetime) -> list[Taken]:
        """Changes Slurm refused since ``since``, oldest first: what seeds the guardrail
        records' retry hold (``cycle.guardrails``)."""
        a = schema.actions
        stmt = (
            select(a.c.job_id, a.c.user, a.c.policy, a.c.at)
            .where(
                a.c.cluster == self.cluster,
                a.c.at >= since,
                a.c.outcome == "failed",
                a.c.alert != ORDERING_ALERT,
                a.c.job_id.is_not(None),
                # a decision a daemon stop left unapplied was never sent: redo it
                or_(a.c.error.is_(None), a.c.error.not_like("interrupted%")),
            )
            .order_by(a.c.at, a.c.id)
        )
        with self.engine.connect() as conn:
            return [Taken(int(j), str(u), str(p), as_utc(at)) for j, u, p, at in conn.execute(stmt)]

    def _actions_of(
        self,
        job_ids: Sequence[int],
        columns: tuple[ColumnElement[Any], ...],
        condition: ColumnElement[bool],
        *,
        what: str,
    ) -> list[tuple[Any, ...]]:
        """``columns`` of this cluster's actions on ``job_ids`` that meet ``condition``, in
        the order they were written (500 ids a query); StoreError naming ``what``."""
        a = schema.actions
        ids = sorted(set(job_ids))
        rows: list[tuple[Any, ...]] = []
        try:
            with self.engine.connect() as conn:
                for i in range(0, len(ids), 500):
                    stmt = (
                        select(*columns)
                        .where(
                            and_(
                                a.c.cluster == self.cluster,
                                a.c.job_id.in_(ids[i : i + 500]),
                                condition,
                            )
                        )
                        .order_by(a.c.id)
                    )
                    rows.extend(tuple(row) for row in conn.execute(stmt))
        except SQLAlchemyError as exc:
            raise StoreError(f"could not read {what}: {one_line(exc)}") from exc
        return rows

    def limit_changes(self, job_ids: Sequence[int]) -> dict[int, LimitChanges]:
        """Job -> what the daemon did to its time limit (executed decisions only): the
        limit it had before the first change (a rightsize's ``time_limit_current_s``, a
        resize's ``time_limit_was_s``) and how often it was requeued with it after a
        timeout (:mod:`slurmgpu.policy.limit_restore`). Jobs never changed are left out."""
        a = schema.actions
        out: dict[int, LimitChanges] = {}
        rows = self._actions_of(
            job_ids,
            (a.c.job_id, a.c.alert, a.c.numbers, a.c.fields),
            a.c.outcome == "done",
            what="time limit changes",
        )
        for job_id, alert, numbers, fields in rows:
            was = out.get(int(job_id), LimitChanges())
            if alert == LIMIT_RESTORE_ALERT:
                was = LimitChanges(was.asked_s, was.restores + 1)
            elif was.asked_s is None and _TIME_LIMIT in (fields or {}):
                n = numbers or {}
                asked = n.get("time_limit_current_s", n.get("time_limit_was_s"))
                if isinstance(asked, int | float):
                    was = LimitChanges(float(asked), was.restores)
            out[int(job_id)] = was
        return {k: v for k, v in out.items() if v.asked_s is not None}

    def rightsize_changes(self, job_ids: Sequence[int]) -> dict[int, RightsizeChanges]:
        """Job -> what its executed rightsize updates lowered: each field's value before
        the first lowering (the action's ``*_current`` numbers) and whether the job was
        undone since (:mod:`slurmgpu.policy.rightsize_undo`). Jobs never rightsized are
        left out."""
        a = schema.actions
        out: dict[int, RightsizeChanges] = {}
        rows = self._actions_of(
            job_ids,
            (a.c.job_id, a.c.alert, a.c.numbers, a.c.outcome),
            and_(
                a.c.policy == "rightsize",
                a.c.kind == "update",
                a.c.outcome.in_(("done", "failed")),
            ),
            what="rightsize changes",
        )
        for job_id, alert, numbers, outcome in rows:
            was = out.get(int(job_id), RightsizeChanges())
            if alert == RIGHTSIZE_UNDO_ALERT:
                was = (
                    replace(was, undone=True)
                    if outcome == "done"
                    else replace(was, undo_failures=was.undo_failures + 1)
                )
            elif outcome == "done":
                was = _rightsize_change(was, numbers or {})
            out[int(job_id)] = was
        return {k: v for k, v in out.items() if v.lowered}

    def rightsize_undos(self) -> list[tuple[str, str, str, str]]:
        """(user, name, partition, reason) of every rightsize undo Slurm took
        (:mod:`slurmgpu.policy.rightsize_undo`), oldest first."""
        a = schema.actions
        stmt = (
            select(a.c.user, a.c.numbers)
            .where(
                and_(
                    a.c.cluster == self.cluster,
                    a.c.alert == RIGHTSIZE_UNDO_ALERT,
                    a.c.outcome == "done",
                )
            )
            .order_by(a.c.id)
        )
        out: list[tuple[str, str, str, str]] = []
        try:
            with self.engine.connect() as conn:
                for user, numbers in conn.execute(stmt):
                    n = numbers or {}
                    name, partition, reason = n.get("name"), n.get("partition"), n.get("reason")
                    if isinstance(name, str) and isinstance(partition, str):
                        out.append((user, name, partition, str(reason or "")))
        except SQLAlchemyError as exc:
            raise StoreError(f"could not read rightsize undos: {one_line(exc)}") from exc
        return out

    # -- reading the audit -------------------------------------------------------

    def latest_by_job(self, job_ids: Sequence[int]) -> dict[int, AuditRecord]:
        """Job → its newest decision (any policy, any outcome), for live views."""
        a = schema.actions
        out: dict[int, AuditRecord] = {}
        ids = sorted(set(job_ids))
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):
                newest = (
                    select(func.max(a.c.id))
                    .where(and_(a.c.cluster == self.cluster, a.c.job_id.in_(ids[i : i + 500])))
                    .group_by(a.c.job_id)
                )
                for r in conn.execute(select(a).where(a.c.id.in_(newest))).mappings():
                    out[int(r["job_id"])] = _record(r)
        return out

    def list(
        self,
        *,
        job_id: int | None = None,
        policy: str | None = None,
        user: str | None = None,
        include_skipped: bool = True,
        limit: int = 200,
    ) -> list[AuditRecord]:
        a = schema.actions
        cond = [a.c.cluster == self.cluster]
        if job_id is not None:
            cond.append(a.c.job_id == job_id)
        if policy:
            cond.append(a.c.policy == policy)
        if user:
            cond.append(a.c.user == user)
        if not include_skipped:
            cond.append(a.c.outcome != "skipped")
        stmt = select(a).where(and_(*cond)).order_by(a.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(stmt).mappings()]


def _record(r: Any) -> AuditRecord:
    return AuditRecord(
        id=int(r["id"]),
        at=as_utc(r["at"]),
        job_id=r["job_id"],
        user=r["user"],
        policy=r["policy"],
        kind=r["kind"],
        mode=r["mode"],
        outcome=r["outcome"],
        reason=r["reason"],
        suppressed=r["suppressed"],
        numbers=dict(r["numbers"] or {}),
        fields=dict(r["fields"] or {}),
        error=r["error"],
        caller_uid=r["caller_uid"],
    )


def _number(numbers: dict[str, Any], key: str) -> float | None:
    value = numbers.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _rightsize_change(was: RightsizeChanges, numbers: dict[str, Any]) -> RightsizeChanges:
    """``was`` with one more executed rightsize update: a field keeps the value it had
    before its first lowering."""
    time_s = was.time_limit_s
    if time_s is None and "time_limit_proposed_s" in numbers:
        time_s = _number(numbers, "time_limit_current_s")
    memory = was.memory_per_node_mib
    if memory is None and (m := _number(numbers, "memory_per_node_current_mib")) is not None:
        memory = int(m)
    cpus = was.cpus
    if cpus is None and (c := _number(numbers, "cpus_current")) is not None:
        cpus = int(c)
    gpus, per_node = was.gpus, was.gpus_per_node
    if gpus is None:
        if (g := _number(numbers, "gpus_per_node_current")) is not None:
            gpus, per_node = int(g), True
        elif (g := _number(numbers, "gpus_current")) is not None:
            gpus, per_node = int(g), False
    return replace(
        was,
        time_limit_s=time_s,
        memory_per_node_mib=memory,
        cpus=cpus,
        gpus=gpus,
        gpus_per_node=per_node,
    )

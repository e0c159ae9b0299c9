"""The actuator's audit trail on a real SQLite store: every decision gets its outcome,
a change made in Slurm as soon as it is made, the rest (notices, changes Slurm refused,
decisions that raised) together in one transaction, whatever their number."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import event

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.intent import SetTimeLimit
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from tests.fakes import FakeSlurm
from tests.unit.policy_builders import pending_job

AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _decision(job_id: int, kind: str, *, execute: bool, notify: bool, why: str = "") -> Decision:
    intents = (SetTimeLimit(3600),) if kind == "update" else ()
    action = Action("p", kind, job_id, "alice", f"{kind} {job_id}", {}, intents)
    return Decision(action, Mode.ENFORCE, execute, notify, why)


class Raising:
    """A notifier that raises for one job: that decision fails, the others go on."""

    def notify(self, action: Action, *, at: datetime) -> str:
        if action.job_id == 7:
            raise RuntimeError("mail server on fire")
        return "sent"


def test_every_decision_gets_its_outcome_in_three_transactions(store: JobStore) -> None:
    slurm = FakeSlurm([pending_job(1), pending_job(7)])  # job 99 is not in Slurm: its change fails
    audit = AuditStore(store.engine, store.cluster)
    actuator = Actuator(slurm, audit, Raising())
    notices = [_decision(100 + i, "warn", execute=False, notify=True) for i in range(50)]
    decisions = [
        _decision(1, "update", execute=True, notify=False),
        _decision(99, "update", execute=True, notify=False),
        _decision(7, "warn", execute=False, notify=True),
        _decision(3, "update", execute=False, notify=False, why="cycle limit"),
        *notices,
    ]
    commits: list[int] = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    results = actuator.carry_out(decisions, AT)

    assert [r.outcome for r in results[:4]] == ["done", "failed", "failed", "skipped"]
    assert {r.outcome for r in results[4:]} == {"notified"}
    # the audit agrees, and nothing is left pending
    stored = {r.job_id: (r.outcome, r.error) for r in audit.list(limit=100)}
    assert stored[1] == ("done", None)
    assert stored[99][0] == "failed" and "Invalid job id" in (stored[99][1] or "")
    assert stored[7] == ("failed", "mail server on fire")
    assert stored[3] == ("skipped", None)
    assert {stored[100 + i] for i in range(50)} == {("notified", None)}
    assert audit.pending() == []
    # the record, the change made, then every other outcome at once: 3, not 1 + 53
    assert len(commits) == 3

"""Carries out the engine's decisions through Slurm and the notifier, and audits each one.

Order per decision: the decision is already in the audit (outcome ``pending``) before
anything happens; then the Slurm change (enforce mode only), then the notification;
then the outcome is stored. A daemon killed in between leaves ``pending`` rows. The next
daemon never replays them: it checks each against Slurm's listing (``actuate.confirm``)
and records it ``done`` ("interrupted; taken (confirmed after restart)") when the change
is in place, ``failed`` ("interrupted; not applied") when it is not, and ``failed``
("interrupted … not confirmed") when Slurm's listing cannot tell (a warning, a job that
has left the listing). The next cycle decides again from a fresh snapshot, so a change
not applied is proposed again and a confirmed one counts for cooldowns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from slurmgpu.actuate.confirm import Verdict, judge
from slurmgpu.actuate.execute import execute_action
from slurmgpu.actuate.separate import recover_separations
from slurmgpu.model import Job
from slurmgpu.policy.base import Action, Decision
from slurmgpu.slurm.client import SlurmClient, SlurmError
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.database import StoreError

log = logging.getLogger("slurmgpu.actuate")


class Notifier(Protocol):
    """Tells a user about an action; returns a one-word outcome ("sent", "rate_limited"…)."""

    def notify(self, action: Action, *, at: datetime) -> str: ...


@dataclass(frozen=True, slots=True)
class ActuationResult:
    decision: Decision
    action_id: int
    outcome: str  # done | notified | skipped | failed
    error: str | None = None


class Actuator:
    """Executes decisions: ``update`` → scontrol update, ``requeue``, ``cancel``, ``warn``."""

    def __init__(
        self, slurm: SlurmClient, audit: AuditStore, notifier: Notifier | None = None
    ) -> None:
        self.slurm = slurm
        self.audit = audit
        self.notifier = notifier
        # Ids of decisions a stopped daemon left pending, until they are judged.
        self._interrupted: set[int] = set()

    def recover(self) -> int:
        """Settle decisions a previous daemon recorded but did not finish; return how many.

        Half-done separations are finished first (no job may stay held). Each interrupted
        decision is then judged against Slurm's listing; when Slurm does not answer now,
        they stay ``pending`` until :meth:`settle_interrupted` gets the first listing.
        """
        stale = self.audit.pending()
        if not stale:
            return 0
        # A separation or a time limit's restore (rightsize's only requeue) stopped
        # between its requeuehold and release must not leave the job held.
        recover_separations(
            self.slurm,
            [*self.audit.list(policy="colocate"), *self.audit.list(policy="rightsize")],
            set(stale),
        )
        self._interrupted = set(stale)
        try:
            jobs = self.slurm.jobs()
        except SlurmError as exc:
            log.warning(
                "%d decision(s) interrupted by a daemon stop; Slurm did not answer (%s): "
                "they are checked against the first listing",
                len(stale),
                exc,
            )
            return len(stale)
        self.settle_interrupted(jobs)
        return len(stale)

    def settle_interrupted(self, jobs: Sequence[Job]) -> int:
        """Record what became of the interrupted decisions, judged on ``jobs`` (a listing
        taken after the restart); return how many were settled (0 once all are)."""
        if not self._interrupted:
            return 0
        by_id = {j.job_id: j for j in jobs}
        counts = dict.fromkeys(Verdict, 0)
        try:
            for r in self.audit.pending_records():
                if r.id not in self._interrupted:
                    continue
                verdict, why = judge(r.kind, r.fields, r.at, by_id.get(r.job_id or -1))
                if verdict is Verdict.TAKEN:
                    self.audit.set_outcome(
                        r.id, "done", f"interrupted; taken (confirmed after restart): {why}"
                    )
                elif verdict is Verdict.NOT_APPLIED:
                    self.audit.set_outcome(
                        r.id, "failed", f"interrupted; not applied (checked after restart): {why}"
                    )
                else:
                    self.audit.set_outcome(
                        r.id, "failed", f"interrupted: the daemon stopped; not confirmed: {why}"
                    )
                self._interrupted.discard(r.id)
                counts[verdict] += 1
        except StoreError as exc:
            log.error("%s; interrupted decisions are settled on a later cycle", exc)
            return 0
        settled = sum(counts.values())
        self._interrupted.clear()  # any left were settled by someone else (not pending)
        if settled:
            log.warning(
                "%d decision(s) interrupted by a daemon stop, checked in Slurm: %d taken "
                "(confirmed), %d not applied, %d not confirmed",
                settled,
                counts[Verdict.TAKEN],
                counts[Verdict.NOT_APPLIED],
                counts[Verdict.NOT_CONFIRMED],
            )
        return settled

    def _version(self) -> str:
        """The release the audit spells update fields for ("" -- the current spelling --
        when Slurm does not answer; the listing that came before has usually told it)."""
        try:
            return self.slurm.version()
        except SlurmError:
            return ""

    def _execute(self, action: Action) -> None:
        execute_action(self.slurm, action)

    def carry_out(self, decisions: Sequence[Decision], at: datetime) -> list[ActuationResult]:
        """Audit, then execute and notify; never raises for Slurm or mail trouble.

        The outcome of a change made in Slurm is recorded as soon as it is known; those of
        decisions that changed nothing (a notice, or a change that failed) together at
        the end, in one transaction: a first cycle on a deep queue notifies thousands of
        jobs, and a transaction each cost 0.25 ms apiece on SQLite (1,945 in 0.23 s on
        bench/policy.py's snapshot). A daemon stopped in between leaves them ``pending``,
        and the next one settles them (:meth:`recover`).
        """
        try:
            ids = self.audit.record(decisions, at, slurm_version=self._version())
        except StoreError as exc:
            # Without an audit row nothing may be done: acting unaudited is worse than waiting.
            log.error("%s; no action taken this cycle", exc)
            return []
        results = []
        later: list[tuple[int, str, str | None]] = []  # (action id, outcome, error)
        for decision, action_id in zip(decisions, ids, strict=True):
            try:
                result = self._one(decision, action_id, at)
            except Exception as exc:  # one job's trouble must not cost the others theirs
                a = decision.action
                log.exception("%s %s job %d raised; other jobs go on", a.policy, a.kind, a.job_id)
                result = ActuationResult(decision, action_id, "failed", str(exc)[:200])
            results.append(result)
            if result.outcome not in {"skipped", "done"}:
                later.append((action_id, result.outcome, result.error))
        if later:
            try:
                self.audit.set_outcomes(later)
            except StoreError as exc:
                log.error("%s", exc)
        return results

    def _one(self, decision: Decision, action_id: int, at: datetime) -> ActuationResult:
        """Execute and notify one decision; record its outcome here only when it made a
        change (``done``): the caller records the others."""
        action = decision.action
        if not (decision.execute or decision.notify):
            return ActuationResult(decision, action_id, "skipped")
        outcome, error = "notified", None
        if decision.execute and action.kind != "warn":
            try:
                self._execute(action)
                outcome = "done"
                log.info(
                    "%s %s job %d: %s", action.policy, action.kind, action.job_id, action.reason
                )
            except (SlurmError, ValueError) as exc:
                outcome, error = "failed", str(exc)
                log.warning(
                    "%s %s job %d failed: %s", action.policy, action.kind, action.job_id, exc
                )
        if decision.notify and outcome != "failed":
            # The warning counts as issued once it is in the audit (shown by sgpu actions,
            # sgpu eff); email is one more channel, and its trouble is recorded, not fatal.
            if self.notifier is None:
                log.info("advice for job %d (%s): %s", action.job_id, action.policy, action.reason)
            else:
                sent = self.notifier.notify(action, at=at)
                if sent == "failed":
                    error = "email notification failed (see the daemon log)"
        if outcome == "done":
            try:
                self.audit.set_outcome(action_id, outcome, error)
            except StoreError as exc:
                log.error("%s", exc)
        return ActuationResult(decision, action_id, outcome, error)

"""The policy engine: every policy's proposals → one audited decision each.

``PolicyEngine.decide(snapshot)`` asks each policy (in the order given) for actions and
returns exactly one :class:`~slurmgpu.policy.base.Decision` per proposed action, taken
or suppressed, so the audit is complete. Pure: time is ``snapshot.at``.

**One action per job per cycle.** When several proposals name the same job, the one with
the highest rank wins: :data:`ACTION_PRIORITY` of its kind (cancel > requeue > resize
> warn > update), then ``Action.priority``, then the earlier policy, then the earlier proposal.
The others are suppressed as ``superseded by …``.

**Guardrails**, in this order; the first that applies is the ``suppressed`` reason:

1. ``job not in snapshot`` — the job is gone;
2. ``exempt user`` / ``exempt partition`` (any partition a pending job lists) /
   ``exempt QOS`` / ``interactive job`` (``Job.batch`` false, while
   ``exempt_interactive``) — every kind, warnings included;
3. ``not opted in`` — ``Action.requires_opt_in`` and neither the job id nor its array
   id is in ``snapshot.opted_in``;
4. ``cooldown`` — a change (update, requeue, cancel) within ``job_cooldown`` of the
   job's last executed change (``snapshot.last_action_at``), unless the action is
   ``protective`` (it undoes a change before it hurts, e.g. a co-location separation).
   A ``resize`` is not held by it: the malleable policy spaces one job's resizes by its
   own ``min_interval`` (a shrink and the expansion back after the waiting job ended are
   minutes apart, well within a 30-minute cooldown);
5. ``rate limit`` (changes executed on one user's jobs in the past hour, counting this
   cycle's, reach ``max_actions_per_user_per_hour``) and ``cycle limit``
   (``max_actions_per_cycle`` changes this cycle) — these bound what slurmgpu does, so
   they count and apply to changes of policies in ``enforce`` mode only. Candidates are
   taken in rank order, then oldest job first (submit time, then job id).

**Modes.** A suppressed decision neither executes nor notifies. Otherwise ``observe``:
record only; ``advise``: notify, never execute; ``enforce``: changes execute and notify,
warnings notify (a warning is a notification; it never executes).

Decisions come back sorted by kind rank (highest first), then job id, then policy order.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

from slurmgpu.model import Job
from slurmgpu.policy.base import Action, Decision, Mode, Policy, PolicySnapshot
from slurmgpu.policy.settings import EngineSettings

__all__ = ["ACTION_PRIORITY", "CHANGE_KINDS", "PolicyEngine"]

ACTION_PRIORITY: dict[str, int] = {
    "cancel": 5,
    "requeue": 4,
    "resize": 3,
    "warn": 2,
    "update": 1,
}
CHANGE_KINDS = frozenset({"update", "requeue", "cancel", "resize"})
# Changes whose policy spaces them itself (MalleableSettings.min_interval), not job_cooldown.
_OWN_INTERVAL_KINDS = frozenset({"resize"})


class _Proposal:
    """One proposed action on its way to a decision."""

    __slots__ = (
        "action",
        "kind_rank",
        "mode",
        "order",
        "policy_index",
        "rank",
        "seq",
        "suppressed",
    )

    def __init__(self, seq: int, policy_index: int, mode: Mode, action: Action) -> None:
        self.seq = seq
        self.policy_index = policy_index
        self.mode = mode
        self.action = action
        self.kind_rank = ACTION_PRIORITY.get(action.kind, 0)
        # Higher is stronger: kind, then the action's own priority, then earlier policy,
        # then earlier proposal.
        self.rank = (self.kind_rank, action.priority, -policy_index, -seq)
        # Output order: kind rank, then job id; policy order and proposal order come from
        # a stable sort of the proposals as made (seq grows with the policy index).
        self.order = (-self.kind_rank, action.job_id)
        self.suppressed = ""


_ORDER = operator.attrgetter("order")


class PolicyEngine:
    """Runs policies with their modes and applies the guardrails of ``settings``."""

    def __init__(
        self,
        policies: Sequence[tuple[Policy, Mode]],
        settings: EngineSettings | None = None,
    ) -> None:
        self.policies = tuple(policies)
        self.settings = settings or EngineSettings()

    def decide(self, snapshot: PolicySnapshot) -> list[Decision]:
        """Return one decision per proposed action, in a deterministic order."""
        proposals: list[_Proposal] = []
        for index, (policy, given) in enumerate(self.policies):
            mode = Mode(given)  # once per policy, not per action
            seq = len(proposals)
            for action in policy.propose(snapshot):
                proposals.append(_Proposal(seq, index, mode, action))
                seq += 1
        if not proposals:
            return []

        wanted = {p.action.job_id for p in proposals}
        jobs = {j.job_id: j for j in snapshot.cluster.jobs if j.job_id in wanted}

        winners: dict[int, _Proposal] = {}
        for p in proposals:
            best = winners.get(p.action.job_id)
            if best is None or p.rank > best.rank:
                winners[p.action.job_id] = p
        for p in proposals:
            w = winners[p.action.job_id]
            if w is not p:
                p.suppressed = f"superseded by {w.action.policy} {w.action.kind} for this job"

        rated: list[_Proposal] = []
        for p in winners.values():
            p.suppressed = self._check(p.action, jobs.get(p.action.job_id), snapshot)
            if not p.suppressed and p.mode is Mode.ENFORCE and p.action.kind in CHANGE_KINDS:
                rated.append(p)
        self._rate_limit(rated, jobs, snapshot)

        proposals.sort(key=_ORDER)  # stable: ties keep policy order, then proposal order
        enforce, observe = Mode.ENFORCE, Mode.OBSERVE
        return [
            Decision(p.action, p.mode, execute=False, notify=False, suppressed=p.suppressed)
            if p.suppressed
            else Decision(
                p.action,
                p.mode,
                execute=p.mode is enforce and p.action.kind in CHANGE_KINDS,
                notify=p.mode is not observe,
            )
            for p in proposals
        ]

    def _check(self, action: Action, job: Job | None, snapshot: PolicySnapshot) -> str:
        """Return why a winning action is held back by a per-job guardrail, or ''."""
        s = self.settings
        if job is None:
            return "job not in snapshot"
        if job.user in s.exempt_users:
            return f"exempt user {job.user}"
        if s.exempt_partitions and job.partition:
            for part in job.partition.split(","):
                if part in s.exempt_partitions:
                    return f"exempt partition {part}"
        if job.qos and job.qos in s.exempt_qos:
            return f"exempt QOS {job.qos}"
        if s.exempt_interactive and not job.batch:
            return "interactive job (exempt)"
        if action.requires_opt_in and not (
            job.job_id in snapshot.opted_in
            or (job.array_job_id is not None and job.array_job_id in snapshot.opted_in)
        ):
            return "not opted in (rightsizing applies to opted-in jobs only)"
        if (
            action.kind in CHANGE_KINDS
            and action.kind not in _OWN_INTERVAL_KINDS
            and not action.protective
        ):
            last = snapshot.last_action_at.get(job.job_id)
            if last is not None and snapshot.at - last < s.job_cooldown:
                ago = int((snapshot.at - last).total_seconds() // 60)
                limit = int(s.job_cooldown.total_seconds() // 60)
                return f"cooldown: last change {ago} min ago (wait {limit} min)"
        return ""

    def _rate_limit(
        self, rated: list[_Proposal], jobs: dict[int, Job], snapshot: PolicySnapshot
    ) -> None:
        """Suppress enforce-mode changes beyond the per-user and per-cycle budgets."""
        s = self.settings

        def order(p: _Proposal) -> tuple[int, int, int, float, int]:
            job = jobs[p.action.job_id]
            submitted = job.submit_time.timestamp() if job.submit_time else math.inf
            return (
                -p.kind_rank,
                -p.action.priority,
                p.policy_index,
                submitted,
                p.action.job_id,
            )

        rated.sort(key=order)
        per_user: dict[str, int] = {}
        taken = 0
        for p in rated:
            user = jobs[p.action.job_id].user
            done = snapshot.user_actions_last_hour.get(user, 0) + per_user.get(user, 0)
            if done >= s.max_actions_per_user_per_hour:
                p.suppressed = (
                    f"rate limit: {done} changes to {user}'s jobs in the last hour "
                    f"(max {s.max_actions_per_user_per_hour})"
                )
            elif taken >= s.max_actions_per_cycle:
                p.suppressed = f"cycle limit: {s.max_actions_per_cycle} changes this cycle"
            else:
                per_user[user] = per_user.get(user, 0) + 1
                taken += 1

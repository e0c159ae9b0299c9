"""The policy engine: every policy's proposals → one audited decision each.

``PolicyEngine.decide(snapshot)`` asks each policy (in the order given) for actions and
returns exactly one :class:`~slurmgpu.policy.base.Decision` per proposed action, taken
or suppressed, so the audit is complete. Pure: time is ``snapshot.at``.

**One action per job per cycle.** When several proposals name the same job, the one with
the highest rank wins: :data:`ACTION_PRIORITY` of its kind (cancel > requeue > resize
> warn > update), then ``Action.priority``, then the earlier policy, then the earlier proposal.
The others are suppressed as ``superseded by …``. An *ordering* update
(:func:`~slurmgpu.policy.base.is_ordering`: a pending job's ``Nice``/``Priority`` only)
does not compete for the slot: it goes with whatever else wins for the job, unless that
is a requeue, resize or cancel (which stop the job anyway; a preemption carries its own
``Nice``). One plan per cycle: every policy's proposal is weighed before any executes.

**Guardrails**, in this order; the first that applies is the ``suppressed`` reason:

1. ``job not in snapshot`` — the job is gone;
2. ``exempt user`` / ``exempt partition`` (any partition a pending job lists) /
   ``exempt QOS`` / ``interactive job`` (``Job.batch`` false, while
   ``exempt_interactive``) — every kind, warnings included;
3. ``not opted in`` — ``Action.requires_opt_in`` and neither the job id nor its array
   id is in ``snapshot.opted_in``; ``resize in flight`` — any change but an ordering
   update to a job whose resize transaction is open (``snapshot.resizing``);
4. ``cooldown`` — a change (update, requeue, cancel) within ``job_cooldown`` of the
   job's last executed change (``snapshot.last_action_at``), unless the action is
   ``protective`` (it undoes a change before it hurts, e.g. a co-location separation)
   or an ordering update (it changes nothing about the job, only its place in line),
   or a follow-up: a change to a *pending* job by a policy that comes after the one that
   made its last change in the engine's order (``snapshot.last_action_by``; the order
   is the pipeline: rightsize adjusts a request, malleable then fits it to the cluster,
   so malleable's start smaller may follow rightsize's limit, but rightsize may not
   redo a limit malleable set for a smaller size) -- the cooldown stops one policy
   flapping a job and a running job being disturbed twice, not each stage taking its
   one step.
   A ``resize`` is not held by it: the malleable policy spaces one job's resizes by its
   own ``min_interval`` (a shrink and the expansion back after the waiting job ended are
   minutes apart, well within a 30-minute cooldown);
   ``failed in Slurm`` — a change (resizes included) by the policy whose last change
   on this job Slurm refused within ``job_cooldown`` (``snapshot.failed_at``): a
   release that refuses an update refuses it again, and the daemon cycles every few
   seconds (seen on the lab: 146 refused shard conversions in ten minutes on 22.05);
5. ``rate limit`` (changes executed on one user's jobs in the past hour, counting this
   cycle's, reach ``max_actions_per_user_per_hour``) and ``cycle limit``
   (``max_actions_per_cycle`` changes this cycle) — these bound what slurmgpu does, so
   they count and apply to changes of policies in ``enforce`` mode only, ordering
   updates excepted (the simulator and the audit do not count those either). Candidates are
   taken in rank order, then oldest job first (submit time, then job id);
6. ``needs the … change of job J`` — ``Action.needs``: the action depends on the same
   policy's action for job J this cycle (a rebalance's expansion on its donor's shrink),
   which was itself suppressed or superseded.

**Modes.** A suppressed decision neither executes nor notifies. Otherwise ``observe``:
record only; ``advise``: notify, never execute; ``enforce``: changes execute and notify,
warnings notify (a warning is a notification; it never executes).

Decisions come back sorted by kind rank (highest first), then job id, then policy order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import (
    ORDERING_ALERT,
    Action,
    Decision,
    Mode,
    Policy,
    PolicySnapshot,
    is_ordering,
)
from slurmgpu.policy.isolate import PolicyFailure, propose_isolated
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
# Winners that stop the job: an ordering update for it is moot this cycle.
_STOPS_JOB = frozenset({"requeue", "resize", "cancel"})


# Output order is (kind rank, highest first; job id), ties in policy then proposal order.
# As one int per proposal (kind band * _BAND + job id) a stable sort of the proposals
# needs no tuple keys; job ids at or above _BAND (Slurm's are 32-bit) sort by tuples.
_BAND = 1 << 48
_KIND_BAND = {
    kind: (max(ACTION_PRIORITY.values()) - rank) * _BAND for kind, rank in ACTION_PRIORITY.items()
}
_UNKNOWN_BAND = (max(ACTION_PRIORITY.values())) * _BAND


class PolicyEngine:
    """Runs policies with their modes and applies the guardrails of ``settings``."""

    def __init__(
        self,
        policies: Sequence[tuple[Policy, Mode]],
        settings: EngineSettings | None = None,
    ) -> None:
        self.policies = tuple(policies)
        self.settings = settings or EngineSettings()
        # What the last decide() left out because a policy raised (the daemon logs them).
        self.failures: list[PolicyFailure] = []
        # Policies are stages in the order given (rightsize adjusts a request, malleable
        # then fits it to the cluster): a later stage may follow an earlier one's change.
        self._stage: dict[str, int] = {}
        for index, (policy, _) in enumerate(self.policies):
            self._stage.setdefault(policy.name, index)

    def decide(self, snapshot: PolicySnapshot) -> list[Decision]:
        """Return one decision per proposed action, in a deterministic order."""
        # Flat lists, one entry per proposal in the order made: a queue of 100,000 jobs
        # proposes tens of thousands of actions a cycle, and an object per proposal
        # (with its rank tuples) cost as much as the policies themselves.
        actions: list[Action] = []
        modes: list[Mode] = []
        owners: list[int] = []  # the proposing policy's index
        self.failures = []
        for index, (policy, given) in enumerate(self.policies):
            mode = Mode(given)  # once per policy, not per action
            # A policy that raises loses the jobs it raised on (or its turn), not the cycle.
            made, failed = propose_isolated(policy, snapshot)
            self.failures.extend(failed)
            actions.extend(made)
            modes.extend([mode] * len(made))
            owners.extend([index] * len(made))
        n = len(actions)
        if not n:
            return []
        suppressed = [""] * n

        # One action per job: the first proposal for a job holds its slot unless a later
        # one outranks it (kind, then the action's priority; ties keep the earlier).
        winner: dict[int, int] = {}
        contested: set[int] = set()
        ordering: list[int] = []
        for i, action in enumerate(actions):
            # the alert first: one comparison rules out nearly every proposal
            if action.alert == ORDERING_ALERT and is_ordering(action):
                ordering.append(i)
                continue
            w = winner.setdefault(action.job_id, i)
            if w != i:
                contested.add(action.job_id)
                if _strength(action) > _strength(actions[w]):
                    winner[action.job_id] = i
        if contested:
            for i, action in enumerate(actions):
                if action.job_id in contested:
                    w = winner[action.job_id]
                    if w != i:
                        best = actions[w]
                        suppressed[i] = f"superseded by {best.policy} {best.kind} for this job"

        by_id = snapshot.cluster.jobs_by_id()
        rated: list[int] = []
        check = self._check
        enforce, observe = Mode.ENFORCE, Mode.OBSERVE
        for i in winner.values():
            action = actions[i]
            why = suppressed[i] = check(action, by_id.get(action.job_id), snapshot)
            if not why and modes[i] is enforce and action.kind in CHANGE_KINDS:
                rated.append(i)
        self._rate_limit(rated, actions, owners, suppressed, by_id, snapshot)
        for i in winner.values():
            action = actions[i]
            if action.needs is None or suppressed[i]:
                continue
            partner = winner.get(action.needs)
            if (
                partner is None
                or suppressed[partner]
                or actions[partner].policy != action.policy
                or modes[partner] is not modes[i]
            ):
                suppressed[i] = f"needs the {action.policy} change of job {action.needs}"
        for i in ordering:
            action = actions[i]
            won = winner.get(action.job_id)
            if won is not None and actions[won].kind in _STOPS_JOB:
                best = actions[won]
                suppressed[i] = f"superseded by {best.policy} {best.kind} for this job"
            else:
                suppressed[i] = check(action, by_id.get(action.job_id), snapshot)

        # stable sorts: ties keep the order made
        if all(0 <= a.job_id < _BAND for a in actions):
            bands = _KIND_BAND
            keys = [bands.get(a.kind, _UNKNOWN_BAND) + a.job_id for a in actions]
            ordered = sorted(range(n), key=keys.__getitem__)
        else:
            wide = [(-ACTION_PRIORITY.get(a.kind, 0), a.job_id) for a in actions]
            ordered = sorted(range(n), key=wide.__getitem__)
        # Positional (action, mode, execute, notify, suppressed): msgspec matches keywords
        # by name, and a big queue's cycle builds tens of thousands of decisions.
        return [
            Decision(actions[i], modes[i], False, False, suppressed[i])
            if suppressed[i]
            else Decision(
                actions[i],
                modes[i],
                modes[i] is enforce and actions[i].kind in CHANGE_KINDS,
                modes[i] is not observe and not is_ordering(actions[i]),
            )
            for i in ordered
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
            job.job_id in snapshot.resizing
            and action.kind in CHANGE_KINDS
            and action.kind != "resize"
            and not is_ordering(action)
        ):
            # Between its requeue and its restart the job is pending, but its request and
            # limit are the resize's: another change now would undo them (a limit cut
            # for the old size killed it at the new one).
            return "resize in flight"
        if (
            action.kind in CHANGE_KINDS
            and action.kind not in _OWN_INTERVAL_KINDS
            and not action.protective
            and not is_ordering(action)
        ):
            last = snapshot.last_action_at.get(job.job_id)
            by = snapshot.last_action_by.get(job.job_id)
            stage = self._stage
            follow_up = (
                job.state is JobState.PENDING
                and by in stage
                and action.policy in stage
                and stage[by] < stage[action.policy]
            )
            if last is not None and snapshot.at - last < s.job_cooldown and not follow_up:
                ago = int((snapshot.at - last).total_seconds() // 60)
                limit = int(s.job_cooldown.total_seconds() // 60)
                return f"cooldown: last change {ago} min ago (wait {limit} min)"
        if action.kind in CHANGE_KINDS and not is_ordering(action):
            failed = snapshot.failed_at.get((job.job_id, action.policy))
            if failed is not None and snapshot.at - failed < s.job_cooldown:
                ago = int((snapshot.at - failed).total_seconds() // 60)
                limit = int(s.job_cooldown.total_seconds() // 60)
                return f"failed in Slurm {ago} min ago: not retried for {limit} min"
        return ""

    def _rate_limit(
        self,
        rated: list[int],
        actions: list[Action],
        owners: list[int],
        suppressed: list[str],
        by_id: Mapping[int, Job],
        snapshot: PolicySnapshot,
    ) -> None:
        """Suppress enforce-mode changes beyond the per-user and per-cycle budgets.

        ``rated`` indexes ``actions``; a held-back change gets its reason in ``suppressed``.
        """
        s = self.settings

        def order(i: int) -> tuple[int, int, int, float, int]:
            action = actions[i]
            job = by_id[action.job_id]
            submitted = job.submit_time.timestamp() if job.submit_time else math.inf
            return (
                -ACTION_PRIORITY.get(action.kind, 0),
                -action.priority,
                owners[i],
                submitted,
                action.job_id,
            )

        rated.sort(key=order)
        per_user: dict[str, int] = {}
        taken = 0
        for i in rated:
            user = by_id[actions[i].job_id].user
            done = snapshot.user_actions_last_hour.get(user, 0) + per_user.get(user, 0)
            if done >= s.max_actions_per_user_per_hour:
                suppressed[i] = (
                    f"rate limit: {done} changes to {user}'s jobs in the last hour "
                    f"(max {s.max_actions_per_user_per_hour})"
                )
            elif taken >= s.max_actions_per_cycle:
                suppressed[i] = f"cycle limit: {s.max_actions_per_cycle} changes this cycle"
            else:
                per_user[user] = per_user.get(user, 0) + 1
                taken += 1


def _strength(action: Action) -> tuple[int, int]:
    """How strongly an action claims its job: its kind's rank, then its own priority."""
    return (ACTION_PRIORITY.get(action.kind, 0), action.priority)

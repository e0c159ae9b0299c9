"""What the engine's guardrails count: each job's last executed change (the cooldown, and
which policy made it), each user's changes in the last hour (the rate limit), and each
policy's last change on a job that Slurm refused (not retried within the cooldown).

One in-memory record used by the daemon and the simulator alike. The simulator only
appends as it acts; the daemon seeds it from its audit (the durable copy) when it starts
and whenever decisions a stopped daemon left pending are settled, and appends as it
acts. An ordering update (``policy.base.is_ordering``) is no change and is never
recorded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slurmgpu.policy.base import Action, is_ordering

__all__ = ["TAKEN_OUTCOMES", "GuardrailRecords", "GuardrailView", "Taken"]

# Outcomes of a change that was made (a resize counts once its transaction started).
TAKEN_OUTCOMES = frozenset({"done", "started"})
HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Taken:
    """One executed change: on which job (None: an administrator's action), whose, by
    which policy, when."""

    job_id: int | None
    user: str
    policy: str
    at: datetime


@dataclass(frozen=True, slots=True)
class GuardrailView:
    """The PolicySnapshot fields the engine's guardrails read."""

    last_action_at: dict[int, datetime]
    last_action_by: dict[int, str]
    user_actions_last_hour: dict[str, int]
    failed_at: dict[tuple[int, str], datetime] = field(default_factory=dict)


class GuardrailRecords:
    """Each job's newest change and each user's changes, newest last.

    Changes must be recorded in time order (a cycle's ``at`` only grows); :meth:`view`
    forgets what has left its windows.
    """

    def __init__(self, taken: Iterable[Taken] = (), failed: Iterable[Taken] = ()) -> None:
        self._last: dict[int, tuple[datetime, str]] = {}
        self._users: dict[str, deque[datetime]] = {}
        self._failed: dict[tuple[int, str], datetime] = {}
        self.reset(taken, failed)

    def reset(self, taken: Iterable[Taken], failed: Iterable[Taken] = ()) -> None:
        """Forget everything, then record ``taken`` and ``failed`` (oldest first)."""
        self._last.clear()
        self._users.clear()
        self._failed.clear()
        for t in taken:
            self.record(t.job_id, t.user, t.policy, t.at)
        for t in failed:
            if t.job_id is not None:
                self._failed[(t.job_id, t.policy)] = t.at

    def record(self, job_id: int | None, user: str, policy: str, at: datetime) -> None:
        if job_id is not None:
            self._last[job_id] = (at, policy)
        self._users.setdefault(user, deque()).append(at)

    def record_action(self, action: Action, outcome: str, at: datetime) -> bool:
        """Record ``action`` if its outcome is a change made (or a change Slurm refused:
        not retried within the cooldown); return whether a change was made."""
        if is_ordering(action):
            return False
        if outcome == "failed":
            self._failed[(action.job_id, action.policy)] = at
            return False
        if outcome not in TAKEN_OUTCOMES:
            return False
        self._failed.pop((action.job_id, action.policy), None)
        self.record(action.job_id, action.user, action.policy, at)
        return True

    def view(self, at: datetime, cooldown: timedelta) -> GuardrailView:
        """Changes since ``at - cooldown`` per job, and per user since ``at`` - 1 hour."""
        since = at - cooldown
        last_at: dict[int, datetime] = {}
        last_by: dict[int, str] = {}
        old = []
        for job_id, (t, policy) in self._last.items():
            if t >= since:
                last_at[job_id] = t
                last_by[job_id] = policy
            else:
                old.append(job_id)
        for job_id in old:
            del self._last[job_id]
        hour_ago = at - HOUR
        per_user: dict[str, int] = {}
        for user, times in list(self._users.items()):
            while times and times[0] < hour_ago:
                times.popleft()
            if times:
                per_user[user] = len(times)
            else:
                del self._users[user]
        failed: dict[tuple[int, str], datetime] = {}
        for key, t in list(self._failed.items()):
            if t >= since:
                failed[key] = t
            else:
                del self._failed[key]
        return GuardrailView(last_at, last_by, per_user, failed)

"""Idle GPUs: warn the owner of a running job whose GPUs do nothing, then act.

Job Defense Shield's zero-utilisation alert (docs/ANCHORS.md §1), on agents' samples:

- A GPU's idle time is ``GpuStat.trailing_idle``: how long every sample has been zero up
  to its last sample (since the job started if it was never busy). A GPU with fewer
  than ``min_samples`` samples, no utilisation figure, or a last sample older than
  ``max_sample_age`` is *unknown*, and an unknown GPU is never idle (no agent, no
  verdict). A job's allocated GPUs come from ``Job.gpu_allocations``.
- A job is idle for ``D`` when at least ``k = ceil(idle_fraction * allocated GPUs)`` of
  its GPUs have each been idle for ``D`` (``D`` is the k-th longest idle time).
- *Fixed window*: when ``k`` GPUs have never been busy, ``D`` runs from the job's start:
  first warning (``idle_gpu_warning_1``) at ``warn_after`` (60 min), second
  (``idle_gpu_warning_2``) at ``second_warn_after`` (105 min), action at ``act_after``
  (120 min).
- *Sliding window* otherwise (GPUs busy once, idle since): warning
  (``idle_gpu_sliding_warning``) at ``sliding_warn_after`` (240 min), action at
  ``sliding_act_after`` (300 min).
- Escalation follows ``PolicySnapshot.alerts``: a warning counts only when it was
  issued inside the current idle window, i.e. after the idle GPUs' last busy sample. A
  job that was busy between a warning and the action has a shorter idle window than
  the warning's age, so the warning no longer counts and the job is spared (and warned
  afresh if it idles again). Each step needs the previous warning to be at least
  ``min_warning_lead`` (15 min) old, so a job found already idle for hours still gets
  two warnings and 30 minutes.
- The action: ``requeue`` (kind ``requeue``, only when ``Job.requeue`` is true: Slurm
  refuses the rest; otherwise ``requeue_fallback``, ``cancel`` by default, or
  ``notify``), ``cancel``, or ``notify`` (a last notice, kind ``warn``, alert
  ``idle_gpu_notice``). It is proposed once per idle window: an action alert inside the
  window means it was already decided.
- Never considered: jobs that are not RUNNING, interactive jobs (``Job.batch`` false)
  while ``exempt_interactive``, jobs in ``exempt_partitions``, jobs with no usage and
  jobs holding no whole GPU (shards only: usage on a shared GPU is not the job's own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import (
    Action,
    GpuStat,
    JobUsage,
    PolicySnapshot,
    PriorAlert,
    slurm_job_ref,
)
from slurmgpu.policy.settings import IdleGpuSettings

__all__ = [
    "ALERT_CANCEL",
    "ALERT_NOTICE",
    "ALERT_REQUEUE",
    "ALERT_SLIDING_WARNING",
    "ALERT_WARNING_1",
    "ALERT_WARNING_2",
    "IdleGpuPolicy",
]

ALERT_WARNING_1 = "idle_gpu_warning_1"
ALERT_WARNING_2 = "idle_gpu_warning_2"
ALERT_SLIDING_WARNING = "idle_gpu_sliding_warning"
ALERT_NOTICE = "idle_gpu_notice"
ALERT_REQUEUE = "idle_gpu_requeue"
ALERT_CANCEL = "idle_gpu_cancel"

_ACTS = {
    "requeue": ("requeue", ALERT_REQUEUE),
    "cancel": ("cancel", ALERT_CANCEL),
    "notify": ("warn", ALERT_NOTICE),
}
_VERB = {"requeue": "requeued", "cancel": "cancelled", "warn": "named in a final notice"}


def _span(d: timedelta) -> str:
    """``"75 min"``, or ``"14 s"`` under a minute (short test windows read right too)."""
    seconds = d.total_seconds()
    return f"{int(seconds)} s" if seconds < 60 else f"{int(seconds // 60)} min"


def _minutes(d: timedelta) -> int:
    return int(d.total_seconds() // 60)


class _Idle:
    """How idle one job is: the window kind, its length and the GPUs that make it."""

    __slots__ = ("allocated", "duration", "idle_gpus", "known", "since", "window")

    def __init__(
        self,
        window: str,
        duration: timedelta,
        since: datetime,
        idle_gpus: int,
        known: int,
        allocated: int,
    ) -> None:
        self.window = window
        self.duration = duration
        self.since = since
        self.idle_gpus = idle_gpus
        self.known = known
        self.allocated = allocated


class IdleGpuPolicy:
    """Warns about and then requeues, cancels or reports jobs whose GPUs stay idle."""

    name = "idle_gpu"

    def __init__(self, settings: IdleGpuSettings | None = None) -> None:
        self.settings = settings or IdleGpuSettings()

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        """Return at most one warn / requeue / cancel action per idle running job."""
        s = self.settings
        alerts: dict[int, list[PriorAlert]] = {}
        for a in snapshot.alerts:
            if a.policy == self.name:
                alerts.setdefault(a.job_id, []).append(a)
        # Nothing happens below the earliest threshold: skip busy jobs cheaply.
        earliest = min(s.warn_after, s.sliding_warn_after)
        actions: list[Action] = []
        running = JobState.RUNNING  # once: an enum member look-up per job costs as much
        usage_of = snapshot.usage.get
        for job in snapshot.cluster.jobs:
            if job.state is not running:
                continue
            usage = usage_of(job.job_id)
            if usage is None:
                continue
            for g in usage.gpus:
                if g.trailing_idle >= earliest:
                    break
            else:
                continue
            if (s.exempt_interactive and not job.batch) or job.partition in s.exempt_partitions:
                continue
            idle = self._idle(job, usage, snapshot.at)
            if idle is None:
                continue
            window_alerts = [
                a for a in alerts.get(job.job_id, ()) if idle.since <= a.at <= snapshot.at
            ]
            action = self._step(job, idle, window_alerts, snapshot.at)
            if action is not None:
                actions.append(action)
        return actions

    def _idle(self, job: Job, usage: JobUsage, at: datetime) -> _Idle | None:
        s = self.settings
        allocated = job.allocated_gpus
        stats: Sequence[GpuStat]
        if allocated:
            held = {(a.node, i) for a in job.gpu_allocations for i in a.gpu_indices}
            stats = [g for g in usage.gpus if (g.node, g.gpu_index) in held]
        else:
            allocated = job.gpus.gpus
            stats = usage.gpus[:allocated]
        if allocated <= 0:
            return None
        known = [
            g
            for g in stats
            if g.samples >= s.min_samples
            and g.mean_util_pct is not None
            and (g.last_sample_at is None or at - g.last_sample_at <= s.max_sample_age)
        ]
        need = max(1, math.ceil(s.idle_fraction * allocated - 1e-9))
        if len(known) < need:
            return None

        def longest_first(g: GpuStat) -> tuple[float, str, int]:
            return (-g.trailing_idle.total_seconds(), g.node, g.gpu_index)

        never_busy = sorted((g for g in known if g.never_busy), key=longest_first)
        if len(never_busy) >= need:
            window, top = "fixed", never_busy[:need]
        else:
            window, top = "sliding", sorted(known, key=longest_first)[:need]
        duration = top[-1].trailing_idle
        if duration <= timedelta(0):
            return None
        since = max((g.last_sample_at or at) - g.trailing_idle for g in top)
        idle_gpus = sum(1 for g in known if g.trailing_idle >= duration)
        return _Idle(window, duration, since, idle_gpus, len(known), allocated)

    def _step(
        self, job: Job, idle: _Idle, window_alerts: list[PriorAlert], at: datetime
    ) -> Action | None:
        """Return the next escalation step for an idle job, or None while it waits."""
        s = self.settings
        latest: dict[str, datetime] = {}
        for a in window_alerts:
            if a.kind not in latest or a.at > latest[a.kind]:
                latest[a.kind] = a.at
        kind, act_alert = self._resolve(job)
        if act_alert in latest or (kind != "warn" and kind in latest):
            return None  # already decided in this idle window
        d = idle.duration
        lead = s.min_warning_lead

        def old_enough(alert: str) -> bool:
            return alert in latest and at - latest[alert] >= lead

        if idle.window == "fixed":
            last_warning = ALERT_WARNING_2 if s.second_warn_after is not None else ALERT_WARNING_1
            if d >= s.act_after and old_enough(last_warning):
                return self._act(job, idle, kind, act_alert, s.act_after, latest[last_warning])
            if (
                s.second_warn_after is not None
                and d >= s.second_warn_after
                and ALERT_WARNING_2 not in latest
                and old_enough(ALERT_WARNING_1)
            ):
                return self._warn(job, idle, ALERT_WARNING_2, s.second_warn_after, kind)
            if d >= s.warn_after and ALERT_WARNING_1 not in latest:
                return self._warn(job, idle, ALERT_WARNING_1, s.warn_after, kind)
            return None
        if d >= s.sliding_act_after and old_enough(ALERT_SLIDING_WARNING):
            return self._act(
                job, idle, kind, act_alert, s.sliding_act_after, latest[ALERT_SLIDING_WARNING]
            )
        if d >= s.sliding_warn_after and ALERT_SLIDING_WARNING not in latest:
            return self._warn(job, idle, ALERT_SLIDING_WARNING, s.sliding_warn_after, kind)
        return None

    def _resolve(self, job: Job) -> tuple[str, str]:
        """Return (action kind, alert name) of the configured action for this job."""
        action: str = self.settings.action
        if action == "requeue" and not job.requeue:
            action = self.settings.requeue_fallback
        return _ACTS[action]

    def _numbers(self, idle: _Idle, threshold: timedelta) -> dict[str, float | int | str | None]:
        return {
            "idle_minutes": round(idle.duration.total_seconds() / 60.0, 1),
            "window": idle.window,
            "idle_gpus": idle.idle_gpus,
            "allocated_gpus": idle.allocated,
            "known_gpus": idle.known,
            "idle_fraction": self.settings.idle_fraction,
            "threshold_minutes": _minutes(threshold),
            "idle_since": idle.since.isoformat(),
            # the names the notification templates read
            "gpus_idle": idle.idle_gpus,
            "gpus_allocated": idle.allocated,
            "act_after_minutes": _minutes(
                self.settings.act_after
                if idle.window == "fixed"
                else self.settings.sliding_act_after
            ),
            "action": self.settings.action,
        }

    def _describe(self, idle: _Idle) -> str:
        since = "since the job started" if idle.window == "fixed" else "after being busy"
        return f"{idle.idle_gpus} of {idle.allocated} GPUs idle for {_span(idle.duration)} {since}"

    def _warn(self, job: Job, idle: _Idle, alert: str, threshold: timedelta, kind: str) -> Action:
        s = self.settings
        act_after = s.act_after if idle.window == "fixed" else s.sliding_act_after
        return Action(
            policy=self.name,
            kind="warn",
            job_id=job.job_id,
            user=job.user,
            reason=(
                f"{self._describe(idle)}; the job will be {_VERB[kind]} after "
                f"{_span(act_after)} idle"
            ),
            numbers=self._numbers(idle, threshold),
            alert=alert,
            slurm_id=slurm_job_ref(job),
        )

    def _act(
        self,
        job: Job,
        idle: _Idle,
        kind: str,
        alert: str,
        threshold: timedelta,
        warned_at: datetime,
    ) -> Action:
        numbers = self._numbers(idle, threshold)
        numbers["warned_at"] = warned_at.isoformat()
        fallback = ""
        if self.settings.action == "requeue" and kind != "requeue":
            fallback = " (the job cannot be requeued)"
        return Action(
            policy=self.name,
            kind=kind,
            job_id=job.job_id,
            user=job.user,
            reason=f"{self._describe(idle)}, warned at {warned_at:%H:%M}{fallback}",
            numbers=numbers,
            alert=alert,
            slurm_id=slurm_job_ref(job),
        )

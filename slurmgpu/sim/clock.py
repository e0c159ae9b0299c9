"""SimSlurm's clock: virtual time and its heap of timed events.

Event-driven: a heap of timed events (arrivals, ends, limits, begin times, checkpoints,
callers' timers); nothing ticks. ``run_until(t)`` processes every event up to ``t``, and
after every instant at which something changed, one scheduling pass (the scheduler
model's :meth:`EventQueue._schedule`). Pure: no I/O and no wall clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from slurmgpu.sim.state import SimJob

__all__ = ["EPOCH", "EventQueue"]

EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


class EventQueue:
    """Virtual time (``now``), timed events and the change counter callers watch."""

    now: float
    changes: int  # state changes so far (callers skip idle policy cycles)
    all_jobs: dict[int, SimJob]
    _seq: itertools.count[int]
    _events: list[tuple[float, int, int, int, int, Callable[[], None] | None]]
    _dirty: bool  # a scheduling pass is due

    def _fire(self, kind: int, job: SimJob) -> None:
        """What a job's event of ``kind`` does (the scheduler model's)."""
        raise NotImplementedError

    def _schedule(self) -> None:
        """One scheduling pass (the scheduler model's)."""
        raise NotImplementedError

    def _changed(self, job: SimJob) -> None:
        job._obj = None
        self.changes += 1

    def at(self, t: float) -> datetime:
        return EPOCH + timedelta(seconds=t)

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at virtual time ``t`` (a caller's timer: a policy cycle, a step)."""
        heapq.heappush(self._events, (max(t, self.now), next(self._seq), 0, 0, 0, fn))

    def _push(self, t: float, kind: int, job: SimJob) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, job.job_id, job.version, None))

    def next_event_s(self) -> float:
        return self._events[0][0] if self._events else math.inf

    @property
    def pass_due(self) -> bool:
        """A scheduling pass is due at this instant (after its remaining events)."""
        return self._dirty

    def run_until(self, t: float) -> None:
        """Process every event up to and including virtual time ``t``."""
        if self._dirty and (not self._events or self._events[0][0] > self.now):
            self._schedule()
        while self._events and self._events[0][0] <= t:
            when, _, kind, job_id, version, fn = heapq.heappop(self._events)
            self.now = max(self.now, when)
            if fn is not None:
                fn()
            else:
                job = self.all_jobs.get(job_id)
                if job is not None and job.version == version:
                    self._fire(kind, job)
            # one scheduling pass per instant, after everything due at it
            if self._dirty and (not self._events or self._events[0][0] > self.now):
                self._schedule()
        self.now = max(self.now, t) if math.isfinite(t) else self.now
        if self._dirty:
            self._schedule()

    _END, _LIMIT, _ELIGIBLE, _CHECKPOINT, _PHASE = 1, 2, 3, 4, 5

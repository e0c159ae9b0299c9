"""Resizes in the simulator, carried out by the daemon's own code: the dispatcher
(``cycle.dispatch.ResizeDispatcher``: a job's ``ResizeExecutor`` transaction or a
pool's ``PoolExecutor`` one) over the in-memory transaction store
(``cycle.transactions.MemoryTransactions``) and SimSlurm's checkpoint record as the
job's acknowledgement (``sim.acks.SimAcks``).

Virtual time reaches the executors the way wall time reaches them in the daemon: as
the ``at`` of each call (SimSlurm's ``at(now)``), never read from a clock. What a resize
costs is SimSlurm's behaviour (the runtime's checkpoint time, the requeue's begin time,
the restart's start-up: ``sim.slurm.ElasticRuntime``) and the executor's pacing
(``ResizeSettings``: the release delay, one observation per ``cycle_interval`` while a
transaction is open, as ``DaemonLoop(busy=…)``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta

from slurmgpu.cycle.dispatch import Outcome, ResizeDispatcher
from slurmgpu.cycle.pool import KIND as POOL_KIND
from slurmgpu.cycle.pool import OPEN as POOL_OPEN
from slurmgpu.cycle.resize import KIND as RESIZE_KIND
from slurmgpu.cycle.resize import OPEN as RESIZE_OPEN
from slurmgpu.cycle.resize import UPDATED, ResizeSettings
from slurmgpu.cycle.transactions import MemoryTransactions
from slurmgpu.model import ClusterSnapshot, MalleableSpec
from slurmgpu.policy.base import Decision
from slurmgpu.sim.acks import SimAcks
from slurmgpu.sim.slurm import SimSlurm

__all__ = ["SimResizes"]


class _InSimulation(logging.Filter):
    """Drops the executors' log records while the simulator drives them: a line per
    transaction step is the daemon's operations log; a simulation counts its outcomes
    instead (thousands of resizes a run would bury ``sgpu simulate``'s table)."""

    depth = 0

    def filter(self, record: logging.LogRecord) -> bool:
        return self.depth == 0


_QUIET = _InSimulation()
for _name in ("slurmgpu.cycle.resize", "slurmgpu.cycle.pool", "slurmgpu.actuate.malleable"):
    logging.getLogger(_name).addFilter(_QUIET)


@contextmanager
def _quiet() -> Iterator[None]:
    _QUIET.depth += 1
    try:
        yield
    finally:
        _QUIET.depth -= 1


class SimResizes:
    """The daemon's resize dispatcher on one SimSlurm, observed as the daemon would."""

    def __init__(self, sim: SimSlurm, settings: ResizeSettings | None = None) -> None:
        self.sim = sim
        self.settings = settings or ResizeSettings()
        self.transactions = MemoryTransactions()
        self.dispatch = ResizeDispatcher(sim, self.transactions, self.settings, SimAcks(sim))
        self._observing = False
        self._history: tuple[int, tuple[timedelta | None, dict[int, datetime]]] | None = None

    @property
    def in_flight(self) -> frozenset[int]:
        return self.dispatch.in_flight

    def history(self) -> tuple[timedelta | None, dict[int, datetime]]:
        """The dispatcher's (the daemon's) view, worked out again only after a write."""
        version = self.transactions.version
        if self._history is None or self._history[0] != version:
            self._history = (version, self.dispatch.history())
        cost, last = self._history[1]
        return cost, dict(last)

    def advance(self, cluster: ClusterSnapshot, at: datetime) -> None:
        """The policy cycle's confirm step: every open transaction on its listing."""
        with _quiet():
            self.dispatch.advance(cluster, at)

    def carry_out(
        self, decision: Decision, cluster: ClusterSnapshot, specs: Mapping[int, MalleableSpec]
    ) -> Outcome:
        """One resize decision, now; its transaction is then observed until it closes."""
        with _quiet():
            done = self.dispatch.carry_out(decision, cluster, specs, self.sim.at(self.sim.now))
        self._observe_in_flight()
        return done

    def listing(self) -> ClusterSnapshot:
        """The jobs of the open transactions as squeue lists them now: all the executors
        look up between the policy cycles (a full listing every second would cost the
        simulator its speed and give them nothing more)."""
        sim = self.sim
        ids: set[int] = set()
        rows = self.transactions.in_states([RESIZE_KIND, POOL_KIND], (*RESIZE_OPEN, *POOL_OPEN))
        for row in rows:
            if row.kind == POOL_KIND:
                ids.update(int(k) for k in row.payload.get("tasks", {}))
            else:
                ids.add(row.job_id)
        jobs = tuple(sim.job_record(sim.all_jobs[i]) for i in sorted(ids) if i in sim.all_jobs)
        return ClusterSnapshot(sim.at(sim.now), jobs, (), sim.version())

    def _observe_in_flight(self, after: float = 0.0) -> None:
        if self._observing or not self.dispatch.in_flight:
            return
        self._observing = True
        step = self.settings.cycle_interval.total_seconds()
        # the first observation on the one-second grid at or after ``after``
        k = max(1, math.ceil((after - self.sim.now) / step - 1e-6))
        self.sim.call_at(self.sim.now + k * step, self._observe)

    def _observe(self) -> None:
        sim = self.sim
        listing = self.listing()
        version = self.transactions.version
        with _quiet():
            self.dispatch.advance(listing, listing.taken_at)
        self._observing = False
        if self.transactions.version != version or sim.pass_due:
            self._observe_in_flight()  # something moved: look again in a second
        else:
            # Nothing moved, and nothing will before the next event in SimSlurm or
            # the next deadline of an open transaction: the daemon's observations on
            # the grid points up to then see what this one saw and do nothing, so
            # they are skipped (the grid, hence every result, is the same).
            self._observe_in_flight(min(sim.next_event_s(), self._next_trigger_s()))

    def _next_trigger_s(self) -> float:
        """When the first open transaction's time-based step comes due (its deadline, or
        the release ``release_delay`` after its update), in virtual seconds."""
        sim = self.sim
        t0 = sim.at(0)
        soonest = math.inf
        rows = self.transactions.in_states([RESIZE_KIND, POOL_KIND], (*RESIZE_OPEN, *POOL_OPEN))
        for row in rows:
            if row.deadline is not None:
                soonest = min(soonest, (row.deadline - t0).total_seconds())
            if row.state == UPDATED:
                due = row.updated_at + self.settings.release_delay
                soonest = min(soonest, (due - t0).total_seconds())
        return soonest

"""The policy cycle, one for the daemon and the simulator: confirm → observe → decide →
plan → act.

- **confirm**: the executor carries on what earlier cycles started, judged on this
  listing (the daemon settles decisions a stopped daemon left pending and advances
  resize transactions; the simulator closes resizes whose job runs again);
- **observe**: the :class:`~slurmgpu.policy.base.PolicySnapshot` is built from the
  listing and the sources (:class:`CycleSources`: usage, history, prior alerts, opt-in,
  malleable jobs) and the guardrail records;
- **decide**: the engine's pure decisions;
- **plan**: with ``dedupe`` (the daemon), a verdict unchanged since the last cycle that
  executes nothing is dropped, so it is not audited every 30 s;
- **act**: the executor carries the plan out through its SlurmClient and returns one
  result per decision; changes made are recorded for the guardrails.

Nothing here reads a database, a file or the wall clock: the sources and the executor
do, behind the protocols below.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from slurmgpu.cycle.guardrails import GuardrailRecords
from slurmgpu.model import ClusterSnapshot, Job, JobState, MalleableSpec
from slurmgpu.policy.base import (
    Decision,
    HistoryRecord,
    JobUsage,
    PolicySnapshot,
    PriorAlert,
)
from slurmgpu.policy.engine import PolicyEngine

log = logging.getLogger("slurmgpu.cycle")

__all__ = [
    "CycleSources",
    "Executor",
    "MalleableView",
    "PolicyCycle",
    "Result",
]


@dataclass(frozen=True, slots=True)
class MalleableView:
    """What the malleable policy reads: specs, resizes in flight, measured rates."""

    specs: Mapping[int, MalleableSpec] = field(default_factory=dict)
    resizing: frozenset[int] = frozenset()
    throughput: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    resize_cost: timedelta | None = None
    last_resize_at: Mapping[int, datetime] = field(default_factory=dict)


class CycleSources(Protocol):
    """What a snapshot needs besides the listing (the daemon's store, or the simulator)."""

    def job_usage(self, cluster: ClusterSnapshot, at: datetime) -> Mapping[int, JobUsage]:
        """Per-GPU usage of the running jobs."""
        ...

    def history(self, at: datetime) -> tuple[HistoryRecord, ...]:
        """Finished jobs for the priors (the same tuple object between reloads)."""
        ...

    def prior_alerts(self, cluster: ClusterSnapshot) -> tuple[PriorAlert, ...]:
        """Warnings and actions issued to the listed jobs before, oldest first."""
        ...

    def opted_in(self, job: Job) -> bool:
        """Whether a pending job opted in to rightsizing."""
        ...

    def malleable_view(self, cluster: ClusterSnapshot, at: datetime) -> MalleableView: ...


class Result(Protocol):
    """One decision's outcome (``done``, ``started``, ``notified``, ``failed`` …)."""

    @property
    def decision(self) -> Decision: ...

    @property
    def outcome(self) -> str: ...


R = TypeVar("R", bound=Result)


class Executor(Protocol[R]):
    """Carries decisions out through a SlurmClient (and, in the daemon, its audit)."""

    def confirm(self, cluster: ClusterSnapshot, at: datetime) -> None:
        """Carry on what earlier cycles started, judged on this listing."""
        ...

    def act(
        self, decisions: Sequence[Decision], cluster: ClusterSnapshot, snap: PolicySnapshot
    ) -> list[R]:
        """Carry ``decisions`` out at ``snap.at``; one result per decision acted on."""
        ...


def _signature(d: Decision) -> tuple[object, ...]:
    a = d.action
    return (a.kind, a.intents, a.alert, d.mode, d.execute, d.suppressed)


@dataclass
class PolicyCycle(Generic[R]):
    """One engine, its sources, its executor and its guardrail records."""

    engine: PolicyEngine
    sources: CycleSources
    executor: Executor[R]
    guardrails: GuardrailRecords = field(default_factory=GuardrailRecords)
    # Drop a verdict unchanged since the last cycle that executes nothing (the daemon:
    # its audit would repeat it every cycle).
    dedupe: bool = False
    # Exceptions of a source that skip the cycle with a warning (the store's).
    unavailable: tuple[type[Exception], ...] = ()
    # Exceptions a policy (per job, or as a whole) raised, by policy name.
    errors: Counter[str] = field(default_factory=Counter)
    _last: dict[tuple[int, str], tuple[object, ...]] = field(default_factory=dict)
    _failing: set[tuple[str, int | None, str]] = field(default_factory=set)

    def step(self, cluster: ClusterSnapshot, at: datetime) -> list[R]:
        """Confirm, observe, decide, plan and act for one listing taken at ``at``."""
        try:
            self.executor.confirm(cluster, at)
            snap = self.observe(cluster, at)
        except self.unavailable as exc:
            log.warning("policies skipped this cycle: %s", exc)
            return []
        decisions = self.engine.decide(snap)
        self._report_failures()
        planned = self.plan(decisions)
        if not planned:
            return []
        results = self.executor.act(planned, cluster, snap)
        for r in results:
            self.guardrails.record_action(r.decision.action, r.outcome, at)
        if self.dedupe:
            self._forget_ended(cluster)
        return results

    def observe(self, cluster: ClusterSnapshot, at: datetime) -> PolicySnapshot:
        src = self.sources
        usage = src.job_usage(cluster, at)
        alerts = src.prior_alerts(cluster)
        guard = self.guardrails.view(at, self.engine.settings.job_cooldown)
        mall = src.malleable_view(cluster, at)
        return PolicySnapshot(
            at=at,
            cluster=cluster,
            usage=usage,
            history=src.history(at),
            alerts=alerts,
            last_action_at=guard.last_action_at,
            last_action_by=guard.last_action_by,
            user_actions_last_hour=guard.user_actions_last_hour,
            failed_at=guard.failed_at,
            opted_in=frozenset(
                j.job_id for j in cluster.jobs if j.state is JobState.PENDING and src.opted_in(j)
            ),
            malleable=mall.specs,
            resizing=mall.resizing,
            throughput=mall.throughput,
            resize_cost=mall.resize_cost,
            last_resize_at=mall.last_resize_at,
        )

    def plan(self, decisions: Sequence[Decision]) -> list[Decision]:
        if not self.dedupe:
            return list(decisions)
        return [d for d in decisions if self._changed(d)]

    def _changed(self, d: Decision) -> bool:
        key = (d.action.job_id, d.action.policy)
        sig = _signature(d)
        if self._last.get(key) == sig and not d.execute:
            return False
        self._last[key] = sig
        return True

    def _forget_ended(self, cluster: ClusterSnapshot) -> None:
        live = {j.job_id for j in cluster.jobs if not j.state.is_terminal}
        for key in [k for k in self._last if k[0] not in live]:
            del self._last[key]

    def _report_failures(self) -> None:
        now: set[tuple[str, int | None, str]] = set()
        for f in self.engine.failures:
            self.errors[f.policy] += 1
            key = (f.policy, f.job_id, f.error)
            now.add(key)
            # Once while it lasts: the same job fails the same way every cycle.
            level = logging.DEBUG if key in self._failing else logging.ERROR
            if f.job_id is None:
                log.log(level, "policy %s raised and was skipped this cycle: %s", f.policy, f.error)
            else:
                log.log(
                    level,
                    "policy %s raised on job %d, which it skips this cycle: %s",
                    f.policy,
                    f.job_id,
                    f.error,
                )
        self._failing = now

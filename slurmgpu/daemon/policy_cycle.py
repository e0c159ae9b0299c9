"""The decide → act half of a daemon cycle: build a PolicySnapshot from the store, run
the engine, audit and carry out the decisions.

The engine and policies are pure and the same objects the simulator runs; everything that
reads the database or the clock is here.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.actuate.actuator import ActuationResult, Actuator
from slurmgpu.actuate.malleable import MalleableActuator
from slurmgpu.config import Settings
from slurmgpu.daemon.malleable import MalleableDirectory
from slurmgpu.daemon.recommend import ExportError, RecommendationExport
from slurmgpu.model import ClusterSnapshot, JobState
from slurmgpu.policy.base import (
    RESIZE,
    Action,
    Decision,
    GpuStat,
    HistoryRecord,
    JobUsage,
    Mode,
    Policy,
    PolicySnapshot,
)
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.las import AttainedServicePolicy
from slurmgpu.policy.malleable import MalleablePolicy
from slurmgpu.policy.recommend import recommendations
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.report.energy import JobEnergy, job_energy
from slurmgpu.slurm.client import SlurmClient
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.database import StoreError
from slurmgpu.store.history import load_history
from slurmgpu.store.transactions import TransactionStore
from slurmgpu.store.usage import GpuUsage, UsageStore

log = logging.getLogger("slurmgpu.daemon")

RIGHTSIZE_OPT_IN = "sgpu:rightsize"


def gpu_stats(rows: list[GpuUsage]) -> tuple[GpuStat, ...]:
    return tuple(
        GpuStat(
            node=g.node,
            gpu_index=g.gpu_index,
            samples=g.samples,
            mean_util_pct=g.mean_util_pct,
            max_util_pct=g.max_util_pct,
            max_memory_mib=g.max_memory_mib,
            memory_total_mib=g.memory_total_mib,
            trailing_idle=g.trailing_idle,
            never_busy=g.never_busy,
            last_sample_at=g.last_at,
        )
        for g in rows
    )


def opted_in(comment: str) -> bool:
    """True when a job's comment carries the rightsize opt-in token."""
    return RIGHTSIZE_OPT_IN in comment.replace(",", " ").replace(";", " ").split()


def _signature(d: Decision) -> tuple[object, ...]:
    a = d.action
    return (a.kind, a.intents, a.alert, d.mode, d.execute, d.suppressed)


@dataclass
class PolicyCycle:
    """Runs the policy engine on each successful observe cycle."""

    engine: PolicyEngine
    usage: UsageStore
    audit: AuditStore
    actuator: Actuator
    history_days: int = 90
    history_refresh: timedelta = timedelta(minutes=10)
    clock: Callable[[], datetime] | None = None
    # Writes job_submit.lua's recommendations after each history reload, when configured.
    export: RecommendationExport | None = None
    rightsize: RightsizePolicy | None = None
    # Resize transactions of malleable jobs and pools (actuate.malleable), and their specs.
    malleable: MalleableActuator | None = None
    directory: MalleableDirectory | None = None
    _history: tuple[HistoryRecord, ...] = ()
    _history_at: datetime | None = None
    # (job, policy) → the last decision recorded, so an unchanged verdict is not written
    # to the audit every 30 s (the first cycle after a restart records it once more).
    _last: dict[tuple[int, str], tuple[object, ...]] = field(default_factory=dict)
    # Exceptions a policy (per job, or as a whole) or the cycle raised, by policy name
    # ("cycle" for the rest); exported as sgpu_policy_errors_total.
    errors: Counter[str] = field(default_factory=Counter)
    _failing: set[tuple[str, int | None, str]] = field(default_factory=set)

    def history(self, at: datetime) -> tuple[HistoryRecord, ...]:
        """Finished jobs for the priors, reloaded every ``history_refresh``.

        The same tuple object is handed out between reloads, so policies that cache
        priors per history object rebuild them only after a reload.
        """
        if self._history_at is None or at - self._history_at >= self.history_refresh:
            try:
                try:
                    since = at - timedelta(days=self.history_days)
                except OverflowError:  # config refuses this; a caller may not have
                    since = datetime.min.replace(tzinfo=at.tzinfo)
                self._history = tuple(load_history(self.usage.engine, self.usage.cluster, since))
                self._history_at = at
                self._export()
            except StoreError as exc:
                log.warning("history not reloaded: %s", exc)
        return self._history

    def _export(self) -> None:
        if self.export is None or self.rightsize is None:
            return
        by_key, fallback = recommendations(
            self.rightsize.priors(self._history), self.rightsize.settings
        )
        try:
            result = self.export.write(by_key, fallback)
        except (OSError, ExportError) as exc:
            log.warning("recommendations not exported to %s: %s", self.export.json_path, exc)
            return
        log.debug("exported %d recommendation(s) to %s", result.entries, result.tsv_path)

    def snapshot(self, cluster: ClusterSnapshot, at: datetime) -> PolicySnapshot:
        running = [j for j in cluster.jobs if j.state is JobState.RUNNING]
        # One grouped query for jobs in their first run; a requeued job's earlier runs
        # are not this run's, so its (few) aggregates are asked for since its start.
        first = [j.job_id for j in running if j.restart_count == 0 or j.start_time is None]
        by_job = self.usage.gpu_usage_many(first)
        for job in running:
            if job.restart_count > 0 and job.start_time is not None:
                by_job.update(self.usage.gpu_usage_many([job.job_id], since=job.start_time))
        usage: dict[int, JobUsage] = {}
        for job in running:
            rows = by_job.get(job.job_id)
            if rows:
                usage[job.job_id] = JobUsage(job.job_id, gpu_stats(rows))
        alerts = self.audit.alerts([j.job_id for j in running]) if running else []
        cooldown = self.engine.settings.job_cooldown
        last = self.audit.last_action_since(at - cooldown)
        specs = self.directory.specs(cluster) if self.directory is not None else {}
        resize_cost, last_resize = (
            self.malleable.history() if self.malleable is not None and specs else (None, {})
        )
        return PolicySnapshot(
            at=at,
            cluster=cluster,
            usage=usage,
            history=self.history(at),
            alerts=tuple(alerts),
            last_action_at=last,
            last_action_by=self.audit.last_action_policy_since(at - cooldown),
            user_actions_last_hour=self.audit.user_actions_since(at - timedelta(hours=1)),
            opted_in=frozenset(
                j.job_id
                for j in cluster.jobs
                if j.state is JobState.PENDING and opted_in(j.comment)
            ),
            malleable=specs,
            resizing=self.malleable.in_flight if self.malleable is not None else frozenset(),
            throughput=(
                self.directory.throughput(cluster, specs) if self.directory and specs else {}
            ),
            resize_cost=resize_cost,
            last_resize_at=last_resize,
        )

    def busy(self) -> bool:
        """True while a resize is in flight: the daemon then observes every second."""
        return self.malleable is not None and self.malleable.busy()

    def run(self, cluster: ClusterSnapshot, at: datetime) -> list[ActuationResult]:
        """Decide and act for one observed snapshot; never raises.

        An exception from one policy on one job leaves that job out (PolicyEngine); any
        other is logged with its traceback and counted, and the next cycle runs as usual.
        """
        try:
            return self._run(cluster, at)
        except Exception:
            self.errors["cycle"] += 1
            log.exception("policy cycle failed; the next cycle runs as usual")
            return []

    def _report_failures(self) -> None:
        now: set[tuple[str, int | None, str]] = set()
        for f in self.engine.failures:
            self.errors[f.policy] += 1
            key = (f.policy, f.job_id, f.error)
            now.add(key)
            # Once while it lasts: the same job fails the same way every 30 s.
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

    def _run(self, cluster: ClusterSnapshot, at: datetime) -> list[ActuationResult]:
        # Decisions a stopped daemon left pending are judged before anything is decided:
        # a change confirmed in Slurm then counts for the cooldown.
        self.actuator.settle_interrupted(cluster.jobs)
        if self.malleable is not None:
            self.malleable.advance(cluster, at)  # before deciding: policies see what is in flight
        try:
            snap = self.snapshot(cluster, at)
        except StoreError as exc:
            log.warning("policies skipped this cycle: %s", exc)
            return []
        decisions = self.engine.decide(snap)
        self._report_failures()
        fresh = [d for d in decisions if self._changed(d)]
        if not fresh:
            return []
        resizes = [d for d in fresh if d.action.kind == RESIZE]
        others = [d for d in fresh if d.action.kind != RESIZE]
        results = self.actuator.carry_out(others, at) if others else []
        if resizes and self.malleable is not None:
            results += self.malleable.carry_out(resizes, cluster, snap.malleable, at)
        self._forget_ended(cluster)
        return results

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


class MailNotifier:
    """The actuator's Notifier on top of the Mailer (email is optional and off by default).

    ``energy_of`` (job id → its GPU energy so far) adds ``energy_kwh``,
    ``energy_idle_pct`` and ``energy_method`` to the numbers of the email (the
    ``_energy.txt`` partial), when the job's energy is measured.
    """

    def __init__(
        self, mailer: Any, energy_of: Callable[[int], JobEnergy | None] | None = None
    ) -> None:
        self.mailer = mailer
        self.energy_of = energy_of

    def notify(self, action: Action, *, at: datetime) -> str:
        return str(self.mailer.notify(self._with_energy(action), at=at).status)

    def _with_energy(self, action: Action) -> Action:
        if self.energy_of is None:
            return action
        try:
            energy = self.energy_of(action.job_id)
        except (StoreError, SQLAlchemyError) as exc:  # the email goes out without it
            log.warning("energy of job %s unknown: %s", action.job_id, exc)
            return action
        if energy is None or energy.energy_j <= 0:
            return action
        numbers = {
            **action.numbers,
            "energy_kwh": round(energy.kwh, 2),
            "energy_idle_pct": round(energy.idle_pct),
            "energy_method": energy.method_text,
        }
        return msgspec.structs.replace(action, numbers=numbers)


def build_policy_cycle(settings: Settings, store: JobStore, slurm: SlurmClient) -> PolicyCycle:
    """The engine with every policy in its configured mode, wired to the store and Slurm."""
    p = settings.policy
    rightsize = RightsizePolicy(p.rightsize)
    policies: list[tuple[Policy, Mode]] = [
        (IdleGpuPolicy(p.idle_gpu), p.idle_gpu.mode),
        (rightsize, p.rightsize.mode),
        (ColocatePolicy(p.colocate), p.colocate.mode),
    ]
    if p.las.enabled:  # the site's opt-in ([policy.las] enabled = true)
        policies.append((AttainedServicePolicy(p.las), p.las.mode))
    policies.append((MalleablePolicy(p.malleable), p.malleable.mode))
    engine = PolicyEngine(policies, p.engine)
    notifier = None
    if settings.notify.enabled:
        from slurmgpu.notify.mailer import Mailer

        usage = UsageStore(store.engine, store.cluster)
        notifier = MailNotifier(
            Mailer(settings.notify, store.engine, cluster=store.cluster),
            lambda job_id: job_energy(None, usage.gpu_energy(job_id), datetime.now(UTC)),
        )
    audit = AuditStore(store.engine, store.cluster)
    actuator = Actuator(slurm, audit, notifier)
    actuator.recover()
    malleable = MalleableActuator(
        slurm, TransactionStore(store.engine, store.cluster), audit, p.resize
    )
    malleable.recover(datetime.now(UTC))
    return PolicyCycle(
        engine,
        UsageStore(store.engine, store.cluster),
        audit,
        actuator,
        history_days=p.history_days,
        history_refresh=p.history_refresh,
        export=RecommendationExport(p.recommendations_file) if p.recommendations_file else None,
        rightsize=rightsize,
        malleable=malleable,
        directory=MalleableDirectory(store),
    )

"""The decide → act half of a daemon cycle: build a PolicySnapshot from the store, run
the engine, audit and carry out the decisions.

The engine and policies are pure and the same objects the simulator runs; everything that
reads the database or the clock is here.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.actuate.actuator import ActuationResult, Actuator
from slurmgpu.actuate.malleable import MalleableActuator
from slurmgpu.config import Settings
from slurmgpu.cycle.core import MalleableView
from slurmgpu.cycle.core import PolicyCycle as SharedCycle
from slurmgpu.cycle.guardrails import GuardrailRecords
from slurmgpu.daemon.las_check import check_las_priority
from slurmgpu.daemon.malleable import MalleableDirectory
from slurmgpu.daemon.recommend import ExportError, RecommendationExport
from slurmgpu.model import ClusterSnapshot, Job, JobState
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
    PriorAlert,
)
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.las import AttainedServicePolicy
from slurmgpu.policy.malleable import MalleablePolicy
from slurmgpu.policy.recommend import recommendations
from slurmgpu.policy.registry import in_pipeline_order
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.report.energy import JobEnergy, job_energy
from slurmgpu.slurm.client import SlurmClient
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.database import StoreError
from slurmgpu.store.health import one_line
from slurmgpu.store.history import HistoryLoader
from slurmgpu.store.transactions import TransactionStore
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.usage_query import GpuUsage
from slurmgpu.tokens import rightsize_opted_in

log = logging.getLogger("slurmgpu.daemon")


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
    """True when a job's comment opts it in to rightsizing (``sgpu:rightsize``) and does
    not opt it out (``sgpu:norightsize``): :func:`slurmgpu.tokens.rightsize_opted_in`."""
    return rightsize_opted_in(comment)


@dataclass
class PolicyCycle:
    """The daemon's wiring of the shared cycle (``cycle.core.PolicyCycle``), run on each
    successful observe cycle.

    It is the cycle's sources (usage from the store, history reloaded every
    ``history_refresh``, prior alerts from the audit, malleable specs from the
    directory and the resize transactions) and its executor (the Actuator, and the
    MalleableActuator for resizes, both audited); the guardrail records are seeded from
    the audit on the first cycle and again whenever interrupted decisions are settled.
    """

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
    _loader: HistoryLoader | None = None
    _backlog: int = 0  # pending jobs rightsizing left unjudged last cycle
    # Exceptions a policy (per job, or as a whole) or the cycle raised, by policy name
    # ("cycle" for the rest); exported as sgpu_policy_errors_total.
    errors: Counter[str] = field(default_factory=Counter)
    guardrails: GuardrailRecords = field(default_factory=GuardrailRecords)
    _seeded: bool = False
    _store_error: str | None = None  # the store error last logged (one line per kind)
    _core: SharedCycle[ActuationResult] = field(init=False)

    def __post_init__(self) -> None:
        self._core = SharedCycle(
            self.engine,
            self,
            self,
            self.guardrails,
            dedupe=True,
            unavailable=(StoreError,),
            errors=self.errors,
        )

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
                if self._loader is None:
                    self._loader = HistoryLoader(self.usage.engine, self.usage.cluster)
                self._history = self._loader.load(since, at)
                self._history_at = at
                self._export()
            except StoreError as exc:
                log.warning("history not reloaded: %s", exc)
        return self._history

    def _export(self) -> None:
        if self.export is None or self.rightsize is None:
            return
        by_key, fallback = recommendations(
            self.rightsize.priors(self._history),
            self.rightsize.settings,
            self.rightsize.sizing,
            self.rightsize.held_back,
        )
        try:
            result = self.export.write(by_key, fallback)
        except (OSError, ExportError) as exc:
            log.warning("recommendations not exported to %s: %s", self.export.json_path, exc)
            return
        log.debug("exported %d recommendation(s) to %s", result.entries, result.tsv_path)

    # ---- the cycle's sources

    def job_usage(self, cluster: ClusterSnapshot, at: datetime) -> dict[int, JobUsage]:
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
        return usage

    def prior_alerts(self, cluster: ClusterSnapshot) -> tuple[PriorAlert, ...]:
        running = [j.job_id for j in cluster.jobs if j.state is JobState.RUNNING]
        return tuple(self.audit.alerts(running)) if running else ()

    def opted_in(self, job: Job) -> bool:
        return opted_in(job.comment)

    def malleable_view(self, cluster: ClusterSnapshot, at: datetime) -> MalleableView:
        specs = self.directory.specs(cluster) if self.directory is not None else {}
        resize_cost, last_resize = (
            self.malleable.history() if self.malleable is not None and specs else (None, {})
        )
        measured = self.directory.measure(cluster, specs) if self.directory and specs else None
        if measured is not None and measured.refused:
            # A job whose files were refused is not resized on them: not malleable here.
            specs = {k: v for k, v in specs.items() if k not in measured.refused}
        return MalleableView(
            specs=specs,
            resizing=self.malleable.in_flight if self.malleable is not None else frozenset(),
            throughput=measured.throughput if measured is not None else {},
            resize_cost=resize_cost,
            last_resize_at=last_resize,
        )

    def snapshot(self, cluster: ClusterSnapshot, at: datetime) -> PolicySnapshot:
        return self._core.observe(cluster, at)

    # ---- the cycle's executor

    def confirm(self, cluster: ClusterSnapshot, at: datetime) -> None:
        # Decisions a stopped daemon left pending are judged before anything is decided:
        # a change confirmed in Slurm then counts for the cooldown.
        settled = self.actuator.settle_interrupted(cluster.jobs)
        if self.malleable is not None:
            self.malleable.advance(cluster, at)  # before deciding: policies see what is in flight
        if settled or not self._seeded:
            self._seed(at)

    def _seed(self, at: datetime) -> None:
        """The guardrail records from the audit (the durable copy): changes made within
        the cooldown and the last hour."""
        cooldown = self.engine.settings.job_cooldown
        window = max(cooldown, timedelta(hours=1))
        self.guardrails.reset(
            self.audit.taken_since(at - window), self.audit.failed_since(at - cooldown)
        )
        self._seeded = True

    def act(
        self, decisions: Sequence[Decision], cluster: ClusterSnapshot, snap: PolicySnapshot
    ) -> list[ActuationResult]:
        at = snap.at
        resizes = [d for d in decisions if d.action.kind == RESIZE]
        others = [d for d in decisions if d.action.kind != RESIZE]
        results = self.actuator.carry_out(others, at) if others else []
        if resizes and self.malleable is not None:
            results += self.malleable.carry_out(resizes, cluster, snap.malleable, at)
        return results

    def busy(self) -> bool:
        """True while a resize is in flight: the daemon then observes every second."""
        return self.malleable is not None and self.malleable.busy()

    def run(self, cluster: ClusterSnapshot, at: datetime) -> list[ActuationResult]:
        """Decide and act for one observed snapshot; never raises.

        An exception from one policy on one job leaves that job out (PolicyEngine); any
        other is logged with its traceback and counted, and the next cycle runs as usual.
        """
        try:
            results = self._core.step(cluster, at)
        except SQLAlchemyError as exc:
            # The store, not a bug: one line (once while the same error lasts); the
            # daemon's store watch checks the store after the cycle.
            self.errors["cycle"] += 1
            line = one_line(exc)
            level = logging.WARNING if line != self._store_error else logging.DEBUG
            self._store_error = line
            log.log(level, "policy cycle skipped: %s; the next cycle runs as usual", line)
            return []
        except Exception:
            self.errors["cycle"] += 1
            log.exception("policy cycle failed; the next cycle runs as usual")
            return []
        self._store_error = None
        self._report_backlog()
        return results

    def _report_backlog(self) -> None:
        """One line when rightsizing starts leaving pending jobs for later cycles (a first
        cycle on a deep queue, a reload that changed most users' history), one when it
        has judged them all; the count in between is the sgpu_rightsize_backlog_jobs
        gauge."""
        if self.rightsize is None:
            return
        backlog = self.rightsize.backlog
        if backlog and not self._backlog:
            log.info(
                "rightsize: %d pending jobs left to judge in the next cycles (at most %d "
                "a cycle: policy.rightsize.max_judged_per_cycle)",
                backlog,
                self.rightsize.settings.max_judged_per_cycle,
            )
        elif self._backlog and not backlog:
            log.info("rightsize: every pending job judged")
        self._backlog = backlog


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
    rightsize = RightsizePolicy(p.rightsize, sizing=p.sizing)
    policies: list[tuple[Policy, Mode]] = [
        (IdleGpuPolicy(p.idle_gpu), p.idle_gpu.mode),
        (rightsize, p.rightsize.mode),
        (ColocatePolicy(p.colocate, sizing=p.sizing), p.colocate.mode),
        (MalleablePolicy(p.malleable), p.malleable.mode),
    ]
    if p.las.enabled:  # the site's opt-in ([policy.las] enabled = true)
        expands = p.malleable.mode is Mode.ENFORCE and p.malleable.expand
        policies.append((AttainedServicePolicy(p.las, malleable_expands=expands), p.las.mode))
        check_las_priority(p.las, slurm)  # warns once, at start, where Nice hits the floor
    # the engine's pipeline order is the registry's, the simulator's too
    engine = PolicyEngine(in_pipeline_order(policies), p.engine)
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
    errors: Counter[str] = Counter()  # the cycle's and the directory's, one metric
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
        directory=MalleableDirectory(store, errors=errors),
        errors=errors,
    )

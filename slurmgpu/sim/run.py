"""Run one trace through SimSlurm with one policy set, the way the daemon would drive it.

Every ``period_s`` (60 s, the daemon's cycle) the runner observes SimSlurm through the
SlurmClient protocol (``jobs()``, ``nodes()``), builds the same
:class:`~slurmgpu.policy.base.PolicySnapshot` the daemon builds (usage of running jobs
from their workload model, history of finished jobs, prior alerts, the engine's
cooldown and rate bookkeeping) and asks the daemon's PolicyEngine to decide. Decisions
to execute are carried out by the actuator's own ``execute_action`` (``actuate.execute``)
through SimSlurm; a ``resize`` by the daemon's dispatcher and resize transactions
(``sim.resizes.SimResizes``: ``cycle.dispatch``, ``ResizeExecutor`` for a job,
``PoolExecutor`` for an array pool, in memory, acknowledged by SimSlurm's checkpoint
record, observed every second while in flight) -- the job pays the checkpoint, the
executor's steps, scheduling and start-up, and is refused where the daemon refuses it.
An alert (a prior alert for the policies) is an issued outcome, as the daemon's audit
counts them: a refused action is none.

A cycle is skipped when nothing changed since the last one, except that one runs at
least every ``quiet_period_s`` (10 min) so time-based rules still fire, and at the
daemon's cadence while running jobs' samples can change a sample-driven policy's
verdict: while an idle job (no GPU util) runs and ``idle_gpu`` is in the set, and until
a co-located (shard) job has had ``colocate``'s ``min_samples`` samples + a cycle
(``_watch_horizon``). History (for the priors) is rebuilt at most every
``history_refresh_s`` (10 min, as the daemon) and only when it grew by 5 % or a day
passed, so a long trace does not rebuild it per cycle.

For replaying a scenario seen on a real cluster (``tests/slurm/test_sim_vs_real.py``):
``SimOptions.history`` preloads the priors' history (the records the daemon's store
would hand out), ``SimOptions.opted_in`` decides opt-in the daemon's way (from the
job's comment) instead of opting every pending job in, ``sample_interval_s`` is the
agents' sampling period, a trace job whose ``extra`` has ``hold`` is submitted held
(``sbatch --hold``), and ``record_decisions`` keeps every decision that was not
suppressed, warnings and advice included (outcome ``notified``), in order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from slurmgpu.actuate.execute import execute_action
from slurmgpu.cycle.core import MalleableView, PolicyCycle
from slurmgpu.cycle.guardrails import GuardrailRecords
from slurmgpu.cycle.resize import KIND as RESIZE_KIND
from slurmgpu.cycle.resize import OVERTAKEN, ResizeSettings
from slurmgpu.model import ClusterSnapshot, Job, JobState, MalleableSpec
from slurmgpu.policy.base import (
    RESIZE,
    Decision,
    HistoryRecord,
    JobUsage,
    PolicySnapshot,
    PriorAlert,
    is_ordering,
    is_preempt,
)
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.priors import Priors
from slurmgpu.sim.baselines import QssfPriority, tiresias_key, tiresias_preemptions
from slurmgpu.sim.costs import CostSet
from slurmgpu.sim.fairshare import FairShareConfig, FairTree
from slurmgpu.sim.gputypes import speed_factor
from slurmgpu.sim.policysets import BASELINES, BATCH_ADAPTIVE, SimPolicies, build_engine
from slurmgpu.sim.resizes import SimResizes
from slurmgpu.sim.sharing import (
    DEFAULT_DEVICE_MIB,
    DEFAULT_MIG_LAYOUT,
    MPS_PER_GPU,
    SharingMode,
    parse_mig_layout,
)
from slurmgpu.sim.slurm import ElasticRuntime, InterferenceModel, SimJob, SimSlurm
from slurmgpu.sim.slurmsched import SlurmScheduling
from slurmgpu.sim.usage import DEVICE_MEMORY_MIB, LazyUsage, UsageModel
from slurmgpu.sim.workload import ProfiledJob, TraceJob, elastic_batch, packed
from slurmgpu.slurm.client import SlurmError
from slurmgpu.slurm.update import audit_fields
from slurmgpu.tokens import NORIGHTSIZE, POOL, rightsize_opted_out
from slurmgpu.tokens import parse as parse_tokens

__all__ = [
    "ClusterShape",
    "DecisionRecord",
    "SimOptions",
    "SimRun",
    "scale_load",
    "simulate",
]

# Outcomes that are alerts (warnings and actions issued), as the daemon's audit counts
# them (store.audit.ISSUED; not imported: sim/ loads no store): a failed action is none.
ISSUED = frozenset({"done", "notified", "skipped"})


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """``16x4``: 16 nodes with 4 GPUs each (and ``shards_per_gpu`` shards per GPU).

    Mixed sizes: ``2x8,4x4`` -- groups of ``NODESxGPUS``, in order (``node_gpus``: each
    node's GPUs; ``gpus_per_node`` is then the largest). Heterogeneous types:
    ``8xa100:4,8xv100:8`` -- groups of ``NODESxTYPE:GPUS``, the nodes of each group
    carrying that GPU type (``types``: ``(nodes, type)`` per group, in order). Groups are
    all typed or all untyped.

    Sharing (:meth:`with_sharing`, :mod:`slurmgpu.sim.sharing`): ``shards_per_gpu``
    shards or ``mps_per_gpu`` MPS units per whole GPU, and ``mig_gpus`` GPUs of every
    node split as ``mig_layout``; ``device_memory_mib`` is the GPUs' memory (the
    co-location policy's and the agents' samples').
    """

    nodes: int = 16
    gpus_per_node: int = 4
    shards_per_gpu: int = 4
    types: tuple[tuple[int, str], ...] = ()
    node_gpus: tuple[int, ...] = ()  # per node, when nodes differ; () = all gpus_per_node
    mps_per_gpu: int = 0
    mig_gpus: int = 0  # per node
    mig_layout: tuple[str, ...] = ()
    device_memory_mib: int = int(DEVICE_MEMORY_MIB)

    def with_sharing(
        self,
        mode: SharingMode,
        *,
        shards_per_gpu: int = 4,
        mig_layout: tuple[str, ...] = DEFAULT_MIG_LAYOUT,
        mig_gpus: int | None = None,
        device_memory_mib: int = DEFAULT_DEVICE_MIB,
    ) -> ClusterShape:
        """This cluster's GPUs presented as ``mode`` shares them (sim.sharing), all on
        ``device_memory_mib`` GPUs; MIG splits ``mig_gpus`` GPUs of every node (default:
        half of the smallest node's, at least one, and one stays whole). ValueError: a
        layout the GPU cannot hold, or no GPU left whole."""
        base = replace(
            self,
            shards_per_gpu=0,
            mps_per_gpu=0,
            mig_gpus=0,
            mig_layout=(),
            device_memory_mib=device_memory_mib,
        )
        if mode == "shards":
            if shards_per_gpu < 2:
                raise ValueError("shards: give each GPU 2 shards or more")
            return replace(base, shards_per_gpu=shards_per_gpu)
        if mode == "mps":
            return replace(base, mps_per_gpu=MPS_PER_GPU)
        if mode == "mig":
            layout = parse_mig_layout(mig_layout, device_memory_mib)
            smallest = min(self.per_node())
            split = max(1, smallest // 2) if mig_gpus is None else mig_gpus
            if split < 1 or split >= max(self.per_node()):
                raise ValueError(
                    f"mig GPUs per node must be 1 to {max(self.per_node()) - 1}, not {split}"
                )
            return replace(base, mig_gpus=split, mig_layout=tuple(p.name for p in layout))
        return base

    @classmethod
    def parse(cls, text: str, shards_per_gpu: int = 4) -> ClusterShape:
        if ":" in text or "," in text:
            return cls._parse_groups(text, shards_per_gpu)
        nodes, sep, gpus = text.lower().partition("x")
        if not sep or not nodes.strip().isdigit() or not gpus.strip().isdigit():
            raise ValueError(
                f"cluster must look like 16x4 (nodes x GPUs per node), 2x8,4x4 (groups of"
                f" nodes x GPUs) or 8xa100:4,8xv100:4 (nodes x type:GPUs per node, per"
                f" group), not {text!r}"
            )
        shape = cls(int(nodes), int(gpus), shards_per_gpu)
        if shape.nodes < 1 or shape.gpus_per_node < 1:
            raise ValueError(f"cluster {text!r} has no GPU")
        return shape

    @classmethod
    def _parse_groups(cls, text: str, shards_per_gpu: int) -> ClusterShape:
        groups: list[tuple[int, str]] = []
        sizes: list[int] = []
        parts = [p.strip() for p in text.lower().split(",")]
        typed = [":" in p for p in parts]
        if any(typed) and not all(typed):
            raise ValueError(
                f"cluster {text!r}: give every group a GPU type (8xa100:4) or none (8x4)"
            )
        for part in parts:
            nodes, sep, rest = part.partition("x")
            gpu_type, colon, gpus = rest.rpartition(":")
            gpu_type = gpu_type.strip()
            if (
                not sep
                or not nodes.strip().isdigit()
                or not gpus.strip().isdigit()
                or (
                    colon
                    and (not gpu_type or not gpu_type.replace("_", "").replace("-", "").isalnum())
                )
            ):
                raise ValueError(
                    f"cluster group {part!r} must look like 8xv100:4 "
                    f"(nodes x GPU type : GPUs per node) or 8x4 (nodes x GPUs per node)"
                )
            if int(nodes) < 1 or int(gpus) < 1:
                raise ValueError(f"cluster group {part!r} has no GPU")
            if colon:
                speed_factor(None, gpu_type)  # a type without measured speeds: refused here
                groups.append((int(nodes), gpu_type))
            sizes.extend([int(gpus)] * int(nodes))
        return cls(
            len(sizes),
            max(sizes),
            shards_per_gpu,
            tuple(groups),
            tuple(sizes) if len(set(sizes)) > 1 else (),
        )

    @classmethod
    def of_nodes(cls, node_gpus: Sequence[int], shards_per_gpu: int = 4) -> ClusterShape:
        """The cluster of these nodes' GPU counts (nodes without GPUs left out), largest
        nodes first; a uniform one when every node has as many. ValueError: no GPU."""
        sizes = sorted((g for g in node_gpus if g > 0), reverse=True)
        if not sizes:
            raise ValueError("no node with a GPU")
        mixed = tuple(sizes) if sizes[0] != sizes[-1] else ()
        return cls(len(sizes), sizes[0], shards_per_gpu, (), mixed)

    @property
    def gpus(self) -> int:
        return sum(self.node_gpus) if self.node_gpus else self.nodes * self.gpus_per_node

    def per_node(self) -> tuple[int, ...]:
        """Each node's GPU count, in node order."""
        return self.node_gpus or (self.gpus_per_node,) * self.nodes

    def text(self) -> str:
        """How :meth:`parse` spells this shape (``16x4``, ``2x8,4x4``, ``8xa100:4,...``)."""
        sizes = self.per_node()
        names = self.node_types()
        groups: list[tuple[int, str | None, int]] = []
        for i, g in enumerate(sizes):
            t = None if names is None else names[i]
            if groups and groups[-1][1:] == (t, g):
                groups[-1] = (groups[-1][0] + 1, t, g)
            else:
                groups.append((1, t, g))
        return ",".join(f"{n}x{t}:{g}" if t else f"{n}x{g}" for n, t, g in groups)

    def node_types(self) -> tuple[str, ...] | None:
        """Each node's GPU type, in node order; None for an untyped cluster."""
        if not self.types:
            return None
        return tuple(t for n, t in self.types for _ in range(n))

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t, g in zip(self.node_types() or (), self.per_node(), strict=False):
            out[t] = out.get(t, 0) + g
        return out


@dataclass(frozen=True, slots=True)
class SimOptions:
    """How the simulated site behaves (Slurm's costs, the daemon's cycle).

    The costs (``requeue_delay_s``, ``submit_delay_s``, ``completing_s``, ``runtime``)
    default to the ``legacy`` cost set's, on which the unit tests pin the simulator's
    mechanics; the tools (``sgpu simulate``, the benches) build their options from a named cost set,
    the measured ``sim.costs.DEFAULT`` unless told otherwise: :meth:`of_costs`.
    """

    period_s: float = 60.0
    quiet_period_s: float = 600.0
    requeue_delay_s: float = 121.0
    runtime: ElasticRuntime = field(default_factory=ElasticRuntime)
    submit_delay_s: float = 0.0  # a submission -> the first pass that may start it
    completing_s: float = 0.0  # a job's end -> its GPUs free (Slurm's COMPLETING state)
    # How the daemon's resize executor (cycle.resize, run here as in the daemon)
    # paces a resize or preemption: its fast path by default (StartTime=now+1 with the
    # update, the release release_delay later, one observation per cycle_interval while
    # in flight); fast_start=False: Slurm's plain requeue path, waiting out
    # requeue_delay_s.
    resize: ResizeSettings = field(default_factory=ResizeSettings)
    history_refresh_s: float = 600.0
    interference: InterferenceModel | None = None
    policies: SimPolicies = field(default_factory=SimPolicies)
    max_virtual_s: float = 400 * 86400.0
    max_resubmits: int = 3  # a user resubmits a timed-out job this many times
    # A job whose limit the daemon lowered (rightsizing, a resize's limit) and that ran
    # into it is requeued with the limit it asked for, keeping its place in the queue.
    restore_lowered_limits: bool = True
    record_decisions: bool = False
    history: tuple[HistoryRecord, ...] = ()  # finished jobs known before the trace starts
    # None: every pending job opted in to rightsizing; else the daemon's rule per job.
    opted_in: Callable[[Job], bool] | None = None
    sample_interval_s: float = 30.0  # the agents' sampling period (GpuStat.samples)
    # The batch-adaptive sets' jobs declare these upper batch limits per application
    # (sim.workload.elastic_batch); empty: the batch each job was submitted with.
    batch_ceilings: tuple[tuple[str, int], ...] = ()
    # Their efficiency by slice of training (sim.workload.ProfiledJob.phased): the batch
    # picked at each (re)start from the noise scale then, not the run's average.
    batch_phases: bool = False
    # The release SimSlurm answers as (what it lets an update change: sim.slurm)
    slurm_version: str = "22.05.8"
    # The site's multifactor fair-share priority (sim.fairshare); None: priority/basic,
    # submit order. The Tiresias and QSSF baselines keep their own order either way.
    fairshare: FairShareConfig | None = None
    # Slurm's own passes (sim.slurmsched: a strict-order main scheduler and conservative
    # backfill every bf_interval); None: one EASY-backfill pass at every change.
    scheduling: SlurmScheduling | None = None

    @classmethod
    def of_costs(cls, costs: CostSet, **others: Any) -> SimOptions:
        """Options charging ``costs`` (a cost set of sim.costs), the rest as given."""
        return cls(
            requeue_delay_s=costs.requeue_delay.seconds,
            submit_delay_s=costs.submit_delay.seconds,
            completing_s=costs.completing.seconds,
            runtime=costs.runtime(),
            **others,
        )


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One executed (or refused) decision, for replay comparisons."""

    at_s: float
    policy: str
    kind: str
    job_id: int
    fields: tuple[tuple[str, str], ...]
    outcome: str


@dataclass(frozen=True, slots=True)
class SimOutcome:
    """What became of one decision in the simulator (the shared cycle's result)."""

    decision: Decision
    outcome: str  # done | notified | skipped | failed: ...


@dataclass
class SimRun:
    """What one simulation produced: every job as it ended, plus bookkeeping."""

    policy_set: str
    shape: ClusterShape
    jobs: list[SimJob]
    never_ran: int
    cycles: int
    executed: int
    failed: int
    resizes: int
    decisions: list[DecisionRecord] = field(default_factory=list)
    end_s: float = 0.0
    all_jobs: list[SimJob] = field(default_factory=list)  # with timed-out earlier attempts
    preemptions: int = 0  # jobs checkpointed and requeued at their own size
    reorders: int = 0  # ordering updates (Nice) executed
    limit_restores: int = 0  # jobs requeued with the limit they asked for (a lowered one hit)
    overtaken: int = 0  # resizes released, then still pending (cycle.resize.OVERTAKEN)


def _history_record(sim: SimSlurm, job: SimJob) -> HistoryRecord:
    run_s = 0.0
    if job.runs:
        last = job.runs[-1]
        run_s = max(0.0, (last.end_s if not math.isnan(last.end_s) else sim.now) - last.start_s)
    return HistoryRecord(
        user=job.user,
        name=job.name,
        partition=job.partition,
        script_hash=None,
        state=job.state.value,
        run_time=timedelta(seconds=run_s),
        time_limit=None if job.time_limit_s is None else timedelta(seconds=job.time_limit_s),
        gpus_requested=job.gpus,
        gpus_used=job.gpus or None,
        cpus=0,
        memory_requested_mib=None,
        peak_memory_mib=None,
        mean_cpu_pct=None,
        mean_gpu_util_pct=job.model.util_pct,
        peak_gpu_memory_mib=job.model.memory_mib or None,
        ended_at=sim.at(job.end_s),
        restarts=job.restarts,
    )


def _type_speed(job: SimJob, gpu_type: str) -> float:
    app = job.model.app.name if isinstance(job.model, ProfiledJob) else None
    return speed_factor(app, gpu_type)


class _Runner:
    def __init__(
        self,
        trace: Sequence[TraceJob],
        shape: ClusterShape,
        policy_set: str,
        options: SimOptions,
        progress: Callable[[int, int], None] | None,
        engine: PolicyEngine | None = None,
    ) -> None:
        self.trace = sorted(trace, key=lambda j: j.submit_s)
        self.options = options
        self.policy_set = policy_set
        self.progress = progress
        self.sim = SimSlurm(
            shape.nodes,
            shape.gpus_per_node,
            shards_per_gpu=shape.shards_per_gpu,
            requeue_delay_s=options.requeue_delay_s,
            submit_delay_s=options.submit_delay_s,
            completing_s=options.completing_s,
            runtime=options.runtime,
            interference=options.interference,
            node_types=shape.node_types(),
            type_speed=_type_speed if shape.types else None,
            node_gpus=shape.node_gpus or None,
            slurm_version=options.slurm_version,
            mps_per_gpu=shape.mps_per_gpu,
            mig_gpus=shape.mig_gpus,
            mig_layout=parse_mig_layout(shape.mig_layout, shape.device_memory_mib)
            if shape.mig_gpus
            else (),
            scheduling=options.scheduling,
        )
        self.shape = shape
        self.engine: PolicyEngine = engine or build_engine(policy_set, options.policies)
        self.qssf: QssfPriority | None = None
        if policy_set == "tiresias":
            self.sim.priority = tiresias_key(self.sim)
        elif policy_set == "qssf":
            self.qssf = QssfPriority(self.sim)
            self.sim.priority = self.qssf
        elif options.fairshare is not None:
            self.sim.priority = FairTree(self.sim, options.fairshare)
        self.next_arrival = 0
        self.history_records: list[HistoryRecord] = list(options.history)
        self.history_tuple: tuple[HistoryRecord, ...] = options.history
        if self.qssf is not None and options.history:
            self.qssf.update(Priors.from_history(options.history))
        self.history_at = -math.inf
        self.alerts: list[PriorAlert] = []
        # Cooldown and rate-limit records, as the daemon's (cycle.guardrails).
        self.guardrails = GuardrailRecords()
        self.last_changes = -1
        self.last_cycle = -math.inf
        self.cycles = self.executed = self.failed = self.resizes = 0
        self.reorders = self.preemptions = self.limit_restores = 0
        self.records: list[DecisionRecord] = []
        # The daemon's resize transactions (cycle.dispatch: jobs and array pools),
        # in memory, acknowledged by SimSlurm's checkpoint record, in virtual time.
        self.resizer = SimResizes(self.sim, options.resize)
        self.total = sum(max(1, j.array_tasks) for j in self.trace)
        self.sim.listeners.append(self._ended)
        self.needs_cycles = bool(self.engine.policies) or policy_set in BASELINES
        # Running jobs whose samples sample-driven policies watch (see _watch_horizon).
        names = {p.name: p for p, _ in self.engine.policies}
        self.watch_idle = "idle_gpu" in names
        self.colocate_window_s = -math.inf
        self.watch_until = -math.inf
        if "colocate" in names:
            min_samples = getattr(getattr(names["colocate"], "settings", None), "min_samples", 3)
            self.colocate_window_s = int(min_samples) * options.sample_interval_s + options.period_s
        # The daemon's cycle (cycle.core), with this runner as its sources and executor.
        self.usage_model = UsageModel(
            self.sim, options.sample_interval_s, float(shape.device_memory_mib)
        )
        # job id -> (what it was worked out from, its spec, its measured rates)
        self.malleable_cache: dict[
            int, tuple[tuple[object, ...], MalleableSpec, dict[int, float] | None]
        ] = {}
        self.core: PolicyCycle[SimOutcome] = PolicyCycle(self.engine, self, self, self.guardrails)

    # ---- arrivals and endings

    def _submit(self, spec: TraceJob) -> None:
        job_id = self.sim.submit_job(spec)
        if spec.extra.get("hold"):
            self.sim.hold(job_id)

    def _arrive(self) -> None:
        spec = self.trace[self.next_arrival]
        self.next_arrival += 1
        self._submit(spec)
        while (
            self.next_arrival < len(self.trace)
            and self.trace[self.next_arrival].submit_s <= self.sim.now
        ):
            self._submit(self.trace[self.next_arrival])
            self.next_arrival += 1
        if self.next_arrival < len(self.trace):
            self.sim.call_at(self.trace[self.next_arrival].submit_s, self._arrive)

    def _ended(self, job: SimJob) -> None:
        self.history_records.append(_history_record(self.sim, job))
        asked = job.spec.time_limit_s
        if (
            job.state is JobState.TIMEOUT
            and self.options.restore_lowered_limits
            and job.array_job_id is None
            and job.time_limit_s is not None
            and (asked is None or job.time_limit_s < asked)
            and job.resubmits < self.options.max_resubmits
        ):
            # Rightsizing never costs a job its run: one that ran into a limit lowered
            # for it is requeued (``scontrol requeuehold`` takes a finished batch job)
            # with the limit it asked for, at its place in the queue (its submit time),
            # after Slurm's requeue delay, resuming from the checkpoint taken at SIGTERM.
            # Its comment gains ``sgpu:norightsize``: its limit is not lowered again. The
            # daemon's rule: slurmgpu.policy.limit_restore.
            comment = job.spec.comment
            if not rightsize_opted_out(comment):
                comment = f"{comment},{NORIGHTSIZE}" if comment else NORIGHTSIZE
            new_id = self.sim.submit_job(replace(job.spec, comment=comment), resume=job)
            task = self.sim.all_jobs[new_id]
            task.submit_s = job.submit_s
            # the same job to Slurm, started again: its run time in sacct is the last
            # run's, so its key sets no limit while it is in the history (as the daemon's
            # restore, slurmgpu.daemon.limit_restore; the killed run is the TIMEOUT sample)
            task.restarts = job.restarts + 1
            task.eligible_s = self.sim.now + self.options.requeue_delay_s
            self.limit_restores += 1
            self.total += 1
        elif (
            job.state is JobState.TIMEOUT
            and job.array_job_id is None
            and job.resubmits < self.options.max_resubmits
        ):
            # The user submits it again with the limit they first asked for (doubled
            # after a second timeout), resuming from the checkpoint taken at SIGTERM.
            limit = job.spec.time_limit_s
            if limit is not None:
                limit *= 2**job.resubmits
            spec = replace(job.spec, time_limit_s=limit)
            self.sim.submit_job(spec, resume=job)
            self.total += 1
        if self.progress is not None:
            self.progress(len(self.sim.finished), self.total)

    # ---- the daemon's cycle

    def _tick(self) -> None:
        sim = self.sim
        quiet = sim.now - self.last_cycle >= self.options.quiet_period_s
        watched = sim.now <= self.watch_until
        if sim.changes != self.last_changes or quiet or watched:
            self._cycle()
        arrivals_left = self.next_arrival < len(self.trace)
        if arrivals_left or not sim.idle:
            stuck = not arrivals_left and not any(True for _ in sim.running())
            if stuck and all(j.held for j in sim.pending()):
                return  # only held jobs left: nothing will ever change
            sim.call_at(sim.now + self.options.period_s, self._tick)

    def _watch_horizon(self) -> float:
        """Until when running jobs' samples may change a sample-driven verdict.

        Worked out at each cycle (a job starting or ending changes the cluster, so a
        cycle follows it): while an idle job runs, for ever; else until the newest
        co-located job has had its samples judged.
        """
        if not self.watch_idle and self.colocate_window_s < 0:
            return -math.inf
        until = -math.inf
        for job in self.sim.running():
            if self.watch_idle and job.model.util_pct <= 0:
                return math.inf
            if job.shard_alloc is not None:
                until = max(until, job.start_s + self.colocate_window_s)
        return until

    def _refresh_history(self) -> None:
        now = self.sim.now
        grown = len(self.history_records) - len(self.history_tuple)
        if grown <= 0 or now - self.history_at < self.options.history_refresh_s:
            return
        if grown < 0.05 * len(self.history_tuple) and now - self.history_at < 86400.0:
            return
        self.history_tuple = tuple(self.history_records)
        self.history_at = now
        if self.qssf is not None:
            self.qssf.update(Priors.from_history(self.history_tuple))
            self.sim.changes += 1

    def _usage(self) -> LazyUsage:
        return self.usage_model.usage()

    def _cycle(self) -> None:
        sim = self.sim
        self.cycles += 1
        self.last_changes = sim.changes
        self.last_cycle = sim.now
        self._refresh_history()
        self.watch_until = self._watch_horizon()
        if self.policy_set == "tiresias":
            self._tiresias()
            return
        if not self.engine.policies:
            return
        at = sim.at(sim.now)
        cluster = ClusterSnapshot(at, tuple(sim.jobs()), tuple(sim.nodes()), sim.version())
        self.core.step(cluster, at)

    # ---- the shared cycle's sources (cycle.core.CycleSources)

    def job_usage(self, cluster: ClusterSnapshot, at: datetime) -> Mapping[int, JobUsage]:
        return self._usage()

    def history(self, at: datetime) -> tuple[HistoryRecord, ...]:
        return self.history_tuple

    def prior_alerts(self, cluster: ClusterSnapshot) -> tuple[PriorAlert, ...]:
        live = {j.job_id for j in cluster.jobs}
        return tuple(a for a in self.alerts if a.job_id in live)

    def opted_in(self, job: Job) -> bool:
        opt_in = self.options.opted_in
        return opt_in is None or opt_in(job)

    def malleable_view(self, cluster: ClusterSnapshot, at: datetime) -> MalleableView:
        specs, rates = self._malleable_view()
        # as the daemon's MalleableActuator: from the transactions, only when a job is
        # malleable
        cost, last = self.resizer.history() if specs else (None, {})
        return MalleableView(
            specs=specs,
            resizing=self.resizer.in_flight,
            throughput=rates,
            resize_cost=cost,
            last_resize_at=last,
        )

    # ---- the shared cycle's executor (cycle.core.Executor)

    def confirm(self, cluster: ClusterSnapshot, at: datetime) -> None:
        self.resizer.advance(cluster, at)  # before deciding, as the daemon

    def act(
        self, decisions: Sequence[Decision], cluster: ClusterSnapshot, snap: PolicySnapshot
    ) -> list[SimOutcome]:
        return [SimOutcome(d, self._carry_out(d, cluster, snap)) for d in decisions]

    def _carry_out(self, d: Decision, cluster: ClusterSnapshot, snap: PolicySnapshot) -> str:
        a = d.action
        sim = self.sim
        if a.kind == RESIZE:
            # the daemon's dispatcher: a job's transaction or a pool's, refusals failed
            done = self.resizer.carry_out(d, cluster, snap.malleable)
            outcome = done.outcome if done.error is None else f"failed: {done.error}"
            if done.outcome == "done":
                if is_preempt(a):
                    self.preemptions += 1
                else:
                    self.resizes += 1
        elif not d.execute:
            outcome = "notified" if d.notify else "skipped"
        else:
            outcome = "done"
            try:
                execute_action(sim, a)
            except (SlurmError, ValueError) as exc:
                outcome = f"failed: {exc}"
        # An alert is what the daemon's audit counts as issued: not a failed action.
        if not d.suppressed and outcome in ISSUED:
            self.alerts.append(PriorAlert(a.job_id, a.policy, a.alert or a.kind, sim.at(sim.now)))
        if d.execute:
            if outcome == "done":
                self.executed += 1
                if is_ordering(a):  # no change for the guardrails (GuardrailRecords)
                    self.reorders += 1
            else:
                self.failed += 1
        if self.options.record_decisions and (d.execute or d.notify):
            self.records.append(
                DecisionRecord(
                    sim.now,
                    a.policy,
                    a.kind,
                    a.job_id,
                    tuple(sorted(audit_fields(a.intents, sim.version()).items())),
                    outcome,
                )
            )
        return outcome

    def _malleable_view(
        self,
    ) -> tuple[dict[int, MalleableSpec], dict[int, dict[int, float]]]:
        specs: dict[int, MalleableSpec] = {}
        rates: dict[int, dict[int, float]] = {}
        sim = self.sim
        cache = self.malleable_cache
        for job in (*sim.running(), *sim.pending()):
            if job.array_job_id is not None:
                # an array pool (``sgpu:pool=MIN:MAX``), by array id, as the daemon's
                # directory gives it (daemon/malleable.py); no measured speeds
                if POOL in job.comment and job.array_job_id not in specs:
                    token = parse_tokens(job.comment).malleable
                    if token is not None and token.pool:
                        specs[job.array_job_id] = MalleableSpec(
                            job.array_job_id, token.lo, token.hi, pool=True
                        )
                continue
            m = job.malleable
            if m is None:
                continue
            running = job.state is JobState.RUNNING and bool(job.runs)
            # measured on the GPU type it runs on now (a typed cluster)
            factor = sim.type_factor(job) if running else 1.0
            # A job's runs only grow, so their count says whether its sizes changed; a
            # phased job's goodput at each size changes with its slice of training.
            model = job.model
            phased = isinstance(model, ProfiledJob) and model.phases > 1
            work = job.work_at(sim.now) if phased and running else 0.0
            phase = model.phase(work) if phased and isinstance(model, ProfiledJob) else 0
            key = (m, len(job.runs), running, factor, phase)
            hit = cache.get(job.job_id)
            if hit is None or hit[0] != key:
                spec = MalleableSpec(job.job_id, m.min_gpus, m.max_gpus)
                measured: dict[int, float] | None = None
                if running:
                    # What the job's runtime reports (elastic/runtime.py): per GPU count,
                    # the speed of its latest run at that count, on the layout it had.
                    layouts: dict[int, tuple[int, ...]] = {}
                    for r in job.runs:
                        if r.gpus >= 1:
                            g = int(r.gpus)
                            layouts[g] = r.placement or packed(g, sim.gpus_per_node)
                    if phased and isinstance(model, ProfiledJob):
                        # the runtime's goodput at each size it ran at, re-evaluated at
                        # the noise scale it measures now (the batch it would pick there)
                        measured = {
                            g: model.rate_in(layouts[g], model.phase_batch(layouts[g], work), work)
                            * factor
                            for g in sorted(layouts)
                        }
                    else:
                        measured = {g: job.model.rate(layouts[g]) * factor for g in sorted(layouts)}
                hit = cache[job.job_id] = (key, spec, measured)
            specs[job.job_id] = hit[1]
            if hit[2] is not None:
                rates[job.job_id] = dict(hit[2])
        if len(cache) > 2 * len(specs) + 64:  # forget jobs that ended
            self.malleable_cache = {j: v for j, v in cache.items() if j in specs}
        return specs, rates

    # ---- Tiresias' preemption, the Slurm way

    def _tiresias(self) -> None:
        sim = self.sim
        for job in tiresias_preemptions(sim):
            if job.state is not JobState.RUNNING or not job.requeue:
                continue
            started = sim.now
            sim.signal(job.job_id, "USR2")
            self.preemptions += 1

            def preempt(job: SimJob = job, started: float = started) -> None:
                acked = sim.checkpointed_at(job.job_id)
                if job.state is JobState.RUNNING and acked is not None and acked >= started:
                    sim.requeue(job.job_id)

            sim.call_at(sim.now + sim.runtime.checkpoint_s, preempt)

    # ---- main loop

    def run(self) -> SimRun:
        sim = self.sim
        if self.trace:
            sim.call_at(self.trace[0].submit_s, self._arrive)
            if self.needs_cycles:
                sim.call_at(self.trace[0].submit_s, self._tick)
        limit = (self.trace[-1].submit_s if self.trace else 0.0) + self.options.max_virtual_s
        while True:
            t = sim.next_event_s()
            if not math.isfinite(t) or t > limit:
                break
            sim.run_until(t)
        done = [j for j in sim.all_jobs.values() if j.done and not j.superseded]
        never = sum(1 for j in sim.all_jobs.values() if not j.done)
        return SimRun(
            self.policy_set,
            self.shape,
            done,
            never,
            self.cycles,
            self.executed,
            self.failed,
            self.resizes,
            self.records,
            sim.now,
            list(sim.all_jobs.values()),
            self.preemptions,
            self.reorders,
            self.limit_restores,
            len(self.resizer.transactions.in_states([RESIZE_KIND], (OVERTAKEN,))),
        )


def simulate(
    trace: Sequence[TraceJob],
    shape: ClusterShape,
    policy_set: str,
    options: SimOptions | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    engine: PolicyEngine | None = None,
) -> SimRun:
    """Run ``trace`` on a ``shape`` cluster under ``policy_set``; deterministic.

    ``engine`` replaces the set's engine (tests drive a test-only policy through the
    real engine this way). Raises ``KeyError`` for an unknown set.
    """
    options = options or SimOptions()
    if policy_set in BATCH_ADAPTIVE:  # its jobs retune their batch (sim.workload)
        trace = elastic_batch(
            trace, dict(options.batch_ceilings) or None, phased=options.batch_phases
        )
    return _Runner(trace, shape, policy_set, options, progress, engine).run()


def scale_load(trace: Sequence[TraceJob], load: float) -> list[TraceJob]:
    """Arrivals ``load`` times as dense (2.0: twice the jobs per hour), same jobs."""
    if load <= 0 or not math.isfinite(load):
        raise ValueError(f"load must be a number > 0, not {load}")
    if not trace:
        return []
    t0 = min(j.submit_s for j in trace)
    out = []
    for j in trace:
        out.append(replace(j, submit_s=t0 + (j.submit_s - t0) / load))
    return out


def seeded(seed: int, salt: str) -> random.Random:
    """A random stream per purpose, so one change does not shift every other draw."""
    return random.Random(f"{seed}:{salt}")  # noqa: S311 - reproducible draws, not secrets

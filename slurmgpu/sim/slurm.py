"""SimSlurm: a Slurm 22.05 that runs in virtual time, behind the SlurmClient protocol.

What it models, and how faithfully:

- **Nodes, GPUs and shards.** Each node has ``gpus`` GPUs, each split into
  ``shards_per_gpu`` ``gres/shard`` units. A GPU is either whole-allocated to one job or
  shared by shard jobs; a whole-GPU job never lands on a GPU that has shard jobs.
- **Scheduling**: pending jobs in priority order (submit order unless a ``priority``
  key is given, which is how the Tiresias and QSSF baselines plug in); the first that
  does not fit gets a reservation at the earliest time it fits *by the running jobs' time
  limits* (EASY backfill, as Slurm's backfill uses limits, never real run times); later
  jobs start now only if they fit and either end by that time or leave the reserved GPUs
  alone. At most ``bf_max_job_test`` (500, Slurm's default) jobs are tried per pass.
  One pass runs at every instant something changes.
- **Placement**: ``--gpus=N`` best fit on one node when it fits, else the nodes with the
  most free GPUs first (a job's speed depends on it); ``--gpus-per-node=K --nodes=M``
  on M nodes. Shard jobs pack onto GPUs that already carry shard jobs first.
- **GPU types** (``node_types``, one per node): a job that asked for a type
  (``gpu:v100:4``) is placed only on nodes of that type, as Slurm's gres matching does;
  an untyped job goes anywhere, spanning types if it must. ``type_speed(job, type)``
  scales its speed on a type (a job over several types runs at its slowest one, as
  synchronous data-parallel training does); without it every type runs alike.
- **Time limits**: a run that reaches its limit ends ``TIMEOUT``.
- **Requeue**: the job goes back to PENDING with ``restart_count + 1`` and a BeginTime
  ``requeue_delay_s`` (121 s, cred_expire + 1 on 22.05-25.x) later; ``requeue(hold=True)``
  also holds it. Work since its last checkpoint is lost.
- **Arrays and throttles**: ``array_tasks`` tasks share one pending meta-record (listed as
  ``A_[3-9%2]``); at most ``ArrayTaskThrottle`` run at once; ``A_i`` addresses one task,
  a bare ``A`` every task (as in Slurm).
- **Priority**: submit order, behind any job of a lower ``Nice`` (``update Nice=``,
  pending or running, as an operator may), unless a ``priority`` key replaces it.
- **Hold, release, update** of pending jobs: ``TimeLimit``, ``TresPerJob``,
  ``TresPerNode`` (gpu or shard), ``NumNodes``, ``Comment``, memory and CPU fields
  (recorded; CPUs and memory are not scheduled). A running job accepts ``TimeLimit``
  and ``NumNodes`` to fewer nodes (Slurm's shrink in place: the job keeps running on
  the nodes it keeps, after the runtime re-forms in ``reform_s``); a GPU change to a
  running job is refused as by slurmctld.
- **Signals** go to the job's elastic runtime (:class:`ElasticRuntime`): on ``USR2``
  or ``TERM`` it pauses, writes a checkpoint in ``checkpoint_s`` and acknowledges
  (:meth:`SimSlurm.checkpointed_at`); a restarted run spends ``startup_s`` loading it.
- **Co-location**: jobs sharing a GPU slow each other as ``interference`` predicts (a
  callable ``(util_a, mem_a, util_b, mem_b) -> (slow_a, slow_b)``; slowdowns >= 1,
  values below 1 are read as relative speeds); without one they run at full speed. A
  job's current relative speed is ``SimJob.speed``; the GPU time it *uses* is its util
  on the one GPU its shards are on times that speed (not times its share of the shards:
  a 30 % job on half a GPU's shards keeps that GPU 30 % busy).

Event-driven: a heap of timed events (arrivals, ends, limits, begin times, checkpoints,
callers' timers); nothing ticks. ``run_until(t)`` processes every event up to ``t``.
Pure: no I/O and no wall clock.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.sim.workload import JobModel, MalleableRange, TraceJob
from slurmgpu.slurm.client import SlurmCommandError
from slurmgpu.slurm.parse import format_time_limit, parse_gres, parse_time_limit

__all__ = [
    "EPOCH",
    "ElasticRuntime",
    "InterferenceModel",
    "PriorityKey",
    "SimJob",
    "SimSlurm",
    "TypeSpeed",
]

EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
InterferenceModel = Callable[[float, float, float, float], tuple[float, float]]
TypeSpeed = Callable[["SimJob", str], float]
PriorityKey = Callable[["SimJob", float], tuple[float, ...]]
_CHECKPOINT_SIGNALS = frozenset({"USR2", "SIGUSR2", "TERM", "SIGTERM", "12", "15"})
_ID_RE = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]*\]))?$")
_START_RE = re.compile(r"^now(?:\+(\d+))?$")


@dataclass(frozen=True, slots=True)
class ElasticRuntime:
    """The user-side runtime's costs: checkpoint on a signal, start-up on every restart."""

    checkpoint_s: float = 20.0
    startup_s: float = 30.0
    reform_s: float = 10.0  # re-forming the process group after a shrink in place


@dataclass(slots=True)
class _Run:
    start_s: float
    end_s: float
    gpus: float  # whole GPUs, or shards / shards_per_gpu
    used_gpu_s: float = 0.0
    # GPUs the job's kernels run on: its whole GPUs, or the one GPU its shards are on
    # (a light job on half a GPU's shards still keeps that GPU busy at its own util).
    compute_gpus: float = 0.0
    # GPUs held per GPU type (heterogeneous clusters; empty when untyped): the run's
    # ``gpus`` and ``used_gpu_s`` split in these proportions.
    by_type: dict[str, float] = field(default_factory=dict)


class SimJob:
    """One job (or array task) inside SimSlurm. Read-only outside this module."""

    __slots__ = (
        "_obj",
        "account",
        "alloc",
        "array_job_id",
        "array_task_id",
        "attained_gpu_s",
        "base_work",
        "busy_from",
        "checkpoint_work",
        "checkpointed_s",
        "comment",
        "eligible_s",
        "end_s",
        "fields",
        "first_start_s",
        "fixed_nodes",
        "gpu_type",
        "gpus",
        "gpus_per_node",
        "held",
        "job_id",
        "malleable",
        "model",
        "name",
        "nice",
        "origin_s",
        "partition",
        "rate",
        "requeue",
        "restarts",
        "resubmits",
        "runs",
        "shard_alloc",
        "shards",
        "spec",
        "speed",
        "start_s",
        "state",
        "submit_s",
        "superseded",
        "time_limit_s",
        "user",
        "version",
    )

    def __init__(self, job_id: int, spec: TraceJob, submit_s: float) -> None:
        self.job_id = job_id
        self.spec = spec
        self.model: JobModel = spec.model
        self.name = spec.name
        self.user = spec.user
        self.account = spec.account
        self.partition = spec.partition
        self.comment = spec.comment
        self.malleable: MalleableRange | None = spec.malleable
        self.array_job_id: int | None = None
        self.array_task_id: int | None = None
        self.submit_s = submit_s
        self.origin_s = submit_s  # first submission, when a user resubmitted it
        self.resubmits = 0
        self.superseded = False  # timed out and submitted again (a later job finishes it)
        self.eligible_s = submit_s
        self.state = JobState.PENDING
        self.held = False
        self.requeue = True
        self.nice = 0
        self.gpus = spec.gpus if not spec.shards else 0
        self.shards = spec.shards
        self.gpus_per_node: int | None = spec.gpus_per_node if self.gpus else None
        self.gpu_type: str | None = spec.gpu_type.lower() if spec.gpu_type else None
        self.fixed_nodes = self.gpus // self.gpus_per_node if self.gpus_per_node else 0
        self.time_limit_s = spec.time_limit_s
        self.fields: dict[str, str] = {}
        self.alloc: list[tuple[int, tuple[int, ...]]] = []
        self.shard_alloc: tuple[int, int, int] | None = None  # node, gpu, shards
        self.start_s = math.nan
        self.first_start_s = math.nan
        self.end_s = math.nan
        self.base_work = 0.0  # work done when ``busy_from`` was set
        self.checkpoint_work = 0.0
        self.checkpointed_s = math.nan
        self.busy_from = math.inf
        self.rate = 0.0
        self.speed = 1.0  # relative speed from co-location (1 = alone on its GPU)
        self.restarts = 0
        self.version = 0
        self.attained_gpu_s = 0.0
        self.runs: list[_Run] = []
        self._obj: Job | None = None

    @property
    def placement(self) -> tuple[int, ...]:
        return tuple(len(g) for _, g in self.alloc)

    @property
    def allocated_gpus(self) -> int:
        return sum(len(g) for _, g in self.alloc)

    def work_at(self, t: float) -> float:
        if t <= self.busy_from:
            return self.base_work
        return min(self.model.work, self.base_work + self.rate * (t - self.busy_from))

    @property
    def done(self) -> bool:
        return self.state.is_terminal


class _Node:
    __slots__ = ("gpu_owner", "gpu_shards", "gpu_type", "index", "name", "shards_per_gpu")

    def __init__(
        self, index: int, name: str, gpus: int, shards_per_gpu: int, gpu_type: str | None = None
    ) -> None:
        self.index = index
        self.name = name
        self.gpu_type = gpu_type
        self.shards_per_gpu = shards_per_gpu
        self.gpu_owner: list[int | None] = [None] * gpus
        self.gpu_shards: list[dict[int, int]] = [{} for _ in range(gpus)]

    def free_gpus(self) -> list[int]:
        return [
            i for i, owner in enumerate(self.gpu_owner) if owner is None and not self.gpu_shards[i]
        ]


class SimSlurm:
    """A virtual-time Slurm cluster (see the module docstring for what it models)."""

    def __init__(
        self,
        nodes: int,
        gpus_per_node: int,
        *,
        shards_per_gpu: int = 0,
        requeue_delay_s: float = 121.0,
        runtime: ElasticRuntime | None = None,
        priority: PriorityKey | None = None,
        interference: InterferenceModel | None = None,
        bf_max_job_test: int = 500,
        min_job_age_s: float = 300.0,
        kill_wait_s: float = 30.0,
        slurm_version: str = "22.05.8",
        node_types: Sequence[str] | None = None,
        type_speed: TypeSpeed | None = None,
    ) -> None:
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError("a cluster needs at least one node with one GPU")
        if node_types is not None and len(node_types) != nodes:
            raise ValueError(f"node_types names {len(node_types)} types for {nodes} nodes")
        types = [t.lower() for t in node_types] if node_types is not None else [None] * nodes
        self.type_speed = type_speed
        self.gpus_by_type: dict[str, int] = {}
        for t in types:
            if t is not None:
                self.gpus_by_type[t] = self.gpus_by_type.get(t, 0) + gpus_per_node
        self.gpus_per_node = gpus_per_node
        self.shards_per_gpu = shards_per_gpu
        self.requeue_delay_s = requeue_delay_s
        self.runtime = runtime or ElasticRuntime()
        self.priority = priority
        self.interference = interference
        self.bf_max_job_test = bf_max_job_test
        self.min_job_age_s = min_job_age_s
        self.kill_wait_s = kill_wait_s
        self.slurm_version = slurm_version
        width = max(2, len(str(nodes)))
        self._nodes = [
            _Node(i, f"gpu{i + 1:0{width}d}", gpus_per_node, shards_per_gpu, types[i])
            for i in range(nodes)
        ]
        self.total_gpus = nodes * gpus_per_node
        self._free_counts = [gpus_per_node] * nodes  # whole GPUs free, per node
        self.now = 0.0
        self._seq = itertools.count()
        self._events: list[tuple[float, int, int, int, int, Callable[[], None] | None]] = []
        self._ids = itertools.count(1)
        self.all_jobs: dict[int, SimJob] = {}
        self._pending: dict[int, SimJob] = {}
        self._running: dict[int, SimJob] = {}
        self._by_limit: list[tuple[float, int]] = []  # (start + limit, job id), running
        self._arrays: dict[int, list[SimJob]] = {}
        self._throttle: dict[int, int] = {}
        self._recent: list[SimJob] = []  # finished, listed until min_job_age_s
        self._dirty = True
        self.finished: list[SimJob] = []
        self.listeners: list[Callable[[SimJob], None]] = []  # called when a job ends
        self.changes = 0  # state changes so far (callers skip idle policy cycles)

    # ------------------------------------------------------------------ clock

    def at(self, t: float) -> datetime:
        return EPOCH + timedelta(seconds=t)

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at virtual time ``t`` (a caller's timer: a policy cycle, a step)."""
        heapq.heappush(self._events, (max(t, self.now), next(self._seq), 0, 0, 0, fn))

    def _push(self, t: float, kind: int, job: SimJob) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, job.job_id, job.version, None))

    def next_event_s(self) -> float:
        return self._events[0][0] if self._events else math.inf

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

    _END, _LIMIT, _ELIGIBLE, _CHECKPOINT = 1, 2, 3, 4

    def _fire(self, kind: int, job: SimJob) -> None:
        if kind == self._END and job.state is JobState.RUNNING:
            self._finish(job, JobState.COMPLETED)
        elif kind == self._LIMIT and job.state is JobState.RUNNING:
            # SIGTERM at the limit, SIGKILL ``kill_wait_s`` later: a runtime that can
            # checkpoint in that window keeps its progress for a resubmission.
            if self.runtime.checkpoint_s <= self.kill_wait_s:
                job.checkpoint_work = job.work_at(self.now)
            self._finish(job, JobState.TIMEOUT)
        elif kind == self._ELIGIBLE:
            self._dirty = True
        elif kind == self._CHECKPOINT and job.state is JobState.RUNNING:
            job.checkpoint_work = job.base_work
            job.checkpointed_s = self.now
            self._changed(job)

    def _changed(self, job: SimJob) -> None:
        job._obj = None
        self.changes += 1

    # ------------------------------------------------------------------ submission

    def submit_job(self, spec: TraceJob, *, resume: SimJob | None = None) -> int:
        """Submit one trace job now; returns its job id (the array id for an array).

        ``resume``: a job that timed out and is submitted again by its user; the new job
        continues from its checkpoint and keeps its original submit time for the JCT.
        """
        if spec.gpus < 0 or spec.shards < 0 or (spec.gpus == 0 and spec.shards == 0):
            raise SlurmCommandError(f"job {spec.name}: asks for no GPU")
        if spec.shards and self.shards_per_gpu < spec.shards:
            raise SlurmCommandError(
                f"job {spec.name}: {spec.shards} shards but the GPUs have {self.shards_per_gpu}"
            )
        if spec.gpus > self.total_gpus:
            raise SlurmCommandError(
                f"job {spec.name}: {spec.gpus} GPUs but the cluster has {self.total_gpus}"
            )
        if spec.gpu_type is not None:
            have = self.gpus_by_type.get(spec.gpu_type.lower(), 0)
            if spec.gpus > have or (spec.shards and not have):
                raise SlurmCommandError(
                    f"job {spec.name}: Invalid generic resource (gres) specification "
                    f"(gpu:{spec.gpu_type}: the cluster has {have} such GPUs)"
                )
        per_node = spec.gpus_per_node
        if (
            spec.gpus
            and per_node is not None
            and (per_node < 1 or per_node > self.gpus_per_node or spec.gpus % per_node)
        ):
            raise SlurmCommandError(
                f"job {spec.name}: {spec.gpus} GPUs at {per_node} per node do not fit "
                f"nodes of {self.gpus_per_node}"
            )
        first = next(self._ids)
        if spec.array_tasks > 0:
            tasks = []
            for i in range(spec.array_tasks):
                task = SimJob(next(self._ids), spec, self.now)
                task.array_job_id, task.array_task_id = first, i
                tasks.append(task)
            self._arrays[first] = tasks
            if spec.array_throttle:
                self._throttle[first] = spec.array_throttle
        else:
            tasks = [SimJob(first, spec, self.now)]
        if resume is not None:
            tasks[0].base_work = tasks[0].checkpoint_work = resume.checkpoint_work
            tasks[0].origin_s = resume.origin_s
            tasks[0].restarts = resume.restarts
            tasks[0].resubmits = resume.resubmits + 1
            resume.superseded = True
        for task in tasks:
            self.all_jobs[task.job_id] = task
            self._pending[task.job_id] = task
            self._changed(task)
        self._dirty = True
        return first

    # ------------------------------------------------------------------ SlurmClient

    def version(self) -> str:
        return self.slurm_version

    def jobs(self) -> list[Job]:
        """Every pending and running job, plus jobs that ended in the last ``min_job_age_s``."""
        cutoff = self.now - self.min_job_age_s
        self._recent = [j for j in self._recent if j.end_s >= cutoff]
        out: list[Job] = []
        metas: set[int] = set()
        for job in self._pending.values():
            if job.array_job_id is not None:
                if job.array_job_id not in metas:
                    metas.add(job.array_job_id)
                    out.append(self._meta_record(job.array_job_id))
                continue
            out.append(self._job_obj(job))
        out.extend(self._job_obj(j) for j in self._running.values())
        out.extend(self._job_obj(j) for j in self._recent)
        return out

    def nodes(self) -> list[Node]:
        out = []
        for n in self._nodes:
            used = [i for i, o in enumerate(n.gpu_owner) if o is not None or n.gpu_shards[i]]
            shards_used = sum(sum(s.values()) for s in n.gpu_shards)
            total = len(n.gpu_owner)
            state = "idle" if not used else ("allocated" if len(used) == total else "mixed")
            out.append(
                Node(
                    name=n.name,
                    state=state,
                    gpus=total,
                    shards=total * n.shards_per_gpu,
                    gpus_used=len(used),
                    gpu_indices_used=tuple(used),
                    shards_used=shards_used,
                    partitions=("gpu",),
                    gpu_type=n.gpu_type,
                )
            )
        return out

    def submit(
        self,
        sbatch_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> int:
        """Only trace jobs can run here: use :meth:`submit_job` (sbatch has no workload)."""
        raise SlurmCommandError("SimSlurm runs trace jobs only (submit_job), not sbatch scripts")

    def update_job(self, job_id: str | int, fields: Mapping[str, str]) -> None:
        targets = self._resolve(job_id)
        for job in targets:
            self._update_one(job, fields)
        self._dirty = True

    def hold(self, job_id: str | int) -> None:
        for job in self._resolve(job_id):
            if job.state is not JobState.PENDING:
                raise SlurmCommandError(f"job {job.job_id} is not pending")
            job.held = True
            self._changed(job)

    def release(self, job_id: str | int) -> None:
        for job in self._resolve(job_id):
            if job.state is JobState.PENDING and job.held:
                job.held = False
                self._changed(job)
        self._dirty = True

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        for job in self._resolve(job_id):
            if job.state is not JobState.RUNNING:
                raise SlurmCommandError(f"job {job.job_id} is not running")
            if not job.requeue:
                raise SlurmCommandError(f"job {job.job_id} may not be requeued")
            self._stop(job)
            job.state = JobState.PENDING
            job.restarts += 1
            job.held = hold
            job.eligible_s = self.now + self.requeue_delay_s
            job.base_work = job.checkpoint_work
            self._pending[job.job_id] = job
            self._push(job.eligible_s, self._ELIGIBLE, job)
            self._changed(job)
        self._dirty = True

    def signal(self, job_id: str | int, signal: str, *, batch_only: bool = False) -> None:
        for job in self._resolve(job_id):
            if job.state is not JobState.RUNNING:
                raise SlurmCommandError(f"job {job.job_id} is not running")
            if signal.upper() not in _CHECKPOINT_SIGNALS:
                continue
            # The runtime stops training, writes a checkpoint, then carries on.
            self._fold(job)
            job.busy_from = max(job.busy_from, self.now) + self.runtime.checkpoint_s
            self._reschedule_end(job)
            self._push(self.now + self.runtime.checkpoint_s, self._CHECKPOINT, job)

    def cancel(self, job_id: str | int) -> None:
        for job in self._resolve(job_id):
            if job.state is JobState.RUNNING:
                self._finish(job, JobState.CANCELLED)
            elif job.state is JobState.PENDING:
                self._pending.pop(job.job_id, None)
                job.state = JobState.CANCELLED
                job.end_s = self.now
                job.version += 1
                self._ended(job)

    def set_array_throttle(self, array_job_id: int, max_running: int) -> None:
        if array_job_id not in self._arrays:
            raise SlurmCommandError(f"{array_job_id} is not an array job")
        if max_running < 0:
            raise SlurmCommandError("ArrayTaskThrottle must be >= 0")
        self._throttle[array_job_id] = max_running
        for task in self._arrays[array_job_id]:
            self._changed(task)
        self._dirty = True

    def set_time_limit(self, job_id: str | int, limit: timedelta) -> None:
        self.update_job(job_id, {"TimeLimit": format_time_limit(limit)})

    # ------------------------------------------------------------------ extras

    def checkpointed_at(self, job_id: int) -> float | None:
        """When the job's runtime last acknowledged a checkpoint (virtual seconds)."""
        job = self.all_jobs.get(job_id)
        if job is None or math.isnan(job.checkpointed_s):
            return None
        return job.checkpointed_s

    def job_record(self, job: SimJob) -> Job:
        """The Job that squeue would list for this job now."""
        return self._job_obj(job)

    def job(self, job_id: int) -> SimJob:
        try:
            return self.all_jobs[job_id]
        except KeyError:
            raise SlurmCommandError(f"Invalid job id specified: {job_id}") from None

    @property
    def idle(self) -> bool:
        return not self._pending and not self._running

    def running(self) -> Iterable[SimJob]:
        return self._running.values()

    def pending(self) -> Iterable[SimJob]:
        return self._pending.values()

    # ------------------------------------------------------------------ internals

    def _resolve(self, job_id: str | int) -> list[SimJob]:
        m = _ID_RE.match(str(job_id).strip())
        if not m:
            raise SlurmCommandError(f"Invalid job id specified: {job_id}")
        jid = int(m.group(1))
        task = m.group(2)
        if jid in self._arrays:
            tasks = [t for t in self._arrays[jid] if not t.done]
            if task is None:
                return tasks
            if task.startswith("["):
                return [t for t in tasks if t.state is JobState.PENDING]
            wanted = [t for t in tasks if t.array_task_id == int(task)]
            if not wanted:
                raise SlurmCommandError(f"Invalid job id specified: {job_id}")
            return wanted
        job = self.all_jobs.get(jid)
        if job is None or task is not None or job.done:
            raise SlurmCommandError(f"Invalid job id specified: {job_id}")
        return [job]

    def _update_one(self, job: SimJob, fields: Mapping[str, str]) -> None:
        for key, value in fields.items():
            if key == "TimeLimit":
                try:
                    limit = parse_time_limit(value)
                except ValueError:
                    raise SlurmCommandError(f"Invalid TimeLimit {value!r}") from None
                job.time_limit_s = None if limit is None else limit.total_seconds()
                if job.state is JobState.RUNNING:
                    self._set_limit_event(job)
            elif key == "Nice":
                # Slurm takes a nice for a pending or a running job (it matters once
                # the job waits again).
                job.nice = _int(key, value)
                job.fields[key] = value
            elif key == "NumNodes" and job.state is JobState.RUNNING:
                self._shrink_in_place(job, _int(key, value))
            elif job.state is not JobState.PENDING:
                raise SlurmCommandError(
                    f"job {job.job_id}: {key} can only change while the job is pending"
                )
            elif key in ("TresPerJob", "TresPerNode"):
                self._set_tres(job, key, value)
            elif key == "StartTime":
                # the begin time: "now" or "now+N" seconds (what the resize fast path sends)
                m = _START_RE.match(value.strip())
                if m is None:
                    raise SlurmCommandError(f"Invalid StartTime {value!r}")
                job.eligible_s = self.now + float(m.group(1) or 0)
                self._push(job.eligible_s, self._ELIGIBLE, job)
            elif key == "NumNodes":
                job.fixed_nodes = _int(key, value)
            elif key in ("MinMemoryNode", "NumCPUs", "MinCPUsNode", "Comment", "Priority"):
                if key == "Comment":
                    job.comment = value
                job.fields[key] = value
            else:
                raise SlurmCommandError(f"Update of {key} is not supported")
        self._changed(job)

    def _set_tres(self, job: SimJob, key: str, value: str) -> None:
        try:
            items = parse_gres(value.replace("gres/", "gres:"))
        except ValueError:
            raise SlurmCommandError(f"Invalid {key} {value!r}") from None
        gpus = sum(i.count for i in items if i.name == "gpu")
        shards = sum(i.count for i in items if i.name == "shard")
        typed = {i.type.lower() for i in items if i.name in ("gpu", "shard") and i.type}
        if len(typed) > 1:
            raise SlurmCommandError(f"Invalid {key} {value!r}: more than one GPU type")
        gpu_type = typed.pop() if typed else None
        if gpu_type is not None and gpu_type not in self.gpus_by_type:
            raise SlurmCommandError(
                f"Invalid generic resource (gres) specification: no gpu:{gpu_type} here"
            )
        if shards:
            if shards > self.shards_per_gpu:
                raise SlurmCommandError(f"job {job.job_id}: no GPU has {shards} shards")
            job.gpus, job.shards, job.gpus_per_node = 0, shards, None
            job.gpu_type = gpu_type
        elif gpus:
            if key == "TresPerNode":
                nodes = max(1, job.fixed_nodes)
                job.gpus, job.gpus_per_node = gpus * nodes, gpus
            else:
                job.gpus, job.gpus_per_node = gpus, None
            job.shards = 0
            job.gpu_type = gpu_type
            have = self.gpus_by_type.get(gpu_type, 0) if gpu_type else self.total_gpus
            if job.gpus > have:
                raise SlurmCommandError(f"job {job.job_id}: more GPUs than the cluster has")
        else:
            raise SlurmCommandError(f"Invalid {key} {value!r}: no gpu or shard count")

    def _shrink_in_place(self, job: SimJob, nodes: int) -> None:
        if nodes < 1 or nodes >= len(job.alloc):
            raise SlurmCommandError(
                f"job {job.job_id}: NumNodes={nodes} is not fewer than its {len(job.alloc)} nodes"
            )
        self._fold(job)
        keep = sorted(job.alloc, key=lambda a: (-len(a[1]), a[0]))[:nodes]
        for node_i, gpus in job.alloc:
            if (node_i, gpus) not in keep:
                for g in gpus:
                    self._nodes[node_i].gpu_owner[g] = None
                self._free_counts[node_i] += len(gpus)
        self._close_run(job)
        job.alloc = keep
        job.gpus = sum(len(g) for _, g in keep)
        job.runs.append(
            _Run(
                self.now,
                math.nan,
                float(job.gpus),
                compute_gpus=float(job.gpus),
                by_type=self._by_type(job, float(job.gpus)),
            )
        )
        job.busy_from = max(job.busy_from, self.now) + self.runtime.reform_s
        self._rates_for([job])
        self._dirty = True

    def _meta_record(self, array_job_id: int) -> Job:
        tasks = [t for t in self._arrays[array_job_id] if t.state is JobState.PENDING]
        ids = [t.array_task_id for t in tasks if t.array_task_id is not None]
        throttle = self._throttle.get(array_job_id) or None
        spec = _ranges(ids) + (f"%{throttle}" if throttle else "")
        first = self._job_obj(tasks[0])
        return _replace_job(
            first,
            job_id=array_job_id,
            array_task_id=None,
            array_task_spec=spec,
            array_max_tasks=throttle,
        )

    def _job_obj(self, job: SimJob) -> Job:
        if job._obj is not None:
            return job._obj
        state = job.state
        flags: frozenset[str] = frozenset()
        reason = ""
        if state is JobState.PENDING:
            if job.held:
                reason = "JobHeldAdmin"
            elif job.eligible_s > self.now:
                reason = "BeginTime"
            else:
                reason = "Priority"
            if job.restarts:
                flags = frozenset({"REQUEUED"})
        if job.shards:
            gpus = GpuRequest(
                shards=job.shards,
                shards_per_node=job.shards,
                gpu_type=job.gpu_type,
                sources=("tres_per_node",),
            )
        elif job.gpus_per_node:
            gpus = GpuRequest(
                gpus=job.gpus,
                per_node=job.gpus_per_node,
                gpu_type=job.gpu_type,
                sources=("tres_per_node",),
            )
        else:
            gpus = GpuRequest(
                gpus=job.gpus, per_job=job.gpus, gpu_type=job.gpu_type, sources=("tres_per_job",)
            )
        allocs: tuple[NodeGpuAllocation, ...] = ()
        nodes: tuple[str, ...] = ()
        if state is JobState.RUNNING or (state.is_terminal and job.alloc):
            if job.shard_alloc is not None:
                n, g, s = job.shard_alloc
                allocs = (NodeGpuAllocation(self._nodes[n].name, shard_indices=(g,), shards=s),)
            else:
                allocs = tuple(
                    NodeGpuAllocation(self._nodes[n].name, gpu_indices=g) for n, g in job.alloc
                )
            nodes = tuple(a.node for a in allocs)
        obj = Job(
            job_id=job.job_id,
            name=job.name,
            user=job.user,
            state=state,
            account=job.account,
            partition=job.partition,
            state_flags=flags,
            reason=reason,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            array_max_tasks=(
                self._throttle.get(job.array_job_id) or None if job.array_job_id else None
            ),
            submit_time=self.at(job.submit_s),
            eligible_time=self.at(job.eligible_s),
            start_time=None if math.isnan(job.start_s) else self.at(job.start_s),
            end_time=None if math.isnan(job.end_s) else self.at(job.end_s),
            time_limit=None if job.time_limit_s is None else timedelta(seconds=job.time_limit_s),
            node_count=max(1, len(job.alloc)) if job.alloc else max(1, job.fixed_nodes),
            tasks=1,
            gpus=gpus,
            nodes=nodes,
            gpu_allocations=allocs,
            restart_count=job.restarts,
            requeue=job.requeue,
            nice=job.nice,
            comment=job.comment,
            exit_code=0 if state is JobState.COMPLETED else (None if not state.is_terminal else 1),
        )
        job._obj = obj
        return obj

    # ---- progress

    def _fold(self, job: SimJob) -> None:
        """Bring ``base_work`` up to now so the rate or pause can change from here."""
        if self.now > job.busy_from:
            if job.runs:
                run = job.runs[-1]
                run.used_gpu_s += (
                    (self.now - job.busy_from)
                    * run.compute_gpus
                    * job.speed
                    * job.model.util_pct
                    / 100.0
                )
            job.base_work = job.work_at(self.now)
            job.busy_from = self.now

    def attained_gpu_s(self, job: SimJob) -> float:
        """GPU-seconds the job has held so far, this run included (Tiresias' service)."""
        total = job.attained_gpu_s
        if job.state is JobState.RUNNING and job.runs:
            total += (self.now - job.runs[-1].start_s) * job.runs[-1].gpus
        return total

    def _reschedule_end(self, job: SimJob) -> None:
        job.version += 1
        self._changed(job)
        if job.rate > 0:
            left = max(0.0, job.model.work - job.base_work)
            self._push(max(job.busy_from, self.now) + left / job.rate, self._END, job)
        self._set_limit_event(job, bump=False)

    def _set_limit_event(self, job: SimJob, *, bump: bool = True) -> None:
        if bump:
            job.version += 1
            if job.rate > 0:
                left = max(0.0, job.model.work - job.base_work)
                self._push(max(job.busy_from, self.now) + left / job.rate, self._END, job)
        self._by_limit_remove(job)
        end = job.start_s + job.time_limit_s if job.time_limit_s is not None else math.inf
        bisect.insort(self._by_limit, (end, job.job_id))
        if math.isfinite(end):
            self._push(end, self._LIMIT, job)

    def _by_limit_remove(self, job: SimJob) -> None:
        for i, (_, jid) in enumerate(self._by_limit):
            if jid == job.job_id:
                del self._by_limit[i]
                return

    def _speed(self, job: SimJob) -> float:
        """Relative speed from co-location on a shared GPU (1 = alone)."""
        if self.interference is None or job.shard_alloc is None:
            return 1.0
        n, g, _ = job.shard_alloc
        speed = 1.0
        for other_id in self._nodes[n].gpu_shards[g]:
            if other_id == job.job_id:
                continue
            other = self.all_jobs[other_id]
            slow, _ = self.interference(
                job.model.util_pct,
                job.model.memory_mib,
                other.model.util_pct,
                other.model.memory_mib,
            )
            speed *= _as_speed(slow)
        return speed

    def _rates_for(self, jobs: Iterable[SimJob]) -> None:
        for job in jobs:
            if job.state is not JobState.RUNNING:
                continue
            self._fold(job)
            placement = job.placement if job.alloc else (1,)
            job.speed = self._speed(job)
            job.rate = job.model.rate(placement) * job.speed * self.type_factor(job)
            self._reschedule_end(job)

    def _job_nodes(self, job: SimJob) -> list[int]:
        if job.shard_alloc is not None:
            return [job.shard_alloc[0]]
        return [n for n, _ in job.alloc]

    def type_factor(self, job: SimJob) -> float:
        """Speed on the GPU types it holds: its slowest type's (1 without a speed model)."""
        if self.type_speed is None:
            return 1.0
        types = {self._nodes[n].gpu_type for n in self._job_nodes(job)}
        speeds = [self.type_speed(job, t) for t in types if t is not None]
        return min(speeds) if speeds else 1.0

    def _by_type(self, job: SimJob, share: float) -> dict[str, float]:
        out: dict[str, float] = {}
        if job.shard_alloc is not None:
            t = self._nodes[job.shard_alloc[0]].gpu_type
            if t is not None:
                out[t] = share
            return out
        for n, gpus in job.alloc:
            t = self._nodes[n].gpu_type
            if t is not None:
                out[t] = out.get(t, 0.0) + len(gpus)
        return out

    def _sharers(self, job: SimJob) -> list[SimJob]:
        if job.shard_alloc is None:
            return []
        n, g, _ = job.shard_alloc
        return [self.all_jobs[j] for j in self._nodes[n].gpu_shards[g] if j != job.job_id]

    # ---- start and stop

    def _start(
        self,
        job: SimJob,
        alloc: list[tuple[int, tuple[int, ...]]],
        shard: tuple[int, int, int] | None,
    ) -> None:
        del self._pending[job.job_id]
        self._running[job.job_id] = job
        job.state = JobState.RUNNING
        job.start_s = self.now
        if math.isnan(job.first_start_s):
            job.first_start_s = self.now
        job.end_s = math.nan
        job.alloc = alloc
        job.shard_alloc = shard
        for n, gpus in alloc:
            for g in gpus:
                self._nodes[n].gpu_owner[g] = job.job_id
            self._free_counts[n] -= len(gpus)
        if shard is not None:
            n, g, s = shard
            if not self._nodes[n].gpu_shards[g]:
                self._free_counts[n] -= 1
            self._nodes[n].gpu_shards[g][job.job_id] = s
        share = job.allocated_gpus if shard is None else shard[2] / max(1, self.shards_per_gpu)
        compute = float(job.allocated_gpus if shard is None else 1)
        job.runs.append(
            _Run(
                self.now,
                math.nan,
                float(share),
                compute_gpus=compute,
                by_type=self._by_type(job, float(share)),
            )
        )
        startup = self.runtime.startup_s if job.restarts else 0.0
        job.base_work = min(job.base_work, job.model.work)
        job.busy_from = self.now + startup
        job.rate = 0.0
        self._rates_for([job, *self._sharers(job)])

    def _close_run(self, job: SimJob) -> None:
        if job.runs and math.isnan(job.runs[-1].end_s):
            self._fold(job)
            run = job.runs[-1]
            run.end_s = self.now
            job.attained_gpu_s += (run.end_s - run.start_s) * run.gpus

    def _stop(self, job: SimJob) -> None:
        """Take a running job off its GPUs (the caller sets its new state)."""
        self._fold(job)
        self._close_run(job)
        sharers = self._sharers(job)
        for n, gpus in job.alloc:
            for g in gpus:
                self._nodes[n].gpu_owner[g] = None
            self._free_counts[n] += len(gpus)
        if job.shard_alloc is not None:
            n, g, _ = job.shard_alloc
            self._nodes[n].gpu_shards[g].pop(job.job_id, None)
            if not self._nodes[n].gpu_shards[g]:
                self._free_counts[n] += 1
        del self._running[job.job_id]
        self._by_limit_remove(job)
        job.version += 1
        job.rate = 0.0
        job.busy_from = math.inf
        job.start_s = math.nan
        self._rates_for(sharers)
        self._dirty = True

    def _finish(self, job: SimJob, state: JobState) -> None:
        work = job.work_at(self.now)
        self._stop(job)
        job.base_work = work
        job.state = state
        job.end_s = self.now
        self._ended(job)

    def _ended(self, job: SimJob) -> None:
        self._changed(job)
        self._recent.append(job)
        self.finished.append(job)
        self._dirty = True
        for listener in self.listeners:
            listener(job)

    # ---- scheduling

    def _eligible(self) -> list[SimJob]:
        now = self.now
        running_tasks: dict[int, int] = {}
        if self._throttle:
            for j in self._running.values():
                if j.array_job_id is not None:
                    running_tasks[j.array_job_id] = running_tasks.get(j.array_job_id, 0) + 1
        out = []
        for job in self._pending.values():
            if job.held or job.eligible_s > now:
                continue
            if job.array_job_id is not None:
                limit = self._throttle.get(job.array_job_id, 0)
                if limit and running_tasks.get(job.array_job_id, 0) >= limit:
                    continue
                if limit:
                    running_tasks[job.array_job_id] = running_tasks.get(job.array_job_id, 0) + 1
            out.append(job)
        if self.priority is None:
            # priority/basic: submit order, less the nice (a higher nice waits behind)
            out.sort(key=lambda j: (j.nice, j.submit_s, j.job_id))
        else:
            key = self.priority
            out.sort(key=lambda j: (*key(j, now), j.submit_s, j.job_id))
        return out

    def _fit(self, job: SimJob, free: list[int]) -> list[tuple[int, int]] | None:
        """Return (node, count) pairs for a whole-GPU job on ``free``, or None."""
        need = job.gpus
        if job.gpu_type is not None:  # only the nodes of the type it asked for
            free = [
                f if n.gpu_type == job.gpu_type else 0
                for f, n in zip(free, self._nodes, strict=True)
            ]
        if job.gpus_per_node:
            k = job.gpus_per_node
            m = max(1, need // k)
            nodes = sorted((f, i) for i, f in enumerate(free) if f >= k)
            if len(nodes) < m:
                return None
            return [(i, k) for _, i in nodes[:m]]
        if need <= self.gpus_per_node:
            best = -1
            for i, f in enumerate(free):
                if f >= need and (best < 0 or f < free[best]):
                    best = i
                    if f == need:
                        break
            if best >= 0:
                return [(best, need)]
        if sum(free) < need:
            return None
        out: list[tuple[int, int]] = []
        left = need
        for f, i in sorted(
            ((f, i) for i, f in enumerate(free) if f > 0), key=lambda x: (-x[0], x[1])
        ):
            take = min(f, left)
            out.append((i, take))
            left -= take
            if left == 0:
                return out
        return None

    def _fit_shard(self, job: SimJob) -> tuple[int, int, int] | None:
        s = job.shards
        fresh: tuple[int, int, int] | None = None
        for n in self._nodes:
            if job.gpu_type is not None and n.gpu_type != job.gpu_type:
                continue
            for g, owner in enumerate(n.gpu_owner):
                if owner is not None:
                    continue
                used = sum(n.gpu_shards[g].values())
                if used and used + s <= n.shards_per_gpu:
                    return (n.index, g, s)
                if not used and fresh is None and s <= n.shards_per_gpu:
                    fresh = (n.index, g, s)
        return fresh

    def _free(self) -> list[int]:
        return list(self._free_counts)

    def _reservation(self, job: SimJob, free: list[int]) -> tuple[float, list[int]] | None:
        """Earliest time (by time limits) ``job`` fits, and the GPUs it reserves per node."""
        future = list(free)
        for end, jid in self._by_limit:
            if not math.isfinite(end):
                break
            other = self._running[jid]
            for n, gpus in other.alloc:
                future[n] += len(gpus)
            if other.shard_alloc is not None:
                n, g, _ = other.shard_alloc
                if len(self._nodes[n].gpu_shards[g]) == 1:
                    future[n] += 1
            fit = self._fit(job, future)
            if fit is not None:
                reserved = [0] * len(free)
                for n, c in fit:
                    reserved[n] = c
                return end, reserved
        return None

    def _schedule(self) -> None:
        self._dirty = False
        free = self._free()
        if not any(free) and not self.shards_per_gpu:
            return
        queue = self._eligible()
        if not queue:
            return
        shadow: float | None = None
        reserved: list[int] | None = None
        spare: list[int] | None = None  # free GPUs the reservation leaves, per node
        failed: dict[tuple[bool, int, str], float] = {}
        tested = 0
        for job in queue:
            if not any(free) and not self.shards_per_gpu:
                break
            if shadow is not None:
                tested += 1
                if tested > self.bf_max_job_test:
                    break
            if job.shards:
                place = self._fit_shard(job)
                if place is None:
                    continue
                n = place[0]
                takes_fresh = not self._nodes[n].gpu_shards[place[1]]
                if takes_fresh and reserved is not None and shadow is not None:
                    ends = self.now + (job.time_limit_s or math.inf)
                    if ends > shadow and free[n] - 1 < reserved[n]:
                        continue
                self._start(job, [], place)
                if takes_fresh:
                    free[n] -= 1
                    spare = None
                    failed.clear()
                continue
            if reserved is None:
                fit = self._fit(job, free)
                if fit is not None:
                    self._start_whole(job, fit, free)
                    continue
                res = self._reservation(job, free)
                if res is not None:
                    shadow, reserved = res
                continue
            ends = self.now + (job.time_limit_s if job.time_limit_s is not None else math.inf)
            assert shadow is not None
            beyond = ends > shadow
            # A job of N GPUs that did not fit on a vector that has not changed since
            # means no job of N or more fits either (--gpus=N fits are monotone in N):
            # this keeps a long backfill queue at O(1) per job.
            key = (beyond, job.gpus_per_node or 0, job.gpu_type or "")
            if job.gpus >= failed.get(key, math.inf):
                continue
            if beyond:
                if spare is None:
                    spare = [max(0, f - r) for f, r in zip(free, reserved, strict=True)]
                fit = self._fit(job, spare)
            else:
                fit = self._fit(job, free)
            if fit is None:
                failed[key] = min(failed.get(key, math.inf), job.gpus)
                continue
            self._start_whole(job, fit, free)
            spare = None
            failed.clear()

    def _start_whole(self, job: SimJob, fit: list[tuple[int, int]], free: list[int]) -> None:
        alloc = []
        for n, count in fit:
            gpus = tuple(self._nodes[n].free_gpus()[:count])
            alloc.append((n, gpus))
            free[n] -= count
        self._start(job, alloc, None)


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SlurmCommandError(f"Invalid {key} {value!r}") from None


def _as_speed(slow: float) -> float:
    if not math.isfinite(slow) or slow <= 0:
        return 1.0
    return 1.0 / slow if slow >= 1.0 else slow


def _ranges(ids: Sequence[int]) -> str:
    out: list[str] = []
    ids = sorted(ids)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def _replace_job(job: Job, **changes: object) -> Job:
    from dataclasses import replace

    return replace(job, **changes)  # type: ignore[arg-type]

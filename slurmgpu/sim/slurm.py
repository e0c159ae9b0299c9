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
  One pass runs at every instant something changes. With ``scheduling``
  (sim.slurmsched.SlurmScheduling, opt-in) Slurm's own passes instead: a main pass in
  strict priority order at every change and every ``sched_interval_s``, and a
  conservative backfill pass (a whole-node plan for every waiting job) every
  ``bf_interval_s``.
- **Nodes**: ``nodes`` alike of ``gpus_per_node`` GPUs, or each of its own size
  (``node_gpus``: a site of 8-GPU and 4-GPU nodes); placement is the same either way.
- **Placement**: ``--gpus=N`` best fit on one node when it fits, else the nodes with the
  most free GPUs first (a job's speed depends on it); ``--gpus-per-node=K --nodes=M``
  on M nodes. Shard jobs pack onto GPUs that already carry shard jobs first.
- **GPU types** (``node_types``, one per node): a job that asked for a type
  (``gpu:v100:4``) is placed only on nodes of that type, as Slurm's gres matching does;
  an untyped job goes anywhere, spanning types if it must. ``type_speed(job, type)``
  scales its speed on a type (a job over several types runs at its slowest one, as
  synchronous data-parallel training does); without it every type runs alike.
- **Submission**: a job is considered by the scheduler ``submit_delay_s`` after its
  submission (0 by default; the measured cost sets of sim.costs give the lab's).
- **Completing**: an ended job's whole GPUs stay allocated ``completing_s`` (0 by
  default) after its end, as slurmctld holds them through COMPLETING (teardown, epilog,
  the node's message back); backfill counts them freed at the hold's end. Shards, MPS
  shares and MIG slices are freed at once.
- **MPS and MIG** (``mps_per_gpu``; ``mig_gpus`` and ``mig_layout``, sim.sharing): every
  whole GPU also serves ``gres/mps`` (a GPU is whole-allocated or shared by MPS jobs, as
  with shards; a cluster has shards or MPS, not both), and the last ``mig_gpus`` GPUs of
  every node are MIG slices, listed as typed GPUs (``gpu:1g.10gb``), which only a job
  asking for that profile gets (first fit; a slice is never reserved for the backfill's
  blocked job, whose whole GPUs it is not). A pending ``gpu:1`` becomes a slice or an MPS
  share as the policy's ``converts_request`` says the release allows (22.05 refuses it).
  A job on a MIG slice runs at ``sim.sharing.mig_speed``, on an MPS share at
  ``sim.sharing.mps_speed`` next to the other MPS jobs of its GPU.
- **Time limits**: a run that reaches its limit ends ``TIMEOUT``.
- **Requeue**: the job goes back to PENDING with ``restart_count + 1`` and a BeginTime
  ``requeue_delay_s`` (121 s, cred_expire + 1 on 22.05-25.x) later; ``requeue(hold=True)``
  also holds it. Work since its last checkpoint is lost.
- **Arrays and throttles**: ``array_tasks`` tasks share one pending meta-record (listed as
  ``A_[3-9%2]``); at most ``ArrayTaskThrottle`` run at once; ``A_i`` addresses one task,
  a bare ``A`` every task (as in Slurm).
- **Priority**: submit order, behind any job of a lower ``Nice`` (``update Nice=``,
  pending or running, as an operator may), unless a ``priority`` key replaces it.
- **Hold, release, update** of pending jobs, applied as typed intents (no Slurm
  spelling to parse): time limit, GPUs per job or per node, shards, node count,
  comment, memory and CPUs (recorded; CPUs and memory are not scheduled), start time.
  A running job accepts a time limit, a nice and a node count to fewer nodes
  (Slurm's shrink in place: the job keeps running on the nodes it keeps; the TERM the
  daemon then sends its steps restarts the command there, which costs ``reform_s``
  from the update); a GPU change to a running job is refused as by slurmctld.
- **Signals** go to the job's elastic runtime (:class:`ElasticRuntime`): on ``USR2``
  or ``TERM`` it pauses, writes a checkpoint in ``checkpoint_s`` and acknowledges
  (:meth:`SimSlurm.checkpointed_at`); a restarted run spends ``startup_s`` loading it, a
  first run ``first_startup_s`` starting (sim.costs: the cost sets).
- **Co-location**: jobs sharing a GPU slow each other as ``interference`` predicts (a
  callable ``(util_a, mem_a, util_b, mem_b) -> (slow_a, slow_b)``; slowdowns >= 1,
  values below 1 are read as relative speeds); without one they run at full speed. A
  job's current relative speed is ``SimJob.speed``; the GPU time it *uses* is its util
  on the one GPU its shards are on times that speed (not times its share of the shards:
  a 30 % job on half a GPU's shards keeps that GPU 30 % busy).

Event-driven: a heap of timed events (arrivals, ends, limits, begin times, checkpoints,
callers' timers); nothing ticks. ``run_until(t)`` processes every event up to ``t``.
Pure: no I/O and no wall clock.

One module per idea: sim.clock (virtual time, the event heap), sim.state (jobs and
nodes), sim.progress (speed and work: when a run ends), sim.scheduler (FIFO + EASY
backfill or Slurm's own passes, sim.slurmsched; placement, starting and stopping runs)
and this one, the SlurmClient face
(submission, squeue/sinfo records, scontrol's updates, signals, requeue, hold/release).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Literal, cast

from slurmgpu.intent import (
    Intent,
    NarrowToMps,
    NarrowToShards,
    SetAdminComment,
    SetComment,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetNice,
    SetNodes,
    SetTimeLimit,
    StartSoon,
)
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.policy.slices import MigProfile, converts_request
from slurmgpu.sim.clock import EPOCH
from slurmgpu.sim.progress import ElasticRuntime, InterferenceModel, TypeSpeed
from slurmgpu.sim.scheduler import ListsPriority, PriorityKey, SchedulerModel
from slurmgpu.sim.slurmsched import SlurmScheduling
from slurmgpu.sim.state import JobRun, SimJob, SimNode
from slurmgpu.sim.workload import TraceJob
from slurmgpu.slurm.client import SlurmCommandError

__all__ = [
    "EPOCH",
    "ElasticRuntime",
    "InterferenceModel",
    "PriorityKey",
    "SimJob",
    "SimSlurm",
    "TypeSpeed",
]

_CHECKPOINT_SIGNALS = frozenset({"USR2", "SIGUSR2", "TERM", "SIGTERM", "12", "15"})
_TERM_SIGNALS = frozenset({"TERM", "SIGTERM", "15"})
_ID_RE = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]*\]))?$")


class SimSlurm(SchedulerModel):
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
        node_gpus: Sequence[int] | None = None,
        submit_delay_s: float = 0.0,
        mps_per_gpu: int = 0,
        mig_gpus: int = 0,
        mig_layout: Sequence[MigProfile] = (),
        scheduling: SlurmScheduling | None = None,
        completing_s: float = 0.0,
    ) -> None:
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError("a cluster needs at least one node with one GPU")
        if shards_per_gpu and mps_per_gpu:
            raise ValueError("give the GPUs shards or MPS, not both")
        if mig_gpus < 0 or mps_per_gpu < 0:
            raise ValueError("mig_gpus and mps_per_gpu must be >= 0")
        if node_types is not None and len(node_types) != nodes:
            raise ValueError(f"node_types names {len(node_types)} types for {nodes} nodes")
        if node_gpus is not None and (len(node_gpus) != nodes or min(node_gpus) < 1):
            raise ValueError(f"node_gpus must give each of the {nodes} nodes one GPU or more")
        # Each node's GPUs: gpus_per_node each, or node_gpus (then gpus_per_node is the
        # most any node has: a job asking more per node fits nowhere).
        sizes = list(node_gpus) if node_gpus is not None else [gpus_per_node] * nodes
        types = [t.lower() for t in node_types] if node_types is not None else [None] * nodes
        layout = tuple(mig_layout) if mig_gpus else ()
        split = [min(mig_gpus, size) if layout else 0 for size in sizes]
        if layout and all(size == cut for size, cut in zip(sizes, split, strict=True)):
            raise ValueError("MIG on every GPU leaves no whole GPU: give mig_gpus fewer")
        # whole GPUs per node (the rest are MIG slices)
        sizes = [size - cut for size, cut in zip(sizes, split, strict=True)]
        self.type_speed = type_speed
        self.gpus_by_type: dict[str, int] = {}
        for t, size in zip(types, sizes, strict=True):
            if t is not None:
                self.gpus_by_type[t] = self.gpus_by_type.get(t, 0) + size
        self.mps_per_gpu = mps_per_gpu
        self.mig_profiles: dict[str, MigProfile] = {p.name: p for p in layout}
        for cut in split:
            for p in layout:
                self.gpus_by_type[p.name] = self.gpus_by_type.get(p.name, 0) + cut
        self.gpus_per_node = max(sizes)
        self.shards_per_gpu = shards_per_gpu
        self.requeue_delay_s = requeue_delay_s
        self.submit_delay_s = submit_delay_s
        self.runtime = runtime or ElasticRuntime()
        self.priority = priority
        self.interference = interference
        self.bf_max_job_test = bf_max_job_test
        self.scheduling = scheduling
        self._bf_last = 0.0
        self._bf_at = self._main_at = math.inf
        self.min_job_age_s = min_job_age_s
        self.kill_wait_s = kill_wait_s
        self.completing_s = completing_s
        self._holds = []
        self.slurm_version = slurm_version
        width = max(2, len(str(nodes)))
        self._nodes = [
            SimNode(
                i,
                f"gpu{i + 1:0{width}d}",
                sizes[i] + split[i],
                shards_per_gpu,
                types[i],
                mps_per_gpu=mps_per_gpu,
                mig_gpus=split[i],
                mig_layout=layout,
            )
            for i in range(nodes)
        ]
        # anything to place besides whole GPUs (the scheduler's pass cannot stop early)
        self._shares = bool(shards_per_gpu or mps_per_gpu or layout)
        self.total_gpus = sum(sizes)
        self._free_counts = list(sizes)  # whole GPUs free, per node
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
        self._node_objs = [None] * len(self._nodes)

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
            if self.scheduling is not None:
                task.time_limit_s = self.scheduling.limit(task.time_limit_s)
            self.all_jobs[task.job_id] = task
            self._pending[task.job_id] = task
            if self.submit_delay_s > 0:  # no pass starts it before then
                task.eligible_s = self.now + self.submit_delay_s
                self._push(task.eligible_s, self._ELIGIBLE, task)
            self._changed(task)
        self._dirty = True
        return first

    def version(self) -> str:
        return self.slurm_version

    def jobs(self) -> list[Job]:
        """Every pending and running job, plus jobs that ended in the last ``min_job_age_s``."""
        cutoff = self.now - self.min_job_age_s
        self._recent = [j for j in self._recent if j.end_s >= cutoff]
        out: list[Job] = []
        metas: set[int] = set()
        # a key that gives Slurm's numbers (Fair Tree) lists them, as squeue's %Q
        tree = self.priority if isinstance(self.priority, ListsPriority) else None
        for job in self._pending.values():
            if job.array_job_id is not None:
                if job.array_job_id not in metas:
                    metas.add(job.array_job_id)
                    out.append(self._meta_record(job.array_job_id))
                continue
            obj = self._job_obj(job)
            if tree is not None:
                prio = int(tree.priority(job, self.now))
                if obj.priority != prio:
                    obj = job._obj = _replace_job(obj, priority=prio)
            out.append(obj)
        out.extend(self._job_obj(j) for j in self._running.values())
        out.extend(self._job_obj(j) for j in self._recent)
        return out

    def nodes(self) -> list[Node]:
        # A node's listing is rebuilt only after a job took or left its GPUs.
        objs = self._node_objs
        for i, obj in enumerate(objs):
            if obj is None:
                objs[i] = self._node_obj(self._nodes[i])
        return cast(list[Node], list(objs))

    @staticmethod
    def _node_obj(n: SimNode) -> Node:
        used = [i for i, o in enumerate(n.gpu_owner) if o is not None or n.gpu_shards[i]]
        whole = len(n.gpu_owner)
        used += [index for (_, index), o in zip(n.slices, n.slice_owner, strict=True) if o]
        total = whole + len(n.slices)
        state = "idle" if not used else ("allocated" if len(used) == total else "mixed")
        types: dict[str, int] = {}
        for p, _ in n.slices:
            types[p.name] = types.get(p.name, 0) + 1
        units = sum(sum(s.values()) for s in n.gpu_shards)
        return Node(
            name=n.name,
            state=state,
            gpus=total,
            shards=whole * n.shards_per_gpu,
            gpus_used=len(used),
            gpu_indices_used=tuple(used),
            shards_used=0 if n.mps_per_gpu else units,
            partitions=("gpu",),
            gpu_type=n.gpu_type,
            gpu_types=tuple(types.items()),
            mps=whole * n.mps_per_gpu,
            mps_used=units if n.mps_per_gpu else 0,
        )

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

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        """Apply the intents as slurmctld would (no Slurm spelling: nothing to parse)."""
        targets = self._resolve(job_id)
        for job in targets:
            self._update_one(job, intents)
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
            if job.steps_restart and not batch_only and signal.upper() in _TERM_SIGNALS:
                # After a shrink in place the daemon ends the holding steps; the batch
                # launcher starts them again on the nodes kept (reform_s, charged there).
                job.steps_restart = False
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
        self.update_job(job_id, (SetTimeLimit.of(limit),))

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

    def _update_one(self, job: SimJob, intents: Sequence[Intent]) -> None:
        for intent in intents:
            if isinstance(intent, SetTimeLimit):
                if intent.seconds is not None and intent.seconds < 0:
                    raise SlurmCommandError(f"Invalid time limit {intent.seconds} s")
                job.time_limit_s = None if intent.seconds is None else float(intent.seconds)
                if self.scheduling is not None:
                    job.time_limit_s = self.scheduling.limit(job.time_limit_s)
                if job.state is JobState.RUNNING:
                    self._set_limit_event(job)
            elif isinstance(intent, SetNice):
                # Slurm takes a nice for a pending or a running job (it matters once
                # the job waits again).
                job.nice = intent.nice
                job.updates[SetNice] = intent
            elif isinstance(intent, SetNodes) and job.state is JobState.RUNNING:
                self._shrink_in_place(job, intent.count)
            elif job.state is not JobState.PENDING:
                raise SlurmCommandError(
                    f"job {job.job_id}: {type(intent).__name__} can only change while the "
                    "job is pending"
                )
            elif isinstance(intent, SetGpus):
                self._set_gpus(job, intent.count, intent.gpu_type, per_node=intent.per_node)
            elif isinstance(intent, NarrowToShards):
                self._set_shards(job, intent.shards)
            elif isinstance(intent, NarrowToMps):
                self._set_mps(job, intent.share)
            elif isinstance(intent, StartSoon):
                # the begin time, now + N seconds (what the resize fast path sends)
                if intent.delay_s < 0:
                    raise SlurmCommandError(f"Invalid StartTime now+{intent.delay_s}")
                job.eligible_s = self.now + float(intent.delay_s)
                self._push(job.eligible_s, self._ELIGIBLE, job)
            elif isinstance(intent, SetNodes):
                job.fixed_nodes = intent.count
            elif isinstance(intent, SetComment):
                job.comment = intent.text
                job.updates[SetComment] = intent
            elif isinstance(intent, SetMemoryPerNode | SetCpus | SetCpusPerNode | SetAdminComment):
                job.updates[type(intent)] = intent  # recorded, not scheduled
            else:
                raise SlurmCommandError(f"Update of {type(intent).__name__} is not supported")
        self._changed(job)

    def _gpu_type(self, gpu_type: str | None) -> str | None:
        typed = gpu_type.lower() if gpu_type else None
        if typed is not None and typed not in self.gpus_by_type:
            raise SlurmCommandError(
                f"Invalid generic resource (gres) specification: no gpu:{typed} here"
            )
        return typed

    def _set_shards(self, job: SimJob, shards: int) -> None:
        if shards < 1:
            raise SlurmCommandError(f"job {job.job_id}: no shard count")
        if shards > self.shards_per_gpu:
            raise SlurmCommandError(f"job {job.job_id}: no GPU has {shards} shards")
        job.gpus, job.shards, job.gpus_per_node = 0, shards, None
        job.gpu_type, job.mps = None, 0

    def _converts(self, job: SimJob, kind: Literal["mig", "mps"]) -> None:
        """Refuse what slurmctld refuses: a pending ``gpu:1`` becoming a MIG slice or an
        MPS share before 23.02 (policy.slices.converts_request); a slice or share stays
        one of its kind on every release."""
        request = self._job_obj(job).gpus
        if kind == "mig" and request.gpu_type and request.gpu_type.lower() in self.mig_profiles:
            return
        if not converts_request(request, kind, self.slurm_version):
            raise SlurmCommandError(
                f"job {job.job_id}: Invalid generic resource (gres) specification "
                f"(Slurm {self.slurm_version} does not change this request to {kind})"
            )

    def _set_mps(self, job: SimJob, share: int) -> None:
        if share < 1:
            raise SlurmCommandError(f"job {job.job_id}: no MPS share")
        if share > self.mps_per_gpu:
            raise SlurmCommandError(
                f"job {job.job_id}: Invalid generic resource (gres) specification "
                f"(mps:{share}, the GPUs serve {self.mps_per_gpu})"
            )
        self._converts(job, "mps")
        job.gpus, job.shards, job.mps, job.gpus_per_node = 0, 0, share, None
        job.gpu_type = None

    def _set_gpus(self, job: SimJob, count: int, gpu_type: str | None, *, per_node: bool) -> None:
        if count < 1:
            raise SlurmCommandError(f"job {job.job_id}: no GPU count")
        typed = self._gpu_type(gpu_type)
        if typed in self.mig_profiles:
            if count != 1:
                raise SlurmCommandError(f"job {job.job_id}: one MIG slice per job here")
            self._converts(job, "mig")
        if per_node:
            nodes = max(1, job.fixed_nodes)
            job.gpus, job.gpus_per_node = count * nodes, count
        else:
            job.gpus, job.gpus_per_node = count, None
        job.shards = job.mps = 0
        job.gpu_type = typed
        have = self.gpus_by_type.get(typed, 0) if typed else self.total_gpus
        if job.gpus > have:
            raise SlurmCommandError(f"job {job.job_id}: more GPUs than the cluster has")

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
                self._node_objs[node_i] = None
        self._close_run(job)
        job.alloc = keep
        job.gpus = sum(len(g) for _, g in keep)
        job.runs.append(
            JobRun(
                self.now,
                math.nan,
                float(job.gpus),
                compute_gpus=float(job.gpus),
                by_type=self._by_type(job, float(job.gpus)),
                placement=job.placement,
            )
        )
        job.busy_from = max(job.busy_from, self.now) + self.runtime.reform_s
        job.steps_restart = True
        self._rates_for([job])
        self._dirty = True

    def _fresh(self, job: SimJob) -> bool:
        """Waiting out ``submit_delay_s`` (not a begin time: squeue's reason is None)."""
        return job.restarts == 0 and job.eligible_s == job.submit_s + self.submit_delay_s

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
            elif job.eligible_s > self.now and not self._fresh(job):
                reason = "BeginTime"
            elif job.eligible_s > self.now:
                reason = "None"  # submitted, not yet seen by a scheduling pass
            else:
                reason = "Priority"
            if job.restarts:
                flags = frozenset({"REQUEUED"})
        if job.mps:
            gpus = GpuRequest(mps=job.mps, mps_per_node=job.mps, sources=("tres_per_node",))
        elif job.shards:
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
            if job.shard_alloc is not None and job.mps:
                n, g, s = job.shard_alloc
                allocs = (NodeGpuAllocation(self._nodes[n].name, mps_indices=(g,), mps=s),)
            elif job.shard_alloc is not None:
                n, g, s = job.shard_alloc
                allocs = (NodeGpuAllocation(self._nodes[n].name, shard_indices=(g,), shards=s),)
            elif job.mig_alloc is not None:
                n, k = job.mig_alloc
                node = self._nodes[n]
                allocs = (NodeGpuAllocation(node.name, gpu_indices=(node.slices[k][1],)),)
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

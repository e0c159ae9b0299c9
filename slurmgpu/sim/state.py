"""What SimSlurm knows of each job and node: :class:`SimJob` (one job or array task, with
its runs) and :class:`SimNode` (who holds each GPU, its shards or MPS shares, and each
MIG slice).

Plain state, read by the event queue (sim.clock), the progress model (sim.progress), the
scheduler model (sim.scheduler) and the SlurmClient face (sim.slurm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slurmgpu.intent import Intent
from slurmgpu.model import Job, JobState
from slurmgpu.policy.slices import MigProfile
from slurmgpu.sim.workload import JobModel, MalleableRange, TraceJob

__all__ = ["JobRun", "SimJob", "SimNode"]


@dataclass(slots=True)
class JobRun:
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
    # GPUs on each node the run held (SimJob.placement at its start; empty for shards):
    # its speed, as the job's runtime measures it (a spread layout runs slower).
    placement: tuple[int, ...] = ()
    # what it held: whole GPUs ("gpu"), shards, an MPS share or a MIG slice
    kind: str = "gpu"


class SimJob:
    """One job (or array task) inside SimSlurm. Read-only outside SimSlurm."""

    __slots__ = (
        "_obj",
        "account",
        "alloc",
        "array_job_id",
        "array_task_id",
        "attained_gpu_s",
        "base_work",
        "batch",
        "batch_for",
        "busy_from",
        "checkpoint_work",
        "checkpointed_s",
        "comment",
        "eligible_s",
        "end_s",
        "first_start_s",
        "fixed_nodes",
        "gpu_type",
        "gpus",
        "gpus_per_node",
        "held",
        "job_id",
        "malleable",
        "mig_alloc",
        "model",
        "mps",
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
        "steps_restart",
        "submit_s",
        "superseded",
        "time_limit_s",
        "updates",
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
        self.mps = 0  # gres/mps units (an update narrowed it to an MPS share)
        self.gpus_per_node: int | None = spec.gpus_per_node if self.gpus else None
        self.gpu_type: str | None = spec.gpu_type.lower() if spec.gpu_type else None
        self.fixed_nodes = self.gpus // self.gpus_per_node if self.gpus_per_node else 0
        self.time_limit_s = spec.time_limit_s
        # the last update of each kind the scheduler records but does not model
        self.updates: dict[type[Intent], Intent] = {}
        self.alloc: list[tuple[int, tuple[int, ...]]] = []
        # node, gpu, units: the shards or (``mps``) MPS units it holds on one GPU
        self.shard_alloc: tuple[int, int, int] | None = None
        self.mig_alloc: tuple[int, int] | None = None  # node, slice (SimNode.slices)
        self.start_s = math.nan
        self.first_start_s = math.nan
        self.end_s = math.nan
        self.base_work = 0.0  # work done when ``busy_from`` was set
        self.checkpoint_work = 0.0
        self.checkpointed_s = math.nan
        self.busy_from = math.inf
        self.rate = 0.0
        self.speed = 1.0  # relative speed from co-location (1 = alone on its GPU)
        # a phased batch-adaptive job: the batch its runtime picked for this run, and
        # the placement it picked it on
        self.batch = 0
        self.batch_for: tuple[int, ...] = ()
        self.restarts = 0
        self.steps_restart = False  # shrunk in place: the TERM to its steps restarts them
        self.version = 0
        self.attained_gpu_s = 0.0
        self.runs: list[JobRun] = []
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


class SimNode:
    """One node: its whole GPUs (``gpu_owner``; shard or MPS jobs in ``gpu_shards``) and
    the MIG slices of its last ``mig_gpus`` GPUs, each split as ``mig_layout``
    (``slices``: each one's profile and Slurm GPU index: Slurm numbers each slice as a
    GPU, here after the whole ones, ``len(gpu_owner) + i``)."""

    __slots__ = (
        "gpu_owner",
        "gpu_shards",
        "gpu_type",
        "index",
        "mps_per_gpu",
        "name",
        "shards_per_gpu",
        "slice_owner",
        "slices",
    )

    def __init__(
        self,
        index: int,
        name: str,
        gpus: int,
        shards_per_gpu: int,
        gpu_type: str | None = None,
        *,
        mps_per_gpu: int = 0,
        mig_gpus: int = 0,
        mig_layout: tuple[MigProfile, ...] = (),
    ) -> None:
        self.index = index
        self.name = name
        self.gpu_type = gpu_type
        self.shards_per_gpu = shards_per_gpu
        self.mps_per_gpu = mps_per_gpu
        split = min(max(mig_gpus, 0), gpus) if mig_layout else 0
        whole = gpus - split
        self.gpu_owner: list[int | None] = [None] * whole
        self.gpu_shards: list[dict[int, int]] = [{} for _ in range(whole)]
        self.slices: tuple[tuple[MigProfile, int], ...] = tuple(
            (p, whole + i) for i, p in enumerate(list(mig_layout) * split)
        )
        self.slice_owner: list[int | None] = [None] * len(self.slices)

    def free_gpus(self) -> list[int]:
        return [
            i for i, owner in enumerate(self.gpu_owner) if owner is None and not self.gpu_shards[i]
        ]

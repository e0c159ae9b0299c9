"""Frozen domain objects shared by every layer.

Everything that crosses a seam (SlurmClient, GpuProbe, Store, policy engine) is one of
these immutable values. Times are timezone-aware UTC ``datetime``; durations are
``timedelta``; memory is MiB (``_mib``). Slurm's own strings appear only at the edges
(``slurmgpu.slurm``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta


class JobState(enum.StrEnum):
    """Base state of a Slurm job (flags such as REQUEUED live in ``Job.state_flags``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        """True for states a job does not leave (unless it is requeued)."""
        return self not in _ACTIVE_STATES


_ACTIVE_STATES = frozenset({JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED})


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a job asked for in GPUs, whatever option it used.

    ``gpus`` is the best estimate of whole GPUs for the entire job: per-node counts are
    multiplied by the node count and per-task counts by the task count. ``shards`` is the
    total number of ``gres/shard`` units. ``sources`` records which options carried the
    request (``"tres_per_node"``, ``"tres_per_job"``, ``"tres_per_task"``,
    ``"tres_per_socket"``), so reports can show how users ask. ``mps`` is the total of
    ``gres/mps`` (a GPU's SMs in percent, 100 per GPU on the usual gres.conf): a share of
    one GPU, not a GPU. ``gpu_type`` of a MIG slice is its profile (``1g.10gb``).
    """

    gpus: int = 0
    per_node: int | None = None
    per_job: int | None = None
    per_task: int | None = None
    gpu_type: str | None = None
    shards: int = 0
    shards_per_node: int | None = None
    sources: tuple[str, ...] = ()
    mps: int = 0
    mps_per_node: int | None = None

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.shards > 0 or self.mps > 0


@dataclass(frozen=True, slots=True)
class NodeGpuAllocation:
    """The GPUs (and shards, and MPS shares) a job holds on one node, by Slurm device
    index. A MIG slice is a GPU index: Slurm numbers each instance as a GPU."""

    node: str
    gpu_indices: tuple[int, ...] = ()
    shard_indices: tuple[int, ...] = ()
    shards: int = 0
    mps_indices: tuple[int, ...] = ()  # the GPUs whose SMs it shares through MPS
    mps: int = 0


@dataclass(frozen=True, slots=True)
class Job:
    """One Slurm job (an array task is its own Job with ``array_task_id`` set)."""

    job_id: int
    name: str
    user: str
    state: JobState
    uid: int | None = None
    account: str = ""
    partition: str = ""
    qos: str = ""
    state_flags: frozenset[str] = frozenset()
    reason: str = ""
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_spec: str | None = None  # pending meta-record of an array, e.g. "2-5%2"
    array_max_tasks: int | None = None  # the ArrayTaskThrottle, None when unlimited
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    time_limit: timedelta | None = None  # None: no limit (INFINITE)
    cpus: int = 0
    memory_mib: int | None = None  # total over all nodes, when Slurm says
    node_count: int = 0
    tasks: int = 0
    gpus: GpuRequest = field(default_factory=GpuRequest)
    nodes: tuple[str, ...] = ()
    gpu_allocations: tuple[NodeGpuAllocation, ...] = ()
    restart_count: int = 0
    requeue: bool = False
    nice: int = 0  # Slurm's nice: subtracted from the job's priority
    comment: str = ""
    admin_comment: str = ""
    work_dir: str = ""
    command: str = ""
    exit_code: int | None = None
    batch: bool = True  # False for salloc/srun interactive allocations
    # --time-min (None: none): Slurm refuses a time limit below it (22.05: "Invalid
    # time-min specification"), so rightsizing never proposes one
    time_min: timedelta | None = None
    # Slurm's priority (squeue's %Q; its nice already subtracted), None where the source
    # has none (stored rows, accounting). Not part of equality: priorities move with each
    # fair-share calculation, and a job whose priority alone moved has not changed
    # (``jobdiff`` hands the fresh one on without a store write).
    priority: int | None = field(default=None, compare=False)

    @property
    def display_id(self) -> str:
        """The id a user types: ``123`` or ``120_3`` for an array task."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        if self.array_job_id is not None and self.array_task_spec:
            return f"{self.array_job_id}_[{self.array_task_spec}]"
        return str(self.job_id)

    @property
    def allocated_gpus(self) -> int:
        return sum(len(a.gpu_indices) for a in self.gpu_allocations)

    @property
    def allocated_shards(self) -> int:
        return sum(a.shards for a in self.gpu_allocations)


@dataclass(frozen=True, slots=True)
class MalleableSpec:
    """A job's opt-in to resizing: its bounds and how it is asked to checkpoint.

    ``min_gpus``/``max_gpus`` bound the job's GPU count; for an array ``pool`` they bound
    how many tasks run at once (its ArrayTaskThrottle) and ``job_id`` is the array id.
    ``state_dir`` is where the job's ``slurmgpu.elastic`` runtime writes its checkpoint
    acknowledgement (a directory shared with the head node); empty: the default,
    ``<work dir>/.sgpu-elastic``.
    """

    job_id: int
    min_gpus: int
    max_gpus: int
    checkpoint_signal: str = "USR2"
    checkpoint_grace: timedelta = timedelta(seconds=120)
    pool: bool = False
    state_dir: str = ""


@dataclass(frozen=True, slots=True)
class Node:
    """One Slurm node with its GPU inventory and what is allocated now."""

    name: str
    state: str  # base state, lower case as sinfo prints it: idle, mixed, allocated, down…
    state_flags: frozenset[str] = frozenset()
    cpus: int = 0
    cpus_allocated: int = 0
    memory_mib: int = 0
    memory_allocated_mib: int = 0
    gpus: int = 0
    gpu_type: str | None = None
    shards: int = 0
    gpus_used: int = 0
    gpu_indices_used: tuple[int, ...] = ()
    shards_used: int = 0
    # The GPUs holding shard work and, where known, how many shards each holds
    # ((index, shards) pairs). From Slurm's gres_used (22.05 names the GPUs only, 24.11+
    # counts per GPU) or, once the observer has compared it with the running jobs'
    # allocations (slurmgpu.nodeusage), from those allocations.
    shard_gpus_used: tuple[int, ...] = ()
    shards_used_by_gpu: tuple[tuple[int, int], ...] = ()
    # (type, count) of each GPU type the node has, e.g. MIG profiles
    # (("1g.10gb", 4), ("3g.40gb", 2)); untyped GPUs are not listed
    gpu_types: tuple[tuple[str, int], ...] = ()
    mps: int = 0  # gres/mps the node offers (100 per GPU on the usual gres.conf)
    mps_used: int = 0
    partitions: tuple[str, ...] = ()
    reason: str = ""
    address: str = ""

    @property
    def available(self) -> bool:
        """True when Slurm may schedule work here (not down, drained or failing)."""
        bad = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING"}
        return self.state not in {"down", "future", "unknown"} and not (self.state_flags & bad)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """What one observe cycle saw: every job and every node at one instant."""

    taken_at: datetime
    jobs: tuple[Job, ...]
    nodes: tuple[Node, ...]
    slurm_version: str = ""
    # Built on first use by jobs_by_id(): not part of the value.
    _by_id: dict[int, Job] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    def jobs_by_id(self) -> Mapping[int, Job]:
        """Every job by its id, built once per snapshot and shared by whoever asks (the
        policy engine and each actuator look jobs up by id every cycle). The last job
        listed wins if Slurm listed an id twice. Treat it as read-only."""
        index = self._by_id
        if index is None:
            index = {j.job_id: j for j in self.jobs}
            object.__setattr__(self, "_by_id", index)
        return index

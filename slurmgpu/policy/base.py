"""The policy seam: what every policy sees (PolicySnapshot) and proposes (Action).

Policies are pure: ``propose(snapshot)`` reads only the snapshot and returns actions; it
never calls Slurm, the database, the clock or the network. The daemon builds snapshots
from the store; the simulator builds them from its virtual cluster; tests build them by
hand. The engine (``policy.engine``) applies modes and guardrails to the proposals.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

import msgspec

from slurmgpu.intent import Intent, Preempt, Resize, SetNice, resize_of
from slurmgpu.model import ClusterSnapshot, Job, MalleableSpec


class Mode(enum.StrEnum):
    """How far a policy may go: record only, record and notify, or act through Slurm."""

    OBSERVE = "observe"
    ADVISE = "advise"
    ENFORCE = "enforce"


@dataclass(frozen=True, slots=True)
class GpuStat:
    """One allocated GPU of a running job, aggregated from agents' samples."""

    node: str
    gpu_index: int
    samples: int
    mean_util_pct: float | None
    max_util_pct: float | None
    max_memory_mib: float | None
    memory_total_mib: float | None
    trailing_idle: timedelta  # idle (util ~0) continuously up to the last sample
    never_busy: bool
    last_sample_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobUsage:
    """What a job has used so far (running jobs) or in total (finished jobs)."""

    job_id: int
    gpus: tuple[GpuStat, ...] = ()
    mean_cpu_pct: float | None = None  # 100 = one core
    max_memory_mib: float | None = None

    @property
    def idle_gpus(self) -> int:
        return sum(1 for g in self.gpus if g.mean_util_pct is not None and g.never_busy)


class HistoryRecord(msgspec.Struct, frozen=True, gc=False):
    """One finished job, as priors learn from it.

    A frozen ``msgspec.Struct`` (like ``Action``): the daemon reloads its 90 days of
    history every few minutes, and a reload compares the new records with the last
    ones (:meth:`~slurmgpu.policy.priors.Priors.carry_over`); a Struct is built and
    compared in C, about three times as fast as a frozen dataclass. Change one with
    ``msgspec.structs.replace``.
    """

    user: str
    name: str
    partition: str
    script_hash: str | None
    state: str
    run_time: timedelta
    time_limit: timedelta | None
    gpus_requested: int
    gpus_used: int | None  # GPUs that were ever busy, when samples exist
    cpus: int
    memory_requested_mib: int | None
    peak_memory_mib: float | None
    mean_cpu_pct: float | None
    mean_gpu_util_pct: float | None
    peak_gpu_memory_mib: float | None
    ended_at: datetime
    # Peak of the busiest node; ``peak_memory_mib`` is the job's total (the sum of its
    # nodes' peaks, like ``Job.memory_mib``). Multi-node memory rightsizing needs this.
    peak_node_memory_mib: float | None = None
    # Times Slurm started the job again (a requeue: a resize, a preemption, the idle-GPU
    # policy, a node failure). ``run_time`` is then the last run's only (Slurm's start
    # time is the last start), not what the job needed in all.
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class PriorAlert:
    """A warning or action already issued for a job (so escalation can follow it).

    ``kind`` is the action's ``alert`` name when it had one (``"idle_gpu_warning_1"``),
    else its ``kind``. The daemon records one for every decision that was not suppressed,
    in every mode, so that escalation (warn, warn again, act) runs the same way in
    ``observe`` mode as in ``enforce`` and the audit shows what enforce would have done.
    """

    job_id: int
    policy: str
    kind: str
    at: datetime


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """Everything a policy may look at in one cycle."""

    at: datetime
    cluster: ClusterSnapshot
    usage: Mapping[int, JobUsage] = field(default_factory=dict)
    history: tuple[HistoryRecord, ...] = ()
    alerts: tuple[PriorAlert, ...] = ()  # newest last
    # When a change (update, requeue, cancel) was last *executed* on each job, any policy;
    # warnings and suppressed or advisory decisions do not count (the engine's cooldown).
    last_action_at: Mapping[int, datetime] = field(default_factory=dict)
    # Which policy made that change, where known: a pending job's change by *another*
    # policy is a follow-up (rightsize's limit, then malleable's start smaller), not a
    # flap, so the cooldown does not hold it (policy.engine).
    last_action_by: Mapping[int, str] = field(default_factory=dict)
    # Changes executed on each user's jobs in the hour before ``at`` (the engine's rate).
    user_actions_last_hour: Mapping[str, int] = field(default_factory=dict)
    # When a policy's change on a job last failed in Slurm (job id, policy), within the
    # cooldown: the engine does not retry it every cycle (a release that refuses the
    # update refuses it again).
    failed_at: Mapping[tuple[int, str], datetime] = field(default_factory=dict)
    opted_in: frozenset[int] = frozenset()  # jobs (or array job ids) that asked for rightsizing
    # Malleable jobs (and array pools, by array id) with their bounds: only these may be
    # resized. Jobs with a resize transaction in flight are in ``resizing``: leave them be.
    malleable: Mapping[int, MalleableSpec] = field(default_factory=dict)
    resizing: frozenset[int] = frozenset()
    # Measured throughput (samples or steps per second) of each malleable job by the GPU
    # count it ran at, as its slurmgpu.elastic runtime reported it.
    throughput: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    # Median measured cost of one resize here (decision → running at the new size), once
    # at least one has completed; None before.
    resize_cost: timedelta | None = None
    # When each job's last completed resize ended (for a minimum interval between resizes).
    last_resize_at: Mapping[int, datetime] = field(default_factory=dict)
    # Each partition's MaxTime, where known (a raised time limit is capped there).
    partition_max_time: Mapping[str, timedelta] = field(default_factory=dict)

    def jobs(self) -> tuple[Job, ...]:
        return self.cluster.jobs


class Action(msgspec.Struct, frozen=True, gc=False):
    """A change one policy proposes for one job, with the numbers behind it.

    ``kind`` is one of: ``update`` (``intents`` are the job's changes, typed:
    ``(SetTimeLimit(5400),)``, :mod:`slurmgpu.intent`; ``slurmgpu.slurm.update`` renders
    them as ``scontrol update`` fields for the running release), ``warn`` (a
    notification, no change), ``requeue`` (with ``intents``: applied while the job is
    held, ``actuate.separate``), ``cancel``, ``resize`` (a malleable job's GPU count, or
    an array pool's running tasks: a :class:`~slurmgpu.intent.Resize` or
    :class:`~slurmgpu.intent.Preempt` intent, built with :func:`resize_action` /
    :func:`preempt_action`; carried out by ``cycle.resize`` / ``cycle.pool`` as a
    persisted transaction). When several policies want the same job in one cycle the
    engine keeps one: the kind ranks first (``policy.engine.ACTION_PRIORITY``), then
    ``priority`` (higher wins), then the order the policies were given in.

    ``requires_opt_in``: the engine suppresses the action unless the job (or its array)
    is in ``PolicySnapshot.opted_in``. ``slurm_id``: the id to give Slurm commands --
    ``A_i`` for an array task and ``A_[2-5]`` for a pending array meta-record, never the
    bare array id (which would address every task); empty means ``str(job_id)``.

    ``protective``: the action undoes an earlier change before it hurts the job (the
    separation of a shared GPU before an out-of-memory), so the engine's cooldown after
    that change does not hold it back; every other guardrail still applies.

    ``needs``: the id of another job whose action, proposed by the same policy in the
    same cycle, this one depends on (a rebalance grows one job into the GPUs another
    gives up): the engine suppresses this action unless that one goes through too.

    A frozen ``msgspec.Struct``, not a dataclass: a cycle over a big queue builds tens of
    thousands of these and a frozen dataclass costs about ten times as much to build.
    Change one with ``msgspec.structs.replace``, not ``dataclasses.replace``.
    ``gc=False``: the cyclic garbage collector does not track these (an Action holds
    strings, numbers, two flat dicts and a tuple of intents, themselves untracked
    Structs of numbers and strings, so it can be in no cycle); tens of thousands
    of them a cycle would otherwise trigger collections that walk the whole heap.
    """

    policy: str
    kind: str
    job_id: int
    user: str
    reason: str
    numbers: Mapping[str, float | int | str | None] = msgspec.field(default_factory=dict)
    intents: tuple[Intent, ...] = ()
    alert: str = ""  # alert name for notification rate limits, e.g. "idle_gpu_warning"
    priority: int = 0
    requires_opt_in: bool = False
    slurm_id: str = ""
    protective: bool = False
    needs: int | None = None


class Decision(msgspec.Struct, frozen=True, gc=False):
    """An action after the engine applied the mode and guardrails.

    ``execute``: the actuator should carry it out (enforce mode and not suppressed).
    ``notify``: the user should be told (advise or enforce, not suppressed).
    ``suppressed``: why the engine held it back (empty when it was not).
    A frozen ``msgspec.Struct`` like :class:`Action`, untracked by the collector too.
    """

    action: Action
    mode: Mode
    execute: bool
    notify: bool
    suppressed: str = ""


def slurm_job_ref(job: Job) -> str:
    """Return the id Slurm commands should address: ``123``, ``120_3`` or ``120_[2-5]``.

    A pending array meta-record's spec loses its ``%N`` throttle, which is not part of an
    id. The bare array id is never returned for a task: it would address every task.
    """
    if job.array_job_id is not None and job.array_task_id is not None:
        return f"{job.array_job_id}_{job.array_task_id}"
    if job.array_job_id is not None and job.array_task_spec:
        return f"{job.array_job_id}_[{job.array_task_spec.split('%', 1)[0]}]"
    return str(job.job_id)


RESIZE = "resize"


def resize_action(
    policy: str,
    job: Job,
    from_gpus: int,
    to_gpus: int,
    reason: str,
    *,
    numbers: Mapping[str, float | int | str | None] | None = None,
    priority: int = 0,
    intents: tuple[Intent, ...] = (),
    gpu_type: str | None = None,
    needs: int | None = None,
) -> Action:
    """A ``resize`` of ``job`` from ``from_gpus`` to ``to_gpus`` (tasks, for an array pool).

    For a pool ``job`` is any record of the array; the action names the array id.
    ``intents`` are more changes for the held job's update (``SetTimeLimit``), sent with
    the new GPU request; ``gpu_type`` moves the job to another GPU type; ``needs`` the
    job whose change this one depends on (``Action.needs``).
    """
    if from_gpus < 0 or to_gpus < 0 or from_gpus == to_gpus:
        raise ValueError(f"not a resize: {from_gpus} -> {to_gpus}")
    job_id = job.array_job_id if job.array_job_id is not None else job.job_id
    return Action(
        policy=policy,
        kind=RESIZE,
        job_id=job_id,
        user=job.user,
        reason=reason,
        numbers={"from_gpus": from_gpus, "to_gpus": to_gpus, **(numbers or {})},
        intents=(*intents, Resize(from_gpus, to_gpus, gpu_type)),
        priority=priority,
        needs=needs,
    )


# ``Action.alert`` of an ``update`` that only reorders the queue (``Nice``/``Priority`` of
# a pending job): the engine neither cools it down nor counts it against the rate limits,
# and it notifies nobody (policy.engine).
ORDERING_ALERT = "queue_order"


def is_ordering(action: Action) -> bool:
    """True for an update that only changes where a pending job stands in the queue."""
    return (
        action.kind == "update"
        and action.alert == ORDERING_ALERT
        and bool(action.intents)
        and all(type(i) is SetNice for i in action.intents)
    )


def is_preempt(action: Action) -> bool:
    """True for a ``resize`` that keeps the size: a preemption (checkpoint, requeue,
    update, release -- the same transaction; the update carries the job's new nice)."""
    return isinstance(resize_of(action.intents), Preempt)


def preempt_action(
    policy: str,
    job: Job,
    gpus: int,
    reason: str,
    *,
    intents: tuple[Intent, ...] = (),
    numbers: Mapping[str, float | int | str | None] | None = None,
    priority: int = 0,
) -> Action:
    """Preempt a running checkpointable ``job``: the resize transaction at its own size.

    ``intents`` (``SetNice``) go in the held job's update, so it waits in its new place.
    """
    if gpus < 1:
        raise ValueError(f"not a preemption: {gpus} GPUs")
    return Action(
        policy=policy,
        kind=RESIZE,
        job_id=job.job_id,
        user=job.user,
        reason=reason,
        numbers={"from_gpus": gpus, "to_gpus": gpus, "preempt": 1, **(numbers or {})},
        intents=(*intents, Preempt(gpus)),
        priority=priority,
    )


def resize_sizes(action: Action) -> tuple[int, int]:
    """Return (from, to) of a ``resize`` action; ValueError when it names no sizes."""
    sized = resize_of(action.intents)
    if isinstance(sized, Resize):
        return sized.from_gpus, sized.to_gpus
    if isinstance(sized, Preempt):
        return sized.gpus, sized.gpus
    raise ValueError(f"resize of job {action.job_id} names no from_gpus/to_gpus")


class Policy(Protocol):
    """A pure policy: ``name`` labels its actions; ``propose`` reads only the snapshot."""

    name: str

    def propose(self, snapshot: PolicySnapshot) -> Iterable[Action]: ...

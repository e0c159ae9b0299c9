"""Least attained service through Slurm: Tiresias' discretised 2D-LAS on checkpointable jobs.

A job's *attained service* is the GPU-time it has held so far (GPUs x seconds, every run
of it, this one included). Jobs that have had little go first: short jobs overtake long
ones without anyone knowing how long a job is (Tiresias, NSDI'19). The service is cut
into queues at ``queue_limits`` GPU-hours (16 by default: the Pollux artifact's
Tiresias); a job's queue is how many limits it has passed.

**Ordering through Slurm.** A pending opted-in job in queue ``q > 0`` gets
``Nice = q * nice_step`` (an ``update`` marked :data:`~slurmgpu.policy.base.ORDERING_ALERT`:
it only reorders the queue, so the engine neither cools it down nor rate-limits it).
Queue 0 needs nothing: a new job has nice 0. Inside a queue the site's own priority
(submit order, fair share) decides, as Tiresias keeps FIFO inside a queue.

**Preemption** (``preempt``): pending jobs are taken best queue first, then as Slurm
orders them (nice, then submit time). One that fits the free GPUs left will start (they
are set aside). One that does not may take the GPUs of running opted-in jobs of a
*worse* queue -- the worst queue first, the latest submitted first -- when those make it
fit; each such job is preempted by the resize transaction at its own size
(:func:`~slurmgpu.policy.base.preempt_action`: checkpoint signal, requeue held, update
``Nice`` to its queue, release), and waits in line behind the better queues.

**Shrink before preempt** (``shrink``): a malleable job can give GPUs and keep running,
so the GPUs are first sought by *shrinking* the same victims, in the same order, each
by no more than the waiting job still lacks and never below its ``min_gpus``
(``--gpus=N`` requests, and ``--gpus-per-node`` ones on one node): a ``resize`` down
(:func:`~slurmgpu.policy.base.resize_action`), whose update also raises the time limit
for the slower size (:func:`~slurmgpu.policy.resize_limit.resized_time_limit`, at
linear slow-down: the most a job slows). The shrunk job keeps its place in line, so it
restarts at once on the GPUs it kept; a whole preemption instead sends a long job behind
every job of a better queue, where it may wait for hours beside GPUs too few for it.
Only when shrinking every victim to its minimum would not make the waiting job fit are
victims preempted whole, as above. A shrunk job gets its GPUs back when nobody waits for
them (``_growths``), from this policy, or, where the malleable policy enforces expansion
beside it, from that one (it prices each growth against its restart; ``grow_back``).

Churn guardrails: a job is never preempted within ``min_runtime`` of its start (a
preemption costs the checkpoint, Slurm's requeue delay and a restart, about 3 min), a
job waits ``min_wait`` before it may preempt anyone (a GPU about to free up may be
enough), at most ``max_preemptions_per_cycle`` a cycle, never a job with a resize in
flight, and the engine's per-user rate limit counts preemptions.

Opt-in: the site enables the policy (``enabled``); a job opts in by being checkpointable
(``PolicySnapshot.malleable``: it answers the checkpoint signal). Other jobs are never
reordered nor preempted; their GPUs are simply not free.

State: the attained service of runs that ended (requeued jobs) is remembered from cycle to
cycle -- Slurm keeps only the current run's start. A daemon restart forgets it, so a job
requeued before the restart counts from its current run only.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmgpu.intent import Intent, SetNice, SetTimeLimit
from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import (
    ORDERING_ALERT,
    Action,
    PolicySnapshot,
    preempt_action,
    resize_action,
    resize_sizes,
)
from slurmgpu.policy.resize_limit import resized_time_limit
from slurmgpu.policy.settings import AttainedServiceSettings

__all__ = ["AttainedServicePolicy"]

# Pending reasons of jobs that will not start whatever GPUs are free.
_NOT_WAITING = frozenset(
    {"Dependency", "DependencyNeverSatisfied", "JobHeldUser", "JobHeldAdmin", "BeginTime"}
)


@dataclass(slots=True)
class _Seen:
    """The run of a job last seen running: its start, GPUs and when it was last seen."""

    start: datetime
    gpus: int
    last: datetime


def _gpus(job: Job) -> int:
    if job.state is JobState.RUNNING and job.gpu_allocations:
        return job.allocated_gpus
    return job.gpus.gpus


def _shrinkable(job: Job, snapshot: PolicySnapshot) -> int:
    """GPUs a running victim can give and keep running: down to its ``min_gpus``, for a
    ``--gpus=N`` request or a ``--gpus-per-node`` one on one node (a multi-node one
    shrinks only by whole nodes, and is preempted whole instead); 0 for any other."""
    spec = snapshot.malleable.get(job.job_id)
    req = job.gpus
    if spec is None or spec.pool or req.shards or req.per_task is not None:
        return 0
    if req.per_node is not None and (req.per_job is not None or job.node_count > 1):
        return 0
    if req.per_node is None and req.per_job is None:
        return 0
    return max(0, _gpus(job) - max(1, spec.min_gpus))


class AttainedServicePolicy:
    """Discretised least-attained-service ordering and preemption (module docstring)."""

    name = "las"

    def __init__(
        self, settings: AttainedServiceSettings | None = None, *, malleable_expands: bool = False
    ) -> None:
        """``malleable_expands``: the malleable policy runs beside this one and enforces
        expansion (it then grows the jobs this one shrank, unless ``grow_back`` says)."""
        self.settings = settings or AttainedServiceSettings()
        grow = self.settings.grow_back
        self.grows_back = (not malleable_expands) if grow is None else grow
        self._limits_s = [h * 3600.0 for h in self.settings.queue_limits]
        self._ended: dict[int, float] = {}  # GPU-seconds of runs that ended
        self._seen: dict[int, _Seen] = {}
        self._shrunk: dict[int, int] = {}  # jobs this policy shrank: the GPUs they had

    # ---- attained service

    def _observe(self, snapshot: PolicySnapshot) -> None:
        at = snapshot.at
        live: set[int] = set()
        for job in snapshot.cluster.jobs:
            if job.state.is_terminal:
                continue
            jid = job.job_id
            live.add(jid)
            seen = self._seen.get(jid)
            running = job.state is JobState.RUNNING and job.start_time is not None
            if seen is not None and (not running or job.start_time != seen.start):
                # The run we saw has ended (requeued, resized): bank it to when last seen.
                held = max(0.0, (seen.last - seen.start).total_seconds()) * seen.gpus
                self._ended[jid] = self._ended.get(jid, 0.0) + held
                del self._seen[jid]
                seen = None
            if running:
                assert job.start_time is not None
                if seen is None:
                    self._seen[jid] = _Seen(job.start_time, _gpus(job), at)
                else:
                    seen.last = at
        for gone in [j for j in self._seen if j not in live]:
            del self._seen[gone]
        for gone in [j for j in self._ended if j not in live]:
            del self._ended[gone]
        for gone in [j for j in self._shrunk if j not in live]:
            del self._shrunk[gone]

    def attained_gpu_s(self, job: Job, at: datetime) -> float:
        """GPU-seconds ``job`` has held: its ended runs (as seen) plus this run so far."""
        total = self._ended.get(job.job_id, 0.0)
        if job.state is JobState.RUNNING and job.start_time is not None:
            total += max(0.0, (at - job.start_time).total_seconds()) * _gpus(job)
        return total

    def queue(self, job: Job, at: datetime) -> int:
        """The job's queue: how many ``queue_limits`` its attained service has passed."""
        return bisect_right(self._limits_s, self.attained_gpu_s(job, at))

    # ---- decisions

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        self._observe(snapshot)
        s = self.settings
        at = snapshot.at
        opted = snapshot.malleable
        actions: list[Action] = []
        pending: list[tuple[int, Job]] = []
        running: list[tuple[int, Job]] = []
        for job in snapshot.cluster.jobs:
            if job.job_id not in opted or job.array_job_id is not None:
                continue
            if job.state is JobState.PENDING:
                q = self.queue(job, at)
                pending.append((q, job))
                nice = q * s.nice_step
                if job.nice != nice:
                    actions.append(
                        Action(
                            policy=self.name,
                            kind="update",
                            job_id=job.job_id,
                            user=job.user,
                            reason=(
                                f"attained {self.attained_gpu_s(job, at) / 3600:.1f} GPU-h: "
                                f"queue {q}, waits behind queues below it"
                            ),
                            numbers={"queue": q, "nice": nice, "nice_was": job.nice},
                            intents=(SetNice(nice),),
                            alert=ORDERING_ALERT,
                        )
                    )
            elif job.state is JobState.RUNNING:
                running.append((self.queue(job, at), job))
        if s.preempt and pending and running:
            actions.extend(self._preemptions(snapshot, pending, running))
        if self.grows_back and self._shrunk and not any(a.job_id in self._shrunk for a in actions):
            actions.extend(self._growths(snapshot))
        return actions

    def _preemptions(
        self,
        snapshot: PolicySnapshot,
        pending: list[tuple[int, Job]],
        running: list[tuple[int, Job]],
    ) -> list[Action]:
        s = self.settings
        at = snapshot.at
        free = sum(max(0, n.gpus - n.gpus_used) for n in snapshot.cluster.nodes if n.available)
        min_run = s.min_runtime.total_seconds()
        victims = [
            (q, job)
            for q, job in running
            if job.job_id not in snapshot.resizing
            and job.requeue
            and job.start_time is not None
            and (at - job.start_time).total_seconds() >= min_run
            and _gpus(job) > 0
        ]
        # worst queue first, then the latest submitted
        victims.sort(
            key=lambda v: (
                -v[0],
                -(v[1].submit_time.timestamp() if v[1].submit_time else math.inf),
                -v[1].job_id,
            )
        )
        order = sorted(
            (
                (q, job)
                for q, job in pending
                if job.reason not in _NOT_WAITING and job.gpus.gpus > 0
            ),
            key=lambda p: (
                p[0],
                p[1].nice,
                p[1].submit_time.timestamp() if p[1].submit_time else math.inf,
                p[1].job_id,
            ),
        )
        out: list[Action] = []
        taken: set[int] = set()
        for q, job in order:
            need = job.gpus.gpus
            if need <= free:
                free -= need
                continue
            waited = (at - job.submit_time).total_seconds() if job.submit_time else 0.0
            if job.eligible_time is not None:
                waited = min(waited, (at - job.eligible_time).total_seconds())
            if waited < s.min_wait.total_seconds():
                continue
            if s.shrink:
                shrinks = self._shrinks(snapshot, job, q, need - free, victims, taken)
                # over the cycle's limit (several small shrinks): preempt whole below
                if shrinks is not None and len(out) + len(shrinks) <= s.max_preemptions_per_cycle:
                    for a in shrinks:
                        was, _ = resize_sizes(a)
                        self._shrunk[a.job_id] = max(was, self._shrunk.get(a.job_id, 0))
                    out.extend(shrinks)
                    taken.update(a.job_id for a in shrinks)
                    free = 0  # the waiting job takes the free GPUs and what was given
                    continue
            chosen: list[tuple[int, Job]] = []
            got = free
            for vq, victim in victims:
                if got >= need:
                    break
                if vq <= q or victim.job_id in taken:
                    continue
                chosen.append((vq, victim))
                got += _gpus(victim)
            if got < need or len(out) + len(chosen) > s.max_preemptions_per_cycle:
                continue
            for vq, victim in chosen:
                taken.add(victim.job_id)
                g = _gpus(victim)
                out.append(
                    preempt_action(
                        self.name,
                        victim,
                        g,
                        (
                            f"queue {vq} (attained "
                            f"{self.attained_gpu_s(victim, at) / 3600:.1f} GPU-h): "
                            f"its {g} GPUs go to job {job.job_id} of queue {q}"
                        ),
                        intents=(SetNice(vq * s.nice_step),),
                        numbers={"queue": vq, "for_job": job.job_id, "for_queue": q},
                    )
                )
            free = got - need
        return out

    def _shrinks(
        self,
        snapshot: PolicySnapshot,
        job: Job,
        q: int,
        lack: int,
        victims: list[tuple[int, Job]],
        taken: set[int],
    ) -> list[Action] | None:
        """Shrinks of ``victims`` (in their order, each by no more than is still lacking)
        that give ``job`` of queue ``q`` its ``lack`` GPUs; None when they cannot."""
        plan: list[tuple[int, Job, int]] = []
        got = 0
        for vq, victim in victims:
            if got >= lack:
                break
            if vq <= q or victim.job_id in taken:
                continue
            give = min(_shrinkable(victim, snapshot), lack - got)
            if give > 0:
                plan.append((vq, victim, give))
                got += give
        if got < lack:
            return None
        at = snapshot.at
        out: list[Action] = []
        for vq, victim, give in plan:
            g = _gpus(victim)
            intents, numbers = self._limit_for(victim, g, g - give, at)
            out.append(
                resize_action(
                    self.name,
                    victim,
                    g,
                    g - give,
                    (
                        f"queue {vq} (attained "
                        f"{self.attained_gpu_s(victim, at) / 3600:.1f} GPU-h): "
                        f"{give} of its {g} GPUs go to job {job.job_id} of queue {q}; "
                        f"it keeps running on {g - give}"
                    ),
                    intents=intents,
                    numbers={
                        "queue": vq,
                        "for_job": job.job_id,
                        "for_queue": q,
                        "shrink": 1,
                        **numbers,
                    },
                )
            )
        return out

    def _growths(self, snapshot: PolicySnapshot) -> list[Action]:
        """Give jobs this policy shrank their GPUs back once nobody waits for GPUs.

        A whole preemption ends when Slurm starts the job again; a shrink ends here: when
        every pending job that waits for GPUs fits the free ones with some left, a shrunk
        job (the earliest shrunk first) grows back towards the size it had, by what is
        left, never within ``min_runtime`` of its restart (nor while a resize of it is in
        flight). Its time limit is left as the shrink raised it (a limit that is too long
        costs the job nothing; one cut short might)."""
        s = self.settings
        at = snapshot.at
        cluster = snapshot.cluster
        free = sum(max(0, n.gpus - n.gpus_used) for n in cluster.nodes if n.available)
        for pending in cluster.jobs:
            if pending.state is JobState.PENDING and pending.reason not in _NOT_WAITING:
                free -= pending.gpus.gpus
        if free <= 0:
            return []
        out: list[Action] = []
        by_id = {j.job_id: j for j in cluster.jobs}
        for jid, had in list(self._shrunk.items()):
            job = by_id.get(jid)
            if job is None or job.state is not JobState.RUNNING or job.start_time is None:
                continue
            g = _gpus(job)
            if g >= had:
                del self._shrunk[jid]
                continue
            if jid in snapshot.resizing or (at - job.start_time) < s.min_runtime:
                continue
            if job.gpus.per_node is not None and free < had - g:
                continue  # a one-node job grows whole, on a node with room (as it started)
            to = min(had, g + free)
            if to <= g or len(out) >= s.max_preemptions_per_cycle:
                continue
            free -= to - g
            if to >= had:
                del self._shrunk[jid]
            out.append(
                resize_action(
                    self.name,
                    job,
                    g,
                    to,
                    f"shrunk for a better queue's job; {to - g} GPUs free and nobody waits: "
                    f"back to {to} of the {had} it had",
                    numbers={"queue": self.queue(job, at), "grow_back": 1, "had_gpus": had},
                )
            )
        return out

    def _limit_for(
        self, job: Job, gpus: int, after: int, at: datetime
    ) -> tuple[tuple[Intent, ...], dict[str, float | int | str | None]]:
        """The time limit for ``job``'s run on ``after`` of its ``gpus``: slowed down
        linearly (the most a job slows), so the shrink costs it no timeout."""
        if job.time_limit is None:
            return (), {}
        elapsed = at - job.start_time if job.start_time is not None else timedelta(0)
        new = resized_time_limit(
            job.time_limit,
            max(elapsed, timedelta(0)),
            gpus,
            after,
            float(gpus),
            float(after),
            restart=self.settings.restart_time,
        )
        if new is None:
            return (), {}
        return (SetTimeLimit.of(new),), {
            "time_limit_s": round(new.total_seconds()),
            "time_limit_was_s": round(job.time_limit.total_seconds()),
        }

"""Malleable jobs: shrink them so waiting jobs start, expand them into GPUs nobody waits for.

Only jobs in ``PolicySnapshot.malleable`` (``sgpu submit --malleable MIN:MAX``) are ever
resized, never below ``min_gpus`` nor above ``max_gpus``, and never while a resize of
theirs is in flight (``PolicySnapshot.resizing``) or within ``min_interval`` of their
last one (``PolicySnapshot.last_resize_at``). A resize is a ``resize`` action
(:func:`~slurmgpu.policy.base.resize_action`) that ``cycle.resize`` carries out as
checkpoint -> requeue held -> update -> release; the job runs nothing meanwhile.

**What a resize costs**: the measured median of past resizes here
(``PolicySnapshot.resize_cost``, decision to running at the new size) while
``use_measured_cost``, else ``checkpoint_time + requeue_delay + startup_time`` (181 s
by default; Slurm 22.05-25.x holds a requeued job back for credential expiry + 1 s).

**What it gains**: each job's throughput at the sizes it ran
(``PolicySnapshot.throughput``, ``{gpus: samples/s}``) is fitted to a speedup curve
(:mod:`slurmgpu.policy.speedup`); a job without measurements follows the curve's prior
shape. A running job's remaining time ``rem`` is estimated from its history's median run
time less its elapsed time, or its elapsed time once it has outlived that (Lindy), at
least ``min_remaining`` and never past its time limit.

**Cycle** (pure; time is ``snapshot.at``):

1. Pending GPU jobs are taken in Slurm's order: lowest ``Nice`` first (what the
   attained-service policy sets), then oldest (eligible time, submit time, id).
   One that fits the free GPUs left will start: its GPUs are set aside. One that does not
   is *blocked*.
2. **Shrink** (for each blocked job, while ``shrink``): its wait ``W`` is estimated as
   when enough running GPUs free up (running jobs sorted by ``rem``). Donors are running
   malleable jobs above their minimum; each gives back GPUs at the least loss per GPU
   until the blocked job fits. A donor runs slower while the waiting job runs (its
   history's median run time ``R``, else its time limit) and is grown back after:
   ``loss = min(rem, R) * (x(g) / x(g - d) - 1) + cost`` (twice the cost when
   ``R < rem``). The plan is proposed when ``W - checkpoint_time - sum(loss) >=
   min_gain * W``. A donor's restart holds all its ``g`` GPUs idle, so its ``cost``
   counts ``g / g_w`` times for a waiting job of ``g_w`` GPUs: a large job is not
   restarted to hand one GPU to a small one. A donor shrunk for an earlier
   waiting job in the same cycle may give more for the next ones with no second
   restart: it is resized once, to the smaller size (no one-GPU-at-a-time chains).
3. **Start smaller** (while ``start_smaller``): a blocked *pending* malleable job that
   fits the free GPUs left at a smaller size (never below ``min_gpus``) has its request
   lowered to the largest that fits (an ``update`` with ``SetGpus``; it
   is grown later like any running job) when starting now beats waiting:
   ``W - run * (x(g) / x(g') - 1) >= min_gain * W``, ``run`` its history's median run
   time, else its time limit, else ``min_remaining``. A job that has run before (requeued
   by a resize or a preemption) is priced on its own runs instead, as a running job is:
   its history's median less the time it has run, or that time once it has outlived the
   median (Lindy), at least ``min_remaining``, never past its limit: a job requeued after
   an hour is not priced on a 48-hour limit. Its runs are counted from what this policy
   saw (forgotten on a daemon restart, as the attained-service policy's).
   Tried before shrinking others for it.
4. **Expand** (while ``expand``): the free GPUs nobody will use -- less, while
   ``reserve_for_blocked``, what the oldest blocked job needs -- go to running
   malleable jobs whose GPUs are busy (``min_busy_util_pct``), each to its best size up
   to ``max_gpus`` and ``max_growth`` times its GPUs, when
   ``rem * (1 - x(g) / x(g')) - cost >= min_gain * rem``. The largest saving per added
   GPU goes first. A job grows no further than its own measurements allow: walking up
   the sizes it ran at, the first step whose measured marginal efficiency
   ``(x(m) / x(k) - 1) / (m / k - 1)`` is below ``min_gain`` caps it at ``k`` (the prior
   curve is overruled there; also after a shrink from such a size).

5. **Rebalance** (while ``shrink`` and ``expand``, and only when no pending job is
   blocked or was helped this cycle: the GPUs would otherwise be the queue's): GPUs
   move from a running job that gains little from them to one that gains more, as
   Pollux re-plans every job's size each interval instead of sizing jobs only when
   they start or when others wait. For a recipient ``r`` growing by ``k`` (within
   ``max_gpus``, ``max_growth`` and its measured ceiling) and a donor ``d`` shrinking
   by ``k`` (not below ``min_gpus``): ``saving = rem_r * (1 - x_r(g) / x_r(g + k)) -
   cost``, ``loss = rem_d * (x_d(g) / x_d(g - k) - 1) + cost * g_d / k`` (the donor's
   restart idles its ``g_d`` GPUs, priced per GPU moved as for a shrink); the pair of
   largest ``saving - loss`` is resized when that exceeds ``min_gain * rem_r`` (the
   expansion's dead band), then the next pair among the jobs not yet touched.
   Per-node (``--gpus-per-node``) and typed requests are left out: their GPUs cannot
   move to another job's nodes freely.

**Re-allocation factor** (Pollux, OSDI'21 §4.2): a job's speed at any new size, grown
or shrunk, counts ``(T - S * cost) / (T + cost)``, ``T`` its age since submission and
``S`` its restarts (``Job.restart_count``): a job restarted often for its age is resized
again only for a larger gain.

Every resize and start smaller also sets the job's time limit (``SetTimeLimit``) for its
new size in the
same update (:mod:`slurmgpu.policy.resize_limit`; ``scale_time_limit``), shown in the
action's ``numbers`` (``time_limit_s``, ``time_limit_was_s``).

6. **Type-aware** (``type_aware``, off by default; a cluster of several GPU types and a
   ``type_speed`` table, :mod:`slurmgpu.policy.gputype`): a job that did not ask for a
   GPU type -- or whose type this policy chose -- grows on the type where it gains
   most: every type's sizes are tried, at ``x(g') * speed(type) / speed(now)`` where
   ``speed(now)`` is the slowest type it holds, against the free GPUs of that type (plus
   its own there); the resize names the type (``Resize.gpu_type``, kept in the
   update's GPU request). A blocked untyped job started smaller is given the type on which it
   runs fastest at the size that fits there (Gavel, OSDI'20, places each job on the
   type where its throughput is highest). A job that asked for a type is never moved
   off it; without the option the policy is type-blind.

``min_gain`` is a dead band: a move and its reverse cannot both clear it, so a job does
not flap. Per-node requests (``--gpus-per-node``) are fitted node by node; ``--gpus``
requests against the cluster's total.

Cost: O(jobs + nodes) plus, per candidate, a memoised curve fit and a scan of its sizes.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slurmgpu.intent import Intent, SetGpus, SetTimeLimit
from slurmgpu.model import Job, JobState, MalleableSpec, Node
from slurmgpu.policy.base import (
    Action,
    HistoryRecord,
    PolicySnapshot,
    resize_action,
)
from slurmgpu.policy.gputype import slowest, speeds_for
from slurmgpu.policy.priors import Priors
from slurmgpu.policy.resize_limit import LONGEST, resized_time_limit
from slurmgpu.policy.settings import MalleableSettings
from slurmgpu.policy.speedup import DEFAULT_PRIOR, SpeedupCurve, SpeedupPrior, fit_speedup

__all__ = ["MAX_BLOCKED_CONSIDERED", "MalleablePolicy"]

# Shrinks are planned for the oldest blocked jobs only (Slurm starts those first anyway),
# so a queue of thousands costs no more than a few dozen plans.
MAX_BLOCKED_CONSIDERED = 32

# Pending reasons of jobs that will not start whatever GPUs are free.
_NOT_WAITING_FOR_GPUS = frozenset(
    {"Dependency", "DependencyNeverSatisfied", "JobHeldUser", "JobHeldAdmin", "BeginTime"}
)
_TINY = 1e-9


@dataclass(slots=True)
class _Running:
    """A running malleable job the policy may resize."""

    job: Job
    spec: MalleableSpec
    gpus: int
    curve: SpeedupCurve
    remaining_s: float
    single_node: bool
    busy: bool
    rates: dict[int, float] = field(default_factory=dict)
    # Sizes it ran at and its measured throughput there (PolicySnapshot.throughput).
    measured: dict[int, float] = field(default_factory=dict)
    # Pollux's re-allocation factor: its speed at any new size counts this much.
    realloc: float = 1.0

    def rate(self, gpus: int) -> float:
        r = self.rates.get(gpus)
        if r is None:
            r = self.rates[gpus] = self.curve.throughput(gpus)
        return r


@dataclass(slots=True)
class _Shrink:
    """A donor shrunk this cycle: as it was, as planned now, and for which jobs."""

    was: _Running
    now: _Running
    for_jobs: list[tuple[Job, float]]  # (waiting job, its wait avoided)
    loss_s: float


@dataclass(frozen=True, slots=True)
class _Cycle:
    """What one :meth:`MalleablePolicy.propose` read, fixed for the cycle."""

    snapshot: PolicySnapshot
    cost_s: float  # one resize's restart
    priors: Priors | None  # run-time medians of the history; None without history
    candidates: dict[int, _Running]  # the running jobs the policy may resize, by id
    ends: tuple[float, ...]  # every running GPU job's remaining seconds, shortest first
    freed_by: tuple[int, ...]  # GPUs free once the first i of them ended (freed_by[0] = 0)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the cycle has given out so far (each step takes from it in turn)."""

    free: _Free  # the GPUs still free
    touched: set[int] = field(default_factory=set)  # jobs resized this cycle
    shrunk: dict[int, _Shrink] = field(default_factory=dict)  # donors, by job id


def _without(c: _Running, give: int) -> _Running:
    """``c`` after giving back ``give`` GPUs from its last nodes (as ``_release``)."""
    allocations = []
    left = give
    for a in reversed(c.job.gpu_allocations):
        n = len(a.gpu_indices)
        if left >= n:
            left -= n
            continue
        allocations.append(dataclasses.replace(a, gpu_indices=a.gpu_indices[: n - left]))
        left = 0
    job = dataclasses.replace(c.job, gpu_allocations=tuple(reversed(allocations)))
    return dataclasses.replace(c, job=job, gpus=c.gpus - give)


def _gpu_type(text: str | None) -> str:
    return (text or "").lower()


class _Free:
    """Free GPUs per node, with set-asides; ``total`` kept as it changes.

    A job that asked for a GPU type (``--gres=gpu:a100:2``) only fits on nodes of that
    type: Slurm would hold it pending on any other, so planning it there would shrink
    donors for nothing and grow it into GPUs it cannot get (the type is kept in every
    update, see ``cycle.resize``). Untyped jobs fit anywhere.
    """

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.per_node: dict[str, int] = {}
        self.types: dict[str, str] = {}
        for n in nodes:
            if n.available and n.gpus > 0:
                self.per_node[n.name] = max(0, n.gpus - n.gpus_used)
                self.types[n.name] = _gpu_type(n.gpu_type)
        self.total = sum(self.per_node.values())

    def usable(self, job: Job, node: str) -> bool:
        """True when ``job`` may run on ``node`` (its GPU type, if it asked for one)."""
        wanted = _gpu_type(job.gpus.gpu_type)
        return not wanted or self.types.get(node, "") == wanted

    def of_type(self, gpu_type: str) -> dict[str, int]:
        """Free GPUs per node of ``gpu_type``."""
        return {n: f for n, f in self.per_node.items() if self.types.get(n) == gpu_type}

    def present_types(self) -> set[str]:
        return {t for t in self.types.values() if t}

    def total_for(self, job: Job) -> int:
        """Free GPUs ``job`` could use: all of them, or those of its GPU type."""
        if not job.gpus.gpu_type:
            return self.total
        return sum(f for n, f in self.per_node.items() if self.usable(job, n))

    def add(self, node: str, count: int) -> None:
        self.per_node[node] = self.per_node.get(node, 0) + count
        self.total += count

    def fits(self, job: Job, extra: dict[str, int] | None = None) -> bool:
        extra = extra or {}
        if not job.gpus.per_node and not job.gpus.gpu_type:
            return self.total + sum(extra.values()) >= job.gpus.gpus
        return self._plan(job, extra) is not None

    def take(self, job: Job) -> bool:
        plan = self._plan(job, {})
        if plan is None:
            return False
        for node, count in plan.items():
            self.add(node, -count)
        return True

    def _plan(self, job: Job, extra: dict[str, int]) -> dict[str, int] | None:
        req = job.gpus
        per_node = self.per_node
        if req.gpu_type:  # only the nodes of its type count
            per_node = {n: f for n, f in per_node.items() if self.usable(job, n)}
            extra = {n: c for n, c in extra.items() if self.usable(job, n)}
            if sum(per_node.values()) + sum(extra.values()) < req.gpus:
                return None
        if req.per_node:
            nodes = max(1, job.node_count)
            if self.total + sum(extra.values()) < req.per_node * nodes:
                return None
            fitting = [
                (f, n) for n, f0 in per_node.items() if (f := f0 + extra.get(n, 0)) >= req.per_node
            ]
            fitting += [(c, n) for n, c in extra.items() if n not in per_node and c >= req.per_node]
            if len(fitting) < nodes:
                return None
            fitting.sort()
            return {n: req.per_node for _, n in fitting[:nodes]}
        need = req.gpus
        if self.total + sum(extra.values()) < need:
            return None
        plan: dict[str, int] = {}
        room = {n: per_node.get(n, 0) + extra.get(n, 0) for n in (*per_node, *extra)}
        for node in sorted(room, key=lambda n: -room[n]):
            if need <= 0:
                break
            got = min(need, room[node])
            if got > 0:
                plan[node] = got
                need -= got
        return plan if need <= 0 else None


def _wants_gpus(job: Job) -> int:
    return job.gpus.gpus if job.gpus.gpus > 0 else 0


def _partition_max_time(job: Job, snapshot: PolicySnapshot) -> timedelta | None:
    """The longest MaxTime of the job's partitions, when every one of them is known."""
    known = snapshot.partition_max_time
    parts = [p for p in (job.partition or "").split(",") if p]
    if not known or not parts or any(p not in known for p in parts):
        return None
    return max(known[p] for p in parts)


def _eligible_order(job: Job) -> tuple[int, float, float, int]:
    """Slurm's order without priorities (priority/basic): the nice, then eligibility."""
    eligible = job.eligible_time.timestamp() if job.eligible_time else math.inf
    submitted = job.submit_time.timestamp() if job.submit_time else math.inf
    return (job.nice, eligible if eligible != math.inf else submitted, submitted, job.job_id)


def _priority_order(job: Job) -> tuple[int, float, int]:
    """Slurm's order where it gives priorities: the highest first (the nice is already
    taken off), then submission."""
    submitted = job.submit_time.timestamp() if job.submit_time else math.inf
    return (-(job.priority or 0), submitted, job.job_id)


def queue_order(pending: Iterable[Job]) -> list[Job]:
    """``pending`` in the order Slurm's scheduler tries them: by the priority Slurm
    lists where every job has one (multifactor: fair share, age, QOS; the nice
    included), else by eligibility and nice (priority/basic, or a source without
    priorities). Which blocked job is started smaller first, which gets a shrink, and
    which one growths keep GPUs for follow it: planned in submit order, a fair-share
    lab's daemon started a job smaller into a GPU Slurm then gave to a job of higher
    priority submitted after it (issue 33)."""
    jobs = list(pending)
    by_priority = all(j.priority is not None for j in jobs)
    return sorted(jobs, key=_priority_order if by_priority else _eligible_order)


def _donor_cost_s(c: _Running, job: Job, cost_s: float) -> float:
    """A donor's restart priced for a waiting job of ``g_w`` GPUs: ``cost * g_d / g_w``.

    A restart holds all the donor's ``g_d`` GPUs idle for ``cost`` seconds: GPU time,
    weighed against the waiting job's wait, which holds back its ``g_w`` GPUs of work.
    A 24-GPU job is not restarted to give one GPU to a one-GPU job unless that job would
    wait about 24 restarts; a 1-GPU donor's restart weighs an eighth for an 8-GPU job
    (figures in docs/simulator.md).
    """
    return cost_s * c.gpus / max(1, _wants_gpus(job))


class MalleablePolicy:
    """Proposes ``resize`` actions for malleable jobs (see the module docstring)."""

    name = "malleable"

    def __init__(
        self, settings: MalleableSettings | None = None, prior: SpeedupPrior = DEFAULT_PRIOR
    ) -> None:
        self.settings = settings or MalleableSettings()
        self.prior = prior
        self._cached: tuple[Sequence[HistoryRecord], Priors] | None = None
        # Jobs whose GPU type this policy chose (type_aware): the only typed jobs it may
        # move to another type. Forgotten on a restart: they then stay where they are.
        self._typed_here: set[int] = set()
        # Seconds each job ran in runs that ended (requeued), and its current run as last
        # seen (start, last seen): a pending job's own past, for its start smaller.
        self._ran_s: dict[int, float] = {}
        self._run_seen: dict[int, tuple[datetime, datetime]] = {}

    def priors(self, history: Sequence[HistoryRecord]) -> Priors:
        """Return median-run-time priors for ``history``, reused while it is the same object.

        Run times pool every GPU count (``by_gpus=False``): the priors' GPU scaling is an
        upper bound made for time limits, which would bias a median, and a malleable
        job's runs change size anyway (Pollux workloads 1-5 and 7, malleable set: mean avg
        JCT 2,929 s pooled vs 3,048 s scaled, bench/sim_pollux.py).
        """
        if self._cached is None or self._cached[0] is not history:
            priors = Priors.from_history(
                history, quantile=0.5, min_samples=self.settings.min_history, by_gpus=False
            )
            if self._cached is not None:  # a reload: unchanged users' statistics kept
                priors.carry_over(self._cached[1])
            self._cached = (history, priors)
        return self._cached[1]

    def _observe_runs(self, snapshot: PolicySnapshot) -> None:
        """Bank the runs of malleable jobs that ended (requeued) since the last cycle."""
        at = snapshot.at
        live: set[int] = set()
        for job in snapshot.cluster.jobs:
            jid = job.job_id
            if job.state.is_terminal or jid not in snapshot.malleable:
                continue
            live.add(jid)
            seen = self._run_seen.get(jid)
            running = job.state is JobState.RUNNING and job.start_time is not None
            if seen is not None and (not running or job.start_time != seen[0]):
                ran = max(0.0, (seen[1] - seen[0]).total_seconds())
                self._ran_s[jid] = self._ran_s.get(jid, 0.0) + ran
                del self._run_seen[jid]
            if running and job.start_time is not None:
                self._run_seen[jid] = (job.start_time, at)
        for table in (self._ran_s, self._run_seen):
            for gone in [j for j in table if j not in live]:
                del table[gone]

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        s = self.settings
        if not snapshot.malleable or not (s.shrink or s.expand or s.start_smaller):
            return []
        self._observe_runs(snapshot)
        cost_s = self._cost_s(snapshot)
        free = _Free(snapshot.cluster.nodes)
        priors = self.priors(snapshot.history) if snapshot.history else None
        running_all: list[tuple[float, int]] = []  # (rem, gpus) of every running GPU job
        candidates: dict[int, _Running] = {}
        pending: list[Job] = []
        for job in snapshot.cluster.jobs:
            if job.state is JobState.RUNNING and job.allocated_gpus > 0:
                rem = self._remaining_s(job, snapshot, priors)
                running_all.append((rem, job.allocated_gpus))
                cand = self._candidate(job, rem, snapshot)
                if cand is not None:
                    candidates[job.job_id] = cand
            elif job.state is JobState.PENDING and _wants_gpus(job) > 0:
                resizing = job.job_id in snapshot.resizing
                if resizing or job.reason not in _NOT_WAITING_FOR_GPUS:
                    pending.append(job)
        running_all.sort()
        freed_by = [0]
        for _, g in running_all:
            freed_by.append(freed_by[-1] + g)
        cycle = _Cycle(
            snapshot=snapshot,
            cost_s=cost_s,
            priors=priors,
            candidates=candidates,
            ends=tuple(r for r, _ in running_all),
            freed_by=tuple(freed_by),
        )
        plan = _Plan(free)

        actions: list[Action] = []
        blocked: list[Job] = []
        slack = sum(c.gpus - c.spec.min_gpus for c in candidates.values())
        for job in queue_order(pending):
            if free.take(job):
                continue
            if s.start_smaller and job.job_id not in snapshot.resizing:
                smaller = self._start_smaller(job, cycle, plan)
                if smaller is not None:
                    actions.append(smaller)
                    continue
            if (
                s.shrink
                and job.job_id not in snapshot.resizing
                and len(blocked) < MAX_BLOCKED_CONSIDERED
                and _wants_gpus(job) <= free.total + slack
            ):
                wait_s = self._wait_s(job, cycle, plan)
                run_s = self._run_estimate_s(job, priors)
                given = self._shrink_plan(job, wait_s, run_s, cycle, plan)
                if given is not None:
                    slack -= given
                    continue
            blocked.append(job)
        actions[:0] = [self._shrink_action(sh, cycle) for sh in plan.shrunk.values()]

        queue_empty = not blocked and not actions
        if s.expand:
            reserve = 0
            if s.reserve_for_blocked and blocked:
                reserve = min(free.total, _wants_gpus(blocked[0]))
            actions.extend(self._expansions(reserve, cycle, plan))
        if s.expand and s.shrink and queue_empty:
            actions.extend(self._rebalance(cycle, plan))
        return actions

    # ---- rebalance

    def _rebalance(self, cycle: _Cycle, plan: _Plan) -> list[Action]:
        """Move GPUs from a running job that gains little from them to one that gains
        more, while nobody waits (Pollux re-plans every job's size each interval)."""
        candidates, cost_s, snapshot = cycle.candidates, cycle.cost_s, cycle.snapshot
        touched = plan.touched
        s = self.settings
        out: list[Action] = []
        # Each recipient's savings by GPUs added (only those that can clear the dead
        # band: the donor's loss is never negative), largest first; k is at most what
        # the most generous donor can give.
        movable = [
            c
            for c in candidates.values()
            if c.job.job_id not in touched and not c.single_node and not c.job.gpus.gpu_type
        ]
        donors = [c for c in movable if c.gpus > c.spec.min_gpus]
        gives = sorted((d.gpus - d.spec.min_gpus for d in donors), reverse=True)
        recipients: list[tuple[float, _Running, dict[int, float]]] = []
        for c in movable:
            if not c.busy or c.gpus >= c.spec.max_gpus or not gives:
                continue
            ceiling = min(
                c.spec.max_gpus,
                math.floor(c.gpus * s.max_growth + _TINY),
                self._measured_ceiling(c),
                c.gpus + gives[0],  # one donor gives at most its GPUs above its minimum
            )
            now = c.rate(c.gpus)
            band = s.min_gain * c.remaining_s
            savings: dict[int, float] = {}
            for k in range(1, ceiling - c.gpus + 1):
                after = c.rate(c.gpus + k) * c.realloc
                saving = c.remaining_s * (1.0 - now / max(_TINY, after)) - cost_s
                if saving > band:
                    savings[k] = saving
            if savings:
                recipients.append((max(savings.values()), c, savings))
        recipients.sort(key=lambda x: (-x[0], x[1].job.job_id))
        losses: dict[tuple[int, int], float] = {}

        def loss_of(d: _Running, k: int) -> float:
            key = (d.job.job_id, k)
            got = losses.get(key)
            if got is None:
                slower = d.rate(d.gpus) / max(_TINY, d.rate(d.gpus - k) * d.realloc)
                got = losses[key] = d.remaining_s * max(0.0, slower - 1.0) + cost_s * d.gpus / k
            return got

        while True:
            best: tuple[float, _Running, _Running, int, float, float] | None = None
            for top, r, savings in recipients:
                if r.job.job_id in touched:
                    continue
                if best is not None and top <= best[0]:
                    break  # no later recipient saves more than the best net found
                band = s.min_gain * r.remaining_s
                for d in donors:
                    if d is r or d.job.job_id in touched:
                        continue
                    most = d.gpus - d.spec.min_gpus
                    for k, saving in savings.items():
                        if k > most or (best is not None and saving <= best[0]):
                            continue
                        loss = loss_of(d, k)
                        net = saving - loss
                        if net > band and (best is None or net > best[0]):
                            best = (net, r, d, k, saving, loss)
            if best is None:
                return out
            _, r, d, k, saving, loss = best
            touched.add(r.job.job_id)
            touched.add(d.job.job_id)
            d_to, r_to = d.gpus - k, r.gpus + k
            d_limit, d_numbers = self._time_limit(
                d.job, snapshot, (d.gpus, d_to), (d.rate(d.gpus), d.rate(d_to)), d.remaining_s
            )
            r_limit, r_numbers = self._time_limit(
                r.job, snapshot, (r.gpus, r_to), (r.rate(r.gpus), r.rate(r_to)), r.remaining_s
            )
            common = {"saving_s": round(saving), "loss_s": round(loss), "cost_s": round(cost_s)}
            out.append(
                resize_action(
                    self.name,
                    d.job,
                    d.gpus,
                    d_to,
                    f"shrink {d.gpus} -> {d_to} GPUs for job {r.job.display_id}, which grows "
                    f"by them and finishes about {saving / 60:.0f} min sooner; this job "
                    f"slows to {d.rate(d_to) / d.rate(d.gpus):.0%} of its speed "
                    f"(about {loss / 60:.0f} min later)",
                    numbers={
                        "direction": "rebalance_shrink",
                        "for_job": r.job.job_id,
                        "throughput_now": d.rate(d.gpus),
                        "throughput_after": d.rate(d_to),
                        **common,
                        **d_numbers,
                    },
                    intents=d_limit,
                )
            )
            out.append(
                resize_action(
                    self.name,
                    r.job,
                    r.gpus,
                    r_to,
                    f"expand {r.gpus} -> {r_to} GPUs given up by job {d.job.display_id}: "
                    f"{r.rate(r_to) / r.rate(r.gpus):.2f}x its speed, about "
                    f"{saving / 60:.0f} min sooner after a {cost_s:.0f} s restart",
                    numbers={
                        "direction": "rebalance_expand",
                        "from_job": d.job.job_id,
                        "throughput_now": r.rate(r.gpus),
                        "throughput_after": r.rate(r_to),
                        **common,
                        **r_numbers,
                    },
                    intents=r_limit,
                    needs=d.job.job_id,
                )
            )

    # ---- estimates

    def _cost_s(self, snapshot: PolicySnapshot) -> float:
        s = self.settings
        if s.use_measured_cost and snapshot.resize_cost is not None:
            return max(0.0, snapshot.resize_cost.total_seconds())
        return s.default_cost.total_seconds()

    def _remaining_s(self, job: Job, snapshot: PolicySnapshot, priors: Priors | None) -> float:
        now = snapshot.at
        elapsed = (now - job.start_time).total_seconds() if job.start_time else 0.0
        elapsed = max(0.0, elapsed)
        limit = job.time_limit
        return self._left_after(
            job, elapsed, priors, None if limit is None else limit.total_seconds() - elapsed
        )

    def _left_after(
        self, job: Job, ran_s: float, priors: Priors | None, limit_left_s: float | None
    ) -> float:
        """A job's run time left after ``ran_s`` seconds: its history's median less what
        it ran, else what it ran (Lindy), at least ``min_remaining``, at most what its
        limit leaves (``limit_left_s``; None: no limit)."""
        rem = ran_s
        if priors is not None:
            est = priors.estimate(job)
            if est is not None and est.run_time.total_seconds() > ran_s:
                rem = est.run_time.total_seconds() - ran_s
        rem = max(rem, self.settings.min_remaining.total_seconds())
        if limit_left_s is not None:
            rem = min(rem, max(0.0, limit_left_s))
        return rem

    def _candidate(self, job: Job, rem: float, snapshot: PolicySnapshot) -> _Running | None:
        spec = snapshot.malleable.get(job.job_id)
        if spec is None or spec.pool or job.job_id in snapshot.resizing:
            return None
        last = snapshot.last_resize_at.get(job.job_id)
        if last is not None and snapshot.at - last < self.settings.min_interval:
            return None
        gpus = job.allocated_gpus
        measured = snapshot.throughput.get(job.job_id) or {}
        # Without measurements the prior's shape gives the ratios (they need no scale).
        curve = fit_speedup(measured, self.prior) or fit_speedup({gpus: 1.0}, self.prior)
        if curve is None:
            return None
        single = bool(job.gpus.per_node) and job.node_count <= 1
        usage = snapshot.usage.get(job.job_id)
        utils = (
            [g.mean_util_pct for g in usage.gpus if g.mean_util_pct is not None] if usage else []
        )
        busy = not utils or sum(utils) / len(utils) >= self.settings.min_busy_util_pct
        clean = {g: r for g, r in measured.items() if g >= 1 and r > 0 and math.isfinite(r)}
        cost_s = self._cost_s(snapshot)
        age = (snapshot.at - job.submit_time).total_seconds() if job.submit_time else 0.0
        realloc = max(0.0, age - job.restart_count * cost_s) / max(_TINY, age + cost_s)
        return _Running(job, spec, gpus, curve, rem, single, busy, measured=clean, realloc=realloc)

    def _type_speeds(self, job: Job, free: _Free) -> dict[str, float] | None:
        """Speeds per present GPU type when ``job`` may be placed by type, else None."""
        s = self.settings
        if not s.type_aware or not s.type_speed:
            return None
        if job.gpus.gpu_type and job.job_id not in self._typed_here:
            return None  # the user asked for this type: never moved off it
        present = free.present_types()
        speeds = speeds_for(s.type_speed, job.name)
        usable = {t: v for t, v in speeds.items() if t in present}
        if len(usable) < 2:
            return None
        return usable

    def _wait_s(self, job: Job, cycle: _Cycle, plan: _Plan) -> float:
        """When enough running GPUs will have freed up for ``job`` (whole-cluster count;
        free GPUs only of its type when it asked for one)."""
        free, ends, freed_by = plan.free, cycle.ends, cycle.freed_by
        short = _wants_gpus(job) - free.total_for(job)
        if short <= 0:
            return 0.0
        i = bisect.bisect_left(freed_by, short)
        return ends[i - 1] if i <= len(ends) else (ends[-1] if ends else 0.0)

    # ---- start smaller

    def _start_smaller(self, job: Job, cycle: _Cycle, plan: _Plan) -> Action | None:
        """Lower a blocked pending malleable job's request to what fits now, if it pays."""
        snapshot, free = cycle.snapshot, plan.free
        spec = snapshot.malleable.get(job.job_id)
        req = job.gpus
        if spec is None or spec.pool or req.shards or req.per_task is not None:
            return None
        if req.per_node is not None and (req.per_job is not None or job.node_count > 1):
            return None
        if req.per_node is None and req.per_job is None:
            return None
        want = req.gpus
        fitting = 0
        top = min(want - 1, spec.max_gpus)
        if req.per_node is None:
            # --gpus=N fits on the cluster's total: the largest size is known at once
            # (no job copy per size tried; a long queue tries this for every job).
            g = min(top, free.total)
            fitting = g if g >= max(1, spec.min_gpus) else 0
        else:
            for g in range(top, spec.min_gpus - 1, -1):
                if g >= 1 and free.fits(self._at_size(job, g)):
                    fitting = g
                    break
        measured = snapshot.throughput.get(job.job_id) or {}
        curve = fit_speedup(measured, self.prior) or fit_speedup({want: 1.0}, self.prior)
        if curve is None:
            return None
        # type_aware: the type it runs fastest on at the size that fits there, against
        # the untyped request (Slurm may put it on the slowest type with free GPUs).
        gpu_type = req.gpu_type
        speeds = self._type_speeds(job, free)
        ref = 1.0
        if speeds is not None:
            with_free = [t for t in speeds if sum(free.of_type(t).values()) > 0]
            ref = min((speeds[t] for t in with_free), default=1.0)
            best_rate = curve.throughput(fitting) * ref if fitting else 0.0
            for t in sorted(speeds):
                g = self._fitting_on_type(job, t, top, spec.min_gpus, free)
                rate = curve.throughput(g) * speeds[t] if g else 0.0
                if g and rate > best_rate * (1 + 1e-9):
                    best_rate, fitting, gpu_type = rate, g, t
            ref_ratio = (speeds[gpu_type] / ref) if gpu_type in speeds else 1.0
        else:
            ref_ratio = 1.0
        if fitting == 0:
            return None
        wait_s = self._wait_s(job, cycle, plan)
        run_s = self._pending_run_s(job, cycle.priors)
        if not math.isfinite(run_s):
            run_s = self.settings.min_remaining.total_seconds()
        slower = curve.throughput(want) / max(_TINY, curve.throughput(fitting) * ref_ratio)
        gain = wait_s - run_s * max(0.0, slower - 1.0)
        if gain <= 0 or gain < self.settings.min_gain * wait_s:
            return None
        placed = self._at_size(job, fitting)
        if gpu_type != req.gpu_type:
            placed = dataclasses.replace(
                placed, gpus=dataclasses.replace(placed.gpus, gpu_type=gpu_type)
            )
            self._typed_here.add(job.job_id)
        free.take(placed)
        limit_intents, limit_numbers = self._time_limit(
            job,
            snapshot,
            (want, fitting),
            (curve.throughput(want), curve.throughput(fitting)),
            run_s,
        )
        return Action(
            policy=self.name,
            kind="update",
            job_id=job.job_id,
            user=job.user,
            reason=(
                f"start now at {fitting} of its {want} GPUs (malleable {spec.min_gpus}:"
                f"{spec.max_gpus}) instead of waiting about {wait_s / 60:.0f} min; "
                "grown when GPUs free up"
            ),
            intents=(
                SetGpus(fitting, gpu_type or None, per_node=req.per_node is not None),
                *limit_intents,
            ),
            numbers={
                "direction": "start_smaller",
                "from_gpus": want,
                "to_gpus": fitting,
                "wait_avoided_s": round(wait_s),
                "run_estimate_s": round(run_s),
                "gain_s": round(gain),
                **limit_numbers,
            },
        )

    def _time_limit(
        self,
        job: Job,
        snapshot: PolicySnapshot,
        gpus: tuple[int, int],
        speeds: tuple[float, float],
        remaining_s: float,
    ) -> tuple[tuple[Intent, ...], dict[str, float | int | str | None]]:
        """The new time limit (and audit numbers) for ``job`` at its new size.

        :func:`~slurmgpu.policy.resize_limit.resized_time_limit`; nothing when the limit
        stays, or while ``scale_time_limit`` is off.
        """
        s = self.settings
        if not s.scale_time_limit or job.time_limit is None:
            return (), {}
        running = job.state is JobState.RUNNING and job.start_time is not None
        elapsed = snapshot.at - job.start_time if running and job.start_time else timedelta(0)
        # an estimate past any time limit Slurm takes is as good as LONGEST
        rem = min(remaining_s, LONGEST.total_seconds()) if math.isfinite(remaining_s) else 0.0
        new = resized_time_limit(
            job.time_limit,
            max(elapsed, timedelta(0)),
            *gpus,
            *speeds,
            remaining=timedelta(seconds=max(0.0, rem)),
            restart=s.checkpoint_time + s.startup_time,
            headroom=s.time_limit_headroom,
            max_time=_partition_max_time(job, snapshot),
        )
        if new is None:
            return (), {}
        numbers: dict[str, float | int | str | None] = {
            "time_limit_s": round(new.total_seconds()),
            "time_limit_was_s": round(job.time_limit.total_seconds()),
        }
        return (SetTimeLimit.of(new),), numbers

    def _fitting_on_type(self, job: Job, gpu_type: str, top: int, least: int, free: _Free) -> int:
        """The most GPUs (``least`` to ``top``) ``job`` fits on now on ``gpu_type`` (0: none)."""
        typed = dataclasses.replace(job, gpus=dataclasses.replace(job.gpus, gpu_type=gpu_type))
        for g in range(top, max(1, least) - 1, -1):
            if free.fits(self._at_size(typed, g)):
                return g
        return 0

    @staticmethod
    def _at_size(job: Job, gpus: int) -> Job:
        req = job.gpus
        if req.per_node is not None:
            smaller = dataclasses.replace(req, gpus=gpus * max(1, job.node_count), per_node=gpus)
        else:
            smaller = dataclasses.replace(req, gpus=gpus, per_job=gpus)
        return dataclasses.replace(job, gpus=smaller)

    # ---- shrink

    def _shrink_plan(
        self, job: Job, wait_s: float, run_s: float, cycle: _Cycle, plan: _Plan
    ) -> int | None:
        """Plan donors for ``job`` into ``shrunk``; the GPUs they give, None: no plan.

        A donor already shrunk this cycle (for an earlier waiting job) may give more at
        no second restart: its one resize goes straight to the smaller size.
        """
        free, touched, shrunk = plan.free, plan.touched, plan.shrunk
        candidates, cost_s = cycle.candidates, cycle.cost_s
        s = self.settings
        start_delay = s.checkpoint_time.total_seconds()
        if wait_s <= start_delay:
            return None
        budget = wait_s - start_delay - s.min_gain * wait_s  # the most the donors may lose
        donors = [
            c
            for c in candidates.values()
            if c.job.job_id not in touched and c.gpus > c.spec.min_gpus
        ]
        donors += [sh.now for sh in shrunk.values() if sh.now.gpus > sh.now.spec.min_gpus]
        extra: dict[str, int] = {}
        chosen: list[tuple[_Running, int, float]] = []
        lost = 0.0
        while not free.fits(job, extra):
            best: tuple[float, _Running, int, float] | None = None
            for c in donors:
                give = self._useful_give(c, job, free, extra)
                if give <= 0:
                    continue
                again = c.job.job_id in shrunk  # its restart is already paid
                restart = 0.0 if again else _donor_cost_s(c, job, cost_s)
                loss = self._shrink_loss(c, c.gpus - give, run_s, restart)
                key = loss / give
                if best is None or key < best[0]:
                    best = (key, c, give, loss)
            if best is None:
                return None
            _, c, give, loss = best
            lost += loss
            if lost > budget:
                return None
            donors.remove(c)
            chosen.append((c, give, loss))
            for node, count in self._release(c, give).items():
                extra[node] = extra.get(node, 0) + count
        # Drop donors the others made unnecessary (largest loss first).
        for entry in sorted(chosen, key=lambda e: -e[2]):
            trial = {n: v for n, v in extra.items()}
            for node, count in self._release(entry[0], entry[1]).items():
                trial[node] -= count
            if free.fits(job, trial):
                chosen.remove(entry)
                extra = trial
                lost -= entry[2]
        for c, give, loss in chosen:
            jid = c.job.job_id
            sh = shrunk.get(jid)
            if sh is None:
                touched.add(jid)
                shrunk[jid] = _Shrink(c, _without(c, give), [(job, wait_s)], loss)
            else:
                sh.now = _without(sh.now, give)
                sh.for_jobs.append((job, wait_s))
                sh.loss_s += loss
        # The blocked job now takes what it will start on: free GPUs plus the donors'.
        for node, count in extra.items():
            free.add(node, count)
        free.take(job)
        return sum(give for _, give, _ in chosen)

    def _shrink_action(self, sh: _Shrink, cycle: _Cycle) -> Action:
        cost_s, snapshot = cycle.cost_s, cycle.snapshot
        c, to = sh.was, sh.now.gpus
        first, wait_s = sh.for_jobs[0]
        others = [j.display_id for j, _ in sh.for_jobs[1:]]
        also = f" (and {', '.join(others)})" if others else ""
        limit_intents, limit_numbers = self._time_limit(
            c.job, snapshot, (c.gpus, to), (c.rate(c.gpus), c.rate(to)), c.remaining_s
        )
        return resize_action(
            self.name,
            c.job,
            c.gpus,
            to,
            f"shrink {c.gpus} -> {to} GPUs so waiting job {first.display_id}{also} "
            f"({_wants_gpus(first)} GPUs) starts about {wait_s / 60:.0f} min sooner; "
            f"this job slows to {c.rate(to) / c.rate(c.gpus):.0%} of its speed",
            numbers={
                "direction": "shrink",
                "for_job": first.job_id,
                "also_for": ",".join(str(j.job_id) for j, _ in sh.for_jobs[1:]) or None,
                "gpus_given": c.gpus - to,
                "wait_avoided_s": round(wait_s),
                "loss_s": round(sh.loss_s),
                "remaining_s": round(c.remaining_s),
                "cost_s": round(cost_s),
                "throughput_now": c.rate(c.gpus),
                "throughput_after": c.rate(to),
                **limit_numbers,
            },
            intents=limit_intents,
        )

    def _useful_give(self, c: _Running, job: Job, free: _Free, extra: dict[str, int]) -> int:
        """How many GPUs ``c`` should give back towards ``job`` (0: it cannot help)."""
        most = c.gpus - c.spec.min_gpus
        if most <= 0:
            return 0
        req = job.gpus
        if req.gpu_type and not any(free.usable(job, a.node) for a in c.job.gpu_allocations):
            return 0  # its GPUs are of another type than the waiting job asked for
        if req.per_node:
            # Per-node requests need the GPUs on one node: give what that node lacks.
            best = 0
            for a in c.job.gpu_allocations:
                if not free.usable(job, a.node):
                    continue
                lack = req.per_node - free.per_node.get(a.node, 0) - extra.get(a.node, 0)
                if 0 < lack <= min(most, len(a.gpu_indices)):
                    best = lack if best == 0 else min(best, lack)
            return best
        given = sum(n for node, n in extra.items() if free.usable(job, node))
        short = _wants_gpus(job) - free.total_for(job) - given
        return max(0, min(most, short))

    @staticmethod
    def _release(c: _Running, give: int) -> dict[str, int]:
        """Where ``give`` GPUs of ``c`` come free: from its last nodes first."""
        out: dict[str, int] = {}
        for a in reversed(c.job.gpu_allocations):
            if give <= 0:
                break
            got = min(give, len(a.gpu_indices))
            out[a.node] = got
            give -= got
        return out

    @staticmethod
    def _shrink_loss(c: _Running, to: int, run_s: float, cost_s: float) -> float:
        """The donor's delay: slower while the waiting job runs, then grown back."""
        slower = c.rate(c.gpus) / max(_TINY, c.rate(to) * c.realloc)
        if run_s < c.remaining_s:
            return run_s * max(0.0, slower - 1.0) + 2 * cost_s
        return c.remaining_s * max(0.0, slower - 1.0) + cost_s

    def _pending_run_s(self, job: Job, priors: Priors | None) -> float:
        """A waiting job's run time left: after runs of its own (it was requeued), as a
        running job's (its history's median less what it ran, else what it ran, at least
        ``min_remaining``, within its limit); before any, :meth:`_run_estimate_s`."""
        ran = self._ran_s.get(job.job_id, 0.0)
        if ran <= 0.0:
            return self._run_estimate_s(job, priors)
        limit = job.time_limit  # a requeued job's limit counts from its restart
        return self._left_after(job, ran, priors, None if limit is None else limit.total_seconds())

    def _run_estimate_s(self, job: Job, priors: Priors | None) -> float:
        """A waiting job's run time: its history's median, else its time limit."""
        if priors is not None:
            est = priors.estimate(job)
            if est is not None:
                return est.run_time.total_seconds()
        return job.time_limit.total_seconds() if job.time_limit is not None else math.inf

    # ---- expand

    def _expansions(self, reserve: int, cycle: _Cycle, plan: _Plan) -> list[Action]:
        """Grow running jobs into free GPUs (all but ``reserve``) no waiting job can use."""
        free, touched = plan.free, plan.touched
        candidates, cost_s, snapshot = cycle.candidates, cycle.cost_s, cycle.snapshot
        pool = free.total - reserve
        if pool <= 0:
            return []
        plans: list[tuple[float, _Running, int, float]] = []
        for c in candidates.values():
            if c.job.job_id in touched or c.gpus >= c.spec.max_gpus or not c.busy:
                continue
            growth = self._best_growth(c, pool, free, cost_s)
            if growth is not None:
                to, saving, _, _ = growth
                plans.append((saving / (to - c.gpus), c, to, saving))
        plans.sort(key=lambda p: (-p[0], p[1].job.job_id))
        actions: list[Action] = []
        for _, c, _, _ in plans:
            if pool <= 0:
                break
            # planned again against what the earlier growths left (same answer when
            # nothing they took mattered to it)
            replan = self._best_growth(c, pool, free, cost_s)
            if replan is None:
                continue
            to, saving, gpu_type, taken = replan
            pool -= taken
            touched.add(c.job.job_id)
            after = c.rate(to)
            type_numbers: dict[str, float | int | str | None] = {}
            if gpu_type is not None:
                after = c.rate(to) * self._type_gain(c, gpu_type, free)
                self._take_of_type(free, gpu_type, taken)
                self._typed_here.add(c.job.job_id)
                type_numbers = {"gpu_type": gpu_type}
            else:
                # the GPUs it grows into are no longer free for the next growth planned
                # (two single-node jobs must not both count one node's idle GPUs)
                self._take_blind(free, c, to)
            limit_intents, limit_numbers = self._time_limit(
                c.job, snapshot, (c.gpus, to), (c.rate(c.gpus), after), c.remaining_s
            )
            actions.append(
                resize_action(
                    self.name,
                    c.job,
                    c.gpus,
                    to,
                    f"expand {c.gpus} -> {to} GPUs"
                    + (f" of type {gpu_type}" if gpu_type else "")
                    + " into idle GPUs no waiting job can use: "
                    f"{after / c.rate(c.gpus):.2f}x its speed, about "
                    f"{saving / 60:.0f} min sooner after a {cost_s:.0f} s restart",
                    numbers={
                        "direction": "expand",
                        "saving_s": round(saving),
                        "remaining_s": round(c.remaining_s),
                        "cost_s": round(cost_s),
                        "throughput_now": c.rate(c.gpus),
                        "throughput_after": after,
                        "idle_gpus": free.total,
                        **type_numbers,
                        **limit_numbers,
                    },
                    intents=limit_intents,
                    gpu_type=gpu_type,
                )
            )
        return actions

    def _current_types(self, c: _Running, free: _Free) -> set[str]:
        return {free.types.get(a.node, "") for a in c.job.gpu_allocations}

    def _type_gain(self, c: _Running, gpu_type: str, free: _Free) -> float:
        """Its speed on ``gpu_type`` over its speed where it runs now (1 if unknown)."""
        speeds = self._type_speeds(c.job, free) or {}
        now = slowest(speeds, self._current_types(c, free))
        there = speeds.get(gpu_type)
        if now is None or there is None or now <= 0:
            return 1.0
        return there / now

    @staticmethod
    def _take_blind(free: _Free, c: _Running, to: int) -> None:
        """Take the free GPUs ``c`` grows into when it restarts at ``to`` GPUs: a
        single-node job on the node with the most room (its own GPUs there and that
        node's free ones: where ``_best_growth_blind`` counted its room); any other job
        from its own nodes first, then the freest."""
        own: dict[str, int] = {}
        for a in c.job.gpu_allocations:
            own[a.node] = own.get(a.node, 0) + len(a.gpu_indices)
        usable = [n for n in free.per_node if free.usable(c.job, n)]
        if c.single_node and usable:
            there = max(usable, key=lambda n: (free.per_node[n] + own.get(n, 0), n in own, n))
            # (its GPUs on another node come free only once it has moved: not counted)
            free.add(there, -min(free.per_node[there], to - own.get(there, 0)))
            return
        left = to - c.gpus
        order = sorted(usable, key=lambda n: (n not in own, -free.per_node[n], n))
        for node in order:
            if left <= 0:
                break
            got = min(free.per_node[node], left)
            free.add(node, -got)
            left -= got

    @staticmethod
    def _take_of_type(free: _Free, gpu_type: str, count: int) -> None:
        for node, f in sorted(free.of_type(gpu_type).items(), key=lambda x: -x[1]):
            if count <= 0:
                break
            got = min(f, count)
            free.add(node, -got)
            count -= got

    def _best_growth(
        self, c: _Running, pool: int, free: _Free, cost_s: float
    ) -> tuple[int, float, str | None, int] | None:
        """The best size to grow ``c`` to, its saving, the GPU type it moves to (None:
        type-blind, wherever Slurm puts it) and how many free GPUs it takes."""
        blind = self._best_growth_blind(c, pool, free, cost_s)
        speeds = self._type_speeds(c.job, free)
        if speeds is None:
            return None if blind is None else (*blind, None, blind[0] - c.gpus)
        s = self.settings
        now_speed = slowest(speeds, self._current_types(c, free))
        if now_speed is None:
            return None if blind is None else (*blind, None, blind[0] - c.gpus)
        own: dict[str, int] = {}
        for a in c.job.gpu_allocations:
            own[a.node] = own.get(a.node, 0) + len(a.gpu_indices)
        now = c.rate(c.gpus)
        best: tuple[int, float, str | None, int] | None = None
        for gpu_type, speed in sorted(speeds.items()):
            nodes = free.of_type(gpu_type)
            own_here = sum(g for n, g in own.items() if free.types.get(n) == gpu_type)
            if c.single_node:
                room = max((f + own.get(n, 0) for n, f in nodes.items()), default=0)
            else:
                room = sum(nodes.values()) + own_here
            top = min(
                c.spec.max_gpus,
                room,
                math.floor(c.gpus * s.max_growth + _TINY),
                own_here + pool,
                self._measured_ceiling(c),
            )
            gain = speed / now_speed
            for to in range(c.gpus + 1, top + 1):
                saving = (
                    c.remaining_s * (1.0 - now / max(_TINY, c.rate(to) * gain * c.realloc)) - cost_s
                )
                enough = saving > 0 and saving >= s.min_gain * c.remaining_s
                if enough and (best is None or saving > best[1] * (1 + 1e-9)):
                    best = (to, saving, gpu_type, max(0, to - own_here))
        return best

    def _measured_ceiling(self, c: _Running) -> int:
        """The largest size ``c`` may grow to by its own measurements (``max_gpus``: none).

        The sizes it ran at above its current size ``g`` are walked up from ``g``: the
        step from the last size kept, ``k``, to the next measured one, ``m``, has a
        measured marginal efficiency -- the relative speed gained over the relative
        GPUs added, ``(x(m) / x(k) - 1) / (m / k - 1)``, 1 for linear scaling. The first
        step below ``min_gain`` was measured not to pay: the job grows no further than
        ``k`` (the prior curve's prediction past ``k`` is overruled by the measurement).
        This is also the hysteresis after a shrink from such a size: the job is not
        grown back to where it was measured to waste GPUs.
        """
        kept = c.gpus
        rate = c.measured.get(kept)
        if rate is None:
            return c.spec.max_gpus
        for m in sorted(g for g in c.measured if g > c.gpus):
            efficiency = (c.measured[m] / rate - 1.0) / (m / kept - 1.0)
            if efficiency < self.settings.min_gain:
                return kept
            kept, rate = m, c.measured[m]
        return c.spec.max_gpus

    def _best_growth_blind(
        self, c: _Running, pool: int, free: _Free, cost_s: float
    ) -> tuple[int, float] | None:
        s = self.settings
        top = min(c.spec.max_gpus, c.gpus + pool, math.floor(c.gpus * s.max_growth + _TINY))
        top = min(top, self._measured_ceiling(c))
        if c.job.gpus.gpu_type:  # it grows only into free GPUs of the type it asked for
            top = min(top, c.gpus + free.total_for(c.job))
        if c.single_node:
            # It restarts on one node: its own GPUs there plus that node's free ones, or
            # any node's free GPUs (of its type).
            own = {a.node: len(a.gpu_indices) for a in c.job.gpu_allocations}
            room = max(
                (f + own.get(n, 0) for n, f in free.per_node.items() if free.usable(c.job, n)),
                default=0,
            )
            top = min(top, room)
        if top <= c.gpus:
            return None
        now = c.rate(c.gpus)
        best: tuple[int, float] | None = None
        for to in range(c.gpus + 1, top + 1):
            saving = c.remaining_s * (1.0 - now / max(_TINY, c.rate(to) * c.realloc)) - cost_s
            enough = saving > 0 and saving >= s.min_gain * c.remaining_s
            if enough and (best is None or saving > best[1] * (1 + 1e-9)):
                best = (to, saving)
        return best

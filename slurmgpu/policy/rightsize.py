"""Rightsizing: bring a pending job's requests down to what its history says it uses.

For every PENDING job with an estimate (:mod:`slurmgpu.policy.priors`) the policy
proposes at most one ``update`` action that combines every field worth changing. Held
jobs are candidates (a hold does not change what the job needs), requeued jobs are
candidates, and a pending array meta-record (``120_[3-9]``) is one candidate addressed as
that range, since its tasks share one shape; tasks already split out are their own jobs.

Rules (defaults in :class:`~slurmgpu.policy.settings.RightsizeSettings`):

- the time limit (``SetTimeLimit``) = the larger of ``time_quantile`` (0.95) *
  ``time_headroom`` (1.3) of past run times (for the job's GPU count: runs that asked
  as many GPUs, else every run scaled so that it never errs short, see
  :mod:`slurmgpu.policy.priors`),
  ``min_time_limit`` (15 min), and ``time_headroom`` * the longest elapsed time of a
  RUNNING job with the same user and name (a sibling running for 2 h proves a run can
  take 2 h), rounded up to ``time_round`` (5 min). A job with no limit
  (``UNLIMITED``) gets one. Only from runs of the job's own script or name unless
  ``time_from_other_jobs``: the user's other jobs say little about this one's run time,
  and a limit too short is a killed run (on Pollux workloads 1, 2 and 4, 66 of the 71
  timeouts after rightsizing came from the ``user+partition`` level).
- memory per node (``SetMemoryPerNode``, MiB) = ``ceil(memory_headroom * peak of the busiest
  node)`` rounded up to ``memory_round_mib`` (256 MiB); a past run without a per-node
  figure counts with its total, which only errs high. Never when any run at the key ran
  out of memory, or when the request is unknown or 0 (all of a node).
- CPUs in total and per node (``SetCpus``, ``SetCpusPerNode``), GPU jobs only: the larger of
  ``ceil(cpu_headroom * the most cores a past run used on average)``,
  ``target_cores_per_gpu`` (12) per GPU, one per task and one per node. Never when a past
  run kept >= 90 % of its cores busy (its demand is unknown).
- GPUs: the most GPUs any past run kept busy (at least 1), when at least
  ``min_history`` runs had GPU samples and none of them asked for fewer GPUs than this
  job: ``SetGpus`` per node for ``--gpus-per-node`` / ``--gres`` requests, per job for
  ``--gpus`` (of the job's GPU type; ``slurmgpu.slurm.update`` spells it for the
  release); ``--gpus-per-task`` and shard requests are left alone. Slurm's per-node
  request replaces the job's whole per-node TRES string: the actuator must keep any
  other GRES the job asked for.

A field is proposed only when it shrinks the request by at least
``min_change_fraction`` (20 %); no field ever grows. Whether the action runs is the
engine's call: ``requires_opt_in`` is set unless ``apply_to_all``, and the engine then
suppresses it for jobs not in ``PolicySnapshot.opted_in``. A job whose comment carries
``sgpu:norightsize`` (:mod:`slurmgpu.tokens`) gets no proposal at all, even under
``apply_to_all``: plugins/job_submit.lua leaves it alone too. The figures come from
:mod:`slurmgpu.policy.sizing`, as the export's and ``sgpu eff``'s do. ``numbers`` carry,
for each field, the current and proposed value, plus the history count, key level and
quantile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import NamedTuple

import msgspec

from slurmgpu.intent import (
    Intent,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetTimeLimit,
)
from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import Action, HistoryRecord, PolicySnapshot, slurm_job_ref
from slurmgpu.policy.priors import LEVELS, Estimate, Priors
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.policy.sizing import key_sizes, time_limit_s
from slurmgpu.tokens import NORIGHTSIZE, rightsize_opted_out
from slurmgpu.units import format_time_limit

__all__ = ["PriorsFactory", "RightsizePolicy"]

PriorsFactory = Callable[[Sequence[HistoryRecord]], Priors]
Numbers = dict[str, float | int | str | None]

_JobKey = tuple[str, str, str, int]
# History levels keyed by the job itself (its script or name), not the user's other jobs.
_OWN_LEVELS = frozenset(level for level in LEVELS if "script" in level or "name" in level)


_LIMIT_TEXTS: dict[float, str] = {}


def _limit_text(seconds: float) -> str:
    """``format_time_limit`` of a limit in seconds, memoised: queues hold few distinct
    limits and proposals are rounded to ``time_round``."""
    text = _LIMIT_TEXTS.get(seconds)
    if text is None:
        text = format_time_limit(timedelta(seconds=seconds))
        if len(_LIMIT_TEXTS) < 4096:
            _LIMIT_TEXTS[seconds] = text
    return text


def _shrinks_enough(current: float, proposed: float, fraction: float) -> bool:
    return proposed < current and (current - proposed) >= fraction * current - 1e-9


class _Inputs(msgspec.Struct, frozen=True, gc=False):
    """What a pending job's verdict depends on besides the priors: its request, the
    sibling floor of its time limit and its opt-in. Untracked by the collector (a cycle
    builds one per pending job) and compared field by field in C."""

    name: str
    partition: str
    # the GpuRequest's fields (its dataclass __eq__ would run in Python)
    gpus: int
    gpus_per_node: int | None
    gpus_per_job: int | None
    gpus_per_task: int | None
    gpu_type: str | None
    shards: int
    time_limit: timedelta | None
    memory_mib: int | None
    node_count: int
    cpus: int
    tasks: int
    array_task_spec: str | None
    floor_s: int | None  # a running sibling's floor, where it binds (else None)
    opted: bool


class _Verdict(msgspec.Struct, frozen=True, gc=False):
    """The action (or none) given for ``inputs``; ``history_time_s`` is the time limit
    history alone gave, below which a running sibling's floor changes nothing. ``job``:
    the object judged (the same object next cycle is the same request; its user's
    history gave the verdict, kept across a reload that left that history the same)."""

    job: Job
    inputs: _Inputs
    action: Action | None
    history_time_s: int | None


class _Seconds(NamedTuple):
    """The settings' durations in seconds, converted once per policy, not per estimate."""

    min_time_s: float
    round_s: float


class _KeyDerived:
    """What one history key's figures other than run times imply under the settings,
    computed once per key (every GPU count of the key shares them)."""

    __slots__ = (
        "cpus_needed",
        "est",
        "gpus_used",
        "history_key",
        "memory_mib",
        "own_level",
        "user",
    )

    def __init__(self, est: Estimate, s: RightsizeSettings) -> None:
        self.est = est
        self.user = est.key[0]
        self.history_key = "/".join(est.key)
        self.own_level = s.time_from_other_jobs or est.level in _OWN_LEVELS
        sizes = key_sizes(est, s)
        self.memory_mib: int | None = sizes.memory_mib
        self.cpus_needed: int | None = sizes.cores
        self.gpus_used: int | None = sizes.gpus


class _Derived:
    """What one key's estimate for one GPU count implies: the key's figures
    (:class:`_KeyDerived`, shared) and the run-time part, which alone depends on the GPU
    count. The same figures as the ``Estimate`` that ``Priors.estimate`` gives for such a
    job, without building one per GPU count (a first cycle meets tens of thousands).

    The numbers and reason text are made on first use: only estimates that lead to an
    action need them."""

    __slots__ = (
        "_numbers",
        "gpu_samples",
        "gpu_scaled",
        "gpus",
        "k",
        "run_time_s",
        "samples",
        "time_s",
    )

    def __init__(
        self,
        k: _KeyDerived,
        run: tuple[float, int, int, bool],
        gpus: int | None,
        s: RightsizeSettings,
        c: _Seconds,
    ) -> None:
        self.k = k
        self.run_time_s, self.samples, self.gpu_samples, self.gpu_scaled = run
        self.gpus = gpus if gpus is not None and gpus > 0 else None
        self._numbers: Numbers | None = None
        self.time_s: int | None = None
        if s.time_limit and k.own_level:
            self.time_s = time_limit_s(self.run_time_s, s.time_headroom, c.round_s, c.min_time_s)

    @property
    def history_numbers(self) -> Numbers:
        """The history figures every action from this estimate records."""
        numbers = self._numbers
        if numbers is None:
            est = self.k.est
            numbers = self._numbers = {
                "history_samples": self.samples,
                "history_level": est.level,
                "history_key": self.k.history_key,
                "time_quantile": est.quantile,
                # the run time is for this many GPUs: from runs with as many, or scaled
                "history_gpus": self.gpus,
                "history_gpu_samples": self.gpu_samples,
                "history_gpu_scaled": int(self.gpu_scaled),
            }
        return numbers

    @property
    def reason(self) -> str:
        """The start of every reason an action from this estimate gives."""
        return f"{self.samples} past runs ({self.k.est.level}) suggest "


class RightsizePolicy:
    """Proposes smaller time limits, memory, CPUs and GPUs for pending jobs.

    ``priors_factory`` turns ``snapshot.history`` into :class:`Priors`; the default uses
    the settings' quantile and ``min_history``. The priors of the last history tuple seen
    are kept, so a daemon or simulator that passes the same tuple again pays for them
    once.
    """

    name = "rightsize"

    def __init__(
        self,
        settings: RightsizeSettings | None = None,
        priors_factory: PriorsFactory | None = None,
    ) -> None:
        self.settings = settings or RightsizeSettings()
        s = self.settings
        self._factory: PriorsFactory = priors_factory or (
            lambda records: Priors.from_history(
                records, quantile=s.time_quantile, min_samples=s.min_history
            )
        )
        self._cached: tuple[Sequence[HistoryRecord], Priors] | None = None
        # Per history key (Priors.answer), and per key and GPU count: what the key's
        # estimate implies, as long as the cached priors.
        self._derived: dict[tuple[int | str, ...], _KeyDerived] = {}
        self._timed: dict[tuple[tuple[int | str, ...], int | None], _Derived] = {}
        # (user, name, partition, GPUs) -> what its estimate implies (None: no estimate),
        # as long as the cached priors: most pending jobs are still pending next cycle,
        # so a key costs one look-up after its first cycle.
        self._keyed: dict[_JobKey, _Derived | None] = {}
        # job id -> (what its verdict depends on besides the priors, that verdict), from
        # the last cycle; as long as the cached priors.
        self._memo: dict[int, _Verdict] = {}
        self._keep = 1.0 - s.min_change_fraction
        self._round_s = s.time_round.total_seconds()
        self._seconds = _Seconds(s.min_time_limit.total_seconds(), self._round_s)

    def priors(self, history: Sequence[HistoryRecord]) -> Priors:
        """Return priors for ``history``, reusing them when it is the same object.

        A new history object (the daemon's reload every ``history_refresh``) gets new
        priors, which take the last ones' statistics for every user whose runs are the
        same (:meth:`Priors.carry_over`); estimates and verdicts of those users' jobs are
        kept too, so a reload costs only the users whose jobs ended since the last one.
        """
        cached = self._cached
        if cached is None or cached[0] is not history:
            priors = self._factory(history)
            changed = None if cached is None else priors.carry_over(cached[1])
            self._cached = (history, priors)
            if changed is None:
                self._derived, self._timed, self._keyed, self._memo = {}, {}, {}, {}
            elif changed:
                # Estimates are per user (key[1], past the level tag); a verdict is its
                # job's user's.
                self._derived = {k: d for k, d in self._derived.items() if k[1] not in changed}
                self._timed = {k: d for k, d in self._timed.items() if k[0][1] not in changed}
                self._keyed = {k: v for k, v in self._keyed.items() if k[0] not in changed}
                self._memo = {j: v for j, v in self._memo.items() if v.job.user not in changed}
            return priors
        return cached[1]

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        """Return one ``update`` action per pending job whose requests history can shrink."""
        s = self.settings
        jobs = snapshot.cluster.jobs
        # A job carrying sgpu:norightsize is no candidate, opted in or not (as in
        # job_submit.lua); the substring test spares the parse for nearly every job.
        pending = [
            j
            for j in jobs
            if j.state is JobState.PENDING
            and not (NORIGHTSIZE in j.comment and rightsize_opted_out(j.comment))
        ]
        if not pending:
            return []
        priors = self.priors(snapshot.history)
        keyed = self._keyed
        # The longest a RUNNING job of the same user and name has run so far, as a floor
        # for the time limit (with the same headroom and rounding as history); by user,
        # then name, so a pending job's look-up builds no tuple.
        at = snapshot.at
        longest: dict[str, dict[str, float]] = {}
        for j in jobs:
            if j.state is JobState.RUNNING and j.start_time is not None:
                elapsed = (at - j.start_time).total_seconds()
                if elapsed > 0.0:
                    names = longest.get(j.user)
                    if names is None:
                        longest[j.user] = {j.name: elapsed}
                    elif elapsed > names.get(j.name, 0.0):
                        names[j.name] = elapsed
        headroom, round_s, min_s = s.time_headroom, self._round_s, self._seconds.min_time_s
        # (elapsed, the time limit floor it implies), once per user and name
        sibling_s: dict[str, dict[str, tuple[float, int]]] = {
            user: {
                name: (elapsed, time_limit_s(elapsed, headroom, round_s, min_s))
                for name, elapsed in names.items()
            }
            for user, names in longest.items()
        }
        opted = snapshot.opted_in
        # Pending jobs share keys (resubmissions, arrays, the same jobs next cycle): each
        # key's estimate (for the job's GPU count) and what that implies are resolved once
        # per priors. And most pending jobs are pending, unchanged, next cycle too: a job
        # whose verdict inputs are what they were last cycle gets last cycle's verdict (the
        # same Action object, or none) for the price of comparing them.
        memo: dict[int, _Verdict] = self._memo
        seen: dict[int, _Verdict] = {}
        actions: list[Action] = []
        for job in pending:
            sibling: float | None = None
            floor: int | None = None
            floors = sibling_s.get(job.user)
            if floors is not None:
                got = floors.get(job.name)
                if got is not None:
                    sibling, floor = got
            array_id = job.array_job_id
            is_opted = job.job_id in opted or (array_id is not None and array_id in opted)
            last = memo.get(job.job_id)
            # A running sibling's floor matters only where it exceeds the history's limit
            # (it grows 30 s a cycle, and mostly stays below): compared with last cycle's
            # verdict only where it did.
            binding = floor
            if floor is not None and last is not None:
                bound = last.history_time_s
                if bound is None or floor <= bound:
                    binding = None
            if (
                last is not None
                and last.job is job
                and last.inputs.opted == is_opted
                and last.inputs.floor_s == binding
            ):
                # The daemon's snapshot hands an unchanged job over as the same object
                # (daemon.diff): nothing to compare but the opt-in and the floor.
                seen[job.job_id] = last
                if last.action is not None:
                    actions.append(last.action)
                continue
            request = job.gpus
            inputs = _Inputs(
                job.name,
                job.partition,
                request.gpus,
                request.per_node,
                request.per_job,
                request.per_task,
                request.gpu_type,
                request.shards,
                job.time_limit,
                job.memory_mib,
                job.node_count,
                job.cpus,
                job.tasks,
                job.array_task_spec,
                binding,
                is_opted,
            )
            if last is not None and last.inputs == inputs and last.job.user == job.user:
                if last.job is not job:  # an equal job parsed anew: known by identity next
                    last = msgspec.structs.replace(last, job=job)
                seen[job.job_id] = last
                if last.action is not None:
                    actions.append(last.action)
                continue
            job_key = (job.user, job.name, job.partition, job.gpus.gpus)
            if job_key in keyed:
                d = keyed[job_key]
            else:
                d = keyed[job_key] = self._resolve(job, priors)
            action: Action | None = None
            history_s: int | None = None
            if d is not None:
                time_s = history_s = d.time_s
                if time_s is not None and floor is not None:
                    time_s = max(time_s, floor)
                action = self._propose_one(job, d, time_s, sibling, is_opted)
                if action is not None:
                    actions.append(action)
            binds = floor is not None and history_s is not None and floor > history_s
            if inputs.floor_s != (floor if binds else None):
                # as the next cycle will compare it: with the floor only where it binds
                inputs = msgspec.structs.replace(inputs, floor_s=floor if binds else None)
            seen[job.job_id] = _Verdict(job, inputs, action, history_s)
        self._memo = seen  # jobs no longer pending drop out
        return actions

    def _resolve(self, job: Job, priors: Priors) -> _Derived | None:
        """Return what the job's estimate (``priors.estimate(job)``) implies, or None.

        Built from its parts (``Priors.answer``, ``key_estimate``, ``run_time``): the
        key's figures once per key, the run time once per key and GPU count."""
        key = priors.answer(job.user, job.name, job.partition)
        if key is None:
            return None
        gpus = (job.gpus.gpus or None) if priors.by_gpus else None
        timed = self._timed.get((key, gpus))
        if timed is None:
            k = self._derived.get(key)
            if k is None:
                est = priors.key_estimate(key)
                assert est is not None  # an answering key has an estimate
                k = self._derived[key] = _KeyDerived(est, self.settings)
            timed = self._timed[key, gpus] = _Derived(
                k, priors.run_time(key, gpus), gpus, self.settings, self._seconds
            )
        return timed

    def _propose_one(
        self,
        job: Job,
        d: _Derived,
        time_s: int | None,
        sibling_s: float | None,
        is_opted: bool,
    ) -> Action | None:
        s = self.settings
        k = d.k  # the key's figures (run times aside: those are d's)
        est = k.est
        keep = self._keep  # a change must leave at most this share of the request
        nodes = job.node_count if job.node_count > 1 else 1

        # Decide every field with plain numbers first: most jobs change nothing. A value
        # is proposed when proposed <= keep * current (and below it), i.e. it shrinks
        # the request by at least min_change_fraction.
        new_time: int | None = None
        if time_s is not None:
            limit = job.time_limit
            if limit is None:
                new_time = time_s
            else:
                current_s = limit.total_seconds()
                if time_s < current_s and time_s <= keep * current_s + 1e-6:
                    new_time = time_s
        new_memory: int | None = None
        current_memory = 0
        if k.memory_mib is not None and job.memory_mib:
            current_memory = -(-job.memory_mib // nodes)
            if k.memory_mib < current_memory and k.memory_mib <= keep * current_memory + 1e-6:
                new_memory = k.memory_mib
        request = job.gpus
        gpus_after = request.gpus
        new_gpus: int | None = None  # per node, or per job for --gpus
        per_node_field = True
        used = k.gpus_used
        if (
            used is not None
            and gpus_after > 0
            and not request.shards
            and est.gpus_requested >= gpus_after
        ):
            if request.per_node:
                per_node = -(-used // nodes)
                if _shrinks_enough(request.per_node, per_node, s.min_change_fraction):
                    new_gpus, gpus_after = per_node, per_node * nodes
            elif (
                request.per_job
                and not request.per_task
                and _shrinks_enough(request.per_job, used, s.min_change_fraction)
            ):
                new_gpus, per_node_field, gpus_after = used, False, used
        new_cpus: int | None = None
        cpus = job.cpus
        if k.cpus_needed is not None and gpus_after > 0 and cpus > 0:
            proposed_cpus = max(
                k.cpus_needed, s.target_cores_per_gpu * gpus_after, job.tasks, nodes
            )
            if proposed_cpus < cpus and proposed_cpus <= keep * cpus + 1e-6:
                new_cpus = proposed_cpus
        if new_time is None and new_memory is None and new_gpus is None and new_cpus is None:
            return None

        intents: list[Intent] = []
        numbers = dict(d.history_numbers)
        changes: list[str] = []
        if new_time is not None:
            limit = job.time_limit
            intents.append(SetTimeLimit(new_time))
            text = _limit_text(new_time)
            numbers["time_limit_current_s"] = limit.total_seconds() if limit is not None else None
            numbers["time_limit_proposed_s"] = new_time
            # the names the notification template reads
            numbers["time_limit_s"] = numbers["time_limit_current_s"]
            numbers["proposed_time_limit_s"] = new_time
            numbers["run_time_quantile_s"] = d.run_time_s
            numbers["sibling_elapsed_s"] = sibling_s
            was = "UNLIMITED" if limit is None else _limit_text(limit.total_seconds())
            changes.append(f"TimeLimit {text} (was {was})")
        if new_memory is not None:
            intents.append(SetMemoryPerNode(new_memory))
            numbers["memory_per_node_current_mib"] = current_memory
            numbers["memory_per_node_proposed_mib"] = new_memory
            numbers["memory_mib"] = current_memory
            numbers["proposed_memory_mib"] = new_memory
            numbers["peak_node_memory_mib"] = est.peak_node_memory_mib
            changes.append(f"MinMemoryNode {new_memory} MiB (was {current_memory} MiB)")
        if new_gpus is not None:
            intents.append(SetGpus(new_gpus, request.gpu_type, per_node=per_node_field))
            numbers["gpus_current"] = request.gpus
            numbers["gpus_proposed"] = gpus_after
            numbers["gpus"] = request.gpus
            numbers["proposed_gpus"] = gpus_after
            numbers["gpus_used_max"] = est.gpus_used
            if per_node_field:
                numbers["gpus_per_node_current"] = request.per_node
                numbers["gpus_per_node_proposed"] = new_gpus
                changes.append(f"{new_gpus} GPU(s) per node (was {request.per_node})")
            else:
                changes.append(f"{new_gpus} GPU(s) (was {request.per_job})")
        if new_cpus is not None:
            intents.append(SetCpus(new_cpus))
            intents.append(SetCpusPerNode(math.ceil(new_cpus / nodes)))
            numbers["cpus_current"] = job.cpus
            numbers["cpus_proposed"] = new_cpus
            numbers["cpu_used_max_pct"] = est.max_cpu_pct
            changes.append(f"{new_cpus} CPUs (was {job.cpus})")
        numbers["opted_in"] = int(is_opted)
        return Action(
            policy=self.name,
            kind="update",
            job_id=job.job_id,
            user=job.user,
            reason=d.reason + "; ".join(changes),
            numbers=numbers,
            intents=tuple(intents),
            alert="rightsize",
            requires_opt_in=not s.apply_to_all,
            slurm_id=slurm_job_ref(job),
        )

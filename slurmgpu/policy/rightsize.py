"""Rightsizing: bring a pending job's requests down to what its history says it uses.

For every PENDING job with an estimate (:mod:`slurmgpu.policy.priors`) the policy
proposes at most one ``update`` action that combines every field worth changing. Held
jobs are candidates (a hold does not change what the job needs), requeued jobs are
candidates, and a pending array meta-record (``120_[3-9]``) is one candidate addressed as
that range, since its tasks share one shape; tasks already split out are their own jobs.

Rules (defaults in :class:`~slurmgpu.policy.settings.RightsizeSettings`, the sizing knobs
in the site's :class:`~slurmgpu.policy.sizing.SizingRules`):

- the time limit (``SetTimeLimit``) = the larger of ``time_quantile`` (0.95) *
  ``time_headroom`` (1.3) of past run times (for the job's GPU count: runs that asked
  as many GPUs, else every run scaled so that it never errs short, see
  :mod:`slurmgpu.policy.priors`),
  ``min_time_limit`` (15 min), and ``time_headroom`` * the longest elapsed time of a
  RUNNING job with the same user and name (a sibling running for 2 h proves a run can
  take 2 h), rounded up to ``time_round`` (5 min). The headroom grows by
  ``timeout_margin_growth`` (1.5) for every run at the key that ended ``TIMEOUT``: a run
  killed at its limit says the key's runs vary more than its history showed (the
  simulator requeues a job rightsized into a timeout with its old limit; the next limit
  at its key is then wider). A run time from history holds for the placement its runs
  had: a job Slurm may split over nodes (``--gpus=k``, k > 1, or GPUs per task) can run
  far slower split (yolov3 on 3 + 1 GPUs: 1.76x its time on one node; every one of the
  5 timeouts of bench/sim_pollux.py's ``rightsize`` set at load 2.0 was one), so its
  limit is sized from k times the run time, the most k GPUs in any placement take
  under diminishing returns: a limit the job cannot hit (numbers:
  ``time_bound_gpus``); a per-node request runs in the shape its history did. A job
  with no limit (``UNLIMITED``) gets one. Never below the job's ``--time-min``
  (Slurm refuses it: "Invalid time-min specification"). Only from runs of the job's own
  script or name unless
  ``time_from_other_jobs``: the user's other jobs say little about this one's run time,
  and a limit too short is a killed run (on Pollux workloads 1, 2 and 4, 66 of the 71
  timeouts after rightsizing came from the ``user+partition`` level). Never from a key
  with a run Slurm restarted (a resize, a preemption, a requeue): its run time is the
  last run's only (:func:`slurmgpu.policy.sizing.limit_from_history`).
- memory per node (``SetMemoryPerNode``, MiB) = ``ceil(memory_headroom * peak of the busiest
  node)`` rounded up to ``memory_round_mib`` (256 MiB); a past run without a per-node
  figure counts with its total, which only errs high. Never when any run at the key ran
  out of memory, or when the request is unknown or 0 (all of a node).
- CPUs in total and per node (``SetCpus``, ``SetCpusPerNode``), GPU jobs only: the larger of
  ``ceil(cpu_headroom * the most cores a past run used on average)``,
  ``target_cores_per_gpu`` (12) per GPU, one per task and one per node. Never when a past
  run kept >= 90 % of its cores busy (its demand is unknown).
- GPUs: the most GPUs any past run kept busy (at least 1), when at least ``min_history``
  runs *of the job's own script or name* had GPU samples (the user's other programs say
  nothing of this one's: ``sizing.own_history``) and none of them asked for fewer GPUs than
  this job: ``SetGpus`` per node for ``--gpus-per-node`` / ``--gres`` requests, per job for
  ``--gpus`` (of the job's GPU type; ``slurmgpu.slurm.update`` spells it for the release);
  ``--gpus-per-task`` and shard requests are left alone. Slurm's per-node request replaces
  the job's whole per-node TRES string: the actuator must keep any other GRES the job asked
  for.

A field is proposed only when it shrinks the request by at least
``min_change_fraction`` (20 %); no field ever grows. Whether the action runs is the
engine's call: ``requires_opt_in`` is set unless ``apply_to_all``, and the engine then
suppresses it for jobs not in ``PolicySnapshot.opted_in``. A job whose comment carries
``sgpu:norightsize`` (:mod:`slurmgpu.tokens`) gets no proposal at all, even under
``apply_to_all``: plugins/job_submit.lua leaves it alone too. The figures come from
:mod:`slurmgpu.policy.sizing`, as the export's and ``sgpu eff``'s do. ``numbers`` carry,
for each field, the current and proposed value, plus the history count, key level and
quantile.

A key (user, name, partition) one of whose jobs waited for ever on a site minimum after
its lowering (the daemon gave it its request back, :mod:`slurmgpu.policy.rightsize_undo`)
gets none of the fields that reason blames lowered again (:meth:`RightsizePolicy.hold_back`).

A job's verdict (its action, or none) is kept while its request, opt-in, sibling floor and
user's history stay the same, so a cycle judges only what changed. At most
``max_judged_per_cycle`` jobs are judged in one cycle (a first cycle on a deep queue, or a
reload that changed most users' history, has more): jobs without a verdict first, each
oldest first, the order the engine's rate limit takes changes in; the rest wait for the
next cycles (``backlog``), a job whose history changed keeping its last verdict meanwhile.
Once all are judged the decisions are those of one cycle judging every job.
"""

from __future__ import annotations

import enum
import math
import operator
from collections.abc import Callable, Mapping, Sequence
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
from slurmgpu.model import GpuRequest, Job, JobState
from slurmgpu.policy.base import Action, HistoryRecord, PolicySnapshot, slurm_job_ref
from slurmgpu.policy.priors import Estimate, Priors
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.policy.sizing import SizingRules, key_sizes, limit_from_history, time_limit_s
from slurmgpu.tokens import NORIGHTSIZE, rightsize_opted_out
from slurmgpu.units import format_time_limit

__all__ = ["PriorsFactory", "RightsizePolicy"]

PriorsFactory = Callable[[Sequence[HistoryRecord]], Priors]
Numbers = dict[str, float | int | str | None]


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


class _Verdict(msgspec.Struct, frozen=True, gc=False):
    """The action (or none) given for ``job``'s request (:func:`_same_request`), its
    opt-in and ``floor_s``, the sibling floor of its time limit where it binds (else
    None). ``history_time_s`` is the time limit history alone gave, below which a
    running sibling's floor changes nothing. ``job``: the object judged (the same object
    next cycle is the same request). ``made``: the priors generation it was made under
    (``RightsizePolicy._generation``); ``key``: the priors key that answered (None:
    none did). It is current while none of the keys ``Priors.answer`` tries for the job,
    up to ``key``, has changed since (a reload that left them the same keeps it, though
    the user's other jobs ended). Untracked by the collector: a cycle builds one per
    pending job."""

    job: Job
    floor_s: int | None
    opted: bool
    action: Action | None
    history_time_s: int | None
    made: int
    key: tuple[int | str, ...] | None


def _same_request(a: Job, b: Job) -> bool:
    """Whether two records of one job (by id) ask for the same: everything of the job a
    verdict reads besides its opt-in and sibling floor. Field by field (``GpuRequest``'s
    dataclass ``__eq__`` would build two tuples)."""
    if not (
        a.user == b.user
        and a.name == b.name
        and a.partition == b.partition
        and a.time_limit == b.time_limit
        and a.time_min == b.time_min
        and a.memory_mib == b.memory_mib
        and a.node_count == b.node_count
        and a.cpus == b.cpus
        and a.tasks == b.tasks
        and a.array_task_spec == b.array_task_spec
    ):
        return False
    ga, gb = a.gpus, b.gpus
    return ga is gb or (
        ga.gpus == gb.gpus
        and ga.per_node == gb.per_node
        and ga.per_job == gb.per_job
        and ga.per_task == gb.per_task
        and ga.gpu_type == gb.gpu_type
        and ga.shards == gb.shards
    )


class _Seconds(NamedTuple):
    """The time rule's knobs (durations in seconds), converted once per policy, not per
    estimate."""

    headroom: float
    min_time_s: float
    round_s: float


class _KeyDerived(msgspec.Struct, gc=False):
    """What one history key's figures other than run times imply under the settings,
    computed once per key (every GPU count of the key shares them; built by
    :func:`_key_derived`). Untracked by the collector, as :class:`_Derived` is: a first
    cycle keeps one per key, tens of thousands, and nothing refers back to one."""

    key: tuple[int | str, ...]  # the priors' key (Priors.answer)
    est: Estimate
    history_key: str
    sets_limit: bool  # its run times may set a time limit (sizing.limit_from_history)
    memory_mib: int | None
    cpus_needed: int | None
    gpus_used: int | None
    gpus_requested: int  # the most GPUs a run at the key asked for


def _key_derived(
    key: tuple[int | str, ...], est: Estimate, s: RightsizeSettings, rules: SizingRules
) -> _KeyDerived:
    sizes = key_sizes(
        est, rules, memory=s.memory, cpus=s.cpus, gpus=s.gpus, min_history=s.min_history
    )
    return _KeyDerived(
        key,
        est,
        "/".join(est.key),
        limit_from_history(est, s.time_from_other_jobs),
        sizes.memory_mib,
        sizes.cores,
        sizes.gpus,
        est.gpus_requested,
    )


class _Derived(msgspec.Struct, gc=False):
    """What one key's estimate for one GPU count implies (built by :func:`_derive`): the
    key's figures (:class:`_KeyDerived`, shared) and the run-time part, which alone
    depends on the GPU count. The same figures as the ``Estimate`` that
    ``Priors.estimate`` gives for such a job, without building one per GPU count (a
    first cycle meets tens of thousands).

    Untracked by the garbage collector (it refers to its key's figures, nothing refers
    back): a first cycle keeps tens of thousands, and as tracked objects they tipped it
    into a full collection of the daemon's heap (0.5-0.9 s on bench/policy.py's case).
    The numbers and reason text are made on first use: only estimates that lead to an
    action need them."""

    k: _KeyDerived
    run_time_s: float
    samples: int
    gpu_samples: int
    gpu_scaled: bool
    gpus: int | None
    time_s: int | None
    spread: int = 1  # the limit bounds any placement of this many GPUs (_spread)
    numbers: Numbers | None = None  # history_numbers, once made
    reason_text: str | None = None  # reason, once made

    @property
    def history_numbers(self) -> Numbers:
        """The history figures every action from this estimate records."""
        numbers = self.numbers
        if numbers is None:
            est = self.k.est
            numbers = self.numbers = {
                "history_samples": self.samples,
                "history_level": est.level,
                "history_key": self.k.history_key,
                "time_quantile": est.quantile,
                # the run time is for this many GPUs: from runs with as many, or scaled
                "history_gpus": self.gpus,
                "history_gpu_samples": self.gpu_samples,
                "history_gpu_scaled": int(self.gpu_scaled),
                # > 1: the limit bounds a run split over nodes (k x the run time)
                "time_bound_gpus": self.spread,
            }
        return numbers

    @property
    def reason(self) -> str:
        """The start of every reason an action from this estimate gives."""
        text = self.reason_text
        if text is None:
            text = self.reason_text = f"{self.samples} past runs ({self.k.est.level}) suggest "
        return text


def _derive(
    k: _KeyDerived,
    run: tuple[float, int, int, bool],
    gpus: int | None,
    s: RightsizeSettings,
    c: _Seconds,
    spread: int = 1,
) -> _Derived:
    """What the key's estimate for ``gpus`` GPUs implies, ``run`` its run-time part
    (``Priors.run_time``); ``spread`` (:func:`_spread`) > 1: the limit is the bound for
    a job that may run in any placement of that many GPUs."""
    run_time_s, samples, gpu_samples, gpu_scaled = run
    time_s: int | None = None
    if s.time_limit and k.sets_limit:
        # the key's margin grows with every run of it that hit its limit
        headroom = c.headroom * s.timeout_margin_growth**k.est.timeouts
        time_s = time_limit_s(run_time_s * spread, headroom, c.round_s, c.min_time_s)
    return _Derived(
        k,
        run_time_s,
        samples,
        gpu_samples,
        gpu_scaled,
        gpus if gpus is not None and gpus > 0 else None,
        time_s,
        spread,
    )


def _spread(request: GpuRequest) -> int:
    """How many times its packed run time a job with this request may take: its GPU
    count when Slurm may split its GPUs over nodes (``--gpus=k``, k > 1, or GPUs per
    task), else 1. A run time from history is one in the placements its runs had, and a
    split placement can be far slower (yolov3 on 3 + 1 GPUs: 1.76x its time on one
    node), more than a margin covers; k GPUs in any placement are at least as fast as
    one (diminishing returns, as :mod:`slurmgpu.policy.priors` scales runs), so k times
    the run time is a bound such a job cannot hit. A per-node request
    (``--gpus-per-node``, ``--gres``) runs in the shape its history did."""
    if request.per_node or request.shards or request.gpus <= 1:
        return 1
    return request.gpus


_NO_SIBLING: tuple[None, None] = (None, None)


def _sibling(
    job: Job, sibling_s: dict[str, dict[str, tuple[float, int]]]
) -> tuple[float, int] | tuple[None, None]:
    """The longest elapsed time of a RUNNING job of ``job``'s user and name, and the
    time limit floor it sets (``propose``'s ``sibling_s``), or (None, None)."""
    floors = sibling_s.get(job.user)
    if floors is None:
        return _NO_SIBLING
    return floors.get(job.name, _NO_SIBLING)


_BY_ID = operator.attrgetter("job_id")
_BY_SUBMIT = operator.attrgetter("submit_time")


def _oldest_first(jobs: list[Job]) -> None:
    """Sort ``jobs`` in place by submit time, then job id, jobs without a submit time
    last: the order the engine's rate limit ranks changes in. Two sorts on C-level keys
    (by id, then a stable one by submit time): a third of one with a Python key (a
    first cycle sorts up to every pending job, 100,000 in 55 ms)."""
    jobs.sort(key=_BY_ID)
    if all(job.submit_time is not None for job in jobs):
        jobs.sort(key=_BY_SUBMIT)
        return
    untimed = [job for job in jobs if job.submit_time is None]
    jobs[:] = [job for job in jobs if job.submit_time is not None]
    jobs.sort(key=_BY_SUBMIT)
    jobs.extend(untimed)


class _Unseen(enum.Enum):
    """A (user, name, partition) not looked up yet (None: looked up, no key answers)."""

    UNSEEN = 0


class RightsizePolicy:
    """Proposes smaller time limits, memory, CPUs and GPUs for pending jobs.

    ``sizing`` is the site's :class:`SizingRules` (headroom, rounding, minimum).
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
        *,
        sizing: SizingRules | None = None,
    ) -> None:
        self.settings = settings or RightsizeSettings()
        self.sizing = sizing or SizingRules()
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
        self._timed: dict[tuple[tuple[int | str, ...], int | None, int], _Derived] = {}
        # (user, name, partition) -> the key that answers for it (None: none does), as
        # long as the cached priors: jobs of one name share it, whatever their GPUs.
        self._by_name: dict[tuple[str, str, str], _KeyDerived | None] = {}
        self._cores_per_gpu = s.target_cores_per_gpu
        # job id -> (what its verdict depends on besides the priors, that verdict), from
        # the last cycle; as long as the cached priors.
        self._memo: dict[int, _Verdict] = {}
        # The priors generation (one more at every new history) and, per user whose
        # history changed since the memo was started, the generation it changed at; the
        # same per priors key (``Priors.changed_keys``). A verdict made before one of the
        # keys it rests on changed is out of date (re-judged, kept until then); the user's
        # generation is the quick test that none did.
        self._generation = 0
        self._changed_at: dict[str, int] = {}
        self._key_changed_at: dict[tuple[int | str, ...], int] = {}
        # Pending jobs left unjudged by the last propose (max_judged_per_cycle): they have
        # no verdict yet, or one from their user's history before it changed.
        self.backlog = 0
        self._keep = 1.0 - s.min_change_fraction
        # (user, name, partition) -> fields not to lower for its jobs (hold_back)
        self._held_back: dict[tuple[str, str, str], frozenset[str]] = {}
        rules = self.sizing
        self._seconds = _Seconds(
            rules.time_headroom,
            rules.min_time_limit.total_seconds(),
            rules.time_round.total_seconds(),
        )

    @property
    def held_back(self) -> Mapping[tuple[str, str, str], frozenset[str]]:
        """(user, name, partition) -> the fields :meth:`hold_back` keeps from lowering."""
        return self._held_back

    def hold_back(self, user: str, name: str, partition: str, fields: frozenset[str]) -> None:
        """Lower none of ``fields`` (``time_limit``, ``memory``, ``cpus``, ``gpus``) of the
        jobs of (``user``, ``name``, ``partition``) from now on: a job of theirs lowered so
        waited for ever on a site minimum (:mod:`slurmgpu.policy.rightsize_undo`). Every
        verdict is judged again (a rare event)."""
        key = (user, name, partition)
        merged = self._held_back.get(key, frozenset()) | fields
        if merged != self._held_back.get(key):
            self._held_back[key] = merged
            self._memo = {}

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
            self._generation += 1
            if changed is None:
                self._derived, self._timed, self._by_name, self._memo = {}, {}, {}, {}
                self._changed_at, self._key_changed_at = {}, {}
            elif changed:
                # Estimates are per priors key; which key answers for a name is per user
                # (cheap to find again: the unchanged keys' statistics are carried over).
                keys = priors.changed_keys
                self._derived = {k: d for k, d in self._derived.items() if k not in keys}
                self._timed = {k: d for k, d in self._timed.items() if k[0] not in keys}
                self._by_name = {k: v for k, v in self._by_name.items() if k[0] not in changed}
                # Verdicts are marked, not filtered out (a pass over every pending job's
                # verdict, ~40 ms on 100k, for a few users' jobs). Marks older than the
                # oldest verdict can mark nothing any more.
                generation = self._generation
                if self._memo:
                    oldest = min(v.made for v in self._memo.values())
                    self._changed_at = {u: g for u, g in self._changed_at.items() if g > oldest}
                    self._key_changed_at = {
                        k: g for k, g in self._key_changed_at.items() if g > oldest
                    }
                self._changed_at.update(dict.fromkeys(changed, generation))
                self._key_changed_at.update(dict.fromkeys(keys, generation))
            return priors
        return cached[1]

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        """Return one ``update`` action per pending job whose requests history can shrink."""
        s = self.settings
        jobs = snapshot.cluster.jobs
        # The members once, not per job: an enum member look-up costs as much as the rest
        # of a test (Python 3.11).
        pending_state, running_state = JobState.PENDING, JobState.RUNNING
        # A job carrying sgpu:norightsize is no candidate, opted in or not (as in
        # job_submit.lua); the substring test spares the parse for nearly every job.
        pending = [
            j
            for j in jobs
            if j.state is pending_state
            and not (NORIGHTSIZE in j.comment and rightsize_opted_out(j.comment))
        ]
        if not pending:
            self.backlog = 0
            return []
        priors = self.priors(snapshot.history)
        by_name, timed = self._by_name, self._timed
        by_gpus = priors.by_gpus
        # The longest a RUNNING job of the same user and name has run so far, as a floor
        # for the time limit (with the same headroom and rounding as history); by user,
        # then name, so a pending job's look-up builds no tuple.
        at = snapshot.at
        longest: dict[str, dict[str, float]] = {}
        for j in jobs:
            if j.state is running_state and j.start_time is not None:
                elapsed = (at - j.start_time).total_seconds()
                if elapsed > 0.0:
                    names = longest.get(j.user)
                    if names is None:
                        longest[j.user] = {j.name: elapsed}
                    elif elapsed > names.get(j.name, 0.0):
                        names[j.name] = elapsed
        headroom, min_s, round_s = self._seconds
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
        changed_at = self._changed_at
        seen: dict[int, _Verdict] = {}
        actions: list[Action] = []
        new: list[Job] = []  # to judge: no verdict, or one for another request
        outdated: dict[int, _Verdict] = {}  # to judge: a key it rests on changed since
        # (user, name, partition, answering key) -> the last generation any key it rests
        # on changed at, once per such key in this cycle
        rests_on: dict[tuple[str, str, str, tuple[int | str, ...] | None], int] = {}
        for job in pending:
            job_id = job.job_id
            last = memo.get(job_id)
            if last is None:
                new.append(job)
                continue
            # A running sibling's floor matters only where it exceeds the history's limit
            # (it grows 30 s a cycle, and mostly stays below): compared with last cycle's
            # verdict only where it did.
            binding = _sibling(job, sibling_s)[1]
            if binding is not None:
                bound = last.history_time_s
                if bound is None or binding <= bound:
                    binding = None
            array_id = job.array_job_id
            if (
                last.opted == (job_id in opted or (array_id is not None and array_id in opted))
                and last.floor_s == binding
                and (last.job is job or _same_request(last.job, job))
            ):
                # The daemon's snapshot hands an unchanged job over as the same object
                # (jobdiff): nothing to compare but the opt-in and the floor.
                if last.job is not job:  # an equal job parsed anew: by identity next
                    last = msgspec.structs.replace(last, job=job)
                if changed_at and changed_at.get(job.user, 0) > last.made:
                    rests = (job.user, job.name, job.partition, last.key)
                    latest = rests_on.get(rests)
                    if latest is None:
                        latest = rests_on[rests] = self._last_change(rests)
                    if latest > last.made:
                        outdated[job_id] = last  # judged again, kept until then
                        continue
                seen[job_id] = last
                if last.action is not None:
                    actions.append(last.action)
                continue
            new.append(job)
        todo = new
        budget = s.max_judged_per_cycle
        self.backlog = 0
        if outdated:
            todo = [*new, *(v.job for v in outdated.values())]
        if budget and len(todo) > budget:
            # More to judge than a cycle judges (a first cycle on a deep queue, a reload
            # that changed most users' history): jobs without a verdict first, each oldest
            # first; the rest next cycle, those with a verdict keeping it meanwhile.
            _oldest_first(new)
            todo = new
            if outdated:
                waiting = [v.job for v in outdated.values()]
                _oldest_first(waiting)
                todo = [*new, *waiting]
            for job in todo[budget:]:
                last = outdated.get(job.job_id)
                if last is not None:  # out of date by one reload: the best there is
                    seen[job.job_id] = last
                    if last.action is not None:
                        actions.append(last.action)
            self.backlog = len(todo) - budget
            del todo[budget:]
        generation = self._generation
        unseen = _Unseen.UNSEEN
        judge = self._propose_one
        for job in todo:
            job_id = job.job_id
            array_id = job.array_job_id
            is_opted = job_id in opted or (array_id is not None and array_id in opted)
            sibling, floor = _sibling(job, sibling_s)
            # What the job's estimate implies: the key's figures once per (user, name,
            # partition), the run time once per key and GPU count.
            name_key = (job.user, job.name, job.partition)
            k = by_name.get(name_key, unseen)
            if k is unseen:
                k = by_name[name_key] = self._key_derived(name_key, priors)
            action: Action | None = None
            history_s: int | None = None
            answered: tuple[int | str, ...] | None = None
            if k is not None:
                answered = k.key
                gpus = (job.gpus.gpus or None) if by_gpus else None
                spread = _spread(job.gpus)
                timed_key = (k.key, gpus, spread)
                d = timed.get(timed_key)
                if d is None:
                    d = timed[timed_key] = _derive(
                        k, priors.run_time(k.key, gpus), gpus, s, self._seconds, spread
                    )
                time_s = history_s = d.time_s
                if floor is not None and time_s is not None and floor > time_s:
                    time_s = floor
                action = judge(job, d, time_s, sibling, is_opted)
                if action is not None:
                    actions.append(action)
            # as the next cycle will compare it: with the floor only where it binds
            binds = floor is not None and history_s is not None and floor > history_s
            seen[job_id] = _Verdict(
                job, floor if binds else None, is_opted, action, history_s, generation, answered
            )
        self._memo = seen  # jobs no longer pending drop out
        return actions

    def _last_change(self, rests: tuple[str, str, str, tuple[int | str, ...] | None]) -> int:
        """The last generation at which a key a verdict rests on changed, for jobs of
        (user, name, partition) answered by ``rests[3]``: a key ``Priors.answer`` tries
        before that one (which may now have enough samples) or that one (whose figures
        may differ); every key tried, where none answered. 0: none changed."""
        user, name, partition, answered = rests
        key_changed_at = self._key_changed_at
        latest = 0
        for key in Priors.chain(user, name, partition):
            latest = max(latest, key_changed_at.get(key, 0))
            if key == answered:
                break
        return latest

    def _key_derived(self, name_key: tuple[str, str, str], priors: Priors) -> _KeyDerived | None:
        """Return what the estimate of jobs of this (user, name, partition) implies, run
        times aside (``priors.estimate`` in parts: ``Priors.answer``, ``key_estimate``),
        or None when no key answers; once per key for all the names it answers."""
        key = priors.answer(*name_key)
        if key is None:
            return None
        k = self._derived.get(key)
        if k is None:
            est = priors.key_estimate(key)
            assert est is not None  # an answering key has an estimate
            k = self._derived[key] = _key_derived(key, est, self.settings, self.sizing)
        return k

    def _propose_one(
        self,
        job: Job,
        d: _Derived,
        time_s: int | None,
        sibling_s: float | None,
        is_opted: bool,
    ) -> Action | None:
        """Return the action for ``job`` from its key's figures ``d`` and the time limit
        ``time_s`` they (and a running sibling) give, or None: nothing shrinks enough."""
        k = d.k  # the key's figures (run times aside: those are d's)
        keep = self._keep  # a change must leave at most this share of the request
        nodes = job.node_count if job.node_count > 1 else 1
        held = self._held_back.get((job.user, job.name, job.partition)) if self._held_back else None
        if held:
            if "time_limit" in held:
                time_s = None
            k = msgspec.structs.replace(
                k,
                memory_mib=None if "memory" in held else k.memory_mib,
                cpus_needed=None if "cpus" in held else k.cpus_needed,
                gpus_used=None if "gpus" in held else k.gpus_used,
            )

        # Decide every field with plain numbers first: most jobs change nothing. A value
        # is proposed when proposed <= keep * current (and below it), i.e. it shrinks
        # the request by at least min_change_fraction.
        new_time: int | None = None
        if time_s is not None and job.time_min is not None:
            # Slurm refuses a limit below the job's --time-min
            time_s = max(time_s, math.ceil(job.time_min.total_seconds()))
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
        memory = k.memory_mib
        if memory is not None:
            requested = job.memory_mib
            if requested:
                current_memory = -(-requested // nodes)
                if memory < current_memory and memory <= keep * current_memory + 1e-6:
                    new_memory = memory
        request = job.gpus
        gpus_after = request.gpus
        new_gpus: int | None = None  # per node, or per job for --gpus
        per_node_field = True
        used = k.gpus_used
        if (
            used is not None
            and gpus_after > 0
            and not request.shards
            and k.gpus_requested >= gpus_after
        ):
            fraction = self.settings.min_change_fraction
            if request.per_node:
                per_node = -(-used // nodes)
                if _shrinks_enough(request.per_node, per_node, fraction):
                    new_gpus, gpus_after = per_node, per_node * nodes
            elif (
                request.per_job
                and not request.per_task
                and _shrinks_enough(request.per_job, used, fraction)
            ):
                new_gpus, per_node_field, gpus_after = used, False, used
        new_cpus: int | None = None
        cpus_needed = k.cpus_needed
        if cpus_needed is not None and gpus_after > 0:
            cpus = job.cpus
            if cpus > 0:
                proposed_cpus = max(cpus_needed, self._cores_per_gpu * gpus_after, job.tasks, nodes)
                if proposed_cpus < cpus and proposed_cpus <= keep * cpus + 1e-6:
                    new_cpus = proposed_cpus
        if new_time is None and new_memory is None and new_gpus is None and new_cpus is None:
            return None
        return self._action(
            job,
            d,
            new_time,
            sibling_s,
            new_memory,
            current_memory,
            new_gpus,
            per_node_field,
            gpus_after,
            new_cpus,
            nodes,
            is_opted,
        )

    def _action(
        self,
        job: Job,
        d: _Derived,
        new_time: int | None,
        sibling_s: float | None,
        new_memory: int | None,
        current_memory: int,
        new_gpus: int | None,
        per_node_field: bool,
        gpus_after: int,
        new_cpus: int | None,
        nodes: int,
        is_opted: bool,
    ) -> Action:
        """The ``update`` action for the fields :meth:`_propose_one` chose: intents,
        numbers (current and proposed value of each field, history figures) and reason."""
        est = d.k.est
        intents: list[Intent] = []
        numbers = dict(d.history_numbers)
        changes: list[str] = []
        if new_time is not None:
            limit = job.time_limit
            current_s = limit.total_seconds() if limit is not None else None
            intents.append(SetTimeLimit(new_time))
            # the names the notification template reads: time_limit_s, proposed_time_limit_s
            numbers.update(
                {
                    "time_limit_current_s": current_s,
                    "time_limit_proposed_s": new_time,
                    "time_limit_s": current_s,
                    "proposed_time_limit_s": new_time,
                    "run_time_quantile_s": d.run_time_s,
                    "sibling_elapsed_s": sibling_s,
                }
            )
            was = "UNLIMITED" if current_s is None else _limit_text(current_s)
            changes.append(f"TimeLimit {_limit_text(new_time)} (was {was})")
        if new_memory is not None:
            intents.append(SetMemoryPerNode(new_memory))
            numbers.update(
                {
                    "memory_per_node_current_mib": current_memory,
                    "memory_per_node_proposed_mib": new_memory,
                    "memory_mib": current_memory,
                    "proposed_memory_mib": new_memory,
                    "peak_node_memory_mib": est.peak_node_memory_mib,
                }
            )
            changes.append(f"MinMemoryNode {new_memory} MiB (was {current_memory} MiB)")
        if new_gpus is not None:
            request = job.gpus
            intents.append(SetGpus(new_gpus, request.gpu_type, per_node=per_node_field))
            numbers.update(
                {
                    "gpus_current": request.gpus,
                    "gpus_proposed": gpus_after,
                    "gpus": request.gpus,
                    "proposed_gpus": gpus_after,
                    "gpus_used_max": est.gpus_used,
                }
            )
            if per_node_field:
                numbers["gpus_per_node_current"] = request.per_node
                numbers["gpus_per_node_proposed"] = new_gpus
                changes.append(f"{new_gpus} GPU(s) per node (was {request.per_node})")
            else:
                changes.append(f"{new_gpus} GPU(s) (was {request.per_job})")
        if new_cpus is not None:
            intents.append(SetCpus(new_cpus))
            intents.append(SetCpusPerNode(math.ceil(new_cpus / nodes)))
            numbers.update(
                {
                    "cpus_current": job.cpus,
                    "cpus_proposed": new_cpus,
                    "cpu_used_max_pct": est.max_cpu_pct,
                }
            )
            changes.append(f"{new_cpus} CPUs (was {job.cpus})")
        numbers["opted_in"] = int(is_opted)
        # Positional, in Action's field order: msgspec matches keywords by name, and a
        # first cycle builds tens of thousands (policy, kind, job_id, user, reason,
        # numbers, intents, alert, priority, requires_opt_in, slurm_id).
        return Action(
            self.name,
            "update",
            job.job_id,
            job.user,
            d.reason + "; ".join(changes),
            numbers,
            tuple(intents),
            "rightsize",
            0,
            not self.settings.apply_to_all,
            slurm_job_ref(job),
        )

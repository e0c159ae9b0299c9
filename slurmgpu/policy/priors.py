"""What a job will probably use, estimated from the finished jobs of the same user.

Helios' QSSF estimate (docs/ANCHORS.md §5): the same user submitting the same job name
tends to run the same thing again. :class:`Priors` groups history by key, finest first,
and :meth:`Priors.estimate` answers from the finest key that has at least
``min_samples`` past runs:

=========================  ==================================================
level                      key
=========================  ==================================================
``user+script+partition``  user, script hash, partition (only when given one)
``user+script``            user, script hash
``user+name+partition``    user, job name, partition
``user+name``              user, job name
``user+partition``         user, partition
``user``                   user
=========================  ==================================================

A pending job that lists several partitions (``gpu,gpu-long``) skips the partition
levels: it may run in any of them.

**GPU count.** The same job name asked with 1 GPU and with 8 runs for very different
times, so a run time is estimated *for the job's GPU count* ``k`` (``Job.gpus.gpus``):
at each level, when at least ``min_samples`` of the key's runs asked for exactly ``k``
GPUs, the run time comes from those runs only (``Estimate.gpu_samples``); otherwise
from every run of the key, a run that had ``g`` GPUs counting as ``t * max(1, g / k)``
(``Estimate.gpu_scaled``). That scaling never shortens a run: with diminishing
returns (speed-up per GPU never rising with more GPUs) a job on fewer GPUs takes at
most ``g / k`` times as long, and on more GPUs at most as long, so the limit built on it
errs long, never into a timeout. Runs and jobs without GPUs are not scaled. The other
figures (memory, CPU, GPUs used) are over every run of the key, as before.

A run of a job Slurm restarted (``HistoryRecord.restarts``: a resize, a preemption, a
requeue) is a sample, counted in ``Estimate.restarted_runs``: its run time is its last
run's only, so :func:`slurmgpu.policy.sizing.limit_from_history` sets no time limit from
such a key; its other figures hold.

Only runs that ended ``COMPLETED`` or ``TIMEOUT`` are samples: a cancelled or failed
run says little about what a full run needs (it may have stopped after a minute); a
timed-out run is a lower bound of its need and keeps the estimate high. Runs that ended
``OUT_OF_MEMORY`` are counted (``oom_runs``) so memory is never shrunk for that key.

Building is O(n) dictionary work; a key's statistics are computed on first use, its
run-time quantile read without a sort where it is the longest run (fewer than
``1 / (1 - q)`` runs, most keys), and kept out of the garbage collector's sight (a
daemon-sized heap costs 0.5-0.9 s per full collection, see ``_Agg``). ``estimate`` walks
the fallback chain (at most six look-ups) once per (user, name, partition), then answers
from a dictionary. Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from itertools import compress

import msgspec

from slurmgpu.model import Job
from slurmgpu.policy.base import HistoryRecord

__all__ = ["LEVELS", "Estimate", "Priors", "quantile_nearest_rank"]

LEVELS = (
    "user+script+partition",
    "user+script",
    "user+name+partition",
    "user+name",
    "user+partition",
    "user",
)
_CPU_SATURATED = 0.9  # a run averaging >= 90 % of its cores may have wanted more


def quantile_nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """Return the nearest-rank ``q`` quantile: the smallest value with >= q of the mass.

    Never interpolates below an observed value, so a time limit built on it covers at
    least ``q`` of past runs.

    >>> quantile_nearest_rank([10.0, 20.0, 30.0], 0.5)
    20.0
    >>> quantile_nearest_rank([10.0, 20.0, 30.0], 0.95)
    30.0
    """
    if not sorted_values:
        raise ValueError("no values")
    return sorted_values[_rank(q, len(sorted_values)) - 1]


class Estimate(msgspec.Struct, frozen=True, gc=False):
    """What runs at one history key used; ``level`` says which key answered.

    ``run_time`` is the nearest-rank ``quantile`` of past run times. Memory and GPU
    figures are maxima over the samples (a request must cover the worst run); CPU has
    the mean and the largest of the runs' mean core use (``100`` = one core).
    ``cpu_saturated``: some run averaged >= 90 % of its cores, so its real demand is
    unknown. ``gpus_used`` is the most GPUs any run kept busy, over ``gpus_used_samples``
    runs that had GPU samples; ``gpus_requested`` the most any run asked for.

    A frozen ``msgspec.Struct`` (like ``Action``), untracked by the garbage collector:
    the first cycle after a history reload builds one per key and GPU count in the
    queue, tens of thousands, and a frozen dataclass costs several times as much to build.
    """

    level: str
    key: tuple[str, ...]
    samples: int
    quantile: float
    run_time: timedelta
    max_run_time: timedelta
    timeouts: int
    peak_memory_mib: float | None
    peak_node_memory_mib: float | None
    mean_cpu_pct: float | None
    max_cpu_pct: float | None
    cpu_saturated: bool
    mean_gpu_util_pct: float | None
    peak_gpu_memory_mib: float | None
    gpus_used: int | None
    gpus_used_samples: int
    gpus_requested: int
    oom_runs: int
    gpus: int | None = None  # the GPU count the run time is for (None: not GPU-aware)
    gpu_samples: int = 0  # runs that asked for exactly ``gpus``
    gpu_scaled: bool = False  # run times of other GPU counts were scaled to ``gpus``
    # Samples whose job Slurm restarted (HistoryRecord.restarts): their run time is the
    # last run's only, so the quantile may be short of what such a job needs in all.
    restarted_runs: int = 0


_SAMPLE, _TIMEOUT, _OOM, _IGNORED = range(4)
_STATE_KINDS: dict[str, int] = {"COMPLETED": _SAMPLE, "TIMEOUT": _TIMEOUT}


def _state_kind(state: str) -> int:
    """Return how a run that ended in ``state`` counts (memoised: few distinct strings)."""
    kind = _STATE_KINDS.get(state)
    if kind is None:
        # sacct prints "CANCELLED by 1000"; the first word is the state.
        word = state.split(" ", 1)[0].upper()
        kind = {"COMPLETED": _SAMPLE, "TIMEOUT": _TIMEOUT, "OUT_OF_MEMORY": _OOM}.get(
            word, _IGNORED
        )
        if len(_STATE_KINDS) < 4096:
            _STATE_KINDS[state] = kind
    return kind


@functools.lru_cache(maxsize=4096)
def _rank(q: float, n: int) -> int:
    """The nearest rank of the ``q`` quantile among ``n`` sorted values, 1-based.
    Memoised: a first cycle asks it for tens of thousands of keys, of few sizes."""
    return min(n, max(math.ceil(q * n - 1e-9), 1))


def _max(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None or value > current else current


class _Agg(msgspec.Struct, gc=False):
    """Mergeable statistics of one group of history records.

    Untracked by the garbage collector, with its run times in tuples (which the collector
    stops tracking once it has seen them), not lists: a build makes one per key, ~66k on
    200k records, and as ~200k tracked objects they set off two full collections of the
    daemon's heap per build (0.5-0.9 s each on bench/policy.py's case, half of what
    computing every key cost). Nothing refers back to one (no cycle to collect)."""

    _sorted: list[float] | None = None  # run_times sorted, once built
    run_times: tuple[float, ...] = ()
    run_gpus: tuple[int, ...] = ()  # GPUs each sample asked for, parallel to run_times
    timeouts: int = 0
    oom: int = 0
    mem_max: float | None = None
    node_mem_max: float | None = None
    cpu_sum: float = 0.0
    cpu_n: int = 0
    cpu_max: float | None = None
    cpu_saturated: bool = False
    gpu_util_sum: float = 0.0
    gpu_util_n: int = 0
    gpu_mem_max: float | None = None
    gpus_used: int | None = None
    gpus_used_n: int = 0
    gpus_requested: int = 0
    restarted: int = 0  # samples whose job was restarted (their run time: the last run's)

    def add_records(self, records: Iterable[HistoryRecord]) -> None:
        times, gpus = list(self.run_times), list(self.run_gpus)
        for r in records:
            kind = _state_kind(r.state)
            if kind >= _OOM:
                if kind == _OOM:
                    self.oom += 1
                continue
            times.append(r.run_time.total_seconds())
            gpus.append(r.gpus_requested)
            if kind == _TIMEOUT:
                self.timeouts += 1
            if r.restarts:
                self.restarted += 1
            self.mem_max = _max(self.mem_max, r.peak_memory_mib)
            # Without a per-node figure the job's total is a safe (high) stand-in.
            node_peak = r.peak_node_memory_mib
            self.node_mem_max = _max(
                self.node_mem_max, node_peak if node_peak is not None else r.peak_memory_mib
            )
            cpu = r.mean_cpu_pct
            if cpu is not None:
                self.cpu_sum += cpu
                self.cpu_n += 1
                self.cpu_max = _max(self.cpu_max, cpu)
                if r.cpus > 0 and cpu >= _CPU_SATURATED * 100.0 * r.cpus:
                    self.cpu_saturated = True
            if r.mean_gpu_util_pct is not None:
                self.gpu_util_sum += r.mean_gpu_util_pct
                self.gpu_util_n += 1
            self.gpu_mem_max = _max(self.gpu_mem_max, r.peak_gpu_memory_mib)
            if r.gpus_used is not None:
                self.gpus_used = (
                    r.gpus_used if self.gpus_used is None else max(self.gpus_used, r.gpus_used)
                )
                self.gpus_used_n += 1
            self.gpus_requested = max(self.gpus_requested, r.gpus_requested)
        self.run_times, self.run_gpus = tuple(times), tuple(gpus)

    def merge(self, other: _Agg) -> None:
        self.run_times += other.run_times
        self.run_gpus += other.run_gpus
        self.timeouts += other.timeouts
        self.oom += other.oom
        self.mem_max = _max(self.mem_max, other.mem_max)
        self.node_mem_max = _max(self.node_mem_max, other.node_mem_max)
        self.cpu_sum += other.cpu_sum
        self.cpu_n += other.cpu_n
        self.cpu_max = _max(self.cpu_max, other.cpu_max)
        self.cpu_saturated = self.cpu_saturated or other.cpu_saturated
        self.gpu_util_sum += other.gpu_util_sum
        self.gpu_util_n += other.gpu_util_n
        self.gpu_mem_max = _max(self.gpu_mem_max, other.gpu_mem_max)
        if other.gpus_used is not None:
            self.gpus_used = (
                other.gpus_used if self.gpus_used is None else max(self.gpus_used, other.gpus_used)
            )
        self.gpus_used_n += other.gpus_used_n
        self.gpus_requested = max(self.gpus_requested, other.gpus_requested)
        self.restarted += other.restarted

    def sorted_times(self) -> list[float]:
        """``run_times`` sorted (shared: not to be changed), once the group is complete."""
        done = self._sorted
        if done is None:
            done = self._sorted = sorted(self.run_times)
        return done

    def run_time(
        self, gpus: int | None, q: float, min_samples: int
    ) -> tuple[float, float, int, int, bool]:
        """The run-time figures for a job of ``gpus`` GPUs (see the module docstring):
        the nearest-rank ``q`` quantile and the longest of the run times it is taken
        over, how many those are, how many runs had exactly ``gpus`` GPUs, and whether
        other counts were scaled. Raises ValueError when no run time applies.

        The same figures as sorting the run times that apply and reading them, without
        the sort where the quantile is the longest run (its rank is the last: fewer than
        ``1 / (1 - q)`` runs, 20 at 0.95, which is most keys): then one plain loop over
        those few runs, which costs a fifth of what chained ``compress``/``map``
        iterators cost to set up (a first cycle asks this of tens of thousands of keys).
        Scaling by ``g / gpus`` keeps the order of runs (rounding is monotonic), so the
        longest scaled run is the longest ``t * g`` scaled."""
        run_times = self.run_times
        n = len(run_times)
        if gpus is None or gpus <= 0:
            if not n:
                raise ValueError("no values")
            rank = _rank(q, n)
            if rank == n and self._sorted is None:
                top = max(run_times)
                return top, top, n, 0, False
            times = self.sorted_times()
            return times[rank - 1], times[-1], n, 0, False
        run_gpus = self.run_gpus
        same_n = run_gpus.count(gpus)
        if same_n >= min_samples or same_n == n:  # from the runs with as many GPUs only
            if not same_n:
                raise ValueError("no values")
            if _rank(q, same_n) == same_n:
                top = -math.inf
                for t, g in zip(run_times, run_gpus, strict=True):
                    if g == gpus and t > top:
                        top = t
                return top, top, same_n, same_n, False
            same = sorted(compress(run_times, map(gpus.__eq__, run_gpus)))
            return same[_rank(q, same_n) - 1], same[-1], same_n, same_n, False
        rank = _rank(q, n)
        if self.gpus_requested <= gpus:  # no run asked for more: none is scaled
            if rank == n:
                top = max(run_times)
                return top, top, n, same_n, True
            times = self.sorted_times()
            return times[rank - 1], times[-1], n, same_n, True
        if rank == n:
            # some run asked for more than ``gpus`` (gpus_requested): ``longest`` is set
            longest = unscaled = -math.inf
            for t, g in zip(run_times, run_gpus, strict=True):
                if g > gpus:
                    longest = max(longest, t * g)
                elif t > unscaled:
                    unscaled = t
            top = max(longest / gpus, unscaled)
            return top, top, n, same_n, True
        scaled = sorted(
            [t * g / gpus if g > gpus else t for t, g in zip(run_times, run_gpus, strict=True)]
        )
        return scaled[rank - 1], scaled[-1], n, same_n, True

    def estimate(
        self,
        level: str,
        key: tuple[str, ...],
        q: float,
        gpus: int | None = None,
        min_samples: int = 1,
    ) -> Estimate:
        quantile, longest, samples, gpu_samples, scaled = self.run_time(gpus, q, min_samples)
        # Positional, in Estimate's field order: a first cycle builds tens of thousands,
        # and msgspec matches 21 keywords by name on each.
        return Estimate(
            level,
            key,
            samples,
            q,
            timedelta(seconds=quantile),
            timedelta(seconds=longest),
            self.timeouts,
            self.mem_max,
            self.node_mem_max,
            self.cpu_sum / self.cpu_n if self.cpu_n else None,
            self.cpu_max,
            self.cpu_saturated,
            self.gpu_util_sum / self.gpu_util_n if self.gpu_util_n else None,
            self.gpu_mem_max,
            self.gpus_used,
            self.gpus_used_n,
            self.gpus_requested,
            self.oom,
            gpus if gpus is not None and gpus > 0 else None,
            gpu_samples,
            scaled,
            self.restarted,
        )


_UNKNOWN = object()  # not computed yet (None is a computed "too few samples")

# Keys are tuples tagged with their level's index in LEVELS, so one dict holds all levels:
# (0, user, script, partition), (1, user, script), (2, user, name, partition),
# (3, user, name), (4, user, partition), (5, user).
_Key = tuple[int | str, ...]


class Priors:
    """Estimates per history key; build with :meth:`from_history`.

    Building only groups the records (one dictionary operation per record, plus one per
    group for the coarser levels). A key's statistics are computed the first time a job
    needs them and kept, so keeping one ``Priors`` across cycles makes ``estimate`` a
    dictionary look-up for every key seen before.

    >>> from datetime import UTC, datetime
    >>> from slurmgpu.model import JobState
    >>> r = HistoryRecord("ann", "train", "gpu", None, "COMPLETED", timedelta(hours=1),
    ...     timedelta(hours=8), 1, 1, 4, 4096, 2000.0, 150.0, 80.0, 9000.0,
    ...     datetime(2025, 1, 1, tzinfo=UTC))
    >>> p = Priors.from_history([r, r, r])
    >>> est = p.estimate(Job(1, "train", "ann", JobState.PENDING, partition="gpu"))
    >>> est.level, est.samples, est.run_time
    ('user+name+partition', 3, datetime.timedelta(seconds=3600))
    """

    def __init__(
        self,
        groups: Mapping[_Key, Sequence[HistoryRecord]],
        children: Mapping[_Key, Sequence[_Key]],
        *,
        quantile: float,
        min_samples: int,
        by_gpus: bool = True,
    ) -> None:
        self._groups = groups  # finest keys (levels 0 and 2) -> their records
        self._children = children  # coarser keys -> the finer keys they sum
        self.quantile = quantile
        self.min_samples = min_samples
        self.by_gpus = by_gpus
        self._aggs: dict[_Key, _Agg] = {}
        self._estimates: dict[tuple[_Key, int | None], Estimate | None] = {}
        # (user, name, partition, script hash, GPUs) -> answer, so a key pending jobs
        # share walks the fallback chain once.
        self._resolved: dict[tuple[str, str, str, str | None, int | None], Estimate | None]
        self._resolved = {}
        # (user, name, partition) -> the finest key with enough samples (``answer``)
        self._answers: dict[tuple[str, str, str], _Key | None] = {}
        # The keys, at every level, whose runs differ from the priors the last
        # carry_over took statistics from (empty until then).
        self.changed_keys: frozenset[_Key] = frozenset()

    @classmethod
    def from_history(
        cls,
        records: Iterable[HistoryRecord],
        *,
        quantile: float = 0.95,
        min_samples: int = 3,
        by_gpus: bool = True,
    ) -> Priors:
        """Return priors over ``records``; keys with < ``min_samples`` samples never answer.

        ``by_gpus`` false: run times pool every GPU count, as if all runs were the job's.
        """
        groups: dict[_Key, list[HistoryRecord]] = {}
        for r in records:
            key: _Key = (2, r.user, r.name, r.partition)
            group = groups.get(key)
            if group is None:
                groups[key] = [r]
            else:
                group.append(r)
            if r.script_hash:
                groups.setdefault((0, r.user, r.script_hash, r.partition), []).append(r)
        children: dict[_Key, list[_Key]] = {}
        for key in groups:
            tag, user, middle, partition = key
            if tag == 0:
                children.setdefault((1, user, middle), []).append(key)
            else:
                children.setdefault((3, user, middle), []).append(key)
                user_partition = (4, user, partition)
                siblings = children.get(user_partition)
                if siblings is None:
                    children[user_partition] = [key]
                    # The user level sums its (fewer) user+partition groups.
                    children.setdefault((5, user), []).append(user_partition)
                else:
                    siblings.append(key)
        # As tuples: untracked by the garbage collector once it has seen them (their
        # records and keys are), where ~66k lists would stay tracked and set off full
        # collections of the daemon's heap (see _Agg).
        return cls(
            {key: tuple(records) for key, records in groups.items()},
            {key: tuple(finer) for key, finer in children.items()},
            quantile=quantile,
            min_samples=min_samples,
            by_gpus=by_gpus,
        )

    def __len__(self) -> int:
        """Return how many history keys there are, over all levels."""
        return len(self._groups) + len(self._children)

    def prepare(self) -> int:
        """Compute every key's statistics now (e.g. off the cycle); return how many answer."""
        return sum(1 for key in (*self._groups, *self._children) if self._at(key) is not None)

    def carry_over(self, old: Priors) -> frozenset[str] | None:
        """Take ``old``'s computed statistics over for every key whose runs are the same
        here; return the users whose history differs (None: nothing taken, ``old`` was
        built with other settings), and leave the keys that differ, at every level, in
        :attr:`changed_keys`. ``old`` gives them up: it stays correct, and computes again
        whatever it is asked.

        Every key, at every level, holds one user's runs only. A finest group (script
        and name keys) holding equal records in equal order has the same statistics, and
        so has a coarser key none of whose finer groups changed. A daemon reloads 90 days
        of history every few minutes and only the groups whose jobs ended (or left the
        window) since then differ: they and the coarser keys above them are computed
        again on first use, every other key's are the ones already computed (the same
        ``Estimate`` objects), the changed users' other names included. Costs one list
        comparison per group, no statistics.
        """
        if (old.quantile, old.min_samples, old.by_gpus) != (
            self.quantile,
            self.min_samples,
            self.by_gpus,
        ):
            return None
        mine, theirs = self._groups, old._groups
        finest = [key for key, records in mine.items() if theirs.get(key) != records]
        finest.extend(key for key in theirs if key not in mine)
        changed_keys: set[_Key] = set()
        changed: set[str] = set()
        for key in finest:
            tag, user, middle, partition = key
            changed.add(str(user))
            changed_keys.add(key)
            if tag == 0:
                changed_keys.add((1, user, middle))
            else:
                changed_keys.update(((3, user, middle), (4, user, partition), (5, user)))
        # Take old's caches over (cheaper than copying the unchanged keys' entries: a
        # reload changes few), less the changed keys' statistics and the changed users'
        # answers, plus any entry computed here already. ``old`` is left with empty
        # caches: still correct, it computes again what it is asked.
        aggs, estimates, resolved = old._aggs, old._estimates, old._resolved
        answers = old._answers
        old._aggs, old._estimates, old._resolved, old._answers = {}, {}, {}, {}
        if changed:
            for key in [k for k in aggs if k in changed_keys]:
                del aggs[key]
            for memo in [m for m in estimates if m[0] in changed_keys]:
                del estimates[memo]
            for job_key in [k for k in resolved if k[0] in changed]:
                del resolved[job_key]
            for name_key in [k for k in answers if k[0] in changed]:
                del answers[name_key]
        aggs.update(self._aggs)
        estimates.update(self._estimates)
        resolved.update(self._resolved)
        answers.update(self._answers)
        self._aggs, self._estimates, self._resolved = aggs, estimates, resolved
        self._answers = answers
        self.changed_keys = frozenset(changed_keys)
        return frozenset(changed)

    @staticmethod
    def chain(user: str, name: str, partition: str) -> tuple[_Key, ...]:
        """The keys :meth:`answer` tries for jobs of ``user``, ``name`` and
        ``partition``, finest first: its answer is the first with enough samples, so it
        stays the same while none of them up to it is among :attr:`changed_keys`."""
        if partition and "," not in partition:
            return ((2, user, name, partition), (3, user, name), (4, user, partition), (5, user))
        return ((3, user, name), (5, user))

    def key_estimates(self) -> Iterable[tuple[tuple[str, str, str], Estimate]]:
        """(user, job name, partition) → estimate, for every such key that answers."""
        for key in self._groups:
            if key[0] == 2:
                est = self._at(key)
                if est is not None:
                    yield (str(key[1]), str(key[2]), str(key[3])), est

    def user_estimates(self) -> Iterable[tuple[str, Estimate]]:
        """user → estimate over all the user's jobs, for every user that answers."""
        for key in self._children:
            if key[0] == 5:
                est = self._at(key)
                if est is not None:
                    yield str(key[1]), est

    def _agg(self, key: _Key) -> _Agg | None:
        agg = self._aggs.get(key)
        if agg is not None:
            return agg
        records = self._groups.get(key)
        if records is not None:
            agg = _Agg()
            agg.add_records(records)
        else:
            finer = self._children.get(key)
            if finer is None:
                return None
            agg = _Agg()
            for child in finer:
                part = self._agg(child)
                if part is not None:
                    agg.merge(part)
        self._aggs[key] = agg
        return agg

    def _at(self, key: _Key, gpus: int | None = None) -> Estimate | None:
        """Return the estimate at one key for a job of ``gpus`` GPUs (None: any), or None
        when the key has too few samples."""
        memo = (key, gpus)
        known = self._estimates.get(memo, _UNKNOWN)
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
        agg = self._aggs.get(key) or self._agg(key)
        est = None
        if agg is not None and len(agg.run_times) >= self.min_samples:
            est = agg.estimate(
                LEVELS[int(key[0])],
                key[1:],  # type: ignore[arg-type]  # past the level tag, every part is a str
                self.quantile,
                gpus,
                self.min_samples,
            )
        self._estimates[memo] = est
        return est

    def answer(self, user: str, name: str, partition: str) -> _Key | None:
        """Return the finest key (script levels aside) that answers for jobs of ``user``,
        ``name`` and ``partition``, or None: the key :meth:`estimate` answers from for such
        a job without a script hash, whatever its GPU count (a key answers when it has
        ``min_samples`` samples; the GPU count changes only the run times it gives).

        With :meth:`key_estimate` and :meth:`run_time`, what :meth:`estimate` gives, in
        parts: a queue holds many GPU counts of each key, and only the run time differs
        between them, so a caller that needs no ``Estimate`` per GPU count builds none.
        """
        memo = (user, name, partition)
        answers = self._answers
        if memo in answers:
            return answers[memo]
        min_samples = self.min_samples
        aggs = self._aggs
        found: _Key | None = None
        if partition and "," not in partition:
            # the finest key answers for most names: its tuple alone is built for them
            key: _Key = (2, user, name, partition)
            agg = aggs.get(key) or self._agg(key)
            if agg is not None and len(agg.run_times) >= min_samples:
                answers[memo] = key
                return key
            keys = self.chain(user, name, partition)[1:]
        else:
            keys = self.chain(user, name, partition)
        for key in keys:
            agg = aggs.get(key) or self._agg(key)
            if agg is not None and len(agg.run_times) >= min_samples:
                found = key
                break
        answers[memo] = found
        return found

    def key_estimate(self, key: _Key) -> Estimate | None:
        """Return the estimate at ``key`` over every GPU count (as :meth:`prepare` computes
        it), or None when the key has too few samples. Its figures other than the run
        times are those of the key's estimate for any GPU count."""
        return self._at(key)

    def run_time(self, key: _Key, gpus: int | None) -> tuple[float, int, int, bool]:
        """Return the run-time part of the estimate at ``key`` (which must answer) for a
        job of ``gpus`` GPUs (None: any): ``run_time`` in seconds (as the ``Estimate``'s
        timedelta holds it), ``samples``, ``gpu_samples`` and ``gpu_scaled``."""
        agg = self._aggs.get(key) or self._agg(key)
        assert agg is not None  # the caller's key answers
        q, _, samples, same_n, scaled = agg.run_time(gpus, self.quantile, self.min_samples)
        # in seconds as the Estimate's timedelta holds it (to the microsecond); a whole
        # number of seconds (every run time that is not scaled) is held as it is
        if not q.is_integer():
            q = timedelta(seconds=q).total_seconds()
        return q, samples, same_n, scaled

    def estimate(self, job: Job, *, script_hash: str | None = None) -> Estimate | None:
        """Return the estimate for ``job``'s GPU count from the finest key with enough
        samples, or None."""
        gpus = (job.gpus.gpus or None) if self.by_gpus else None
        key = (job.user, job.name, job.partition, script_hash, gpus)
        if key in self._resolved:
            return self._resolved[key]
        est = self._resolve(job, script_hash, gpus)
        self._resolved[key] = est
        return est

    def _resolve(self, job: Job, script_hash: str | None, gpus: int | None) -> Estimate | None:
        at = self._at
        user, partition = job.user, job.partition
        one_partition = bool(partition) and "," not in partition
        # Finest key first; tried in this order, each built only when the finer missed.
        if script_hash:
            if one_partition and (est := at((0, user, script_hash, partition), gpus)):
                return est
            if est := at((1, user, script_hash), gpus):
                return est
        if one_partition and (est := at((2, user, job.name, partition), gpus)):
            return est
        if est := at((3, user, job.name), gpus):
            return est
        if one_partition and (est := at((4, user, partition), gpus)):
            return est
        return at((5, user), gpus)

"""What each simulated job does: how much work, how fast at each size, its user's limit.

A :class:`TraceJob` is one row of a trace, already resolved: when it is submitted, who
by, what it asks Slurm for, and a :class:`JobModel` that says how fast it progresses on a
given placement. Two models:

- :class:`ProfiledJob`: a Pollux application at a fixed global batch size; work is
  optimiser steps and speed comes from the measured profile (:mod:`.profiles`), so it
  depends on GPUs *and* placement.
- :class:`RigidJob`: a job known only by its run time at its requested size (Philly,
  sacct, generic CSV). Work is seconds at that size; at another size it speeds up by
  Amdahl's law with parallel fraction ``parallel_fraction`` (0.95 unless given).

User time limits (:class:`TimeLimitModel`): the real run time times a seeded log-normal
overestimate (median ``median_factor`` 3x, ``sigma`` 0.8, at least ``min_factor``
1.25x), rounded *up* to the values people type (15 and 30 min, 1, 2, 4, 8, 12 h, then
whole days), capped at ``max_limit`` (7 days). Slurm users ask for several times what
they need (docs/ANCHORS.md §5); the rounding is why a few round values dominate real
limits. Same seed, same limits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Protocol

from slurmgpu.policy.goodput import BatchChoice, best_batch, goodput
from slurmgpu.sim.profiles import Application, ThroughputProfile

__all__ = [
    "JobModel",
    "MalleableRange",
    "ProfiledJob",
    "RigidJob",
    "TimeLimitModel",
    "TraceJob",
    "elastic_batch",
]


class JobModel(Protocol):
    """How a job progresses: ``work`` units in total, ``rate(placement)`` units per second."""

    work: float
    util_pct: float
    memory_mib: float

    def rate(self, placement: Sequence[int]) -> float: ...

    def run_time(self, gpus: int, gpus_per_node: int) -> float:
        """Seconds to finish on ``gpus`` packed onto as few nodes as possible."""
        ...


@lru_cache(maxsize=4096)
def packed(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """``packed(6, 4) == (4, 2)``: the compact placement Slurm's best fit gives."""
    out: list[int] = []
    while sum(out) < gpus:
        out.append(min(gpus_per_node, gpus - sum(out)))
    return tuple(out)


@dataclass(slots=True)
class ProfiledJob:
    """A Pollux application at a fixed batch size; speed from its measured profile."""

    app: Application
    profile: ThroughputProfile
    batch_size: int
    work: float = 0.0
    util_pct: float = 0.0
    memory_mib: float = 0.0

    # ``(lo, hi)``: the job trains on the elastic runtime, which retunes its global batch
    # within these limits at every (re)start to the best goodput on its GPUs
    # (:func:`slurmgpu.policy.goodput.best_batch`, as Pollux's agent does); work is then
    # the application's efficiency-weighted progress instead of steps at one batch.
    batch_limits: tuple[int, int] | None = None
    # With batch limits: the efficiency of the slice of training the job is in (its noise
    # scale phi_k), not the run's average; the runtime picks the batch at each (re)start
    # from the phi it measured so far (elastic.scaling.best_global_batch) and keeps it for
    # the run (:meth:`phase_batch`, :meth:`rate_in`).
    phased: bool = False
    _rates: dict[tuple[int, ...], float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.batch_limits is None:
            self.work = float(self.app.steps(self.batch_size))
        else:
            self.work = float(self.app.progress)
        self.util_pct = self.app.util_pct
        self.memory_mib = self.app.memory_mib

    def _step_time(self, placement: Sequence[int], batch: int) -> float:
        return self.profile.step_time(
            placement,
            batch,
            max_local_bsz=self.app.max_local_bsz,
            init_batch_size=self.app.init_batch_size,
        )

    def rate(self, placement: Sequence[int]) -> float:
        # memoised: the simulator asks for every running job's sizes every cycle
        key = tuple(placement)
        r = self._rates.get(key)
        if r is None:
            if self.batch_limits is None:
                r = 1.0 / self._step_time(placement, self.batch_size)
            else:
                r = self.best(placement).goodput
            self._rates[key] = r
        return r

    def best(self, placement: Sequence[int]) -> BatchChoice:
        """The batch the runtime trains at on ``placement`` (batch-adaptive jobs), or the
        fixed batch with its goodput."""
        app = self.app
        b0 = app.init_batch_size
        if self.batch_limits is None:
            t = self._step_time(placement, self.batch_size)
            eff = app.efficiency(self.batch_size)
            return BatchChoice(
                sum(placement), self.batch_size, goodput(self.batch_size, b0, t, eff), eff
            )
        lo, hi = self.batch_limits
        return _best_batch(app, self.profile, tuple(placement), lo, hi, self.batch_size)

    @property
    def phases(self) -> int:
        """Slices of training whose efficiency differs (1: the run's average)."""
        return len(self.app.noise_scale) if self.phased and self.batch_limits else 1

    def phase(self, work: float) -> int:
        """The slice of training ``work`` units of progress are in."""
        k = self.phases
        if k == 1:
            return 0
        return min(k - 1, int((work + 1e-9 * self.work) * k / self.work))

    def phase_end(self, work: float) -> float:
        """The progress at which the slice ``work`` is in ends (``work`` total for the
        last slice, and for a job of one phase)."""
        k = self.phases
        if k == 1:
            return self.work
        return self.work * (self.phase(work) + 1) / k

    def phase_batch(self, placement: Sequence[int], work: float) -> int:
        """The batch the runtime picks on ``placement`` with ``work`` done: the best
        goodput at the noise scale of the slice it is in."""
        lo, hi = self.batch_limits or (self.batch_size, self.batch_size)
        return _best_batch(
            self.app, self.profile, tuple(placement), lo, hi, self.batch_size, self.phase(work)
        ).batch

    def rate_in(self, placement: Sequence[int], batch: int, work: float) -> float:
        """Progress per second at ``batch`` on ``placement`` in the slice of ``work``."""
        eff = self.app.efficiency_in(batch, self.phase(work))
        return goodput(batch, self.app.init_batch_size, self._step_time(placement, batch), eff)

    def adaptive(self, lo: int | None = None, hi: int | None = None) -> ProfiledJob:
        """This job on the elastic runtime with batch-size adaptation within ``[lo, hi]``
        (default: the application's initial batch ``B0`` up to the batch it was
        submitted with -- the user's own batch is the most it trains at)."""
        low = lo if lo is not None else min(self.app.init_batch_size, self.batch_size)
        high = hi if hi is not None else self.batch_size
        return ProfiledJob(self.app, self.profile, self.batch_size, batch_limits=(low, high))

    def run_time(self, gpus: int, gpus_per_node: int) -> float:
        return self.work / self.rate(packed(gpus, gpus_per_node))


@lru_cache(maxsize=65536)
def _best_batch(
    app: Application,
    profile: ThroughputProfile,
    placement: tuple[int, ...],
    lo: int,
    hi: int,
    current: int,
    phase: int = -1,
) -> BatchChoice:
    """The runtime's batch choice, shared by every job of the same application and limits:
    at the run's average efficiency, or (``phase`` >= 0) at that slice's noise scale."""
    return best_batch(
        sum(placement),
        lambda b: profile.step_time(
            placement,
            b,
            max_local_bsz=app.max_local_bsz,
            init_batch_size=app.init_batch_size,
        ),
        app.efficiency if phase < 0 else (lambda b: app.efficiency_in(b, phase)),
        init_batch=app.init_batch_size,
        lo=lo,
        hi=hi,
        current=current,
    )


@dataclass(slots=True)
class RigidJob:
    """A job known by its run time at ``base_gpus``; Amdahl speed-up elsewhere."""

    duration_s: float
    base_gpus: int
    parallel_fraction: float = 0.95
    util_pct: float = 100.0
    memory_mib: float = 0.0
    work: float = 0.0

    def __post_init__(self) -> None:
        self.work = float(self.duration_s)

    def _speedup(self, gpus: int) -> float:
        p = self.parallel_fraction
        return 1.0 / ((1.0 - p) + p / max(1, gpus))

    def rate(self, placement: Sequence[int]) -> float:
        gpus = sum(placement)
        if gpus == self.base_gpus or self.base_gpus <= 0:
            return 1.0
        return self._speedup(gpus) / self._speedup(self.base_gpus)

    def run_time(self, gpus: int, gpus_per_node: int) -> float:
        return self.work / self.rate(packed(gpus, gpus_per_node))


@dataclass(frozen=True, slots=True)
class MalleableRange:
    """A job that opted in to resizing, between ``min_gpus`` and ``max_gpus``."""

    min_gpus: int
    max_gpus: int


@dataclass(slots=True)
class TraceJob:
    """One job of a trace, ready to submit to :class:`~slurmgpu.sim.slurm.SimSlurm`.

    ``gpus`` is the whole-GPU request (``--gpus=N``, Slurm places it on any nodes), or
    with ``gpus_per_node`` K the ``--gres=gpu:K`` form (``gpus / K`` nodes of K GPUs;
    what co-location can turn into shards); ``shards`` a ``gres/shard`` request instead.
    ``time_limit_s`` None means no limit. ``gpu_type`` (None: any) is the GPU type the
    job asked for; on a heterogeneous cluster it runs only on nodes of that type.
    """

    submit_s: float
    name: str
    user: str
    model: JobModel
    gpus: int = 1
    shards: int = 0
    gpus_per_node: int | None = None
    time_limit_s: float | None = None
    account: str = ""
    partition: str = "gpu"
    malleable: MalleableRange | None = None
    line: int = 0  # where it came from, for messages
    comment: str = ""
    array_tasks: int = 0  # > 0: an array of this many identical tasks
    array_throttle: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    gpu_type: str | None = None  # ``--gres=gpu:TYPE:N``: only nodes of that type


_ROUND_S = (
    15 * 60,
    30 * 60,
    3600,
    2 * 3600,
    4 * 3600,
    8 * 3600,
    12 * 3600,
)


@dataclass(frozen=True, slots=True)
class TimeLimitModel:
    """Seeded user time limits: real run time times a log-normal overestimate, rounded up."""

    median_factor: float = 3.0
    sigma: float = 0.8
    min_factor: float = 1.25
    max_limit_s: float = 7 * 86400.0

    def limit(self, run_time_s: float, rng: random.Random) -> float:
        """Return a time limit for a job that really runs ``run_time_s`` seconds."""
        factor = max(self.min_factor, math.exp(rng.gauss(math.log(self.median_factor), self.sigma)))
        wanted = run_time_s * factor
        for r in _ROUND_S:
            if wanted <= r:
                return float(r)
        days = math.ceil(wanted / 86400.0 - 1e-9) * 86400.0
        # The cap never cuts a job below its own need: a trace with week-long runs keeps them.
        floor = math.ceil(run_time_s * self.min_factor / 86400.0 - 1e-9) * 86400.0
        return float(max(min(self.max_limit_s, days), floor))


def elastic_batch(
    trace: Sequence[TraceJob], ceilings: Mapping[str, int] | None = None, *, phased: bool = False
) -> list[TraceJob]:
    """``trace`` with its profiled jobs on the elastic runtime's batch-size adaptation
    (:meth:`ProfiledJob.adaptive`: from ``B0`` up to the batch each was submitted with);
    other jobs unchanged. The sets whose goodput allocator retunes batch sizes run this
    (``slurmgpu.sim.policysets.BATCH_ADAPTIVE``); baselines keep the submitted batch.

    ``ceilings`` (application name -> batch): a job of that application declares that
    batch as its upper limit instead (never below the batch it was submitted with) --
    the what-if of users who let the runtime train at any batch the application was
    validated at, as Pollux's jobs may (``sim.pollux.MAX_BATCH_SIZE``). ``phased``: their
    efficiency follows the slice of training they are in (:attr:`ProfiledJob.phased`)."""
    out: list[TraceJob] = []
    for job in trace:
        model = job.model
        if isinstance(model, ProfiledJob) and model.batch_limits is None:
            top = (ceilings or {}).get(model.app.name)
            hi = max(model.batch_size, top) if top is not None else None
            adaptive = model.adaptive(hi=hi)
            adaptive.phased = phased
            out.append(replace(job, model=adaptive))
        else:
            out.append(job)
    return out

"""How fast a malleable job runs at a GPU count it has not tried, from the counts it ran at.

Pollux (OSDI'21; docs/ANCHORS.md §2) models a data-parallel step at a fixed global batch
as compute that divides over the GPUs plus synchronisation that does not. We fit the
same shape, as *seconds per unit of work* (the inverse of throughput) on ``n`` GPUs::

    t(n) = serial + parallel / n + sync * [n > 1] + per_gpu * (n - 1)

all four terms non-negative: ``serial + parallel / n`` is Amdahl's law (the compute of a
step at local batch ``B / n`` plus its fixed overheads); ``sync`` the all-reduce that
appears with a second GPU; ``per_gpu`` its growth with every further replica (Pollux's
``T_sync = alpha + beta * (K - 2)``), which makes throughput fall again past a job's best
size, as several measured models do. A term for the nodes spanned did not lower the
held-out error (``bench/speedup_fit.py``), so the curve ignores placement. Throughput is
``1 / t(n)``; the unit of work is whatever the job's runtime reports (samples or steps per
second) and cancels in every ratio a policy uses.

A job has usually run at one or two sizes, so the fit is regularised towards a prior
*shape* (:class:`SpeedupPrior`, relative to the time on one GPU) scaled to the job's
measurements: with one measurement the curve is the prior through that point; with more,
the data pull the terms away from it (ridge penalty ``prior.weight``). The default prior
was chosen on the measured Pollux profiles (``shared/data/pollux/profiles``, six models)
by ``bench/speedup_fit.py``, which also reports the held-out error of this fit against
linear scaling (``x(n) = x(n0) * n / n0``, what assuming perfect scaling gives) and a
plain two-term Amdahl fit.

Predictions at a size that was measured are the measurement; elsewhere the fitted curve
is rescaled so it passes through the nearest measured size (the fit's error there is the
best estimate of its error nearby).

Pure and fast: non-negative least squares over four terms by enumerating the 15 supports
(closed-form normal equations, no numpy), memoised on the measurements, so a cycle that
sees the same measurements again pays a dictionary look-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

__all__ = [
    "DEFAULT_PRIOR",
    "SpeedupCurve",
    "SpeedupPrior",
    "fit_amdahl",
    "fit_speedup",
    "linear_scaling",
]

_TERMS = 4


@dataclass(frozen=True, slots=True)
class SpeedupPrior:
    """The shape of ``t(n)`` assumed before measurements, relative to ``t(1) = 1``.

    ``serial`` is Amdahl's serial fraction (the parallel part is ``1 - serial``); ``sync``
    and ``per_gpu`` are the extra time of a second GPU and of each further GPU, as
    fractions of the time on one GPU. ``weight``: how strongly the prior holds each term
    against measurements (0 trusts the measurements alone; the relative error of one
    measurement weighs 1).

    The defaults were chosen on all six measured Pollux models by
    ``bench/speedup_fit.py --choose-prior``: with them, one measurement on 1 GPU predicts
    ``1 / (0.015 + 0.985 / 8 + 0.03) = 6.0x`` on 8 GPUs.
    """

    serial: float = 0.015
    sync: float = 0.03
    per_gpu: float = 0.0
    weight: float = 10.0

    def __post_init__(self) -> None:
        for name in ("serial", "sync", "per_gpu", "weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"speedup prior {name} must be a number >= 0, not {value!r}")
        if self.serial > 1:
            raise ValueError(f"speedup prior serial must be <= 1, not {self.serial!r}")

    def shape(self) -> tuple[float, float, float, float]:
        return (self.serial, 1.0 - self.serial, self.sync, self.per_gpu)


DEFAULT_PRIOR = SpeedupPrior()


def _features(gpus: int) -> tuple[float, float, float, float]:
    return (1.0, 1.0 / gpus, 1.0 if gpus > 1 else 0.0, float(gpus - 1))


@dataclass(frozen=True, slots=True)
class SpeedupCurve:
    """A fitted ``t(n)`` (seconds per unit of work) and the measurements it came from."""

    serial: float
    parallel: float
    sync: float
    per_gpu: float
    measured: tuple[tuple[int, float], ...]  # (gpus, throughput), sorted by gpus

    def fitted_time(self, gpus: int) -> float:
        """Return the curve's seconds per unit of work on ``gpus`` GPUs (no rescaling)."""
        f = _features(gpus)
        return self.serial * f[0] + self.parallel * f[1] + self.sync * f[2] + self.per_gpu * f[3]

    def throughput(self, gpus: int) -> float:
        """Return the predicted throughput on ``gpus`` GPUs (the measurement if there is one)."""
        if gpus < 1:
            return 0.0
        nearest_gpus, nearest_rate = min(
            self.measured, key=lambda m: (abs(math.log(m[0] / gpus)), m[0])
        )
        if nearest_gpus == gpus:
            return nearest_rate
        here = self.fitted_time(gpus)
        there = self.fitted_time(nearest_gpus)
        if here <= 0 or there <= 0:
            return nearest_rate * gpus / nearest_gpus
        return nearest_rate * there / here

    def speedup(self, gpus: int, base: int) -> float:
        """Return throughput on ``gpus`` over throughput on ``base`` GPUs."""
        b = self.throughput(base)
        return self.throughput(gpus) / b if b > 0 else 0.0

    def best_size(self, low: int, high: int) -> int:
        """Return the size in ``[low, high]`` with the highest throughput (smallest on ties)."""
        best, best_rate = low, -1.0
        for n in range(low, high + 1):
            rate = self.throughput(n)
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = n, rate
        return best


def _clean(observations: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    return tuple(
        sorted(
            (int(g), float(r))
            for g, r in observations.items()
            if g >= 1 and isinstance(r, int | float) and math.isfinite(r) and r > 0
        )
    )


def fit_speedup(
    observations: Mapping[int, float], prior: SpeedupPrior = DEFAULT_PRIOR
) -> SpeedupCurve | None:
    """Return the curve through a job's measured ``{gpus: throughput}``; None without any.

    Throughputs that are not finite and positive, and sizes below 1, are ignored.
    """
    measured = _clean(observations)
    if not measured:
        return None
    return _fit(measured, prior)


@lru_cache(maxsize=8192)
def _fit(measured: tuple[tuple[int, float], ...], prior: SpeedupPrior) -> SpeedupCurve:
    shape = prior.shape()
    # The prior's scale: the geometric mean of measured time over the shape's time.
    logs = [math.log((1.0 / r) / max(1e-12, _dot(shape, _features(g)))) for g, r in measured]
    scale = math.exp(sum(logs) / len(logs))
    if len(measured) == 1:  # the prior through the one point fits it exactly
        a, b, c, d = (scale * x for x in shape)
        return SpeedupCurve(a, b, c, d, measured)
    rows: list[tuple[tuple[float, ...], float]] = []
    for g, r in measured:
        t = 1.0 / r
        f = _features(g)
        rows.append((tuple(x / t for x in f), 1.0))  # relative residual
    w = math.sqrt(prior.weight)
    for j in range(_TERMS):
        unit = tuple(w / scale if i == j else 0.0 for i in range(_TERMS))
        rows.append((unit, w * shape[j]))
    theta = _nnls(rows)
    return SpeedupCurve(theta[0], theta[1], theta[2], theta[3], measured)


def fit_amdahl(observations: Mapping[int, float]) -> SpeedupCurve | None:
    """Return a plain two-term Amdahl fit ``t(n) = serial + parallel / n`` (a baseline).

    With one measurement it is linear scaling (no serial part).
    """
    measured = _clean(observations)
    if not measured:
        return None
    rows = [((1.0 * r, r / g), 1.0) for g, r in measured]  # relative residuals: t * r - 1
    rows4 = [((a, b, 0.0, 0.0), y) for (a, b), y in rows]
    if len({g for g, _ in measured}) < 2:
        g, r = measured[0]
        return SpeedupCurve(0.0, g / r, 0.0, 0.0, measured)
    theta = _nnls(rows4, terms=2)
    return SpeedupCurve(theta[0], theta[1], 0.0, 0.0, measured)


def linear_scaling(observations: Mapping[int, float], gpus: int) -> float:
    """Return the linear-scaling guess at ``gpus``: the nearest measurement times n / n0."""
    measured = _clean(observations)
    if not measured:
        return 0.0
    g, r = min(measured, key=lambda m: (abs(math.log(m[0] / gpus)), m[0]))
    return r * gpus / g


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _nnls(rows: Sequence[tuple[Sequence[float], float]], terms: int = _TERMS) -> list[float]:
    """Return ``argmin ||A x - y||`` with ``x >= 0`` for tiny ``A`` (rows of (a_i, y_i)).

    Every support (subset of positive terms) is solved by its normal equations; the best
    feasible one wins. The empty support (all zero) is always feasible.
    """
    ata = [[sum(r[0][i] * r[0][j] for r in rows) for j in range(terms)] for i in range(terms)]
    aty = [sum(r[0][i] * r[1] for r in rows) for i in range(terms)]
    yty = sum(r[1] * r[1] for r in rows)
    full = _solve(ata, aty)
    if full is not None and min(full) >= 0:  # the unconstrained optimum is feasible
        return full
    best = [0.0] * terms
    best_res = yty
    for size in range(1, terms):
        for support in combinations(range(terms), size):
            sol = _solve([[ata[i][j] for j in support] for i in support], [aty[i] for i in support])
            if sol is None or min(sol) < 0:
                continue
            x = [0.0] * terms
            for k, i in enumerate(support):
                x[i] = sol[k]
            # ||Ax - y||^2 = x'A'Ax - 2x'A'y + y'y
            res = (
                sum(x[i] * ata[i][j] * x[j] for i in range(terms) for j in range(terms))
                - 2 * sum(x[i] * aty[i] for i in range(terms))
                + yty
            )
            if res < best_res - 1e-15:
                best, best_res = x, res
    return best


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (nearly) singular."""
    n = len(v)
    a = [[*row, v[i]] for i, row in enumerate(m)]
    tiny = 1e-12 * max(abs(x) for row in m for x in row)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= tiny:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            if factor:
                for c in range(col, n + 1):
                    a[r][c] -= factor * a[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out

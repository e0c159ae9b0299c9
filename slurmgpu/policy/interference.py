"""How much two jobs sharing one GPU slow each other down, from what a site can observe.

The model predicts each job's *speed* (its throughput with the partner divided by its
throughput alone, so 1.0 = no slowdown) from the two jobs' GPU utilisation when alone --
the duty cycle, or the SM share per-process samples give under sharing -- as fractions
``a`` (this job) and ``b`` (the partner)::

    speed(a, b) = intercept + partner * b + product * a * b + saturation * min(1, 1 / (a + b))

clamped to ``[MIN_SPEED, 1]``; slowdown = 1 / speed. The terms: a heavier partner slows
a job (``partner``), two busy jobs contend more than either alone (``product``), and once
the two together would need more than the whole GPU (``a + b > 1``) time-slicing divides
it (``saturation``). It is symmetric: the partner's speed is ``speed(b, a)``.

The coefficients (:data:`COEFFICIENTS`) were fitted offline by least squares on the 1,388
measured pairs of Lucid (ASPLOS'23, ``shared/data/lucid/colocate_info.csv``; see
``bench/interference.py``, which refits them and reports the held-out error against the
"no slowdown" baseline). The data is used to fit and evaluate, never shipped as a lookup
table. Each job's utilisation alone is not in the file (it has the pair's combined util and
memory); the script recovers it per job configuration by least squares on the pairs'
combined figures (combined util ~ sum of the two, fitted on unsaturated pairs).

Memory does not enter the speed: in the Lucid pairs the jobs' memory footprint adds
nothing to the held-out error once utilisation is known (bench/interference.py). It is a
hard rule instead (:func:`fits_memory`): the peaks of the jobs on one GPU plus a margin
must fit the device.

**Isolation** (:func:`slowdown_shared`). The pairs were measured time-sliced, which is
what ``gres/shard`` gives (no isolation): the whole model applies. Under MPS the jobs'
kernels run at once on separate SMs, so there is no time-slicing -- the ``saturation``
term sees the GPU as never oversubscribed -- but they still share memory bandwidth and
caches: the ``partner`` and ``product`` terms stay (partly isolated). A MIG slice has its
own SMs, memory and caches: no partner term at all (isolated). Both MPS and MIG cap a
job at its share of the SMs instead: a job that keeps ``u`` % of a whole GPU busy on a
share of ``s`` % runs ``u / s`` times slower when ``u > s``.

Pure and cheap: a few float operations per call, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "COEFFICIENTS",
    "MIN_SPEED",
    "InterferenceModel",
    "PairSlowdown",
    "SharingMode",
    "fits_memory",
    "predict",
    "slowdown_shared",
    "slowdown_with",
]

SharingMode = Literal["shard", "mps", "mig"]

MIN_SPEED = 0.05  # never predict a job stops altogether (slowdown capped at 20x)


@dataclass(frozen=True, slots=True)
class InterferenceModel:
    """Coefficients of the speed model (see the module docstring)."""

    intercept: float
    partner: float
    product: float
    saturation: float

    def speed(self, util_pct: float, partner_util_pct: float) -> float:
        """Return the predicted speed (0-1] of a job at ``util_pct`` next to a partner."""
        a = min(max(util_pct, 0.0), 100.0) / 100.0
        b = min(max(partner_util_pct, 0.0), 100.0) / 100.0
        total = a + b
        fill = 1.0 if total <= 1.0 else 1.0 / total
        s = self.intercept + self.partner * b + self.product * a * b + self.saturation * fill
        return min(1.0, max(MIN_SPEED, s))

    def contention_speed(self, util_pct: float, partner_util_pct: float) -> float:
        """:meth:`speed` without time-slicing (MPS: SMs split, bandwidth shared)."""
        a = min(max(util_pct, 0.0), 100.0) / 100.0
        b = min(max(partner_util_pct, 0.0), 100.0) / 100.0
        s = self.intercept + self.partner * b + self.product * a * b + self.saturation
        return min(1.0, max(MIN_SPEED, s))


# Fitted by `bench/interference.py --fit` on all 1,388 Lucid pairs (both directions).
COEFFICIENTS = InterferenceModel(
    intercept=0.701555,
    partner=-0.093307,
    product=-0.494136,
    saturation=0.326203,
)


@dataclass(frozen=True, slots=True)
class PairSlowdown:
    """Predicted slowdown (>= 1: time with the partner / time alone) of each job of a pair.

    ``memory_mib`` is the pair's combined GPU memory (the memory rule's input).
    """

    slowdown_a: float
    slowdown_b: float
    memory_mib: float

    @property
    def worst(self) -> float:
        return max(self.slowdown_a, self.slowdown_b)


def predict(
    util_a: float,
    mem_a: float,
    util_b: float,
    mem_b: float,
    model: InterferenceModel = COEFFICIENTS,
) -> PairSlowdown:
    """Return the predicted slowdown of job a and job b when they share one GPU.

    Utilisations are percent (0-100) of the GPU each job keeps busy alone; memory is MiB.

    >>> p = predict(20, 4096, 20, 4096)
    >>> round(p.slowdown_a, 3) == round(p.slowdown_b, 3), p.slowdown_a < 1.05
    (True, True)
    >>> predict(90, 1024, 90, 1024).slowdown_a > 1.8
    True
    """
    return PairSlowdown(
        slowdown_a=1.0 / model.speed(util_a, util_b),
        slowdown_b=1.0 / model.speed(util_b, util_a),
        memory_mib=max(mem_a, 0.0) + max(mem_b, 0.0),
    )


def slowdown_with(
    util_pct: float, partner_utils_pct: Iterable[float], model: InterferenceModel = COEFFICIENTS
) -> float:
    """Return one job's predicted slowdown next to several partners (their utils summed).

    The pairwise model is extended by treating all partners as one job whose utilisation
    is the sum of theirs (capped at 100 %): time-slicing does not care whose kernel runs.
    """
    partner = min(100.0, sum(max(u, 0.0) for u in partner_utils_pct))
    return 1.0 / model.speed(util_pct, partner)


def slowdown_shared(
    util_pct: float,
    partner_utils_pct: Iterable[float],
    mode: SharingMode,
    sm_share_pct: float = 100.0,
    model: InterferenceModel = COEFFICIENTS,
) -> float:
    """One job's predicted slowdown on a GPU shared as ``mode`` (see the module docstring):
    ``shard`` is :func:`slowdown_with`; ``mps`` the contention terms only, times the cap of
    its SM share; ``mig`` the cap of its slice alone, whoever else is on the GPU.

    >>> slowdown_shared(10, [40], "mig", sm_share_pct=100 / 7)
    1.0
    >>> round(slowdown_shared(30, [], "mig", sm_share_pct=100 / 7), 2)
    2.1
    >>> a = slowdown_shared(40, [40, 40], "shard")
    >>> b = slowdown_shared(40, [40, 40], "mps", sm_share_pct=50)
    >>> 1.0 < b < a
    True
    """
    share = max(sm_share_pct, 1e-9)
    cap = max(1.0, max(util_pct, 0.0) / share)
    if mode == "mig":
        return cap
    if mode == "mps":
        partner = min(100.0, sum(max(u, 0.0) for u in partner_utils_pct))
        return cap / model.contention_speed(util_pct, partner)
    return slowdown_with(util_pct, partner_utils_pct, model)


def fits_memory(peaks_mib: Iterable[float], device_mib: float, margin_mib: float) -> bool:
    """True when the jobs' peak GPU memory together, plus ``margin_mib``, fits the device.

    >>> fits_memory([8192, 8192], 81920, 2048), fits_memory([40000, 40000], 81920, 2048)
    (True, False)
    """
    return sum(max(p, 0.0) for p in peaks_mib) + max(margin_mib, 0.0) <= device_mib

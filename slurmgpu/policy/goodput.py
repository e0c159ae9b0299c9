"""Goodput: the batch size a data-parallel job should train at on a given number of GPUs.

Pollux (OSDI'21, docs/ANCHORS-2.md §1) measures a training job's useful speed as
*goodput* = throughput x statistical efficiency. Throughput is samples per second at
global batch ``B`` on the job's GPUs (``B / step_time(B)``); statistical efficiency is
how much each sample of a batch ``B`` is worth against one of the job's initial batch
``B0``::

    efficiency(B) = (phi + B0) / (phi + B)        (1 at B0, falling as B grows)

where ``phi`` is the gradient noise scale (PGNS, ``grad_var / grad_sqr * B0``;
:class:`slurmgpu.elastic.scaling.GradientNoise` measures ``var`` and ``sqr``). Progress is
counted in steps at ``B0``: a step at ``B`` is worth ``B / B0 * efficiency(B)`` of them, so

    goodput(B) = B / B0 * efficiency(B) / step_time(B)     (B0-steps per second)

A small batch wastes the GPUs (steps are short, synchronisation and fixed costs dominate),
a large one wastes samples (the gradient was already clean). More GPUs move the best
batch up: each GPU needs enough local batch to be busy. That is why Pollux retunes the
batch at every reallocation and why a job's speedup from more GPUs is better with the
batch retuned than with it held fixed -- the allocator must know which, or it undervalues
growing such a job.

:func:`best_batch` picks the batch of highest goodput within the job's declared limits
``[lo, hi]`` (the user's: the runtime never trains outside them), at multiples of the
GPU count (every GPU takes the same local batch), the limits themselves included. It is
pure: the job's step-time model is a callable, so the runtime (measured step times) and
the simulator (the measured Pollux profiles) call the same code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BatchChoice", "batch_candidates", "best_batch", "efficiency", "goodput"]

# Candidate batches per GPU count: a geometric grid over the limits (plus the limits and
# the current batch); more points change the chosen goodput by < 1 % on the Pollux
# profiles (their step times are measured at 5-10 local batch sizes).
_GRID = 24


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """The chosen global batch on ``gpus`` GPUs, and its goodput (``B0``-steps/s)."""

    gpus: int
    batch: int
    goodput: float
    efficiency: float


def efficiency(batch: float, init_batch: float, noise_scale: float) -> float:
    """Pollux's statistical efficiency of ``batch`` against ``init_batch`` (at most 1)."""
    if init_batch <= 0 or batch <= 0:
        raise ValueError("batch sizes must be positive")
    phi = max(0.0, noise_scale)
    if math.isinf(phi):  # pure noise: every sample counts fully
        return 1.0
    b = max(batch, init_batch)
    return (phi + init_batch) / (phi + b)


def goodput(batch: int, init_batch: int, step_time_s: float, eff: float) -> float:
    """``B0``-steps per second of ``batch`` at ``step_time_s`` a step and efficiency ``eff``."""
    if step_time_s <= 0 or not math.isfinite(step_time_s):
        return 0.0
    return batch / init_batch * eff / step_time_s


def batch_candidates(gpus: int, lo: int, hi: int, current: int | None = None) -> list[int]:
    """Global batches to try on ``gpus`` GPUs within ``[lo, hi]``: the limits, the current
    batch, and a geometric grid rounded to multiples of ``gpus`` (each GPU the same)."""
    if gpus < 1 or lo < 1 or hi < lo:
        raise ValueError(f"need gpus >= 1 and 1 <= lo <= hi, not {gpus}, {lo}, {hi}")
    out = {lo, hi}
    if current is not None and lo <= current <= hi:
        out.add(current)
    if hi > lo:
        ratio = (hi / lo) ** (1.0 / _GRID)
        for i in range(1, _GRID):
            b = lo * ratio**i
            m = max(1, round(b / gpus)) * gpus
            if lo <= m <= hi:
                out.add(m)
    return sorted(out)


def best_batch(
    gpus: int,
    step_time: Callable[[int], float],
    efficiency_of: Callable[[int], float],
    *,
    init_batch: int,
    lo: int,
    hi: int,
    current: int | None = None,
) -> BatchChoice:
    """The batch in ``[lo, hi]`` of highest goodput on ``gpus`` GPUs.

    ``step_time(B)`` is seconds per optimiser step at global batch ``B`` on these GPUs
    (gradient accumulation included when ``B`` does not fit them); ``efficiency_of(B)``
    the statistical efficiency of ``B`` (:func:`efficiency` with the measured noise
    scale, or an average over training where it varies). Ties keep the smaller batch.
    """
    best: BatchChoice | None = None
    for b in batch_candidates(gpus, lo, hi, current):
        eff = efficiency_of(b)
        g = goodput(b, init_batch, step_time(b), eff)
        if best is None or g > best.goodput * (1 + 1e-12):
            best = BatchChoice(gpus, b, g, eff)
    assert best is not None
    return best

"""Batch-size and learning-rate rules for a job whose GPU count changes between runs.

Data-parallel training keeps the per-GPU batch and lets the global batch follow the GPU
count: ``batch = per_gpu_batch * gpus``. The learning rate then follows one rule:

- ``linear`` (Goyal et al. 2017): ``lr = base_lr * k`` with ``k = batch / base_batch``;
- ``sqrt`` (Krizhevsky 2014; Hoffer et al. 2017): ``lr = base_lr * sqrt(k)``;
- ``adascale`` (Johnson et al. 2020, used by Pollux/AdaptDL): ``lr = base_lr * r`` with
  the gain ``r = (var + sqr) / (var / k + sqr)``, where ``var`` is the gradient variance
  at the base batch and ``sqr`` the squared norm of the true gradient. ``1 <= r <= k``:
  a noisy gradient (large ``var``) gains almost ``k``, a clean one almost nothing.
  Pollux's statistical efficiency is ``r / k``.

:class:`GradientNoise` estimates ``var`` and ``sqr`` from the per-replica gradients a
data-parallel step already has (AdaScale's estimator, smoothed with an exponential
moving average).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "RULES",
    "GradientNoise",
    "LrRule",
    "adascale_gain",
    "best_global_batch",
    "global_batch",
    "scaled_lr",
    "statistical_efficiency",
]

LrRule = Literal["linear", "sqrt", "adascale"]
RULES: tuple[LrRule, ...] = ("linear", "sqrt", "adascale")


def global_batch(per_gpu_batch: int, gpus: int) -> int:
    if per_gpu_batch < 1 or gpus < 1:
        raise ValueError("per_gpu_batch and gpus must be at least 1")
    return per_gpu_batch * gpus


def adascale_gain(scale: float, var: float, sqr: float) -> float:
    """AdaScale's gain ``(var + sqr) / (var / scale + sqr)``, in ``[1, scale]`` for scale >= 1.

    With no estimate yet (both zero) the gain is ``scale`` (the linear rule).
    """
    if scale <= 0:
        raise ValueError("scale must be positive")
    var, sqr = max(var, 0.0), max(sqr, 0.0)
    if var + sqr == 0:
        return scale
    gain = (var + sqr) / (var / scale + sqr)
    lo, hi = min(1.0, scale), max(1.0, scale)
    return min(max(gain, lo), hi)


def statistical_efficiency(scale: float, var: float, sqr: float) -> float:
    """Pollux's efficiency of a step at ``scale`` times the base batch: ``gain / scale``."""
    return adascale_gain(scale, var, sqr) / scale


def scaled_lr(
    base_lr: float,
    base_batch: int,
    batch: int,
    rule: LrRule = "sqrt",
    *,
    var: float = 0.0,
    sqr: float = 0.0,
) -> float:
    """The learning rate for ``batch`` given ``base_lr`` tuned at ``base_batch``."""
    if base_batch < 1 or batch < 1:
        raise ValueError("batch sizes must be at least 1")
    k = batch / base_batch
    if rule == "linear":
        return base_lr * k
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    if rule == "adascale":
        return base_lr * adascale_gain(k, var, sqr)
    raise ValueError(f"unknown learning-rate rule {rule!r} (linear, sqrt or adascale)")


@dataclass
class GradientNoise:
    """Running estimates of gradient variance (at one replica's batch) and squared norm.

    ``update(replica_sq_norms, mean_sq_norm)`` takes, for one step with ``S >= 2``
    replicas, each replica's squared gradient norm and the squared norm of their mean:
    ``var ≈ S/(S-1) * (mean_i |g_i|^2 - |ḡ|^2)`` and ``sqr ≈ |ḡ|^2 - var / S``.
    """

    smoothing: float = 0.9
    var: float = 0.0
    sqr: float = 0.0
    updates: int = 0

    def update(self, replica_sq_norms: Sequence[float], mean_sq_norm: float) -> None:
        s = len(replica_sq_norms)
        if s < 2:
            return  # one replica: no spread to measure; keep the previous estimate
        mean_of_sq = sum(replica_sq_norms) / s
        var = max(s / (s - 1) * (mean_of_sq - mean_sq_norm), 0.0)
        sqr = max(mean_sq_norm - var / s, 0.0)
        a = self.smoothing if self.updates else 0.0
        self.var = a * self.var + (1 - a) * var
        self.sqr = a * self.sqr + (1 - a) * sqr
        self.updates += 1

    def gain(self, scale: float) -> float:
        return adascale_gain(scale, self.var, self.sqr)

    def noise_scale(self, base_batch: int) -> float:
        """Pollux's gradient noise scale at ``base_batch``: ``var / sqr * base_batch``
        (infinite with no clean-gradient estimate yet: every sample counts fully)."""
        if self.sqr <= 0:
            return math.inf if self.var > 0 else 0.0
        return self.var / self.sqr * base_batch


def best_global_batch(
    gpus: int,
    step_time: Callable[[int], float],
    noise: GradientNoise,
    *,
    base_batch: int,
    lo: int,
    hi: int,
    current: int | None = None,
) -> int:
    """The global batch a run on ``gpus`` GPUs should train at: the one of highest
    goodput (:func:`slurmgpu.policy.goodput.best_batch`, Pollux's throughput x
    statistical efficiency) within the user's limits ``[lo, hi]``.

    ``step_time(B)`` is the run's measured (or modelled) seconds per step at global
    batch ``B`` on these GPUs, ``noise`` the gradient statistics measured so far at
    ``base_batch`` (the batch the learning rate was tuned at). With no noise estimate
    yet (``var`` and ``sqr`` zero) efficiency is taken as 1: the largest batch that
    still speeds steps up wins. Call it at every (re)start and keep the batch for the
    run; :func:`scaled_lr` with ``rule="adascale"`` then gives its learning rate.
    """
    from slurmgpu.policy.goodput import best_batch, efficiency

    phi = math.inf if noise.var + noise.sqr <= 0 else noise.noise_scale(base_batch)

    def eff(b: int) -> float:
        return efficiency(b, base_batch, phi)

    return best_batch(
        gpus, step_time, eff, init_batch=base_batch, lo=lo, hi=hi, current=current
    ).batch

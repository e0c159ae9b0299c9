"""Batch-size and learning-rate rules, and the AdaScale gain from measured gradients."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from slurmgpu.elastic.scaling import (
    GradientNoise,
    adascale_gain,
    global_batch,
    scaled_lr,
    statistical_efficiency,
)


def test_linear_and_square_root_rules() -> None:
    assert global_batch(16, 4) == 64
    assert scaled_lr(0.1, 32, 128, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 32, 128, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 128, 32, "sqrt") == pytest.approx(0.05)  # shrinking lowers it
    with pytest.raises(ValueError, match="unknown"):
        scaled_lr(0.1, 32, 64, "cubic")  # type: ignore[arg-type]


def test_adascale_gain_lies_between_one_and_the_scale() -> None:
    assert adascale_gain(4, var=1.0, sqr=0.0) == pytest.approx(4.0)  # pure noise: linear
    assert adascale_gain(4, var=0.0, sqr=1.0) == pytest.approx(1.0)  # no noise: no gain
    gain = adascale_gain(4, var=1.0, sqr=1.0)
    assert gain == pytest.approx(2 / 1.25)
    assert statistical_efficiency(4, 1.0, 1.0) == pytest.approx(gain / 4)
    assert adascale_gain(4, 0.0, 0.0) == 4  # no estimate yet: the linear rule
    assert scaled_lr(0.1, 32, 128, "adascale", var=1.0, sqr=1.0) == pytest.approx(0.1 * gain)


def test_gradient_noise_recovers_the_variance_and_the_true_gradient() -> None:
    rng = np.random.default_rng(3)
    true = np.full(50, 0.2)  # |g|^2 = 2.0
    sigma = 0.5  # per-coordinate noise of one replica: var = 50 * 0.25 = 12.5
    noise = GradientNoise(smoothing=0.98)
    for _ in range(3000):
        grads = [true + rng.normal(scale=sigma, size=50) for _ in range(4)]
        mean = np.mean(grads, axis=0)
        noise.update([float(g @ g) for g in grads], float(mean @ mean))
    assert noise.var == pytest.approx(12.5, rel=0.15)
    assert noise.sqr == pytest.approx(2.0, rel=0.3)
    assert 1 < noise.gain(4) < 4
    assert math.isfinite(noise.gain(0.5))
    single = GradientNoise()
    single.update([1.0], 1.0)
    assert single.updates == 0  # one replica measures nothing


def test_best_global_batch_grows_with_the_gpus_and_the_gradient_noise() -> None:
    from slurmgpu.elastic.scaling import best_global_batch

    def step(gpus: int) -> Callable[[int], float]:
        return lambda b: 0.05 + 0.001 * b / gpus

    quiet = GradientNoise(var=1.0, sqr=1.0, updates=10)  # phi = B0 = 32
    noisy = GradientNoise(var=100.0, sqr=1.0, updates=10)  # phi = 3200
    kw = {"base_batch": 32, "lo": 32, "hi": 8192}
    on_one = best_global_batch(1, step(1), noisy, **kw)
    on_eight = best_global_batch(8, step(8), noisy, **kw)
    assert 32 <= on_one < on_eight <= 8192
    assert best_global_batch(8, step(8), quiet, **kw) < on_eight
    # no estimate yet: every sample counts, so the largest batch that speeds steps up
    assert best_global_batch(8, step(8), GradientNoise(), **kw) == 8192
    assert quiet.noise_scale(32) == 32.0

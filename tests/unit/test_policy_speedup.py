"""The speedup curve: fitted from the sizes a job ran at, predicting the sizes it did not."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from slurmgpu.policy.speedup import (
    DEFAULT_PRIOR,
    SpeedupPrior,
    fit_amdahl,
    fit_speedup,
    linear_scaling,
)

DATA = Path(__file__).resolve().parents[3] / "shared/data/pollux/profiles"


def amdahl(serial: float, n: int, one_gpu: float = 100.0) -> float:
    return one_gpu / (serial + (1 - serial) / n)


def test_no_usable_measurement_gives_no_curve() -> None:
    assert fit_speedup({}) is None
    assert fit_speedup({0: 5.0, 2: -1.0, 4: math.nan, 8: math.inf}) is None
    assert fit_amdahl({}) is None


def test_bad_measurements_are_ignored_not_fitted() -> None:
    curve = fit_speedup({2: 50.0, 4: math.nan, 0: 3.0})
    assert curve is not None
    assert curve.measured == ((2, 50.0),)


def test_a_measured_size_predicts_its_measurement() -> None:
    curve = fit_speedup({2: 51.0, 4: 100.0, 8: 150.0})
    assert curve is not None
    assert curve.throughput(2) == 51.0
    assert curve.throughput(4) == 100.0
    assert curve.throughput(8) == 150.0
    assert curve.throughput(0) == 0.0


def test_one_measurement_follows_the_prior_shape_through_it() -> None:
    curve = fit_speedup({1: 10.0})
    assert curve is not None
    p = DEFAULT_PRIOR
    expected = 1 / (p.serial + (1 - p.serial) / 8 + p.sync + p.per_gpu * 7)
    assert curve.speedup(8, 1) == pytest.approx(expected, rel=1e-9)
    assert 1.0 < curve.speedup(2, 1) < 2.0  # sub-linear, never super-linear by default


def test_clean_amdahl_measurements_are_recovered_at_held_out_sizes() -> None:
    seen = {n: amdahl(0.1, n) for n in (1, 2, 4)}
    free = fit_speedup(seen, SpeedupPrior(weight=0.0))
    assert free is not None
    for n in (3, 6, 8, 16):
        assert free.throughput(n) == pytest.approx(amdahl(0.1, n), rel=1e-6)
    regular = fit_speedup(seen)
    assert regular is not None
    for n in (3, 6, 8):
        assert regular.throughput(n) == pytest.approx(amdahl(0.1, n), rel=0.1)


def test_every_term_is_non_negative_even_for_super_linear_data() -> None:
    curve = fit_speedup({1: 10.0, 2: 25.0, 4: 60.0}, SpeedupPrior(weight=0.0))
    assert curve is not None
    assert min(curve.serial, curve.parallel, curve.sync, curve.per_gpu) >= 0.0


def test_falling_throughput_past_a_size_is_fitted_and_best_size_finds_the_peak() -> None:
    # Sync that grows with every replica: throughput peaks near 6 GPUs.
    def rate(n: int) -> float:
        return 1.0 / (0.01 + 1.0 / n + 0.03 * (n - 1))

    curve = fit_speedup({n: rate(n) for n in (2, 4, 8)}, SpeedupPrior(weight=0.0))
    assert curve is not None
    assert curve.throughput(16) < curve.throughput(8)
    assert curve.best_size(1, 16) in (5, 6)
    assert curve.best_size(1, 3) == 3


def test_prediction_is_anchored_on_the_nearest_measured_size() -> None:
    curve = fit_speedup({1: 10.0, 8: 40.0})
    assert curve is not None
    # 6 is nearer 8 than 1 (in ratio), so it is scaled from 8's measurement.
    ratio = curve.fitted_time(8) / curve.fitted_time(6)
    assert curve.throughput(6) == pytest.approx(40.0 * ratio)


def test_linear_scaling_baseline_and_one_point_amdahl_agree() -> None:
    assert linear_scaling({4: 100.0}, 8) == 200.0
    assert linear_scaling({2: 50.0, 8: 150.0}, 16) == 300.0  # from the nearest, 8
    assert linear_scaling({}, 4) == 0.0
    one = fit_amdahl({4: 100.0})
    assert one is not None and one.throughput(8) == pytest.approx(200.0)
    two = fit_amdahl({1: amdahl(0.2, 1), 4: amdahl(0.2, 4)})
    assert two is not None and two.throughput(8) == pytest.approx(amdahl(0.2, 8), rel=1e-6)


def test_prior_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="serial"):
        SpeedupPrior(serial=1.5)
    with pytest.raises(ValueError, match="weight"):
        SpeedupPrior(weight=-1.0)


# (model, global batch) pairs the Pollux workloads submit (shared/data/pollux/workloads).
POLLUX_JOBS = (
    ("bert", 384),
    ("cifar10", 2048),
    ("cifar10", 4096),
    ("deepspeech2", 320),
    ("deepspeech2", 640),
    ("imagenet", 3200),
    ("imagenet", 6400),
    ("ncf", 32768),
    ("yolov3", 64),
)


def test_fit_beats_linear_scaling_on_measured_pollux_profiles() -> None:
    """After one resize (two sizes measured) the fit predicts the other sizes better."""
    if not DATA.is_dir():
        pytest.skip(f"measured profiles absent at {DATA} (shared/data not present)")
    from slurmgpu.sim.profiles import ThroughputProfile, load_profiles
    from slurmgpu.sim.workload import packed

    profiles = load_profiles(DATA)
    fit_err: list[float] = []
    lin_err: list[float] = []
    for model, batch in POLLUX_JOBS:
        prof = profiles[model]
        top = min(64, prof.max_replicas(batch))

        def rate(n: int, prof: ThroughputProfile = prof, batch: int = batch) -> float:
            return batch / prof.step_time(packed(n, 4), batch)

        for n0 in (1, 2, 4, 8, 16):
            for other in (n0 // 2, 2 * n0):
                if not 1 <= other <= top or other == n0 or n0 > top:
                    continue
                seen = {n0: rate(n0), other: rate(other)}
                curve = fit_speedup(seen)
                assert curve is not None
                for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
                    if n in seen or n > top:
                        continue
                    true = rate(n)
                    fit_err.append(abs(curve.throughput(n) - true) / true)
                    lin_err.append(abs(linear_scaling(seen, n) - true) / true)
    assert len(fit_err) > 100
    assert statistics.median(fit_err) < statistics.median(lin_err)
    assert statistics.fmean(fit_err) < 0.5 * statistics.fmean(lin_err)

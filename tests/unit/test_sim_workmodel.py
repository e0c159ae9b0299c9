"""Pollux's work model (slurmgpu.sim.profiles.Application): steps at a fixed batch size.

The reference step counts are what the Pollux artifact's ``Job.step`` integrates epoch by
epoch from its measured gradient statistics (validation-B.csv), worked out once from
petuum/adaptdl branch osdi21-artifact; our eight-slice noise-scale fit must stay within
4 % of each.
"""

from __future__ import annotations

import itertools

import pytest

from slurmgpu.sim.profiles import APPLICATIONS

# application -> batch size -> steps Pollux's simulator needs to finish the budget
POLLUX_STEPS = {
    "cifar10": {128: 39063, 512: 10632, 2048: 3343, 4096: 2143},
    "imagenet": {200: 576526, 1600: 78669, 3200: 42850, 6400: 25094},
    "yolov3": {8: 103444, 64: 15970, 512: 4976},
    "bert": {12: 14774, 96: 1893, 384: 476},
    "ncf": {256: 194174, 4096: 12183, 32768: 1552},
    "deepspeech2": {20: 28536, 320: 2275, 640: 1391},
}


@pytest.mark.parametrize(
    ("app", "batch", "expected"),
    [(a, b, s) for a, rows in POLLUX_STEPS.items() for b, s in rows.items()],
)
def test_steps_reproduce_pollux(app: str, batch: int, expected: int) -> None:
    got = APPLICATIONS[app].steps(batch)
    assert abs(got / expected - 1) <= 0.04, (app, batch, got, expected)


@pytest.mark.parametrize("app", sorted(APPLICATIONS))
def test_efficiency_is_one_at_b0_and_falls_with_batch(app: str) -> None:
    a = APPLICATIONS[app]
    assert a.efficiency(a.init_batch_size) == pytest.approx(1.0)
    sizes = [a.init_batch_size * 2**k for k in range(8)]
    effs = [a.efficiency(b) for b in sizes]
    assert all(x > y for x, y in itertools.pairwise(effs))
    # more samples in total at a bigger batch, never fewer
    samples = [a.steps(b) * b for b in sizes]
    assert all(x <= y * 1.0001 for x, y in itertools.pairwise(samples))

"""bench/gpu_check_energy.py's comparison, against a fake NVML with a known power trace
(the script itself runs on a real GPU; see docs/gpu-facts.md)."""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check_energy.py"


def _load() -> ModuleType:
    return load_script("gpu_check_energy", SCRIPT)


class FakeNvml:
    """A GPU drawing a constant ``watts``; its counter integrates that since creation."""

    def __init__(self, watts: float, *, back_at: int | None = None) -> None:
        self.watts = watts
        self.t0 = time.monotonic()
        self.reads = 0
        self.back_at = back_at

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self.reads += 1
        if self.back_at is not None and self.reads >= self.back_at:
            return 0  # as after a driver reload
        return int(1_000_000 + self.watts * (time.monotonic() - self.t0) * 1000)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self.watts * 1000)


def test_counter_and_power_integral_agree_for_a_steady_draw() -> None:
    check = _load()
    out = check.measure(FakeNvml(80.0), None, 0.5, 0.05)
    assert out["counter_j"] == pytest.approx(80.0 * out["seconds"], rel=0.05)
    assert abs(out["power_integral_vs_counter_pct"]) < 5
    assert out["counter_went_back"] is False
    assert out["power_w"]["median"] == 80.0


def test_a_counter_that_goes_back_is_reported() -> None:
    check = _load()
    assert check.measure(FakeNvml(80.0, back_at=4), None, 0.3, 0.05)["counter_went_back"]


def test_coarse_sampling_keeps_the_first_and_last_reading() -> None:
    check = _load()
    points = [(i * 0.1, 100.0 + i) for i in range(31)]
    every = check._every(points, 1.0)
    assert every[0] == points[0] and every[-1] == points[-1]
    assert [round(t, 1) for t, _ in every] == [0.0, 1.0, 2.0, 3.0]
    assert check._trapezoid([(0.0, 100.0), (2.0, 200.0)]) == 300.0

"""The interference model: its shape, the memory rule, and its fit on Lucid's pairs."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmgpu.policy.interference import (
    COEFFICIENTS,
    MIN_SPEED,
    fits_memory,
    predict,
    slowdown_with,
)
from tests.script_module import load_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "interference.py"

util = st.floats(min_value=0, max_value=100, allow_nan=False)


@given(util, util)
def test_slowdown_is_at_least_one_and_symmetric(a: float, b: float) -> None:
    p = predict(a, 1000, b, 2000)
    q = predict(b, 2000, a, 1000)
    assert 1.0 <= p.slowdown_a <= 1.0 / MIN_SPEED
    assert p.slowdown_a == pytest.approx(q.slowdown_b)
    assert p.slowdown_b == pytest.approx(q.slowdown_a)
    assert p.memory_mib == 3000


@given(util, util, util)
def test_a_busier_partner_never_slows_a_job_less(a: float, b1: float, b2: float) -> None:
    low, high = sorted((b1, b2))
    assert predict(a, 0, high, 0).slowdown_a >= predict(a, 0, low, 0).slowdown_a - 1e-12


def test_light_pairs_barely_slow_down_and_heavy_pairs_do() -> None:
    assert predict(10, 4096, 10, 4096).worst < 1.02
    assert predict(30, 4096, 30, 4096).worst < 1.15
    assert predict(90, 4096, 90, 4096).worst > 1.8
    # A light job next to a heavy one suffers more than next to a light one.
    assert predict(20, 0, 90, 0).slowdown_a > predict(20, 0, 20, 0).slowdown_a + 0.1


def test_several_partners_count_as_one_job_with_their_summed_util() -> None:
    assert slowdown_with(30, [20, 20]) == pytest.approx(predict(30, 0, 40, 0).slowdown_a)
    assert slowdown_with(30, [80, 80]) == pytest.approx(predict(30, 0, 100, 0).slowdown_a)
    assert slowdown_with(30, []) == pytest.approx(1.0 / COEFFICIENTS.speed(30, 0))


def test_memory_rule_needs_the_margin_to_fit_too() -> None:
    assert fits_memory([30_000, 30_000], 81_920, 2_048)
    assert not fits_memory([40_000, 40_000], 81_920, 2_048)  # 80,000 + 2,048 > 81,920
    assert fits_memory([40_000, 40_000], 81_920, 0)
    assert not fits_memory([81_920], 81_920, 1)


def _bench() -> ModuleType:
    return load_script("bench_interference", BENCH)


@pytest.fixture(scope="module")
def lucid() -> tuple[ModuleType, list[object]]:
    bench = _bench()
    path = bench.DEFAULT_DATA / bench.LUCID_CSV
    if not path.is_file():
        reason = f"Lucid pairs not found at {path} (shared/data is not in this checkout)"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    return bench, bench.load_pairs(path)


def test_shipped_coefficients_are_what_the_fitting_script_fits(
    lucid: tuple[ModuleType, list[object]],
) -> None:
    bench, pairs = lucid
    model, profiles = bench.fit(pairs)
    assert len(pairs) == 1388 and len(profiles) == 56
    for name in ("intercept", "partner", "product", "saturation"):
        assert getattr(model, name) == pytest.approx(getattr(COEFFICIENTS, name), abs=1e-5)


def test_model_beats_the_no_slowdown_baseline_on_held_out_pairs(
    lucid: tuple[ModuleType, list[object]],
) -> None:
    bench, pairs = lucid
    for seed in (0, 1, 2):
        e = bench.evaluate(pairs, seed, bound=1.25)
        assert e.pairs > 300
        assert e.mae_model < 0.8 * e.mae_naive
        assert e.rmse_model < e.rmse_naive
        assert e.mae_model < e.mae_slicing
        assert e.admitted_ok_model > e.admitted_ok_naive


def test_a_malformed_row_is_one_clear_error(tmp_path: Path) -> None:
    bench = _bench()
    bad = tmp_path / "pairs.csv"
    bad.write_text("model1,speed1\nResNet18,fast\n")
    with pytest.raises(ValueError, match=r"line 2: not a Lucid pair row"):
        bench.load_pairs(bad)

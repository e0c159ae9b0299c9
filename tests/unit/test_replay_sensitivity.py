"""bench/replay_real.py's sensitivity band: the simulator with its per-job costs shifted."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from slurmgpu.sim.costs import cost_set
from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench_replay_real", ROOT / "bench" / "replay_real.py")


def test_shifted_moves_both_start_ups_and_the_submission_delay_never_below_zero(
    bench: ModuleType,
) -> None:
    base = cost_set("replay-stand-in")
    assert bench.shifted(base, 0.0, 0.0) is base
    up = bench.shifted(base, 0.5, -0.25)
    assert up.first_startup.seconds == pytest.approx(base.first_startup.seconds + 0.5)
    assert up.startup.seconds == pytest.approx(base.startup.seconds + 0.5)
    assert up.submit_delay.seconds == pytest.approx(base.submit_delay.seconds - 0.25)
    assert "sensitivity" in up.first_startup.source()
    # the other costs stay as measured
    assert up.checkpoint == base.checkpoint and up.requeue_delay == base.requeue_delay
    down = bench.shifted(base, -100.0, -100.0)
    assert down.first_startup.seconds == down.startup.seconds == down.submit_delay.seconds == 0


def test_sensitivity_takes_the_least_and_most_of_each_figure_over_the_grid(
    bench: ModuleType,
) -> None:
    seen: list[tuple[float, float]] = []

    def run(shift: tuple[float, float]) -> dict[str, float]:
        seen.append(shift)
        a, b = shift
        return {"avg_jct_s": 100 + 10 * a - 4 * b, "p99_jct_s": 300 - a * b, "makespan_s": 500.0}

    band = bench.sensitivity(run, 0.5)
    assert sorted(seen) == sorted((a * 0.5, b * 0.5) for a in (-1, 0, 1) for b in (-1, 0, 1))
    assert band["avg_jct_s"] == (pytest.approx(100 - 5 - 2), pytest.approx(100 + 5 + 2))
    assert band["p99_jct_s"] == (pytest.approx(299.75), pytest.approx(300.25))
    assert band["makespan_s"] == (500.0, 500.0)
    line = bench.band_line(
        "slurm", band, {"avg_jct_s": 100.0, "p99_jct_s": 300.0, "makespan_s": 400.0}
    )
    assert line == "slurm      avg JCT 0.93-1.07, p99 1.00-1.00, makespan 1.25-1.25"


def test_ensemble_runs_the_plan_first_then_late_submissions_from_the_same_origin(
    bench: ModuleType,
) -> None:
    from slurmgpu.sim.workload import RigidJob, TraceJob

    trace = [
        TraceJob(submit_s=100.0 + 60 * i, name=f"j{i}", user="u", model=RigidJob(10, 1))
        for i in range(5)
    ]
    calls: list[tuple[list[float], float]] = []

    def run(moved: list[TraceJob], *, origin_s: float) -> dict[str, float]:
        calls.append(([j.submit_s for j in moved], origin_s))
        return {"avg_jct_s": sum(j.submit_s for j in moved), "p99_jct_s": 1.0, "makespan_s": 2.0}

    out = bench.ensemble(run, trace, 60.0, 4, 1.0)
    assert len(calls) == 4 and all(origin == 100.0 for _, origin in calls)
    planned = [j.submit_s for j in trace]
    assert calls[0][0] == planned  # the first run as planned
    for submits, _ in calls[1:]:  # the others each late by 0-1 wall s, i.e. 0-60 trace s
        late = [s - p for s, p in zip(submits, planned, strict=True)]
        assert all(0.0 <= d <= 60.0 for d in late) and any(d > 0 for d in late)
    assert calls[1][0] != calls[2][0]  # seeded per run: each run draws its own
    assert out["p99_jct_s"] == [1.0] * 4 and len(out["avg_jct_s"]) == 4
    again = bench.ensemble(run, trace, 60.0, 4, 1.0)
    assert again == out  # the same seeds, the same runs

    line = bench.ensemble_line(
        "all", out, {"avg_jct_s": out["avg_jct_s"][0], "p99_jct_s": 2.0, "makespan_s": 0.0}
    )
    assert line.startswith("all ") and "p99 0.500 (0.50-0.50)" in line and "makespan -" in line

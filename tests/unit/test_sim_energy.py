"""Energy per policy set in the simulator: kWh and kWh per job from the GPU power model."""

from __future__ import annotations

import pytest

from slurmgpu.sim.loaders import load_trace
from slurmgpu.sim.metrics import SIM_GPU_POWER, summarise
from slurmgpu.sim.profiles import load_profiles
from slurmgpu.sim.render import Comparison, comparison_csv
from slurmgpu.sim.run import ClusterShape, simulate
from tests.unit.pollux_data import DATA, needs_data


@needs_data
def test_energy_is_idle_power_over_the_makespan_plus_the_used_gpu_time() -> None:
    trace = load_trace(DATA / "workloads" / "workload-1.csv", load_profiles(DATA / "profiles"))
    shape = ClusterShape(16, 4)
    r = summarise(simulate(trace, shape, "slurm"))
    p = SIM_GPU_POWER
    capacity_s = shape.gpus * r.makespan_s
    # the same run's utilisation figure, turned into power by the linear model
    mean_w = p.idle_w + (p.busy_w - p.idle_w) * r.used_util_pct / 100.0
    assert r.energy_kwh == pytest.approx(mean_w * capacity_s / 3.6e6, rel=1e-9)
    assert p.idle_w * capacity_s / 3.6e6 < r.energy_kwh < p.busy_w * capacity_s / 3.6e6
    assert r.kwh_per_job == pytest.approx(r.energy_kwh / r.jobs)
    csv_text = comparison_csv(Comparison("workload-1", "16x4", 1.0, 0, [r]))
    header = csv_text.splitlines()[0].split(",")
    assert "energy_kwh" in header and "kwh_per_job" in header

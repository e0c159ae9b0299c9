"""The replay scenario of tests/sim_scenario.py in the simulator alone: the decisions the
daemon's engine takes there are the hand-checked ones (the real-cluster half is
tests/slurm/test_sim_vs_real.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from slurmgpu.store import JobStore
from tests.sim_scenario import CONFIG, EXPECTED, simulated, store_history


def test_the_scenario_takes_the_expected_decisions_in_the_simulator(
    tmp_path: Path, store: JobStore
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    history = store_history(store, datetime.now(UTC).replace(microsecond=0))
    assert len(history) == 3
    assert simulated(config, history, tmp_path) == EXPECTED

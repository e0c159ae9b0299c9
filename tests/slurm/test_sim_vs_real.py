"""The replay scenario of tests/sim_scenario.py on the real lab cluster and in SimSlurm:
the real daemon (enforce mode, four agents, a fakeload job at 0 %) and the simulator,
both through the engine ``build_policy_cycle`` builds from the same config and with the
same history rows, take the same decisions in the same order."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.store import open_store
from slurmgpu.store.audit import AuditStore
from tests.polling import wait_for
from tests.sim_scenario import (
    CONFIG,
    EXPECTED,
    IDLE,
    IDLE_LIMIT_S,
    LIMIT_S,
    TAKEN_OUTCOMES,
    TRAIN,
    Taken,
    simulated,
    store_history,
    until_first_requeue,
)
from tests.slurm.harness import Telemetry, running_stack

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "SimSlurm models the 4-node lab; the stack: one agent per node gpu1-gpu4"


def _hms(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:00"


def _taken(t: Telemetry, roles: dict[int, str]) -> list[Taken]:
    store = open_store(t.db, migrate=False)
    rows = AuditStore(store.engine, store.cluster).list(include_skipped=False, limit=1000)
    return [
        (r.policy, r.kind, roles[r.job_id], tuple(sorted(r.fields.items())), r.outcome)
        for r in sorted(rows, key=lambda r: r.id)
        if r.job_id in roles and r.outcome in TAKEN_OUTCOMES
    ]


def test_a_scenario_takes_the_same_decisions_on_the_real_cluster_and_in_the_simulator(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    # The history goes into the daemon's database before the daemon starts.
    now = datetime.now(UTC).replace(microsecond=0)
    history = store_history(open_store(f"sqlite:///{tmp_path / 'state.db'}"), now)
    assert len(history) == 3
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        train = ("--hold", "-J", TRAIN, "-t", _hms(LIMIT_S), "--gres=gpu:1", "--wrap", "sleep 600")
        roles = {
            t.submit("--comment", "sgpu:rightsize", *train): "opted",
            t.submit(*train): "other",
        }
        idle = t.submit(
            "--requeue",
            "-J",
            IDLE,
            "-t",
            _hms(IDLE_LIMIT_S),
            "--gres=gpu:1",
            "--wrap",
            t.fakeload("--util", "0", "--mem", "1GiB", "--duration", "300s"),
        )
        roles[idle] = "idle"
        wait_for(
            "the idle job's requeue",
            lambda: any(k[1] == "requeue" for k in _taken(t, roles)),
            timeout_s=120,
        )
        t.stop_daemon()
        real = until_first_requeue(_taken(t, roles))
    config = tmp_path / "config.toml"  # what the daemon ran with, secret file included
    sim = simulated(config, history, tmp_path)
    assert real == EXPECTED, real
    assert sim == real

"""A node agent's loop against the fake daemon: the node, its site secret, its gres.conf
and the simulated GPUs' directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgpu.agent.loop import AgentLoop
from slurmgpu.agent.sampler import NodeSampler
from slurmgpu.agent.sender import DaemonClient, HmacAuth
from slurmgpu.agent.spool import BatchSpool
from slurmgpu.telemetry.gresconf import minors_by_index, read_gres_conf
from slurmgpu.telemetry.host import HostUsageSampler
from slurmgpu.telemetry.simgpu import SimulatedGpuProbe
from slurmgpu.wire import node_token
from tests.fakedaemon import FakeDaemon

NODE = "agentnode"
SECRET = b"0123456789abcdef0123456789abcdef-test-site-secret"
DEADLINE_S = 30.0


@pytest.fixture
def gres_conf(tmp_path: Path) -> Path:
    path = tmp_path / "gres.conf"
    path.write_text(f"NodeName={NODE} Name=gpu File=/dev/tty[0-3]\n")
    return path


@pytest.fixture
def sim_dir(tmp_path: Path) -> Path:
    return tmp_path / "simgpu"


def make_loop(
    daemon: FakeDaemon,
    gres_conf: Path,
    sim_dir: Path,
    spool_dir: Path,
    *,
    token: bytes | None = None,
    max_batches: int = 1000,
) -> AgentLoop:
    probe = SimulatedGpuProbe(NODE, gres_conf, None, sim_dir)
    sampler = NodeSampler(
        NODE,
        probe,
        HostUsageSampler(),
        slurm_minors_by_index=minors_by_index(read_gres_conf(gres_conf, NODE)),
    )
    client = DaemonClient(
        daemon.url, NODE, HmacAuth(token or node_token(SECRET, NODE)), timeout_s=5.0
    )
    spool = BatchSpool(spool_dir, max_batches=max_batches)
    return AgentLoop(sampler, client, spool, interval_s=0.1, drain_budget_s=DEADLINE_S)

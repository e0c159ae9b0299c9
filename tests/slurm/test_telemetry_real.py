"""Telemetry end to end on the real local cluster: fakeload jobs → agents → daemon → store.

One daemon (API on a free 127.0.0.1 port) and one agent per lab node with the simulated
GPU probe run as real processes. Jobs declare their load with ``sgpu fakeload``; the
assertions compare what the store aggregated with what each job declared. Tolerance:
declared utilisation ± 1 percentage point (the simulated probe reports declarations
exactly; the slack covers samples taken while a declaration is being refreshed).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.store import open_store, schema
from slurmgpu.store.usage_query import GpuUsage
from tests.polling import wait_for
from tests.slurm.harness import NODES, Telemetry, running_stack

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the stack (harness.running_stack): one agent on each 4-node lab node, gpu1-gpu4"


@pytest.fixture
def telemetry(slurm_cluster: LabCluster, tmp_path: Path) -> Iterator[Telemetry]:
    with running_stack(slurm_cluster, tmp_path) as stack:
        yield stack


def test_each_job_gets_the_usage_it_declared(telemetry: Telemetry) -> None:
    t = telemetry
    busy = t.submit(
        "--gres=gpu:2",
        "-w",
        "gpu1",
        "--wrap",
        t.fakeload("--util", "80", "--mem", "10GiB", "--duration", "120s"),
    )
    idle_after = t.submit(
        "--gres=gpu:1",
        "-w",
        "gpu2",
        "--wrap",
        t.fakeload(
            "--util", "60", "--mem", "2GiB", "--pattern", "idle-after:5s", "--duration", "120s"
        ),
    )
    no_process = t.submit("--gres=gpu:1", "-w", "gpu2", "--wrap", "sleep 120")
    shard_a = t.submit(
        "--gres=shard:2",
        "-w",
        "gpu3",
        "--wrap",
        t.fakeload("--util", "30", "--mem", "3GiB", "--duration", "120s"),
    )
    shard_b = t.submit(
        "--gres=shard:2",
        "-w",
        "gpu3",
        "--wrap",
        t.fakeload("--util", "20", "--mem", "1GiB", "--duration", "120s"),
    )

    wait_for("samples of the 2-GPU job", lambda: t.gpus(busy))
    two = wait_for("steady samples of the 2-GPU job", lambda: t.steady(busy))
    assert len(two) == 2
    for g in two:
        assert g.node == "gpu1"
        assert g.mean_util_pct == pytest.approx(80, abs=1)
        assert g.max_memory_mib == pytest.approx(10240, abs=1)

    def idle_long_enough() -> list[GpuUsage] | None:
        rows = t.gpus(idle_after)
        return rows if rows and rows[0].trailing_idle.total_seconds() >= 5 else None

    (g_idle,) = wait_for("the idle-after job to go idle", idle_long_enough)
    assert g_idle.max_util_pct == pytest.approx(60, abs=1)
    assert not g_idle.never_busy

    (g_none,) = wait_for("samples of the job with no process", lambda: t.gpus(no_process))
    assert g_none.never_busy
    assert g_none.mean_util_pct == 0
    assert g_none.node == "gpu2"
    assert g_none.gpu_index != g_idle.gpu_index

    wait_for("samples of shard job A", lambda: t.gpus(shard_a))
    wait_for("samples of shard job B", lambda: t.gpus(shard_b))
    (a,) = wait_for("steady samples of shard job A", lambda: t.steady(shard_a))
    (b,) = wait_for("steady samples of shard job B", lambda: t.steady(shard_b))
    assert (a.node, a.gpu_index) == (b.node, b.gpu_index), "both shard jobs share one GPU"
    assert a.shared and b.shared
    assert a.mean_util_pct == pytest.approx(30, abs=1)
    assert b.mean_util_pct == pytest.approx(20, abs=1)
    assert a.max_memory_mib == pytest.approx(3072, abs=1)
    assert b.max_memory_mib == pytest.approx(1024, abs=1)

    jobs = {j["job_id"]: j for j in json.loads(t.run("jobs", "--json"))}
    assert jobs[shard_a]["gpu_allocations"][0]["shard_gpus"] == [a.gpu_index]


def _seqs(t: Telemetry) -> dict[tuple[str, str, int], list[int]]:
    """Sample sequence numbers per (node, agent run, GPU), from the idempotent sample ids."""
    store = open_store(t.db, migrate=False)
    s = schema.samples
    out: dict[tuple[str, str, int], list[int]] = {}
    with store.engine.connect() as conn:
        for uid, gpu in conn.execute(
            select(s.c.sample_uid, s.c.gpu_index).where(s.c.kind == "gpu")
        ):
            m = re.fullmatch(r"([^:]+):([^:]+):(\d+):(\d+):.*", uid)
            assert m, uid
            out.setdefault((m.group(1), m.group(2), gpu), []).append(int(m.group(3)))
    return out


@pytest.mark.slow
def test_daemon_down_30s_loses_no_samples_and_stores_no_duplicates(telemetry: Telemetry) -> None:
    t = telemetry
    job = t.submit(
        "--gres=gpu:1",
        "-w",
        "gpu4",
        "--wrap",
        t.fakeload("--util", "50", "--mem", "1GiB", "--duration", "180s"),
    )
    wait_for("first samples", lambda: t.gpus(job, min_samples=3))
    t.stop_daemon()
    down_at = time.time()
    time.sleep(30)  # the outage under test: agents must spool for its whole length
    t.start_daemon()  # (a second `sgpu daemon --once` here would be refused: the lease)

    def gaps() -> dict[tuple[str, str, int], list[int]]:
        out = {}
        for key, values in _seqs(t).items():
            assert len(values) == len(set(values)), f"duplicate samples for {key}"
            missing = sorted(set(range(min(values), max(values) + 1)) - set(values))
            if missing:
                out[key] = missing
        return out

    def complete() -> bool:
        logs = [(t.tmp / f"agent-{n}.log").read_text() for n in NODES]
        return all("takes samples again" in text for text in logs) and not gaps()

    wait_for("every agent to drain its spool with no gap", complete, timeout_s=120)
    assert not gaps()
    rows = t.usage().gpu_usage(job)
    assert rows and rows[0].first_at.timestamp() < down_at < rows[0].last_at.timestamp()

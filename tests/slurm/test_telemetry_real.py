"""Telemetry end to end on the real local cluster: fakeload jobs → agents → daemon → store.

One daemon (API on a free 127.0.0.1 port) and one agent per lab node with the simulated
GPU probe run as real processes. Jobs declare their load with ``sgpu fakeload``; the
assertions compare what the store aggregated with what each job declared. Tolerance:
declared utilisation ± 1 percentage point (the simulated probe reports declarations
exactly; the slack covers samples taken while a declaration is being refreshed).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import select

from slurmgpu.labcluster import LabCluster
from slurmgpu.store import open_store, schema
from slurmgpu.store.usage import GpuUsage, UsageStore

T = TypeVar("T")
NODES = ("gpu1", "gpu2", "gpu3", "gpu4")


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 90.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Telemetry:
    tmp: Path
    env: dict[str, str]
    db: str
    port: int
    sim_dir: Path
    lab: LabCluster
    daemon: subprocess.Popen[bytes] | None = None
    agents: dict[str, subprocess.Popen[bytes]] | None = None

    def sgpu(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "slurmgpu", *args]

    def run(self, *args: str) -> str:
        proc = subprocess.run(
            self.sgpu(*args), env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, f"sgpu {' '.join(args)}: {proc.stderr.strip()}"
        return proc.stdout

    def start_daemon(self) -> None:
        log = (self.tmp / "daemon.log").open("ab")
        self.daemon = subprocess.Popen(
            self.sgpu("daemon", "--interval", "1s", "--listen", f"127.0.0.1:{self.port}"),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for("the daemon's API", lambda: _healthy(self.port), timeout_s=30)

    def stop_daemon(self) -> None:
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGTERM)
        assert self.daemon.wait(timeout=60) == 0
        self.daemon = None

    def start_agents(self) -> None:
        self.agents = {}
        gres = self.lab.etc_dir / "gres.conf"
        for node in NODES:
            token = self.tmp / f"{node}.token"
            self.run("node-token", node, "--out", str(token))
            log = (self.tmp / f"agent-{node}.log").open("ab")
            self.agents[node] = subprocess.Popen(
                self.sgpu(
                    "agent",
                    "--node",
                    node,
                    "--daemon",
                    f"http://127.0.0.1:{self.port}",
                    "--interval",
                    "1s",
                    "--probe",
                    "sim",
                    "--sim-dir",
                    str(self.sim_dir),
                    "--gres-conf",
                    str(gres),
                    "--auth",
                    "hmac",
                    "--token-file",
                    str(token),
                    "--spool-dir",
                    str(self.tmp / f"spool-{node}"),
                ),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def submit(self, *args: str) -> int:
        out = self.run("submit", "--parsable", "-o", "/dev/null", *args)
        return int(out.strip().split(";")[0])

    def fakeload(self, *args: str) -> str:
        argv = [
            sys.executable,
            "-m",
            "slurmgpu",
            "fakeload",
            "--state-dir",
            str(self.sim_dir),
            "--interval",
            "1s",
            *args,
        ]
        return " ".join(argv)

    def usage(self) -> UsageStore:
        store = open_store(self.db, migrate=False)
        return UsageStore(store.engine, store.cluster)

    def gpus(self, job_id: int, min_samples: int = 5) -> list[GpuUsage] | None:
        rows = self.usage().gpu_usage(job_id)
        return rows if rows and all(r.samples >= min_samples for r in rows) else None

    def steady(self, job_id: int, window_s: float = 6.0) -> list[GpuUsage] | None:
        """Aggregates over the last seconds only: the first sample of a job can come before
        its fakeload has declared anything (allocated, no process yet: 0 %), which is right
        but would blur a comparison with the declared figure."""
        since = datetime.now(UTC) - timedelta(seconds=window_s)
        rows = self.usage().gpu_usage(job_id, since=since)
        return rows if rows and all(r.samples >= 3 for r in rows) else None


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture
def telemetry(slurm_cluster: LabCluster, tmp_path: Path) -> Iterator[Telemetry]:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[daemon]\nsecret_file = "{tmp_path / "site.secret"}"\nmax_backoff = "2s"\n'
        '[slurm]\ncommand_timeout = "10s"\n'
    )
    db = f"sqlite:///{tmp_path / 'state.db'}"
    env = {**os.environ, "SGPU_DB": db, "SGPU_CONFIG": str(config)}
    t = Telemetry(tmp_path, env, db, free_port(), tmp_path / "simgpu", slurm_cluster)
    t.sim_dir.mkdir()
    t.run("db", "upgrade")
    t.start_daemon()
    t.start_agents()
    try:
        yield t
    finally:
        subprocess.run(["scancel", "--user", "root"], check=False, timeout=30)
        for proc in (t.agents or {}).values():
            proc.terminate()
        for proc in (t.agents or {}).values():
            proc.wait(timeout=60)
        if t.daemon is not None:
            t.daemon.terminate()
            t.daemon.wait(timeout=60)
        for log in tmp_path.glob("*.log"):
            assert "Traceback" not in log.read_text(), f"{log.name} has a traceback"


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
    t.start_daemon()
    t.run("daemon", "--once")  # not needed for ingest, shows the store is writable again

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

"""The real stack for end-to-end tests: a daemon (API on a free port), one agent per lab
node with the simulated GPU probe, and the `sgpu` command line, all as real processes."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import Job, JobState
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.usage_query import GpuUsage
from tests.lab_processes import job_processes
from tests.polling import wait_for
from tests.ports import free_port
from tests.slurm.train_log import read_jsonl
from tests.tier_guard import skip_missing

NODES = ("gpu1", "gpu2", "gpu3", "gpu4")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_train.py"
SLURM = CliSlurmClient(timeout_s=20)  # SLURM_CONF from the environment: the session's lab


def listed_job(job_id: int, slurm: CliSlurmClient = SLURM) -> Job | None:
    """``job_id`` as squeue lists it now; None when it is not listed."""
    return next((j for j in slurm.jobs() if j.job_id == job_id), None)


def running_job(job_id: int, gpus: int | None = None, slurm: CliSlurmClient = SLURM) -> Job | None:
    """``job_id`` while it runs (not completing), on ``gpus`` GPUs if given; else None."""
    j = listed_job(job_id, slurm)
    ok = (
        j is not None
        and j.state is JobState.RUNNING
        and "COMPLETING" not in j.state_flags
        and (gpus is None or j.allocated_gpus == gpus)
    )
    return j if ok else None


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

    def run_daemon_until_killed(self, fault_module: str, point: str, timeout_s: float) -> str:
        """Run the daemon under ``tests.slurm.<fault_module>`` until it SIGKILLs itself at
        ``point``; return the text of the marker file it wrote just before."""
        marker = self.tmp / f"killed-{fault_module}-{point.replace(':', '-')}"
        root = Path(__file__).resolve().parents[2]
        with (self.tmp / "daemon.log").open("ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    f"tests.slurm.{fault_module}",
                    point,
                    str(marker),
                    *("daemon", "--interval", "1s", "--listen", f"127.0.0.1:{self.port}"),
                ],
                env={**self.env, "PYTHONPATH": str(root)},
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

            def proc_ended() -> bool:
                return proc.poll() is not None

            try:
                wait_for(f"the daemon killed at {point}", proc_ended, timeout_s)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert proc.returncode == -signal.SIGKILL, f"the daemon exited {proc.returncode}"
        return marker.read_text()

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
        everything = self.usage().gpu_usage(job_id)
        # Not before the job's first sample (taken at start-up) has left the window.
        if not everything or min(r.first_at for r in everything) > since - timedelta(seconds=2):
            return None
        rows = self.usage().gpu_usage(job_id, since=since)
        return rows if rows and all(r.samples >= 3 for r in rows) else None


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextmanager
def running_stack(
    slurm_cluster: LabCluster, tmp_path: Path, extra_config: str = ""
) -> Iterator[Telemetry]:
    """Daemon + 4 agents on the lab cluster; ``extra_config`` is appended to the TOML."""
    config = tmp_path / "config.toml"
    config.write_text(
        f'[daemon]\nsecret_file = "{tmp_path / "site.secret"}"\nmax_backoff = "2s"\n'
        '[slurm]\ncommand_timeout = "10s"\n' + extra_config
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


@dataclass
class Lab:
    """``sgpu`` on the lab cluster with its own store and config and no daemon: jobs are
    submitted with ``sgpu submit`` or sbatch, and resized by ``tests/slurm/resize_driver.py``
    (the daemon's own MalleableActuator, in a process a test can kill)."""

    tmp: Path
    env: dict[str, str]
    db: str
    slurm: CliSlurmClient

    def sgpu(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "slurmgpu", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, f"sgpu {' '.join(args)}: {proc.stderr.strip()}"
        return proc.stdout

    def submit(self, *args: str) -> int:
        return int(self.sgpu("submit", "--parsable", "-o", "/dev/null", *args).split(";")[0])

    def sbatch(self, *args: str) -> int:
        return self.slurm.submit(["-o", "/dev/null", *args], env=self.env)

    def job(self, job_id: int) -> Job | None:
        return listed_job(job_id, self.slurm)

    def running(self, job_id: int, gpus: int | None = None) -> Job | None:
        return running_job(job_id, gpus, self.slurm)

    def drive(self, *args: str, expect: int = 0) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.slurm.resize_driver", "--db", self.db, *args],
            env={**self.env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == expect, f"driver {args} exited {proc.returncode}: {out}"
        assert "Traceback" not in out, out
        return out

    def trainer(
        self, name: str, gpus: int, lo: int, hi: int, steps: int = 100000, *extra: str
    ) -> int:
        log = self.tmp / f"{name}.jsonl"
        return self.submit(
            "--malleable",
            f"{lo}:{hi}",
            "--checkpoint-grace",
            "30s",
            "--elastic-dir",
            str(self.tmp / "state"),
            f"--gres=gpu:{gpus}",
            *extra,
            "-J",
            name,
            "--wrap",
            f"{sys.executable} {EXAMPLE} --steps {steps} --step-time 0.2 --log {log}",
        )

    def log(self, name: str) -> list[dict[str, Any]]:
        return read_jsonl(self.tmp / f"{name}.jsonl")

    def processes(self, job_id: int) -> list[psutil.Process]:
        """Processes of ``job_id`` of this lab's cluster (its ``SLURM_CONF`` too, not only
        its id: another lab may run a job of that id; tests/lab_processes.py)."""
        return job_processes(job_id, self.env["SLURM_CONF"])

    def steps(self, name: str) -> list[int]:
        return [int(r["step"]) for r in self.log(name) if "event" not in r]

    def starts(self, name: str) -> list[tuple[Any, Any, Any]]:
        return [
            (r["gpus"], r["restart"], r["resumed_step"])
            for r in self.log(name)
            if r.get("event") == "start"
        ]


def lab_dir(slurm_cluster: LabCluster, prefix: str) -> Path:
    """A fresh directory under the lab's root, with the checkout and this Python shared with
    the cluster: a Slurm chroot (the release stage: 24.11, 26.05) sees them bound in, so
    the jobs' ``sgpu launch``, torchrun and workers run the same code as on the host."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=slurm_cluster.root))
    slurm_cluster.share(ROOT, Path(sys.prefix), Path(sys.base_prefix))
    return path


@contextmanager
def driven_lab(tmp: Path, extra_env: Mapping[str, str] | None = None) -> Iterator[Lab]:
    """A :class:`Lab` keeping its store, config and logs in ``tmp``; on leaving, every job
    of the session is cancelled and the cluster waited on to drain."""
    config = tmp / "config.toml"
    config.write_text('[slurm]\ncommand_timeout = "20s"\n')
    db = f"sqlite:///{tmp / 'state.db'}"
    env = {
        **os.environ,
        "SGPU_DB": db,
        "SGPU_CONFIG": str(config),
        "PYTHONPATH": str(ROOT),
        **(extra_env or {}),
    }
    lab = Lab(tmp, env, db, CliSlurmClient(timeout_s=20))
    lab.sgpu("db", "upgrade")
    try:
        yield lab
    finally:
        subprocess.run(["scancel", "--user", "root"], check=False, timeout=30)
        wait_for(
            "the cluster to drain",
            lambda: not [j for j in lab.slurm.jobs() if not j.state.is_terminal],
            timeout_s=60,
        )


@contextmanager
def framework_lab(
    slurm_cluster: LabCluster, prefix: str, modules: tuple[str, ...], why: str, tier: str
) -> Iterator[Lab]:
    """A :func:`driven_lab` for a malleable-framework test (torchrun, Lightning, Hugging
    Face, multi-node): skips through ``tier`` when one of ``modules`` (the jobs' framework)
    is missing, ``why`` saying how to install it. One thread per worker (``OMP_NUM_THREADS``)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        skip_missing(tier, f"{', '.join(missing)} not installed ({why})")
    with driven_lab(lab_dir(slurm_cluster, f"{prefix}-"), {"OMP_NUM_THREADS": "1"}) as lab:
        yield lab

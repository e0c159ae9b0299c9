"""slurmgpu against a site's own policy, on the site-profile lab (16 nodes, accounts, QOS
preemption; slurmgpu/lab/cluster/site.py), each part run as the users and rights a site
would give it: the jobs are the site users', the resize machinery runs as the daemon's
own user (coordinator of account ``root``, no AdminLevel) from a database only it can
write.

- Slurm's own QOS preemption requeues a malleable job in the middle of its resize (after
  the checkpoint, just before slurmgpu's own requeue): the resize ends cleanly at the new
  size, nothing is left held, no step is lost.
- A resize never moves a job to another account, QOS or partition.
- A growth the partition's nodes cannot hold (8 GPUs a node of a one-node job in partition
  ``debug``, ``MaxNodes=1``, on 4-GPU nodes) never runs: it goes back, the job runs on.
- A resize respects the site's QOS limits: a growth Slurm takes (an operator's or
  coordinator's update is not checked against them) but the QOS will never run goes
  back to the old size, and the job runs on.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.lab.cluster import LabCluster, site
from tests.polling import wait_for
from tests.slurm.site_users import (
    ROOT,
    as_user,
    cancel_all,
    job_fields,
    sbatch_as,
    shared_dir,
    user_argv,
    user_env,
    user_python,
)

# the site profile on every release: scripts/test.sh runs it in each release stage too
pytestmark = pytest.mark.release

EXAMPLE = ROOT / "examples" / "elastic_train.py"
OWNER = "sgpu-u4"  # biology
RIVAL = "sgpu-u1"  # physics


@dataclass
class Site:
    lab: LabCluster
    work: Path
    python: list[str]
    env: dict[str, str]

    def sgpu_as(self, user: str, *args: str) -> str:
        proc = as_user(user, *self.python, "-m", "slurmgpu", *args, cwd=self.work, env=self.env)
        assert proc.returncode == 0, f"sgpu {' '.join(args)} as {user}: {proc.stderr.strip()}"
        return proc.stdout

    def trainer(self, name: str, *sbatch: str, gpus: int = 4, malleable: str = "2:4") -> int:
        log = self.work / f"{name}.jsonl"
        out = self.sgpu_as(
            OWNER,
            "submit",
            "--parsable",
            "-o",
            str(self.work / f"{name}.out"),
            "--malleable",
            malleable,
            "--checkpoint-grace",
            "30s",
            "--elastic-dir",
            str(self.work / "state"),
            f"--gres=gpu:{gpus}",
            *sbatch,
            "-J",
            name,
            "--wrap",
            f"{self.python[0]} {EXAMPLE} --steps 100000 --step-time 0.2 --log {log}",
        )
        return int(out.strip().split(";")[0])

    def driver(self, *args: str) -> subprocess.Popen[str]:
        """The daemon's resize machinery (tests/slurm/resize_driver.py) as the daemon's
        user; its output goes to ``driver.log``."""
        log = (self.work / "driver.log").open("a")
        argv = [*self.python, "-m", "tests.slurm.resize_driver", "--db", self.env["SGPU_DB"]]
        command, env = user_argv(site.DAEMON_USER, [*argv, *args], self.env)
        return subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def driver_log(self) -> str:
        path = self.work / "driver.log"
        return path.read_text() if path.exists() else ""

    def log(self, name: str) -> list[dict[str, Any]]:
        path = self.work / f"{name}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def steps(self, name: str) -> list[int]:
        return [int(r["step"]) for r in self.log(name) if "event" not in r]

    def starts(self, name: str) -> list[tuple[Any, Any, Any]]:
        return [
            (r["gpus"], r["restart"], r["resumed_step"])
            for r in self.log(name)
            if r.get("event") == "start"
        ]


def running(job_id: int, gpus: int | None = None) -> dict[str, str] | None:
    fields = job_fields(job_id)
    if fields.get("JobState") != "RUNNING":
        return None
    # 22.05 calls the allocation TRES, later releases AllocTRES
    tres = fields.get("AllocTRES") or fields.get("TRES", "")
    if gpus is not None and f"gres/gpu={gpus}" not in tres.split(","):
        return None
    return fields


def placement(fields: dict[str, str]) -> tuple[str, str, str, str]:
    return fields["UserId"], fields["Account"], fields["QOS"], fields["Partition"]


@pytest.fixture
def site_env(site_cluster: LabCluster) -> Iterator[Site]:
    with shared_dir("sgpu-site-interplay-") as work:
        yield from _site_env(site_cluster, work, user_python(site_cluster, work))


def _site_env(site_cluster: LabCluster, work: Path, python: list[str]) -> Iterator[Site]:
    daemon = site.DAEMON_UID
    (work / "daemon").mkdir()
    db = f"sqlite:///{work / 'daemon' / 'state.db'}"
    config = work / "config.toml"
    config.write_text('[slurm]\ncommand_timeout = "20s"\n')
    env = user_env({"SGPU_DB": db, "SGPU_CONFIG": str(config)})
    upgrade = subprocess.run(
        [*python, "-m", "slurmgpu", "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    # the daemon's database is its own: the users cannot write it
    for path in (work / "daemon", *(work / "daemon").iterdir()):
        os.chown(path, daemon, site.GID)
        path.chmod(0o700 if path.is_dir() else 0o600)
    try:
        yield Site(site_cluster, work, python, env)
    finally:
        cancel_all()


def _consecutive(steps: list[int]) -> bool:
    return bool(steps) and steps == list(range(1, len(steps) + 1))


def test_slurm_preempts_a_malleable_job_in_the_middle_of_its_resize(site_env: Site) -> None:
    s = site_env
    job = s.trainer("preempted", "--qos=scavenger", "-w", "gpu16")
    first = wait_for("the malleable job at 4 GPUs", lambda: running(job, 4))
    wait_for("10 steps", lambda: len(s.steps("preempted")) >= 10)

    go = s.work / "go"
    driver = s.driver(
        "--start", f"{job}:4:2", "--pause-before", "requeue", "--go", str(go), "--timeout", "240"
    )
    try:
        wait_for(
            "the resize checkpointed and about to requeue",
            lambda: "paused before requeue" in s.driver_log() or driver.poll() is not None,
            timeout_s=120,
        )
        assert driver.poll() is None, s.driver_log()
        # Slurm's turn: a normal-QOS job of another account wants the whole node
        rival = sbatch_as(RIVAL, "-w", "gpu16", "--gres=gpu:4", "-t", "2", "--wrap", "sleep 20")
        preempted = wait_for(
            "the malleable job requeued by Slurm",
            lambda: (
                f
                if (f := job_fields(job)).get("JobState") == "PENDING" and f.get("Restarts") == "1"
                else None
            ),
        )
        wait_for("the rival running", lambda: running(rival))
        go.touch()
        assert driver.wait(timeout=300) == 0, s.driver_log()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    log = s.driver_log()
    assert "Traceback" not in log, log
    assert "nothing in flight" in log, log
    # nothing left held: the job waits for the node only, then runs again by itself
    fields = job_fields(job)
    assert "Held" not in fields["Reason"] and fields["Priority"] != "0", fields
    assert placement(preempted) == placement(first)
    wait_for("the rival done", lambda: job_fields(rival).get("JobState") != "RUNNING", 90)
    # Slurm's requeue did the resize's requeue: the transaction saw the restart count grow
    # (its step is idempotent by that count), set the new size on the pending job and
    # released nothing it had not held; the job runs at 2 GPUs from its checkpoint.
    back = wait_for("the job running at 2 GPUs", lambda: running(job, 2), timeout_s=120)
    assert placement(back) == placement(first)
    assert "Held" not in back["Reason"]
    name = "preempted"
    wait_for(
        "steps after the restart",
        lambda: len(s.starts(name)) >= 2 and s.steps(name)[-1] > s.starts(name)[-1][2] + 3,
        timeout_s=120,
    )
    assert _consecutive(s.steps(name)), "a step was lost or repeated"
    resizes = s.sgpu_as(site.DAEMON_USER, "resizes", "--job", str(job), "--json")
    rows = json.loads(resizes)
    assert [r["state"] for r in rows] == ["running"], rows
    assert [(g, r) for g, r, _ in s.starts(name)] == [(4, 0), (2, 1)]


def test_a_resize_keeps_the_jobs_account_qos_and_partition(site_env: Site) -> None:
    s = site_env
    job = s.trainer("kept", "--qos=scavenger", "-p", "gpu", "-w", "gpu15")
    before = wait_for("the malleable job at 4 GPUs", lambda: running(job, 4))
    wait_for("5 steps", lambda: len(s.steps("kept")) >= 5)
    driver = s.driver("--start", f"{job}:4:2", "--timeout", "240")
    assert driver.wait(timeout=300) == 0, s.driver_log()
    after = wait_for("the job at 2 GPUs", lambda: running(job, 2), timeout_s=60)
    assert placement(after) == placement(before)
    assert after["Restarts"] == "1"


def test_a_growth_over_the_qos_limit_goes_back_and_the_job_runs_on(site_env: Site) -> None:
    s = site_env

    def qos_limit(value: str) -> None:
        subprocess.run(
            ["sacctmgr", "-i", "modify", "qos", "scavenger", "set", f"MaxTRESPerJob={value}"],
            capture_output=True,
            timeout=30,
            check=True,
        )

    qos_limit("gres/gpu=2")
    try:
        job = s.trainer("capped", "--qos=scavenger", "-w", "gpu13", gpus=2)
        before = wait_for("the malleable job at 2 GPUs", lambda: running(job, 2))
        wait_for("5 steps", lambda: len(s.steps("capped")) >= 5)
        driver = s.driver("--start", f"{job}:2:4", "--timeout", "240")
        assert driver.wait(timeout=300) == 0, s.driver_log()
    finally:
        qos_limit("gres/gpu=-1")
    after = wait_for("the job at 2 GPUs again", lambda: running(job, 2), timeout_s=60)
    assert placement(after) == placement(before)
    assert "Held" not in after["Reason"]
    (row,) = json.loads(s.sgpu_as(site.DAEMON_USER, "resizes", "--job", str(job), "--json"))
    assert row["state"] == "rolled_back", row
    assert "QOSMaxGRESPerJob" in (row["error"] or ""), row
    wait_for(
        "steps after the restart",
        lambda: (
            len(s.starts("capped")) >= 2 and s.steps("capped")[-1] > s.starts("capped")[-1][2] + 3
        ),
        timeout_s=120,
    )
    assert _consecutive(s.steps("capped"))
    assert [(g, r) for g, r, _ in s.starts("capped")] == [(2, 0), (2, 1)]


def test_a_growth_no_node_of_the_partition_holds_goes_back(
    site_env: Site,
) -> None:
    s = site_env
    # partition debug: MaxNodes=1; 8 GPUs would be 2 nodes of 4
    job = s.trainer("debug", "-p", "debug", "-N", "1", gpus=4, malleable="2:8")
    before = wait_for("the malleable job at 4 GPUs", lambda: running(job, 4))
    wait_for("5 steps", lambda: len(s.steps("debug")) >= 5)
    driver = s.driver("--start", f"{job}:4:8", "--timeout", "240")
    assert driver.wait(timeout=300) == 0, s.driver_log()
    after = wait_for("the job at 4 GPUs again", lambda: running(job, 4), timeout_s=60)
    assert placement(after) == placement(before) and after["Partition"] == "debug"
    assert after["NumNodes"] == "1", after
    (row,) = json.loads(s.sgpu_as(site.DAEMON_USER, "resizes", "--job", str(job), "--json"))
    assert row["state"] == "rolled_back", row
    assert "BadConstraints" in (row["error"] or ""), row
    wait_for(
        "steps after the restart",
        lambda: len(s.starts("debug")) >= 2 and s.steps("debug")[-1] > s.starts("debug")[-1][2] + 3,
        timeout_s=120,
    )
    assert _consecutive(s.steps("debug"))

"""The lab cluster against real Slurm daemons (no mocks): GRES, GPU/shard jobs, slurmctld
restart with a running job, and that ``down()`` stops exactly its own processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from click.testing import CliRunner

from slurmgpu.cli.cluster import cluster
from slurmgpu.lab.cluster import LabCluster
from tests import polling
from tests.lab_processes import job_processes

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "tests the 4-node lab launcher itself (restart, down() stops its own)"

if TYPE_CHECKING:
    from collections.abc import Callable

R = TypeVar("R")
_T = 30.0  # seconds any single wait may take


def slurm(*argv: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr.strip()}"
    return proc.stdout


def wait_for(probe: Callable[[], R | None], what: str, timeout: float = _T) -> R:
    """``tests.polling.wait_for`` with this module's argument order: any value but None."""
    return polling.wait_for(what, probe, timeout, until_not_none=True)


def sbatch(*args: str) -> int:
    return int(slurm("sbatch", "--parsable", *args).strip().split(";")[0])


def job_state(job_id: int) -> str | None:
    proc = subprocess.run(
        ["scontrol", "show", "job", str(job_id)],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    for token in proc.stdout.split():
        if token.startswith("JobState="):
            return token.removeprefix("JobState=")
    return None


def wait_state(job_id: int, want: str) -> str:
    return wait_for(lambda: want if job_state(job_id) == want else None, f"job {job_id} {want}")


def output_line(path: Path, prefix: str) -> str | None:
    """The first line of ``path`` starting with ``prefix`` (without it), once it exists."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return next((ln.removeprefix(prefix) for ln in lines if ln.startswith(prefix)), None)


def slurm_daemon_pids() -> set[int]:
    """Every slurmctld/slurmd process on the host, whoever started it."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if comm in ("slurmctld", "slurmd") and state != "Z":
            pids.add(int(proc.name))
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_all_four_nodes_idle_with_four_gpus_and_sixteen_shards(slurm_cluster: LabCluster) -> None:
    def all_idle() -> dict[str, str] | None:
        states = slurm_cluster.node_states()
        return states if states and set(states.values()) == {"idle"} else None

    states = wait_for(all_idle, "all nodes idle")
    assert sorted(states) == ["gpu1", "gpu2", "gpu3", "gpu4"]
    gres = dict(line.split() for line in slurm("sinfo", "-h", "-N", "-o", "%N %G").splitlines())
    assert gres == {f"gpu{i}": "gpu:4,shard:16" for i in range(1, 5)}


def test_gpu2_job_sees_two_cuda_visible_devices(slurm_cluster: LabCluster, tmp_path: Path) -> None:
    out = tmp_path / "gpu.out"
    job = sbatch("--gres=gpu:2", "-o", str(out), "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES")

    cvd = wait_for(lambda: output_line(out, "CVD="), f"output of job {job}")

    assert len(cvd.split(",")) == 2, cvd
    wait_state(job, "COMPLETED")


def test_shard_job_runs_with_its_shards(slurm_cluster: LabCluster, tmp_path: Path) -> None:
    out = tmp_path / "shard.out"
    job = sbatch("--gres=shard:2", "-o", str(out), "--wrap", "echo SHARDS=$SLURM_SHARDS_ON_NODE")

    shards = wait_for(lambda: output_line(out, "SHARDS="), f"output of job {job}")

    assert shards == "2"
    wait_state(job, "COMPLETED")


def test_job_submit_lua_plugin_runs_and_accepts_jobs(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    # the lab installs plugins/job_submit.lua; it logs malleable submissions
    out = str(tmp_path / "lua.out")
    job = sbatch("-J", "lua-probe", "--comment", "sgpu:malleable=1:2", "-o", out, "--wrap", "true")
    log = slurm_cluster.log_dir / "slurmctld.log"

    wait_for(
        lambda: (
            True
            if "slurmgpu: malleable submission user=root name=lua-probe" in log.read_text()
            else None
        ),
        "job_submit.lua log line",
    )
    wait_state(job, "COMPLETED")


def test_a_jobs_processes_are_its_labs_not_a_decoys_with_the_same_job_id(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    """Another lab on this machine has its own job of the same id: its processes carry
    that SLURM_JOB_ID too, but their lab's SLURM_CONF (tests/lab_processes.py)."""
    job = sbatch("-o", str(tmp_path / "sleep.out"), "--wrap", "sleep 300")
    decoy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        env={**os.environ, "SLURM_JOB_ID": str(job), "SLURM_CONF": str(tmp_path / "x.conf")},
    )
    try:
        wait_state(job, "RUNNING")
        procs = wait_for(lambda: job_processes(job, slurm_cluster.conf_path) or None, "procs")
        assert decoy.pid not in {p.pid for p in procs}
        assert "sleep" in {p.name() for p in procs}  # the batch script's own command
        assert all(p.environ()["SLURM_CONF"] == str(slurm_cluster.conf_path) for p in procs)
    finally:
        subprocess.run(["scancel", str(job)], timeout=15, check=False)
        decoy.kill()
        decoy.wait(timeout=10)
    wait_state(job, "CANCELLED")
    wait_for(lambda: not job_processes(job, slurm_cluster.conf_path) or None, "no job process")


def test_running_job_survives_slurmctld_stop_and_start(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    job = sbatch("-o", str(tmp_path / "long.out"), "--wrap", "sleep 300")
    try:
        wait_state(job, "RUNNING")

        slurm_cluster.stop_ctld()
        assert slurm_cluster.status()["daemons"]["slurmctld"]["alive"] is False
        assert not slurm_cluster.is_up()
        slurm_cluster.start_ctld()

        assert slurm_cluster.is_up()
        assert wait_state(job, "RUNNING") == "RUNNING"
    finally:
        subprocess.run(["scancel", str(job)], timeout=15, check=False)
    wait_state(job, "CANCELLED")


def test_down_stops_exactly_its_own_pids(slurm_cluster: LabCluster, tmp_path: Path) -> None:
    others = slurm_daemon_pids()  # the session cluster, and e.g. a lab on the default ports
    # This worker's session cluster must survive; other xdist workers' clusters may stop
    # by themselves meanwhile (their tests done), so they are not asserted alive after.
    session = {d["pid"] for d in slurm_cluster.status()["daemons"].values()}
    assert len(session) == 5 and session <= others
    second = LabCluster(
        tmp_path / "second",
        nodes=2,
        # 1,000 ports on: clear of every xdist worker's session cluster (10 apart each;
        # +10 was the next worker's slurmctld, a collision seen in CI)
        ctld_port=slurm_cluster.ctld_port + 1000,
        slurmd_port_base=slurm_cluster.slurmd_port_base + 1000,
    )
    second.up(timeout_s=30.0)
    own = {d["pid"] for d in second.status()["daemons"].values()}
    assert len(own) == 3 and not own & others

    second.down()

    assert not any(alive(pid) for pid in own)
    assert all(alive(pid) for pid in session), "down() stopped a process it did not start"
    assert slurm_cluster.is_up()
    assert not second.is_up()


def test_cli_status_and_env_describe_the_running_cluster(slurm_cluster: LabCluster) -> None:
    runner = CliRunner()
    root = str(slurm_cluster.root)

    status = runner.invoke(cluster, ["status", "--root", root, "--json"])
    env = runner.invoke(cluster, ["env", "--root", root])

    assert status.exit_code == 0, status.output
    info = json.loads(status.output)
    assert info["up"] is True
    assert sorted(info["nodes"]) == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert env.exit_code == 0, env.output
    assert env.output.strip() == f"export SLURM_CONF={slurm_cluster.conf_path}"

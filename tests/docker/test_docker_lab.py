"""docker-slurm/ in a real container engine, under Compose v1 and v2.

Each Compose version builds (cached after the first), brings up the ``accounting`` profile
(MariaDB, slurmdbd, slurmctld, gpu1..gpu4), waits for every node to be idle (the time from
``up`` is printed), runs a GPU job and a shard job, reads them back with ``sacct``, runs one
``sgpu daemon --once`` cycle on the host through ``docker-slurm/host-bin`` (CliSlurmClient
calling the Slurm commands in the controller container) and takes the cluster down.

Run by ``scripts/test.sh`` after ``scripts/docker_prepare.sh`` (root): it sets
``SGPU_DOCKER_TESTS=1``, and then an engine that does not answer is a failure, never a skip.
Without that variable these tests skip (with this reason), so a plain ``pytest`` on a machine
without an engine does not start one; but a run that asks for them (``pytest -m docker``)
then fails naming it (tests/tier_guard.py), and ``scripts/test.sh -m docker`` prepares the
engine and sets the variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tier_guard import skip_missing

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "docker-slurm"
COMPOSE_FILE = LAB / "docker-compose.yml"
OVERLAY = LAB / "docker-compose.sgpu.yml"
HOST_BIN = LAB / "host-bin"
ENABLE_ENV = "SGPU_DOCKER_TESTS"
COMPOSE = {"v1": ["docker-compose"], "v2": ["docker", "compose"]}
NODES = ["gpu1", "gpu2", "gpu3", "gpu4"]
SITE_NODES = [f"gpu{i}" for i in range(1, 17)]
IDLE_TIMEOUT_S = 120.0


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return proc.stdout


def _require_engine() -> None:
    """Skip (with the reason) unless enabled; once enabled, a missing engine fails."""
    if os.environ.get(ENABLE_ENV) != "1":
        skip_missing(
            "docker",
            f"docker tests run only with {ENABLE_ENV}=1 (scripts/test.sh sets it after "
            "scripts/docker_prepare.sh has installed and started the engine)",
        )
    if shutil.which("docker") is None:
        pytest.fail("no docker CLI: run scripts/docker_prepare.sh (as root) first", pytrace=False)
    proc = subprocess.run(
        ["docker", "info"], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"the container engine does not answer (docker info: {proc.stderr.strip()[-500:]}); "
            "scripts/docker_prepare.sh starts dockerd, see /var/log/slurmgpu-dockerd.log",
            pytrace=False,
        )


def _base_image_env() -> dict[str, str]:
    """Use the registry-free base image when scripts/docker_prepare.sh made one."""
    release = os.environ.get("DEBIAN_RELEASE", "bookworm")
    if "SGPU_BASE_IMAGE" in os.environ:
        return {}
    probe = subprocess.run(
        ["docker", "image", "inspect", f"slurmgpu/debian:{release}-slim"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return {"SGPU_BASE_IMAGE": "slurmgpu/debian"} if probe.returncode == 0 else {}


@dataclass
class DockerLab:
    """One running docker-slurm project."""

    version: str
    project: str
    env: dict[str, str]
    work: Path
    up_to_idle_s: float = 0.0
    profile: str = "accounting"  # the Compose profile: "accounting" or "site"

    def compose(self, *args: str, timeout: float = 300) -> str:
        argv = [*COMPOSE[self.version], "-p", self.project, "-f", str(COMPOSE_FILE)]
        argv += ["-f", str(OVERLAY), "--profile", self.profile, *args]
        return _run(argv, env=self.env, timeout=timeout)

    def ctld(self, *cmd: str, timeout: float = 120) -> str:
        """Run a command in the controller container."""
        return self.compose("exec", "-T", "slurmctld", *cmd, timeout=timeout)

    def host_env(self) -> dict[str, str]:
        """Environment for host commands that reach Slurm through docker-slurm/host-bin."""
        env = dict(self.env)
        env["PATH"] = f"{HOST_BIN}:{env['PATH']}"
        env["SGPU_DOCKER_PROJECT"] = self.project
        env.pop("SLURM_CONF", None)
        return env

    def idle_nodes(self) -> list[str]:
        try:
            out = self.ctld("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", timeout=30)
        except (AssertionError, subprocess.TimeoutExpired):
            return []
        return sorted(set(out.split()))


@pytest.fixture(scope="module", params=["v2", "v1"])
def lab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DockerLab]:
    yield from _lab(request, tmp_path_factory, request.param, "accounting", NODES)


# The site profile under Compose v2 only: 19 containers take a while to start on two
# cores, and what differs between the Compose versions is covered by the lab above.
@pytest.fixture(scope="module")
def site_lab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DockerLab]:
    yield from _lab(request, tmp_path_factory, "v2", "site", SITE_NODES)


def _lab(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    version: str,
    profile: str,
    nodes: list[str],
) -> Iterator[DockerLab]:
    _require_engine()
    if shutil.which(COMPOSE[version][0]) is None or (
        subprocess.run(
            [*COMPOSE[version], "version"], capture_output=True, timeout=60, check=False
        ).returncode
        != 0
    ):
        pytest.fail(
            f"Compose {version} ({' '.join(COMPOSE[version])}) is missing: "
            "run scripts/docker_prepare.sh",
            pytrace=False,
        )
    work = tmp_path_factory.mktemp(f"docker-{version}-{profile}")
    env = dict(os.environ)
    env.update(_base_image_env())
    env.update(
        SGPU_ACCOUNTING="1",
        SGPU_PROFILE="site" if profile == "site" else "default",
        SGPU_REPO=str(REPO),
        SGPU_WORK=str(work),
        # Compose v1 otherwise colours and sizes its output for a terminal
        COMPOSE_INTERACTIVE_NO_CLI="1",
        # v2 would build with BuildKit, whose cache is not the classic builder's that
        # docker_prepare.sh (v1) filled: on a fresh CI machine that is a second full build
        DOCKER_BUILDKIT="0",
    )
    project = f"sgpu-test-{version}" if profile == "accounting" else f"sgpu-test-{profile}"
    lab = DockerLab(version, project, env, work, profile=profile)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    lab.compose("down", "-v", "--remove-orphans", timeout=120)  # leftovers of a killed run
    try:
        t_build = time.monotonic()
        lab.compose("build", "-q", "config", "mariadb", timeout=900)
        build_s = time.monotonic() - t_build
        start = time.monotonic()
        lab.compose("up", "-d", timeout=300)
        while lab.idle_nodes() != sorted(nodes):
            if time.monotonic() - start > IDLE_TIMEOUT_S:
                logs = lab.compose("logs", "--tail=20", timeout=60)
                pytest.fail(
                    f"Compose {version}: not all nodes idle after {IDLE_TIMEOUT_S:g} s\n{logs}"
                )
            time.sleep(0.2)
        lab.up_to_idle_s = time.monotonic() - start
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None:
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                reporter.write_line("")
                reporter.write_line(
                    f"docker-slurm (Compose {version}, {profile} profile): build "
                    f"{build_s:.1f} s (cached after the first), up -> {len(nodes)} nodes idle "
                    f"{lab.up_to_idle_s:.1f} s"
                )
        yield lab
    finally:
        lab.compose("down", "-v", "--remove-orphans", timeout=180)


def _compose(version: str, *args: str) -> str:
    argv = [*COMPOSE[version], "-f", str(COMPOSE_FILE), "--profile", "accounting", *args]
    return _run(argv, env={**os.environ, "SGPU_ACCOUNTING": "1"}, timeout=60)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_compose_file_validates_without_privileged(version: str) -> None:
    _require_engine()
    assert not re.search(r"^name:", COMPOSE_FILE.read_text(), re.MULTILINE), (
        "Compose v1 rejects a top-level name:"
    )
    listed = set(_compose(version, "config", "--services").split())
    # v1 lists (and prints) the services of every profile; its `up` honours them
    services = listed - set(SITE_NODES[len(NODES) :]) if version == "v1" else listed
    assert services == {"config", "slurmctld", *NODES, "slurmdbd", "mariadb"}
    merged = _compose(version, "config")  # the merged, validated file
    # only the services: v2 prints the x- anchors' blocks as well
    block = re.search(r"^services:\n((?:(?:[ -].*)?\n)*)", merged, re.MULTILINE)
    assert block is not None, merged
    config = block.group(1)
    assert "privileged" not in config
    assert config.count("cap_drop:") == len(listed)
    assert not re.search(r"cap_add:(\n\s*- [A-Z_]+)*\n\s*- ALL\b", config)


def test_all_nodes_idle_with_four_gpus_and_sixteen_shards(lab: DockerLab) -> None:
    out = lab.ctld("sinfo", "-h", "-N", "-o", "%N %G %T")
    rows = sorted(line.split() for line in out.splitlines() if line.strip())
    assert rows == [[node, "gpu:4,shard:16", "idle"] for node in NODES]
    assert lab.up_to_idle_s > 0


def test_gpu_job_gets_two_devices(lab: DockerLab) -> None:
    out = lab.ctld(
        "srun", "-J", "docker-gpu", "--gres=gpu:2", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"
    )
    assert sorted(out.strip().split(",")) == ["0", "1"]


def test_shard_job_gets_its_shards(lab: DockerLab) -> None:
    out = lab.ctld(
        "srun", "-J", "docker-shard", "--gres=shard:4", "sh", "-c", "echo $SLURM_SHARDS_ON_NODE"
    )
    assert out.strip() == "4"


def _sacct_tres(lab: DockerLab) -> dict[str, str]:
    out = lab.ctld("sacct", "-a", "-X", "-n", "-P", "-o", "JobName,State,AllocTRES")
    return {
        name: tres
        for name, state, tres in (line.split("|") for line in out.splitlines() if line)
        if state == "COMPLETED"
    }


def test_sacct_lists_the_gpu_and_shard_jobs_with_their_gres(lab: DockerLab) -> None:
    lab.ctld("srun", "-J", "acct-gpu", "--gres=gpu:1", "true")
    lab.ctld("srun", "-J", "acct-shard", "--gres=shard:2", "true")
    deadline = time.monotonic() + 30  # slurmctld sends job records to slurmdbd asynchronously
    tres = _sacct_tres(lab)
    while not {"acct-gpu", "acct-shard"} <= set(tres) and time.monotonic() < deadline:
        time.sleep(0.5)
        tres = _sacct_tres(lab)
    assert "gres/gpu=1" in tres.get("acct-gpu", ""), tres
    assert "gres/shard=2" in tres.get("acct-shard", ""), tres


def test_daemon_once_on_the_host_sees_the_jobs(lab: DockerLab) -> None:
    env = lab.host_env()
    sgpu = str(REPO / ".venv" / "bin" / "sgpu")
    db = f"sqlite:///{lab.work / 'sgpu.db'}"
    # submitted from the host through the wrapper; the checkout is mounted at its own path
    running = _run(
        [
            "sbatch",
            "--parsable",
            "-J",
            "docker-running",
            "--gres=gpu:1",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        ],
        env=env,
    ).strip()
    lab.ctld("srun", "-J", "docker-done", "--gres=shard:4", "true")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = lab.ctld("squeue", "-h", "-j", running, "-o", "%T").strip()
        if state == "RUNNING":
            break
        time.sleep(0.3)
    _run([sgpu, "--db", db, "db", "upgrade"], env=env)
    _run([sgpu, "--db", db, "daemon", "--once", "--no-api", "--no-policies"], env=env)
    jobs = {j["name"]: j for j in json.loads(_run([sgpu, "--db", db, "jobs", "--json"], env=env))}
    assert jobs["docker-running"]["state"] == "RUNNING"
    assert str(jobs["docker-running"]["job_id"]) == running
    assert jobs["docker-running"]["gpus_requested"] == 1
    assert jobs["docker-running"]["nodes"][0] in NODES
    assert jobs["docker-done"]["state"] == "COMPLETED"
    assert jobs["docker-done"]["shards_requested"] == 4
    _run(["scancel", running], env=env)


# ---------------------------------------------------------------- the site profile


def _as_user(lab: DockerLab, user: str, *cmd: str) -> str:
    """``cmd`` as ``user`` in the controller container (jobs run from /tmp)."""
    return lab.ctld("runuser", "-u", user, "--", *cmd)


def _job_field(lab: DockerLab, job: str, field: str) -> str:
    out = lab.ctld("scontrol", "show", "job", "-o", job)
    fields = dict(p.split("=", 1) for p in out.split() if "=" in p)
    return fields.get(field, "")


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.5)


def test_site_profile_has_its_nodes_partitions_and_associations(site_lab: DockerLab) -> None:
    rows = site_lab.ctld("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %G").split("\n")
    assert sorted(r.split()[0] for r in rows if r.strip()) == sorted(SITE_NODES)
    parts = site_lab.ctld("sinfo", "-h", "-o", "%R %D").split()
    assert parts == ["gpu", "16", "debug", "2"]
    assoc = site_lab.ctld("sacctmgr", "-n", "-P", "show", "assoc", "format=account,user,qos")
    users = {row[1]: row for row in (ln.split("|") for ln in assoc.splitlines()) if row[1]}
    for user in [f"sgpu-u{i}" for i in range(1, 9)]:
        assert set(users[user][2].split(",")) == {"normal", "scavenger"}, users[user]
    assert users["sgpu-u1"][0] == "physics" and users["sgpu-u4"][0] == "biology"
    coords = site_lab.ctld("sacctmgr", "-n", "-P", "show", "user", "sgpu-daemon", "withcoord")
    assert "root" in coords, coords


def test_site_profile_jobs_run_as_their_user_who_sees_only_their_own(
    site_lab: DockerLab,
) -> None:
    who = _as_user(site_lab, "sgpu-u4", "srun", "--chdir=/tmp", "-N", "1", "id", "-un")
    assert who.strip() == "sgpu-u4"
    mine = _as_user(
        site_lab, "sgpu-u2", "sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null",
        "--wrap", "sleep 60",
    ).strip()  # fmt: skip
    try:
        assert _as_user(site_lab, "sgpu-u5", "squeue", "-h", "-o", "%i").split() == []
        assert mine in _as_user(site_lab, "sgpu-u2", "squeue", "-h", "-o", "%i").split()
    finally:
        site_lab.ctld("scancel", mine)


def test_site_profile_qos_preemption_requeues_a_scavenger_job(site_lab: DockerLab) -> None:
    common = ["--parsable", "--chdir=/tmp", "-o", "/dev/null", "-w", "gpu16", "--gres=gpu:4"]
    victim = _as_user(
        site_lab, "sgpu-u1", "sbatch", *common, "--qos=scavenger", "--wrap", "sleep 300"
    ).strip()
    rival = ""
    try:
        _wait(
            "the scavenger job running",
            lambda: _job_field(site_lab, victim, "JobState") == "RUNNING",
        )
        rival = _as_user(site_lab, "sgpu-u4", "sbatch", *common, "--wrap", "sleep 300").strip()
        _wait(
            "the normal-QOS job running",
            lambda: _job_field(site_lab, rival, "JobState") == "RUNNING",
        )
        assert _job_field(site_lab, victim, "JobState") == "PENDING"
        assert _job_field(site_lab, victim, "Restarts") == "1"
    finally:
        site_lab.ctld("scancel", victim, *([rival] if rival else []))

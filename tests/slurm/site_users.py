"""Run commands as the site profile's Unix users (slurmgpu/lab/cluster/site.py).

``sgpu`` as such a user: the test venv's interpreter may live where other users cannot
execute it (pyenv under /root), so a user runs the system ``python3`` of the same minor
version with this checkout and the venv's site-packages on ``PYTHONPATH`` -- in a Slurm
chroot lab, a copy of it the chroot sees (:func:`user_python`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurmgpu.lab.chroot_python import (
    CHROOT_PATH,
    ChrootPythonError,
    chroot_env,
    chroot_python,
    stdlib_of,
)
from slurmgpu.lab.cluster import LabCluster
from slurmgpu.lab.cluster.site import DAEMON_USER
from slurmgpu.lab.replay import ReplayLabError, site_python
from slurmgpu.slurm.cli import CliSlurmClient
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def slurm_chroot() -> str | None:
    """The Slurm chroot the lab runs from (``SGPU_TEST_SLURM_ROOT``), or None."""
    return os.environ.get("SGPU_TEST_SLURM_ROOT") or None


@contextmanager
def shared_dir(prefix: str) -> Iterator[Path]:
    """A directory every user may write to (pytest's tmp_path is root's, mode 0700),
    removed afterwards unless ``SGPU_KEEP_LAB`` is set."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        if not os.environ.get("SGPU_KEEP_LAB"):
            _remove(path)


def _remove(path: Path, timeout_s: float = 30.0) -> None:
    """Remove ``path``, again while a cancelled job's last process (slower to go in a
    chroot lab) still writes its state there; what is left after ``timeout_s`` stays."""
    deadline = time.monotonic() + timeout_s
    shutil.rmtree(path, ignore_errors=True)
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
        shutil.rmtree(path, ignore_errors=True)


def _system_python() -> None:
    """Skip (saying why) unless :data:`SYSTEM_PYTHON` can load the test venv's packages
    (:func:`slurmgpu.lab.replay.site_python`, the replay bench's own check)."""
    try:
        site_python()
    except ReplayLabError as exc:
        pytest.skip(str(exc))


def _purelib() -> Path:
    """The venv's site-packages, links resolved (a chroot sees what is bound, not links)."""
    return Path(sysconfig.get_paths()["purelib"]).resolve()


def user_python(lab: LabCluster, work: Path) -> list[str]:
    """The interpreter a site user runs slurmgpu with (and a job its Python); skips,
    saying why, if there is none.

    Natively :data:`SYSTEM_PYTHON`. In a Slurm chroot lab (the release stage) the users'
    commands run inside the chroot, which has no Python: a copy of the same interpreter
    in ``work`` (a :func:`shared_dir`), bound in with its standard library, this checkout
    and the venv's site-packages (:func:`slurmgpu.lab.chroot_python.chroot_python`, as
    bench/replay_real.py does). The venv's own interpreter cannot serve: it lives under
    ``/root``, which no user may enter, in the chroot as on the host."""
    _system_python()
    if lab.chroot is None:
        return [str(SYSTEM_PYTHON)]
    try:
        argv, _ = chroot_python(lab, SYSTEM_PYTHON, work, ROOT)
    except ChrootPythonError as exc:
        pytest.skip(str(exc))
    return argv


def chroot_user_env() -> dict[str, str]:
    """What a site user's command needs inside a Slurm chroot (:func:`user_python`'s copy
    of the interpreter): the chroot's ``PATH``, ``PYTHONHOME`` at the host's standard
    library (bound in), this checkout and the venv's site-packages importable."""
    return chroot_env(stdlib_of(SYSTEM_PYTHON), ROOT)


def chroot_argv(user: str) -> list[str]:
    """The prefix that runs a command as ``user`` inside the Slurm chroot (root enters
    it, the chroot's ``runuser`` drops to the user)."""
    chroot = slurm_chroot()
    assert chroot is not None, "not a chroot lab"
    return ["chroot", chroot, "runuser", "-u", user, "--"]


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a site user's command: this cluster's SLURM_CONF and PATH, and
    slurmgpu importable by :func:`user_python` (in a chroot lab, whose copy of the
    interpreter is told where its standard library is by ``PYTHONHOME``)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURM_CONF": os.environ["SLURM_CONF"],
        "PYTHONPATH": f"{ROOT}:{_purelib()}",
        "LANG": "C.UTF-8",
    }
    if slurm_chroot() is not None:
        env["PYTHONHOME"] = str(stdlib_of(SYSTEM_PYTHON).parents[1])
    return {**env, **(extra or {})}


def user_argv(
    user: str, argv: Sequence[str], env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """``argv`` as ``user`` and its environment; in a chroot lab inside the chroot (a user
    may not chroot, so the chroot's ``runuser`` drops to the user there, with the
    chroot's PATH)."""
    if slurm_chroot() is not None:
        return [*chroot_argv(user), *argv], {**env, "PATH": CHROOT_PATH}
    return ["runuser", "-u", user, "--", *argv], env


def as_user(
    user: str, *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``user`` (:func:`user_argv`), waited on."""
    command, run_env = user_argv(user, argv, env or user_env())
    return subprocess.run(
        command,
        env=run_env,
        cwd=cwd or "/tmp",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def sbatch_as(user: str, *args: str) -> int:
    proc = as_user(user, "sbatch", "--parsable", "-o", "/dev/null", *args)
    assert proc.returncode == 0, f"sbatch as {user}: {proc.stderr.strip()}"
    return int(proc.stdout.strip().split(";")[0])


def job_fields(job_id: int) -> dict[str, str]:
    """``scontrol show job -o`` of ``job_id`` (as root) as ``{key: value}``; {} if gone."""
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job_id)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        return {}
    return dict(
        part.split("=", 1) for part in proc.stdout.split() if "=" in part and part[0].isupper()
    )


def cancel_all(slurm: CliSlurmClient | None = None) -> None:
    """Cancel every job on the cluster (as root) and wait until none is left running."""
    client = slurm or CliSlurmClient(timeout_s=20)
    ids = sorted({str(j.job_id) for j in client.jobs() if not j.state.is_terminal})
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)
    wait_for(
        "the site cluster to drain",
        lambda: not [j for j in client.jobs() if not j.state.is_terminal],
        timeout_s=90,
    )


@dataclass
class SiteWork:
    """A shared work directory on the site lab, the users' Python, and an environment
    naming the daemon's database (``daemon/state.db``: the daemon user's alone, 0600 in a
    0700 directory, created by its first :meth:`daemon_once`)."""

    work: Path
    python: list[str]
    env: dict[str, str]

    @property
    def db(self) -> Path:
        return self.work / "daemon" / "state.db"

    def daemon_once(self, *args: str, config: str = "") -> subprocess.CompletedProcess[str]:
        """``sgpu daemon --once --no-api`` as the daemon's user (``config``: TOML of its own)."""
        env = dict(self.env)
        if config:
            path = self.work / "daemon-extra.toml"
            path.write_text(Path(self.env["SGPU_CONFIG"]).read_text() + config)
            env["SGPU_CONFIG"] = str(path)
        argv = [*self.python, "-m", "slurmgpu", "daemon", "--once", "--no-api", *args]
        proc = as_user(DAEMON_USER, *argv, env=env)
        assert proc.returncode == 0, f"sgpu daemon --once as {DAEMON_USER}: {proc.stderr}"
        return proc

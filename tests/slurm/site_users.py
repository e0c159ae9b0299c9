"""Run commands as the site profile's Unix users (slurmgpu/lab/cluster/site.py).

``sgpu`` as such a user: the test venv's interpreter may live where other users cannot
execute it (pyenv under /root), so a user runs the system ``python3`` of the same minor
version with this checkout and the venv's site-packages on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from slurmgpu.slurm.cli import CliSlurmClient
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
_CHROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


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
            shutil.rmtree(path, ignore_errors=True)


def user_python() -> list[str]:
    """The interpreter a site user runs slurmgpu with; skips (saying why) if there is none."""
    if slurm_chroot() is not None:
        pytest.skip(
            "a chroot lab's users run Slurm's commands inside the chroot, where this "
            "checkout's Python is not"
        )
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the site users to run slurmgpu with")
    proc = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(
            f"{SYSTEM_PYTHON} is {proc.stdout.strip()}, not {sys.version_info[:2]}: it "
            "cannot load the test venv's packages for the site users"
        )
    return [str(SYSTEM_PYTHON)]


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a site user's command: this cluster's SLURM_CONF and PATH, and
    slurmgpu importable by :func:`user_python`."""
    purelib = sysconfig.get_paths()["purelib"]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURM_CONF": os.environ["SLURM_CONF"],
        "PYTHONPATH": f"{ROOT}:{purelib}",
        "LANG": "C.UTF-8",
    }
    return {**env, **(extra or {})}


def as_user(
    user: str, *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``user``; in a chroot lab inside the chroot (a user may not chroot, so
    the chroot's ``runuser`` drops to the user there, with the chroot's PATH)."""
    chroot = slurm_chroot()
    env = env or user_env()
    prefix = ["runuser", "-u", user, "--"]
    if chroot is not None:
        prefix = ["chroot", chroot, *prefix]
        env = {**env, "PATH": _CHROOT_PATH}
    return subprocess.run(
        [*prefix, *argv],
        env=env,
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

"""What the lab cluster needs of this (Debian) host before it can start: Slurm's daemons and
client commands installed (with apt-get when missing, as root) and MUNGE answering (its run
directory, key and munged). Starting and stopping the cluster's own daemons is
:mod:`slurmgpu.lab.cluster.launcher`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

__all__ = [
    "CLIENTS",
    "DAEMONS",
    "LabClusterError",
    "ensure_munge",
    "ensure_packages",
    "find_daemon",
    "packages_present",
    "tail",
]

DAEMONS = ("slurmctld", "slurmd", "slurmstepd")
CLIENTS = ("sinfo", "squeue", "scontrol", "scancel", "sbatch")
APT_PACKAGES = ("slurm-wlm", "munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")

_MUNGE_POLL_S = 0.1
_CMD_TIMEOUT_S = 5.0


class LabClusterError(RuntimeError):
    """The lab cluster could not be installed, started, queried or stopped."""


# --------------------------------------------------------------------------- packages


def find_daemon(name: str) -> Path | None:
    """The real binary of a Slurm daemon (``/usr/sbin/NAME-wlm`` on Debian), or None.

    Debian ships ``/usr/sbin/NAME`` as an alternatives link that may point at the
    *emulator* (front-end) build; that one is refused.
    """
    wlm = Path(f"/usr/sbin/{name}-wlm")
    if os.access(wlm, os.X_OK):
        return wlm
    for cand in (shutil.which(name), f"/usr/sbin/{name}"):
        if not cand:
            continue
        real = Path(cand).resolve()
        if os.access(real, os.X_OK) and "emulator" not in real.name:
            return real
    return None


def packages_present() -> bool:
    """True when the Slurm daemons, the client commands and munge are installed."""
    return (
        all(find_daemon(d) is not None for d in DAEMONS)
        and all(shutil.which(c) is not None for c in CLIENTS)
        and all(shutil.which(m) or Path(f"/usr/sbin/{m}").exists() for m in ("munge", "munged"))
    )


def tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of a command's or a log's output, for an error message."""
    return "\n".join(text.strip().splitlines()[-lines:])


def ensure_packages() -> None:
    """Install Debian's ``slurm-wlm`` and ``munge`` with apt-get when they are missing.

    Raises ``LabClusterError`` when they are missing and we are not root or have no apt-get.
    """
    if packages_present():
        return
    if os.geteuid() != 0:
        raise LabClusterError(
            "Slurm is not installed (need slurmctld-wlm, slurmd-wlm, sinfo, munged) and "
            "installing it needs root: run as root, or `apt-get install slurm-wlm munge`"
        )
    apt = shutil.which("apt-get")
    if apt is None:
        raise LabClusterError(
            "Slurm is not installed and there is no apt-get here; install "
            "slurmctld, slurmd, the Slurm client commands and munge yourself"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        [apt, "-q", "update"],
        [apt, "-q", "-y", "install", "--no-install-recommends", *APT_PACKAGES],
    ):
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=900, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LabClusterError(f"{' '.join(argv)} failed: {exc}") from exc
        if proc.returncode != 0:
            raise LabClusterError(
                f"{' '.join(argv)} exited {proc.returncode}:\n{tail(proc.stdout + proc.stderr)}"
            )
    if not packages_present():
        raise LabClusterError(
            f"apt-get installed {' '.join(APT_PACKAGES)} but the Slurm daemons are still "
            "missing (no /usr/sbin/slurmctld-wlm or /usr/sbin/slurmctld)"
        )


# --------------------------------------------------------------------------- munge


def _munge_works() -> bool:
    munge, unmunge = shutil.which("munge"), shutil.which("unmunge")
    if munge is None or unmunge is None:
        return False
    try:
        cred = subprocess.run(
            [munge, "-n"], capture_output=True, timeout=_CMD_TIMEOUT_S, check=False
        )
        if cred.returncode != 0:
            return False
        check = subprocess.run(
            [unmunge],
            input=cred.stdout,
            capture_output=True,
            timeout=_CMD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return check.returncode == 0


def ensure_munge(timeout_s: float = 10.0) -> None:
    """Make ``munge -n | unmunge`` work: run dir, key, and munged (started as user munge)."""
    if _munge_works():
        return
    if os.geteuid() != 0:
        raise LabClusterError("munged is not running and starting it needs root")
    try:
        user = pwd.getpwnam("munge")
    except KeyError as exc:
        raise LabClusterError("there is no 'munge' user; install the munge package") from exc
    MUNGE_RUN.mkdir(parents=True, exist_ok=True)
    os.chown(MUNGE_RUN, user.pw_uid, user.pw_gid)
    MUNGE_RUN.chmod(0o755)
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        mungekey = shutil.which("mungekey") or "/usr/sbin/mungekey"
        made = False
        if os.access(mungekey, os.X_OK):
            made = (
                subprocess.run(
                    [mungekey, "--create", f"--keyfile={MUNGE_KEY}"],
                    capture_output=True,
                    timeout=30,
                    check=False,
                ).returncode
                == 0
            )
        if not made:
            MUNGE_KEY.write_bytes(os.urandom(1024))
    os.chown(MUNGE_KEY, user.pw_uid, user.pw_gid)
    MUNGE_KEY.chmod(0o400)
    munged = shutil.which("munged") or "/usr/sbin/munged"
    try:
        # munged daemonizes itself; the parent exits once the socket is ready
        proc = subprocess.run(
            [munged],
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabClusterError(f"could not start munged: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    while not _munge_works():
        if time.monotonic() > deadline:
            raise LabClusterError(
                f"munged (exit {proc.returncode}) is not answering after {timeout_s:.0f} s: "
                f"{tail(proc.stdout + proc.stderr, 5)}"
            )
        time.sleep(_MUNGE_POLL_S)

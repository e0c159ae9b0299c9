"""A site user's Python inside a Slurm chroot lab (``LabCluster(slurm_root=...)``).

The lab's users run slurmgpu with the system ``python3`` (the venv's interpreter may
live where they cannot execute it, e.g. under /root). In a chroot lab their commands run
inside the chroot, which has no Python of its own: a copy of the host's interpreter is
put in a directory the chroot sees, and that directory, the interpreter's standard
library, the venv's site-packages and the checkout are bound into the chroot at their
own paths (:meth:`LabCluster.share`). A user may not chroot: root enters it and drops
to the user there, with the chroot's ``PATH``.

The trace replay's bench (bench/replay_real.py) and the release tests
(tests/slurm/site_users.py) both set their users up this way.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

from slurmgpu.lab.cluster import LabCluster

__all__ = ["CHROOT_PATH", "ChrootPythonError", "chroot_env", "chroot_python", "stdlib_of"]

CHROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class ChrootPythonError(RuntimeError):
    """The host's interpreter cannot serve inside this chroot; one line saying why."""


def stdlib_of(python: Path) -> Path:
    """The standard library directory of the interpreter ``python``."""
    try:
        proc = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ChrootPythonError(f"{python} cannot tell its standard library: {exc}") from exc
    return Path(proc.stdout.strip())


def _purelib() -> Path:
    """This interpreter's site-packages, links resolved (a chroot sees binds, not links)."""
    return Path(sysconfig.get_paths()["purelib"]).resolve()


def _bound(path: Path) -> bool:
    """Whether ``path`` is a mount point (a bind from the same file system included)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return any(line.split()[1:2] == [str(path)] for line in mounts)


def chroot_env(stdlib: Path, checkout: Path) -> dict[str, str]:
    """What a user's command needs inside the chroot to run :func:`chroot_python`'s copy:
    the chroot's ``PATH``, ``PYTHONHOME`` at the host's standard library (bound in), the
    checkout and this interpreter's site-packages importable."""
    return {
        "PATH": CHROOT_PATH,
        "PYTHONHOME": str(stdlib.parents[1]),
        "PYTHONPATH": f"{checkout}:{_purelib()}",
    }


def chroot_python(
    lab: LabCluster, python: Path, work: Path, checkout: Path
) -> tuple[list[str], dict[str, str]]:
    """The argv of a copy of ``python`` (the host's system interpreter) under
    ``work/python`` and the environment it runs with inside ``lab``'s chroot, after
    binding ``work``, its standard library, this interpreter's site-packages and
    ``checkout`` into the chroot. ``work`` must be a directory the users may enter.

    Raises :class:`ChrootPythonError` when the chroot has a Python of its own at the
    host's standard library path (binding over it would hide the chroot's)."""
    if lab.chroot is None:
        raise ChrootPythonError(f"the lab under {lab.root} does not run from a chroot")
    binary = python.resolve()
    stdlib = stdlib_of(binary)
    inside = lab.chroot.inside(stdlib)
    if inside.exists() and not _bound(inside):
        raise ChrootPythonError(
            f"the chroot has a Python of its own at {stdlib}: the host's standard library "
            "cannot be bound in its place"
        )
    copy = work / "python" / binary.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, copy)
    copy.parent.chmod(0o755)
    lab.share(stdlib, _purelib(), checkout, work)
    return [str(copy)], chroot_env(stdlib, checkout)

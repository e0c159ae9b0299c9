"""Slurm from another Debian release, installed in a chroot (``scripts/slurm_chroot.sh``).

The lab cluster (:class:`slurmgpu.lab.cluster.LabCluster` with ``slurm_root=``) runs that
chroot's daemons and commands instead of the host's. The lab's own directory is
bind-mounted into the chroot at the *same* path, so slurm.conf, state, spool and logs have
one path inside and outside, and the host reads the logs as for a native lab.

Inside the chroot: ``/proc``, ``/sys``, ``/dev`` (the host's, so ``/dev/tty[0-3]`` serve
as fake GPUs as on the host) and ``/dev/pts`` are mounted, and ``/run`` is a tmpfs of its
own so the chroot's munged socket and pid files never meet the host's. These base mounts
stay after a lab stops (another lab may use the same chroot); ``slurm_chroot.sh umount``
removes them. Client commands run through small wrapper scripts (:meth:`write_wrappers`)
that ``chroot`` and then return to the caller's directory when it exists inside.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["CLIENT_COMMANDS", "ChrootError", "SlurmChroot"]

CLIENT_COMMANDS = (
    "sinfo",
    "squeue",
    "scontrol",
    "scancel",
    "sbatch",
    "sacct",
    "sacctmgr",
    "srun",
    "sprio",
    "sshare",
)
_TIMEOUT_S = 30.0
_CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ChrootError(RuntimeError):
    """The chroot is missing, incomplete, or could not be mounted."""


def _mounts() -> set[str]:
    try:
        text = Path("/proc/self/mounts").read_text()
    except OSError:
        return set()
    return {line.split()[1].replace("\\040", " ") for line in text.splitlines() if line.strip()}


class SlurmChroot:
    """A debootstrap chroot holding Debian's ``slurmctld``, ``slurmd``, ``slurm-client``
    and ``munge`` (what ``scripts/slurm_chroot.sh build SUITE`` makes)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).absolute()

    def __repr__(self) -> str:
        return f"SlurmChroot({str(self.path)!r})"

    def inside(self, path: Path | str) -> Path:
        """The host path of ``path`` as seen from inside the chroot."""
        return self.path / str(path).lstrip("/")

    def check(self) -> None:
        missing = [
            p
            for p in ("usr/sbin/slurmctld", "usr/sbin/slurmd", "usr/bin/sinfo", "usr/sbin/munged")
            if not (self.path / p).exists()
        ]
        if missing:
            raise ChrootError(
                f"{self.path} is not a Slurm chroot (missing {', '.join(missing)}); "
                "build one with scripts/slurm_chroot.sh build SUITE"
            )

    def daemon(self, name: str) -> str | None:
        """The in-chroot path of a Slurm daemon's real binary (``-wlm`` first)."""
        for cand in (f"/usr/sbin/{name}-wlm", f"/usr/sbin/{name}"):
            real = self.inside(cand)
            if real.exists() and os.access(real, os.X_OK) and "emulator" not in real.name:
                return cand
        return None

    def argv(self, *command: str) -> list[str]:
        return ["chroot", str(self.path), *command]

    def run_in(
        self, *command: str, timeout: float = _TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*command), capture_output=True, text=True, timeout=timeout, check=False
        )

    # ------------------------------------------------------------------ mounts

    def _mount(self, target: Path, *args: str) -> None:
        if str(target) in _mounts():
            return
        target.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            ["mount", *args, str(target)],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            raise ChrootError(f"mount {' '.join(args)} {target}: {proc.stderr.strip()}")

    def mount_base(self) -> None:
        """proc, sys, dev, dev/pts and a tmpfs /run inside the chroot (idempotent);
        an ``/etc/hosts`` naming localhost if the chroot has none (debootstrap makes
        none, and slurmctld could not resolve ``AccountingStorageHost=localhost``), and
        this machine's name in it."""
        self.check()
        hosts = self.inside("/etc/hosts")
        if not hosts.exists():
            hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        # This machine's own name too, as the host resolves it: a job's torchrun
        # (--standalone) rendezvouses at it, and debootstrap's chroot cannot resolve it.
        name = socket.gethostname()
        if name and name not in hosts.read_text().split():
            with hosts.open("a") as f:
                f.write(f"127.0.1.1\t{name}\n")
        self._mount(self.inside("/proc"), "-t", "proc", "proc")
        self._mount(self.inside("/sys"), "-t", "sysfs", "sys")
        self._mount(self.inside("/dev"), "--bind", "/dev")
        self._mount(self.inside("/dev/pts"), "--bind", "/dev/pts")
        self._mount(self.inside("/run"), "-t", "tmpfs", "-o", "mode=755", "tmpfs")

    def bind(self, host_dir: Path) -> None:
        """Make ``host_dir`` visible at the same path inside the chroot."""
        host_dir = host_dir.absolute()
        self._mount(self.inside(host_dir), "--bind", str(host_dir))

    def unbind(self, host_dir: Path) -> None:
        target = self.inside(host_dir.absolute())
        if str(target) not in _mounts():
            return
        proc = subprocess.run(
            ["umount", str(target)], check=False, capture_output=True, text=True, timeout=_TIMEOUT_S
        )
        if proc.returncode != 0:  # a process inside still holds it: detach it lazily
            subprocess.run(
                ["umount", "-l", str(target)], check=False, capture_output=True, timeout=_TIMEOUT_S
            )
        with contextlib.suppress(OSError):
            target.rmdir()  # the empty mount point (never anything under it)

    def kill_leftovers(self, lab_root: Path) -> list[int]:
        """SIGKILL the processes in this chroot left by the lab at ``lab_root`` and all
        under them; returns their pids. slurmstepd is told by ``SLURM_CONF`` under
        ``lab_root`` in its environment or a file under ``lab_root`` open (its log):
        it may overwrite its environment with its process title."""
        parents: dict[int, int] = {}
        roots: set[int] = set()
        mine = str(lab_root.absolute()) + "/"
        seen_via_mount = str(self.inside(lab_root.absolute())) + "/"
        marker = f"SLURM_CONF={mine}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
                if os.readlink(entry / "root") != str(self.path):
                    continue
                env = (entry / "environ").read_bytes().split(b"\0")
                if any(e.startswith(marker) for e in env) or any(
                    os.readlink(fd).startswith((mine, seen_via_mount))
                    for fd in (entry / "fd").iterdir()
                    if fd.is_symlink()
                ):
                    roots.add(pid)
        doomed = set(roots)
        grew = True
        while grew:
            more = {p for p, pp in parents.items() if pp in doomed and p not in doomed}
            doomed |= more
            grew = bool(more)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return sorted(doomed)

    # ------------------------------------------------------------------ munge, version

    def _munge_works(self) -> bool:
        try:
            cred = self.run_in("munge", "-n")
            if cred.returncode != 0:
                return False
            check = subprocess.run(
                self.argv("unmunge"),
                input=cred.stdout,
                capture_output=True,
                text=True,
                timeout=_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return check.returncode == 0

    def _ids(self, user: str) -> tuple[int, int]:
        for line in self.inside("/etc/passwd").read_text().splitlines():
            parts = line.split(":")
            if parts[0] == user and len(parts) > 3:
                return int(parts[2]), int(parts[3])
        raise ChrootError(f"no user {user!r} in {self.inside('/etc/passwd')}")

    def ensure_munge(self, timeout_s: float = 10.0) -> None:
        """Start the chroot's own munged (as its munge user) unless one answers."""
        if self._munge_works():
            return
        uid, gid = self._ids("munge")
        run_dir = self.inside("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chown(run_dir, uid, gid)
        key = self.inside("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            key.write_bytes(os.urandom(1024))
        os.chown(key, uid, gid)
        key.chmod(0o400)
        proc = subprocess.run(
            ["chroot", f"--userspec={uid}:{gid}", "--groups=", str(self.path), "/usr/sbin/munged"],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
        deadline = time.monotonic() + timeout_s
        while not self._munge_works():
            if time.monotonic() > deadline:
                raise ChrootError(
                    f"munged in {self.path} (exit {proc.returncode}) is not answering: "
                    f"{(proc.stdout + proc.stderr).strip()[-300:]}"
                )
            time.sleep(0.1)

    def version(self) -> tuple[int, int] | None:
        """``(major, minor)`` of the chroot's Slurm, from dpkg (no slurm.conf needed)."""
        try:
            proc = self.run_in("dpkg-query", "-W", "-f", "${Version}", "slurmctld")
        except (OSError, subprocess.TimeoutExpired):
            return None
        parts = proc.stdout.strip().split(".")
        if proc.returncode != 0 or len(parts) < 2:
            return None
        try:
            return int(parts[0]), int(parts[1])
        except ValueError:
            return None

    # ------------------------------------------------------------------ client wrappers

    def write_wrappers(self, bin_dir: Path) -> Path:
        """One executable per Slurm client command in ``bin_dir`` that runs the chroot's
        command (environment kept, so ``SLURM_CONF`` works) in the caller's directory
        when that exists inside, else in ``/``. For ``CliSlurmClient(bin_dir=...)``.

        The command is named by its path inside the chroot, and ``PATH`` is the chroot's
        own: ``bin_dir`` may be visible inside (the lab root is bind-mounted), and jobs
        inherit the submitter's ``PATH``, where the host's directories mean nothing."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        for cmd in CLIENT_COMMANDS:
            inner = next(
                (
                    f"{d}/{cmd}"
                    for d in ("/usr/bin", "/usr/sbin")
                    if self.inside(f"{d}/{cmd}").exists()
                ),
                None,
            )
            if inner is None:
                continue
            script = (
                "#!/bin/sh\n"
                f"# {cmd} from the Slurm chroot {self.path} (written by slurmgpu.lab.cluster)\n"
                f"PATH={_CHROOT_PATH} exec chroot {shlex.quote(str(self.path))} "
                '/bin/sh -c \'cd "$0" 2>/dev/null || cd /; exec "$@"\' '
                f'"$PWD" {inner} "$@"\n'
            )
            path = bin_dir / cmd
            path.write_text(script)
            path.chmod(0o755)
        return bin_dir

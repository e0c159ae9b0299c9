"""Put the site profile (:mod:`slurmgpu.lab.cluster.site`) in place: Unix users and groups
on this host (and in the Slurm chroot, whose slurmctld resolves uids from its own
``/etc/passwd``), then the accounts, users and QOS in slurmdbd through ``sacctmgr``.

Both steps are idempotent: a user that exists with the planned uid is left alone; a user
or group that exists with *another* id is an error (the profile owns uids 61000-61008, and
a clash would give jobs to the wrong person).
"""

from __future__ import annotations

import grp
import pwd
import shutil
import subprocess
from typing import TYPE_CHECKING

from slurmgpu.lab.cluster import site

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

__all__ = ["ProvisionError", "ensure_unix_users", "planned_users", "sacctmgr_setup"]

_TIMEOUT_S = 30.0


class ProvisionError(RuntimeError):
    """A Unix user or a Slurm association of the site profile could not be made."""


def planned_users() -> list[tuple[str, int]]:
    """``(name, uid)`` of every Unix user the site profile needs: the daemon's, then the
    eight users'."""
    return [(site.DAEMON_USER, site.DAEMON_UID), *((u.name, u.uid) for u in site.USERS)]


def _passwd_ids(passwd: Path | None) -> tuple[dict[str, int], dict[str, int]]:
    """``({user: uid}, {group: gid})`` of the host (``passwd`` None) or of a chroot's
    ``etc/`` next to ``passwd``."""
    if passwd is None:
        return (
            {p.pw_name: p.pw_uid for p in pwd.getpwall()},
            {g.gr_name: g.gr_gid for g in grp.getgrall()},
        )
    users = {
        f[0]: int(f[2])
        for line in passwd.read_text().splitlines()
        if len(f := line.split(":")) > 3 and f[2].isdigit()
    }
    group_file = passwd.with_name("group")
    groups = {
        f[0]: int(f[2])
        for line in group_file.read_text().splitlines()
        if len(f := line.split(":")) > 2 and f[2].isdigit()
    }
    return users, groups


def ensure_unix_users(
    runner: Callable[[Sequence[str]], subprocess.CompletedProcess[str]] | None = None,
    passwd: Path | None = None,
) -> list[str]:
    """Create group :data:`site.GROUP` and the planned users where missing; returns the
    names created. ``runner`` runs ``groupadd``/``useradd`` (default: on this host);
    ``passwd`` is the ``/etc/passwd`` those commands change (default: this host's)."""
    run = runner or _run_host
    users, groups = _passwd_ids(passwd)
    where = f" in {passwd.parent.parent}" if passwd is not None else ""
    made: list[str] = []
    if site.GROUP in groups:
        if groups[site.GROUP] != site.GID:
            raise ProvisionError(
                f"group {site.GROUP}{where} has gid {groups[site.GROUP]}, not {site.GID}"
            )
    else:
        _check(run(["groupadd", "-g", str(site.GID), site.GROUP]), f"groupadd {site.GROUP}")
    for name, uid in planned_users():
        if name in users:
            if users[name] != uid:
                raise ProvisionError(f"user {name}{where} has uid {users[name]}, not {uid}")
            continue
        argv = [
            "useradd",
            "--uid",
            str(uid),
            "--gid",
            str(site.GID),
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/bin/sh",
            name,
        ]
        _check(run(argv), f"useradd {name}{where}")
        made.append(name)
    return made


def _run_host(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    exe = shutil.which(argv[0]) or f"/usr/sbin/{argv[0]}"
    return subprocess.run(
        [exe, *argv[1:]], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        raise ProvisionError(f"{what} exited {proc.returncode}: {(proc.stderr or '').strip()}")


def sacctmgr_setup(
    sacctmgr: Callable[[Sequence[str]], subprocess.CompletedProcess[str]], cluster: str
) -> None:
    """Run :func:`site.sacctmgr_commands` through ``sacctmgr`` (called with the arguments
    after ``sacctmgr -i``). "Nothing new added" / "Nothing modified" count as done."""
    for args in site.sacctmgr_commands(cluster):
        proc = sacctmgr(args)
        text = (proc.stdout + proc.stderr).strip()
        if proc.returncode == 0 or "Nothing new added" in text or "Nothing modified" in text:
            continue
        raise ProvisionError(f"sacctmgr -i {' '.join(args)} exited {proc.returncode}: {text}")

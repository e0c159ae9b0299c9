"""Start, watch and stop a real multi-node Slurm cluster with fake GPUs on this host.

One slurmctld and one slurmd per node (``slurmd -N gpuN``), all on 127.0.0.1 and told
apart by port, each node with 4 fake GPUs (``gres/gpu`` backed by ``/dev/tty[0-3]``) and 16
shards. Everything lives under one root directory::

    root/etc     slurm.conf gres.conf cgroup.conf job_submit.lua  (rendered templates)
    root/etc/slurmgpu  recommendations.{json,tsv}  (read by job_submit.lua; none at start)
    root/sbin    slurmctld slurmd slurmstepd -> /usr/sbin/*-wlm   (argv[0] must be exact)
    root/run     slurmctld.pid slurmd-gpuN.pid cluster.json        (what we started)
    root/log     slurmctld.log slurmd-gpuN.log *.out jobcomp.txt
    root/state   StateSaveLocation;  root/spool/gpuN  SlurmdSpoolDir

``down()`` signals only the pids recorded in ``root/run``, after checking that each one is
still a daemon of this cluster, so other clusters on the host are left alone. What the
host needs first (Slurm's packages, MUNGE) is :mod:`slurmgpu.lab.cluster.host_setup`.

With ``slurm_root=`` (a chroot made by ``scripts/slurm_chroot.sh``, e.g. Debian trixie's
Slurm 24.11 or sid's 26.05) the daemons and commands are that chroot's
(:mod:`slurmgpu.lab.cluster.chroot`): ``root`` is bind-mounted into it at the same path,
``root/sbin`` links to its binaries, and ``root/bin`` holds wrappers of its client
commands (:attr:`LabCluster.bin_dir`, for ``CliSlurmClient(bin_dir=...)``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgpu.lab.cluster.chroot import ChrootError, SlurmChroot
from slurmgpu.lab.cluster.host_setup import (
    DAEMONS,
    LabClusterError,
    ensure_munge,
    ensure_packages,
    find_daemon,
    tail,
)
from slurmgpu.lab.cluster.provision import ProvisionError, ensure_unix_users, sacctmgr_setup
from slurmgpu.lab.cluster.render import (
    PROFILES,
    ClusterConfig,
    Profile,
    RenderError,
    detect_slurm_version,
    find_templates,
    write,
)
from slurmgpu.lab.cluster.sharing import SHARINGS, Sharing

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = ["LabCluster"]

_POLL_S = 0.1
_CMD_TIMEOUT_S = 5.0
# sinfo %T states of a node that answers and can run (or is running) jobs
_SERVING_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned", "reserved"})


# --------------------------------------------------------------------------- processes


def _proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (``None`` if there is no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ..." -- comm may contain spaces and parentheses
    return stat.rsplit(")", 1)[1].split()[0]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return True
    return False


# --------------------------------------------------------------------------- the cluster


class LabCluster:
    """A native multi-node Slurm lab cluster rooted at ``root``.

    ``ctld_port`` is slurmctld's port; node ``gpuN`` listens on ``slurmd_port_base + N - 1``.
    ``templates`` overrides where the config templates are read from (default
    ``$SGPU_CLUSTER_TEMPLATES``, else the templates shipped in this package).
    ``accounting`` adds slurmdbd + MariaDB (the chroot's, else this host's).
    ``profile="site"`` (:mod:`slurmgpu.lab.cluster.site`) sets the cluster up like a shared
    site: accounting, 3 accounts and 8 Unix users with associations, fairshare, QOS
    preemption, two partitions, and 16 nodes unless ``nodes`` says otherwise.
    """

    def __init__(
        self,
        root: Path | str,
        nodes: int | None = None,
        ctld_port: int = 6817,
        slurmd_port_base: int = 17001,
        templates: Path | None = None,
        slurm_root: Path | str | None = None,
        accounting: bool = False,
        profile: Profile = "default",
        sharing: Sharing = "none",
    ) -> None:
        self.root = Path(root).absolute()
        self.chroot = SlurmChroot(slurm_root) if slurm_root else None
        self._shared: list[Path] = []  # host directories bound into the chroot by share()
        if profile not in PROFILES:
            raise LabClusterError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
        self.profile: Profile = profile
        if sharing not in SHARINGS:
            raise LabClusterError(f"unknown sharing {sharing!r} (known: {', '.join(SHARINGS)})")
        self.sharing: Sharing = sharing
        self.accounting = accounting or profile == "site"
        self.nodes = nodes if nodes is not None else (16 if profile == "site" else 4)
        self.ctld_port = ctld_port
        self.slurmd_port_base = slurmd_port_base
        self.templates = templates
        try:  # validates node count and ports early
            self._config(None)
        except RenderError as exc:
            raise LabClusterError(str(exc)) from exc
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @classmethod
    def from_root(cls, root: Path | str, templates: Path | None = None) -> LabCluster:
        """The cluster last brought up at ``root`` (nodes and ports from ``run/cluster.json``)."""
        root = Path(root).absolute()
        meta: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((root / "run" / "cluster.json").read_text())
        return cls(
            root,
            nodes=int(meta.get("nodes", 4)),
            ctld_port=int(meta.get("ctld_port", 6817)),
            slurmd_port_base=int(meta.get("slurmd_port_base", 17001)),
            templates=templates,
            slurm_root=meta.get("slurm_root") or None,
            accounting=bool(meta.get("accounting")),
            profile="site" if meta.get("profile") == "site" else "default",
            sharing="mig-mps" if meta.get("sharing") == "mig-mps" else "none",
        )

    def __repr__(self) -> str:
        return (
            f"LabCluster(root={str(self.root)!r}, nodes={self.nodes}, "
            f"ctld_port={self.ctld_port}, slurmd_port_base={self.slurmd_port_base}"
            + (f", profile={self.profile!r}" if self.profile != "default" else "")
            + (f", sharing={self.sharing!r}" if self.sharing != "none" else "")
            + (f", slurm_root={str(self.chroot.path)!r})" if self.chroot else ")")
        )

    # ------------------------------------------------------------------ paths & names

    @property
    def etc_dir(self) -> Path:
        return self.root / "etc"

    @property
    def conf_path(self) -> Path:
        return self.etc_dir / "slurm.conf"

    @property
    def sbin_dir(self) -> Path:
        return self.root / "sbin"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    def share(self, *host_dirs: Path) -> None:
        """Make ``host_dirs`` visible to jobs at the same paths: bound into the Slurm
        chroot (read-write, until :meth:`down`); without a chroot jobs already see them.
        E.g. the checkout and the Python a job's ``torchrun`` comes from."""
        if self.chroot is None:
            return
        for path in (d.absolute() for d in host_dirs):
            if path not in self._shared:
                self.chroot.bind(path)
                self._shared.append(path)

    @property
    def bin_dir(self) -> Path | None:
        """Wrappers of the chroot's client commands (None: the host's, from PATH)."""
        return self.root / "bin" if self.chroot else None

    def command(self, name: str) -> str:
        """The path (or PATH name) of Slurm client command ``name`` for this cluster."""
        return str(self.bin_dir / name) if self.bin_dir else name

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def node_names(self) -> list[str]:
        return [f"gpu{i}" for i in range(1, self.nodes + 1)]

    @property
    def recommendations_path(self) -> Path:
        """Where the daemon's JSON export goes for this cluster (``etc/slurmgpu/``); the
        installed job_submit.lua reads the ``.tsv`` next to it at every submission."""
        return Path(self._config(None).recommendations_json)

    @property
    def daemon_names(self) -> list[str]:
        """``slurmctld`` and ``slurmd-gpuN`` (after ``mariadb`` and ``slurmdbd`` with
        accounting): the keys of pid files and of ``status()``."""
        dbd = ["mariadb", "slurmdbd"] if self.accounting else []
        return [*dbd, "slurmctld", *(f"slurmd-{n}" for n in self.node_names)]

    def env(self) -> dict[str, str]:
        """Environment that points Slurm's client commands at this cluster."""
        return {"SLURM_CONF": str(self.conf_path)}

    def _config(self, version: tuple[int, int] | None) -> ClusterConfig:
        return ClusterConfig.native(
            self.root,
            nodes=self.nodes,
            ctld_port=self.ctld_port,
            slurmd_port_base=self.slurmd_port_base,
            slurm_version=version,
            accounting=self.accounting,
            profile=self.profile,
            sharing=self.sharing,
        )

    def _pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    # ------------------------------------------------------------------ process bookkeeping

    def _recorded_pid(self, name: str) -> int | None:
        try:
            return int(self._pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None

    def _alive_pid(self, name: str) -> int | None:
        """The pid of daemon ``name`` if it is running and is ours, else None."""
        proc = self._procs.get(name)
        pid = self._recorded_pid(name)
        if proc is not None and proc.pid == pid:
            # our own child: trust waitpid. (Its /proc cmdline can still be empty just after
            # Popen returns: exec closes the CLOEXEC pipe before it sets up the new argv.)
            return pid if proc.poll() is None else None
        if pid is None:
            return None
        state = _proc_state(pid)
        if state is None or state in ("Z", "X"):
            return None
        # guard against pid reuse: the process must be one we started from root/sbin
        return pid if str(self.sbin_dir) in _cmdline(pid) else None

    def _alive(self) -> dict[str, int | None]:
        return {name: self._alive_pid(name) for name in self.daemon_names}

    def is_up(self) -> bool:
        """True when slurmctld and every slurmd of this cluster are running (no Slurm RPC)."""
        return all(pid is not None for pid in self._alive().values())

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.out").open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.root,
                env={**os.environ, **self.env()},
            )
        self._procs[name] = proc
        self._pid_file(name).write_text(f"{proc.pid}\n")

    def _signal_and_wait(self, names: Sequence[str], timeout_s: float) -> None:
        """TERM the named daemons, wait for them, KILL what is left; forget their pids."""
        targets = {n: pid for n in names if (pid := self._alive_pid(n)) is not None}
        for pid in targets.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while any(self._alive_pid(n) is not None for n in targets):
            if time.monotonic() > deadline:
                for n in targets:
                    if (pid := self._alive_pid(n)) is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                kill_deadline = time.monotonic() + 5.0
                while (
                    any(self._alive_pid(n) is not None for n in targets)
                    and time.monotonic() < kill_deadline
                ):
                    time.sleep(_POLL_S)
                break
            time.sleep(_POLL_S)
        for n in names:
            proc = self._procs.pop(n, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
            if self._alive_pid(n) is None:
                self._pid_file(n).unlink(missing_ok=True)

    # ------------------------------------------------------------------ slurm commands

    def _run(self, *argv: str, timeout: float = _CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.command(argv[0]), *argv[1:]],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` from sinfo (e.g. ``idle``, ``mixed``, ``idle*``); {} if no answer."""
        try:
            proc = self._run("sinfo", "-h", "-N", "-o", "%N %T")
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if proc.returncode != 0:
            return {}
        states: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def _idle_nodes(self) -> set[str]:
        try:
            proc = self._run("sinfo", "-h", "-N", "-t", "idle", "-o", "%N %T")
        except (OSError, subprocess.TimeoutExpired):
            return set()
        if proc.returncode != 0:
            return set()
        return {
            parts[0]
            for line in proc.stdout.splitlines()
            if len(parts := line.split()) == 2 and parts[1] == "idle"
        }

    def _ctld_answers(self) -> bool:
        try:
            return self._run("sinfo", "-h", "-o", "%P").returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    # ------------------------------------------------------------------ diagnostics

    def _logtail(self, name: str) -> str:
        chunks = []
        for path in (self.log_dir / f"{name}.log", self.log_dir / f"{name}.out"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                if text.strip():
                    chunks.append(f"--- {path} ---\n{tail(text)}")
        return "\n".join(chunks) or f"(no log for {name} in {self.log_dir})"

    def _check_daemons(self, names: Iterable[str]) -> None:
        for name in names:
            if self._alive_pid(name) is None:
                proc = self._procs.get(name)
                code = "" if proc is None else f" (exit {proc.returncode})"
                raise LabClusterError(f"{name} died during start-up{code}\n{self._logtail(name)}")

    # ------------------------------------------------------------------ lifecycle

    def _prepare(self) -> None:
        if self.profile == "site":
            # the users submit with this cluster's slurm.conf and write their output here
            self.root.mkdir(parents=True, exist_ok=True)
            self.root.chmod(0o755)
            self._prepare_users()
        for d in (self.etc_dir, self.sbin_dir, self.run_dir / "slurm", self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "state").mkdir(exist_ok=True)
        for node in self.node_names:
            (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        for daemon in DAEMONS:
            real: Path | None
            if self.chroot is not None:  # a path inside the chroot, where the link is read
                found = self.chroot.daemon(daemon)
                real = Path(found) if found else None
            else:
                real = find_daemon(daemon)
            if real is None:
                where = f" in {self.chroot.path}" if self.chroot else ""
                raise LabClusterError(
                    f"cannot find the {daemon} binary (/usr/sbin/{daemon}-wlm){where}"
                )
            link = self.sbin_dir / daemon
            if link.is_symlink() and Path(os.readlink(link)) == real:
                continue
            link.unlink(missing_ok=True)
            link.symlink_to(real)  # argv[0] must be "slurmctld"/"slurmd", not "*-wlm"
        if self.chroot is not None:
            self.chroot.write_wrappers(self.root / "bin")
            version = self.chroot.version()
        else:
            version = detect_slurm_version(self.sbin_dir / "slurmctld")
        if self.accounting:
            self._prepare_accounting()
        try:
            write(self._config(version), self.etc_dir, find_templates(self.templates))
        except RenderError as exc:
            raise LabClusterError(str(exc)) from exc
        meta = {
            "nodes": self.nodes,
            "ctld_port": self.ctld_port,
            "slurmd_port_base": self.slurmd_port_base,
            "slurm_conf": str(self.conf_path),
            "slurm_version": ".".join(map(str, version)) if version else None,
            "slurm_root": str(self.chroot.path) if self.chroot else None,
            "bin_dir": str(self.bin_dir) if self.bin_dir else None,
            "accounting": self.accounting,
            "profile": self.profile,
            "sharing": self.sharing,
        }
        (self.run_dir / "cluster.json").write_text(json.dumps(meta, indent=2) + "\n")

    def _prepare_users(self) -> None:
        """The site profile's Unix users, on this host and in the chroot (its slurmctld
        and slurmd resolve uids from the chroot's own /etc/passwd)."""
        try:
            ensure_unix_users()
            if self.chroot is not None:
                chroot = self.chroot
                ensure_unix_users(
                    lambda argv: chroot.run_in(*argv), passwd=chroot.inside("/etc/passwd")
                )
        except (ProvisionError, OSError, subprocess.SubprocessError) as exc:
            raise LabClusterError(f"site profile users: {exc}") from exc

    def _provision_accounts(self) -> None:
        """The site profile's cluster, QOS, accounts and users in slurmdbd (before
        slurmctld starts, so it finds its associations at once)."""

        def sacctmgr(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
            return self._run("sacctmgr", "-i", *args, timeout=30.0)

        try:
            sacctmgr_setup(sacctmgr, self._config(None).cluster_name)
        except (ProvisionError, OSError, subprocess.SubprocessError) as exc:
            raise LabClusterError(f"site profile accounts: {exc}") from exc

    def _prepare_accounting(self) -> None:
        """Links to mariadbd and slurmdbd (the chroot's, else this host's); a MariaDB data
        directory."""
        for name in ("mariadbd", "slurmdbd"):
            real = f"/usr/sbin/{name}"
            if self.chroot is not None and not self.chroot.inside(real).exists():
                raise LabClusterError(f"no {real} in {self.chroot.path} (slurmdbd, mariadb-server)")
            if self.chroot is None and not os.access(real, os.X_OK):
                raise LabClusterError(
                    f"no {real} on this host: apt-get install slurmdbd mariadb-server"
                )
            link = self.sbin_dir / name
            link.unlink(missing_ok=True)
            link.symlink_to(real)
        datadir = self.root / "mysql"
        if not (datadir / "mysql").is_dir():
            proc = self._run_root(
                "mariadb-install-db",
                f"--datadir={datadir}",
                "--user=root",
                "--skip-test-db",
                "--auth-root-authentication-method=normal",
                "--force",  # a debootstrap chroot may not resolve its host name
                timeout=120,
            )
            if proc.returncode != 0:
                raise LabClusterError(
                    f"mariadb-install-db failed: {tail(proc.stdout + proc.stderr, 8)}"
                )

    def _start_accounting(self, deadline: float) -> None:
        """MariaDB (no grant tables: a throw-away lab database on 127.0.0.1), then
        slurmdbd, each waited for on its port. slurmdbd's first start on a fresh
        database may die (seen with MariaDB 11.8): it is started once more."""
        config = self._config(None)
        self._spawn(
            "mariadb",
            self._in_root(
                [
                    str(self.sbin_dir / "mariadbd"),
                    "--no-defaults",
                    f"--datadir={self.root / 'mysql'}",
                    "--user=root",
                    "--skip-grant-tables",
                    "--bind-address=127.0.0.1",
                    f"--port={config.storage_port}",
                    f"--socket={self.run_dir / 'mariadb.sock'}",
                    f"--pid-file={self.run_dir / 'mariadbd.pid'}",
                    f"--log-error={self.log_dir / 'mariadb.log'}",
                ]
            ),
        )
        self._wait_port("mariadb", config.storage_port, deadline)
        dbd = self._in_root([str(self.sbin_dir / "slurmdbd"), "-D"])
        for attempt in (1, 2):
            self._spawn("slurmdbd", dbd)
            try:
                self._wait_port("slurmdbd", config.dbd_port, deadline)
                return
            except LabClusterError:
                if attempt == 2 or self._alive_pid("slurmdbd") is not None:
                    raise
                time.sleep(1.0)

    def _wait_port(self, name: str, port: int, deadline: float) -> None:
        while True:
            self._check_daemons([name])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise LabClusterError(f"{name} not listening on {port}\n{self._logtail(name)}")
            time.sleep(_POLL_S)

    def _check_ports(self, names: Iterable[str]) -> None:
        ports = {"slurmctld": self.ctld_port}
        if self.accounting:
            config = self._config(None)
            ports.update({"slurmdbd": config.dbd_port, "mariadb": config.storage_port})
        ports.update(
            {f"slurmd-{n}": self.slurmd_port_base + i for i, n in enumerate(self.node_names)}
        )
        busy = [f"{ports[n]} ({n})" for n in names if _port_in_use(ports[n])]
        if busy:
            raise LabClusterError(
                f"port(s) already in use: {', '.join(busy)}; another Slurm cluster may be "
                "running -- pick other ports (ctld_port / slurmd_port_base, --port)"
            )

    def _run_root(self, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a program of the Slurm root (the chroot's, else this host's)."""
        if self.chroot is not None:
            return self.chroot.run_in(*argv, timeout=timeout)
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def _in_root(self, argv: list[str]) -> list[str]:
        return self.chroot.argv(*argv) if self.chroot is not None else argv

    def _ctld_argv(self) -> list[str]:
        # -D foreground, -i ignore unreadable state; never -c: keep jobs across restarts
        return self._in_root(
            [str(self.sbin_dir / "slurmctld"), "-D", "-i", "-f", str(self.conf_path)]
        )

    def _slurmd_argv(self, node: str) -> list[str]:
        return self._in_root(
            [
                str(self.sbin_dir / "slurmd"),
                "-D",
                "-f",
                str(self.conf_path),
                "-N",
                node,
                "-d",
                str(self.sbin_dir / "slurmstepd"),
            ]
        )

    def up(self, timeout_s: float = 30.0, progress: Callable[[str], None] | None = None) -> float:
        """Start the cluster (installing Slurm/munge if needed); returns seconds from launching
        the daemons until every node is idle. Raises ``LabClusterError`` (with the tail of
        slurmctld's log) if a daemon dies or ``timeout_s`` passes first."""
        say = progress or (lambda _msg: None)
        if self.is_up():
            # already running (perhaps with jobs): wait only until every node answers
            say(f"already running under {self.root}")
            t0 = time.monotonic()
            return self._wait_nodes(t0, t0 + timeout_s, timeout_s, busy_ok=True)
        # a half-running cluster from an earlier attempt: stop what is left of it first
        if any(pid is not None for pid in self._alive().values()):
            say("stopping the remains of an earlier start")
            self._signal_and_wait(self.daemon_names, timeout_s=10.0)

        if self.chroot is not None:
            say(f"mounting the Slurm chroot {self.chroot.path}")
            try:
                self.chroot.mount_base()
                self.root.mkdir(parents=True, exist_ok=True)
                self.chroot.bind(self.root)
                self.chroot.ensure_munge()
            except ChrootError as exc:
                raise LabClusterError(str(exc)) from exc
        else:
            say("checking Slurm and munge packages")
            ensure_packages()
            ensure_munge()
        self._check_ports(self.daemon_names)
        say(f"rendering config into {self.etc_dir}")
        self._prepare()

        say(f"starting slurmctld (port {self.ctld_port}) and {self.nodes} slurmd")
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        if self.accounting:
            try:
                self._start_accounting(deadline)
                if self.profile == "site":
                    say("adding the site's QOS, accounts and users (sacctmgr)")
                    self._provision_accounts()
            except LabClusterError:
                self._signal_and_wait(["slurmdbd", "mariadb"], timeout_s=10.0)
                raise
        self._spawn("slurmctld", self._ctld_argv())
        for node in self.node_names:
            self._spawn(f"slurmd-{node}", self._slurmd_argv(node))
        try:
            return self._wait_nodes(t0, deadline, timeout_s, busy_ok=False)
        except LabClusterError:
            self._signal_and_wait(self.daemon_names, timeout_s=5.0)
            raise

    def _ready_nodes(self, busy_ok: bool) -> set[str]:
        if not busy_ok:
            return self._idle_nodes()
        return {n for n, st in self.node_states().items() if st.lower() in _SERVING_STATES}

    def _wait_nodes(self, t0: float, deadline: float, timeout_s: float, busy_ok: bool) -> float:
        """Poll sinfo until every node is idle (or, with ``busy_ok``, serving jobs)."""
        want = set(self.node_names)
        while True:
            self._check_daemons(self.daemon_names)
            ready = self._ready_nodes(busy_ok)
            if want <= ready:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                states = self.node_states()
                shown = ", ".join(f"{n}={states.get(n, '?')}" for n in self.node_names)
                what = "up" if busy_ok else "idle"
                raise LabClusterError(
                    f"only {len(ready & want)}/{self.nodes} nodes {what} after {timeout_s:.0f} s "
                    f"({shown if states else 'slurmctld not answering'})\n"
                    f"{self._logtail('slurmctld')}"
                )
            time.sleep(_POLL_S)

    def stop_ctld(self, timeout_s: float = 15.0) -> None:
        """Stop slurmctld only (TERM, so it saves state); slurmd and running jobs go on."""
        self._signal_and_wait(["slurmctld"], timeout_s=timeout_s)

    def start_ctld(self, timeout_s: float = 30.0) -> float:
        """Start slurmctld again without ``-c`` (jobs and node states are recovered);
        returns seconds until it answers."""
        if self._alive_pid("slurmctld") is not None:
            return 0.0
        if not self.conf_path.exists():
            raise LabClusterError(f"{self.conf_path} does not exist; run up() first")
        self._check_ports(["slurmctld"])
        t0 = time.monotonic()
        self._spawn("slurmctld", self._ctld_argv())
        while not self._ctld_answers():
            self._check_daemons(["slurmctld"])
            if time.monotonic() - t0 > timeout_s:
                raise LabClusterError(
                    f"slurmctld not answering {timeout_s:.0f} s after restart\n"
                    f"{self._logtail('slurmctld')}"
                )
            time.sleep(_POLL_S)
        return time.monotonic() - t0

    def _cancel_jobs(self, timeout_s: float) -> None:
        try:
            ids = self._run("squeue", "-h", "-o", "%A").stdout.split()
            if ids:
                self._run("scancel", *sorted(set(ids)))
        except (OSError, subprocess.TimeoutExpired):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                left = self._run("squeue", "-h", "-t", "PD,R,CG,S", "-o", "%A")
            except (OSError, subprocess.TimeoutExpired):
                return
            if left.returncode != 0 or not left.stdout.strip():
                return
            time.sleep(0.2)

    def down(self, cancel_jobs: bool = True) -> None:
        """Stop this cluster's daemons -- only the pids recorded under ``root/run``.

        With ``cancel_jobs`` (default) all jobs are cancelled first, so no slurmstepd is left
        behind; pass False to keep them (state is saved, ``up()`` recovers them).
        """
        if cancel_jobs and self._alive_pid("slurmctld") is not None:
            self._cancel_jobs(timeout_s=20.0)
        # slurmd first, so slurmctld does not log every node as lost
        self._signal_and_wait([n for n in self.daemon_names if n != "slurmctld"], 10.0)
        self._signal_and_wait(["slurmctld"], 10.0)
        if self.accounting:
            self._signal_and_wait(["slurmdbd"], 10.0)
            self._signal_and_wait(["mariadb"], 20.0)
        if self.chroot is not None and not any(self._alive().values()):
            # jobs' slurmstepd (and their jobs) outlive slurmd; in a chroot they would
            # also hold the bind mount: end the ones of this lab (SLURM_CONF is ours)
            self.chroot.kill_leftovers(self.root)
            for d in reversed(self._shared):
                self.chroot.unbind(d)
            self._shared.clear()
            self.chroot.unbind(self.root)

    def status(self) -> dict[str, Any]:
        """Which daemons are alive (with pids) and, if slurmctld answers, each node's state."""
        alive = self._alive()
        daemons = {
            name: {
                "pid": pid if pid is not None else self._recorded_pid(name),
                "alive": pid is not None,
            }
            for name, pid in alive.items()
        }
        ctld_alive = alive["slurmctld"] is not None
        return {
            "root": str(self.root),
            "slurm_conf": str(self.conf_path),
            "ctld_port": self.ctld_port,
            "slurmd_ports": {n: self.slurmd_port_base + i for i, n in enumerate(self.node_names)},
            "up": all(pid is not None for pid in alive.values()),
            "daemons": daemons,
            "nodes": self.node_states() if ctld_alive else {},
        }

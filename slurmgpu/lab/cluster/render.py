"""Render the lab cluster's Slurm config from the templates shipped with this package.

The templates are package data (``slurmgpu/lab/cluster/templates``, found with
:mod:`importlib.resources`), so an installed wheel renders the same files as a checkout.
One set of templates serves both ways of running the lab cluster:

* ``native``: slurmctld + N slurmd on 127.0.0.1 of this host, distinguished by port
  (``slurmgpu.lab.cluster.LabCluster``);
* ``docker``: one container per daemon, ``NodeAddr=gpuN`` and default ports
  (``docker-slurm/docker-compose.yml``).

This module uses the standard library only, so the docker entrypoint can run it with the
image's ``python3`` and no installed dependencies::

    python3 -m slurmgpu.lab.cluster --mode docker --out /etc/slurm
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Literal

from slurmgpu.lab.cluster import sharing as gpu_sharing
from slurmgpu.lab.cluster import site
from slurmgpu.lab.cluster.sharing import SHARINGS, Sharing

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "CONFIG_FILES",
    "TEMPLATES_ENV",
    "ClusterConfig",
    "NodeSpec",
    "RenderError",
    "detect_slurm_version",
    "find_templates",
    "install_job_submit",
    "job_submit_source",
    "main",
    "node_range",
    "packaged_templates",
    "render",
    "write",
]

TEMPLATES_ENV = "SGPU_CLUSTER_TEMPLATES"

# rendered file name -> template file name
CONFIG_FILES: Mapping[str, str] = {
    "slurm.conf": "slurm.conf.in",
    "gres.conf": "gres.conf.in",
    "cgroup.conf": "cgroup.conf",
    "job_submit.lua": "job_submit.lua",
}
_DBD_FILE = ("slurmdbd.conf", "slurmdbd.conf.in")

# The real plugin, preferred over the placeholder template: <tree>/plugins/job_submit.lua
# next to <tree>/slurmgpu when this package runs from a source tree (a checkout, or
# /opt/slurmgpu in the docker image); else the copy an installed wheel puts in
# <prefix>/share/slurmgpu/plugins (pyproject's data-files), for the default or user scheme.
SOURCE_PLUGIN = Path(__file__).resolve().parents[3] / "plugins" / "job_submit.lua"
INSTALLED_PLUGINS: tuple[Path, ...] = tuple(
    dict.fromkeys(
        Path(sysconfig.get_path("data", scheme))
        / "share"
        / "slurmgpu"
        / "plugins"
        / "job_submit.lua"
        for scheme in (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user"))
    )
)
DEFAULT_RECOMMENDATIONS = "/etc/slurmgpu/recommendations.json"
# slurmgpu's job_submit logic as a Lua module (plugins/slurmgpu_submit.lua), installed
# next to job_submit.lua
SUBMIT_MODULE = "slurmgpu_submit.lua"
# the one line of plugins/job_submit.lua that names the recommendations file
_RECOMMENDATIONS_LINE = re.compile(r'^local RECOMMENDATIONS_FILE = "[^"\n]*"$', re.MULTILINE)

Mode = Literal["native", "docker"]
# "default": one partition, FIFO priority, no accounts (what most tests assume);
# "site": accounts, users, fairshare, QOS preemption, two partitions (lab/cluster/site.py)
Profile = Literal["default", "site"]
PROFILES: tuple[Profile, ...] = ("default", "site")

# CgroupPlugin=disabled exists from Slurm 23.02 on; 22.05 rejects it.
_CGROUP_DISABLED_SINCE = (23, 2)


class RenderError(Exception):
    """The templates are missing or cannot be rendered."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One compute node as slurm.conf declares it."""

    name: str
    addr: str
    port: int
    hostname: str | None = None

    def line(self) -> str:
        parts = [f"NodeName={self.name}"]
        if self.hostname is not None:
            parts.append(f"NodeHostname={self.hostname}")
        parts += [f"NodeAddr={self.addr}", f"Port={self.port}"]
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything the templates are filled with. Build it with ``native()`` or ``docker()``."""

    mode: Mode
    nodes: int
    ctld_host: str
    ctld_addr: str
    ctld_port: int
    slurmd_port_base: int
    state_dir: str
    spool_dir: str
    run_dir: str
    log_dir: str
    gpu_files: str
    slurm_user: str = "root"
    cluster_name: str = "lab"
    accounting: bool = False
    dbd_host: str = "slurmdbd"
    storage_host: str = "mariadb"
    storage_user: str = "slurm"
    storage_pass: str = "slurm"  # noqa: S105 - a throwaway lab database, documented as such
    dbd_port: int = 6819
    storage_port: int = 3306
    slurm_version: tuple[int, int] | None = None
    # the daemon's JSON export; job_submit.lua reads the .tsv next to it
    recommendations_json: str = DEFAULT_RECOMMENDATIONS
    profile: Profile = "default"
    # GPU sharing layout (lab/cluster/sharing.py): "mig-mps" makes gpu2 MIG, gpu3 MPS
    sharing: Sharing = "none"

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise RenderError(f"unknown profile {self.profile!r} (known: {', '.join(PROFILES)})")
        if self.sharing not in SHARINGS:
            raise RenderError(f"unknown sharing {self.sharing!r} (known: {', '.join(SHARINGS)})")
        if self.sharing != "none" and (self.mode != "native" or self.nodes < 3):
            raise RenderError(
                f"sharing {self.sharing!r} needs the native lab and at least 3 nodes "
                f"(gpu2 MIG, gpu3 MPS), not {self.mode} with {self.nodes}"
            )
        if self.profile == "site" and not self.accounting:
            raise RenderError("the site profile needs accounting (slurmdbd + MariaDB)")
        if self.nodes < 1:
            raise RenderError(f"a cluster needs at least 1 node, not {self.nodes}")
        ports = [self.ctld_port, self.slurmd_port_base]
        if self.mode == "native":
            ports.append(self.slurmd_port_base + self.nodes - 1)
        for port in ports:
            if not 1 <= port <= 65535:
                raise RenderError(f"port {port} is outside 1-65535")
        if self.mode == "native" and (
            self.slurmd_port_base <= self.ctld_port < self.slurmd_port_base + self.nodes
        ):
            raise RenderError(
                f"slurmctld port {self.ctld_port} collides with the slurmd ports "
                f"{self.slurmd_port_base}-{self.slurmd_port_base + self.nodes - 1}"
            )

    @classmethod
    def native(
        cls,
        root: Path,
        *,
        nodes: int = 4,
        ctld_port: int = 6817,
        slurmd_port_base: int = 17001,
        slurm_user: str = "root",
        slurm_version: tuple[int, int] | None = None,
        accounting: bool = False,
        profile: Profile = "default",
        sharing: Sharing = "none",
    ) -> ClusterConfig:
        """All daemons on 127.0.0.1 of this host, state under ``root``. With
        ``accounting``, slurmdbd listens on the port after the last slurmd's and MariaDB
        on the one after that (a chroot lab starts both)."""
        root = Path(root).absolute()
        return cls(
            mode="native",
            nodes=nodes,
            ctld_host="localhost",
            ctld_addr="127.0.0.1",
            ctld_port=ctld_port,
            slurmd_port_base=slurmd_port_base,
            state_dir=str(root / "state"),
            spool_dir=str(root / "spool"),
            run_dir=str(root / "run" / "slurm"),
            log_dir=str(root / "log"),
            gpu_files="/dev/tty[0-3]",
            slurm_user=slurm_user,
            slurm_version=slurm_version,
            recommendations_json=str(root / "etc" / "slurmgpu" / "recommendations.json"),
            accounting=accounting,
            dbd_host="localhost",
            storage_host="127.0.0.1",
            dbd_port=slurmd_port_base + nodes,
            storage_port=slurmd_port_base + nodes + 1,
            profile=profile,
            sharing=sharing,
        )

    @classmethod
    def docker(
        cls,
        *,
        nodes: int = 4,
        accounting: bool = False,
        slurm_user: str = "root",
        slurm_version: tuple[int, int] | None = None,
        profile: Profile = "default",
    ) -> ClusterConfig:
        """One container per daemon: ``slurmctld`` and ``gpu1..gpuN``, default ports."""
        return cls(
            mode="docker",
            nodes=nodes,
            ctld_host="slurmctld",
            ctld_addr="slurmctld",
            ctld_port=6817,
            slurmd_port_base=6818,
            state_dir="/var/spool/slurmctld",
            spool_dir="/var/spool/slurmd",
            run_dir="/run/slurm",
            log_dir="/var/log/slurm",
            gpu_files="/dev/fakegpu[0-3]",
            slurm_user=slurm_user,
            accounting=accounting,
            slurm_version=slurm_version,
            profile=profile,
        )

    @property
    def node_names(self) -> list[str]:
        return [f"gpu{i}" for i in range(1, self.nodes + 1)]

    @property
    def recommendations_tsv(self) -> str:
        """What job_submit.lua reads: the JSON export's path with the suffix ``.tsv``."""
        return str(Path(self.recommendations_json).with_suffix(".tsv"))

    def node_specs(self) -> list[NodeSpec]:
        if self.mode == "native":
            return [
                NodeSpec(name, "127.0.0.1", self.slurmd_port_base + i, hostname="localhost")
                for i, name in enumerate(self.node_names)
            ]
        return [NodeSpec(name, name, self.slurmd_port_base) for name in self.node_names]

    def node_groups(self) -> dict[str, tuple[str, str]]:
        """``{template prefix: (gres, node lines)}`` of the default nodes (``""``), the
        MIG node (``MIG_``) and the MPS node (``MPS_``): slurm.conf.in declares each group
        after a ``NodeName=DEFAULT`` line of its GRES. Without sharing every node is
        default and the other groups are empty."""
        default = gpu_sharing.node_gres("none", "", self.gpu_files).gres
        specs = {spec.name: spec.line() for spec in self.node_specs()}
        special = {"MIG_": gpu_sharing.MIG_NODE, "MPS_": gpu_sharing.MPS_NODE}
        groups: dict[str, tuple[str, str]] = {}
        if self.sharing == "none":
            groups[""] = (default, "\n".join(specs.values()))
            groups.update(dict.fromkeys(special, (default, "")))
            return groups
        taken = set(special.values())
        groups[""] = (default, "\n".join(ln for n, ln in specs.items() if n not in taken))
        for prefix, node in special.items():
            gres = gpu_sharing.node_gres(self.sharing, node, self.gpu_files, self.slurm_version)
            groups[prefix] = (gres.gres, specs[node])
        return groups

    def gres_types(self) -> str:
        return "gpu,shard" if self.sharing == "none" else "gpu,shard,mps"

    def accounting_lines(self) -> str:
        if not self.accounting:
            return "AccountingStorageType=accounting_storage/none"
        return "\n".join(
            [
                "AccountingStorageType=accounting_storage/slurmdbd",
                f"AccountingStorageHost={self.dbd_host}",
                f"AccountingStoragePort={self.dbd_port}",
                # per-job GPUs and shards in sacct: without it ReqTRES/AllocTRES list only
                # billing,cpu,mem,node (and 26.05 refuses it without slurmdbd, so only here)
                "AccountingStorageTRES="
                + ",".join(f"gres/{t}" for t in self.gres_types().split(",")),
            ]
        )

    def cgroup_line(self) -> str:
        version = self.slurm_version or (22, 5)
        if version >= _CGROUP_DISABLED_SINCE:
            return "CgroupPlugin=disabled"
        return "IgnoreSystemdOnFailure=yes"

    def site_lines(self) -> str:
        if self.profile != "site":
            return "# profile default: priority/basic, no preemption, no account limits"
        return "\n".join(
            [
                "# profile site (slurmgpu/lab/cluster/site.py)",
                *site.policy_lines(),
                f"# {host_cgroup_reason()}",
            ]
        )

    def partition_lines(self) -> str:
        if self.profile == "site":
            return "\n".join(site.partition_lines(node_range(self.nodes), self.nodes))
        return (
            f"PartitionName=gpu Nodes={node_range(self.nodes)} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=NO DefMemPerCPU=256"
        )

    def variables(self) -> dict[str, str]:
        return {
            "CLUSTER_NAME": self.cluster_name,
            "CTLD_HOST": self.ctld_host,
            "CTLD_ADDR": self.ctld_addr,
            "CTLD_PORT": str(self.ctld_port),
            "SLURM_USER": self.slurm_user,
            "STATE_DIR": self.state_dir,
            "SPOOL_DIR": self.spool_dir,
            "RUN_DIR": self.run_dir,
            "LOG_DIR": self.log_dir,
            "ACCOUNTING": self.accounting_lines(),
            "SITE_POLICY": self.site_lines(),
            "DBD_SITE_POLICY": (
                f"PrivateData={site.DBD_PRIVATE_DATA}" if self.profile == "site" else ""
            ),
            "PARTITIONS": self.partition_lines(),
            "NODE_COUNT": str(self.nodes),
            "NODE_RANGE": node_range(self.nodes),
            **{
                f"{prefix}{key}": value
                for prefix, (gres, lines) in self.node_groups().items()
                for key, value in (("NODE_GRES", gres), ("NODE_LINES", lines))
            },
            "GPU_FILES": self.gpu_files,
            "GRES_TYPES": self.gres_types(),
            "GRES_LINES": gpu_sharing.gres_conf_lines(
                self.sharing,
                self.node_names,
                node_range(self.nodes),
                self.gpu_files,
                self.slurm_version,
            ),
            "DBD_HOST": self.dbd_host,
            "STORAGE_HOST": self.storage_host,
            "STORAGE_USER": self.storage_user,
            "STORAGE_PASS": self.storage_pass,
            "DBD_PORT": str(self.dbd_port),
            "STORAGE_PORT": str(self.storage_port),
        }


def host_cgroup_reason() -> str:
    """:func:`site.cgroup_reason` for the host this runs on."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        mounts = ""
    v2 = [ln.split()[1] for ln in mounts.splitlines() if ln.split()[2:3] == ["cgroup2"]]
    controllers: str | None = None
    if v2:
        try:
            controllers = (Path(v2[0]) / "cgroup.controllers").read_text()
        except OSError:
            controllers = None
    return site.cgroup_reason(mounts, controllers)


def node_range(nodes: int) -> str:
    """The hostlist expression of ``gpu1..gpuN``: ``gpu1`` or ``gpu[1-N]``."""
    return "gpu1" if nodes == 1 else f"gpu[1-{nodes}]"


def packaged_templates() -> Path:
    """The templates shipped in this package (``slurmgpu/lab/cluster/templates``)."""
    templates = resources.files("slurmgpu.lab.cluster") / "templates"
    if not isinstance(templates, Path):  # a zip import: no directory to read from
        raise RenderError(
            f"the packaged templates are not on a file system ({templates}); "
            f"set {TEMPLATES_ENV} to a directory holding them"
        )
    return templates


def find_templates(templates: Path | str | None = None) -> Path:
    """The template directory: ``templates``, else ``$SGPU_CLUSTER_TEMPLATES``, else the
    templates shipped in this package. Raises ``RenderError`` naming what was tried."""
    if templates is not None:
        candidate = Path(templates)
    elif os.environ.get(TEMPLATES_ENV):
        candidate = Path(os.environ[TEMPLATES_ENV])
    else:
        candidate = packaged_templates()
    required = list(CONFIG_FILES.values())
    if all((candidate / name).is_file() for name in required):
        return candidate
    raise RenderError(
        f"lab cluster templates not found (need {', '.join(required)}) in {candidate}. "
        f"Pass templates=... or set {TEMPLATES_ENV} to a directory holding them."
    )


def job_submit_source(templates: Path) -> Path:
    """The job_submit.lua to install: the slurmgpu plugin of the source tree this package
    runs from (:data:`SOURCE_PLUGIN`), else the one an installed wheel ships
    (:data:`INSTALLED_PLUGINS`), else the templates' placeholder ``job_submit.lua``."""
    for plugin in (SOURCE_PLUGIN, *INSTALLED_PLUGINS):
        if plugin.is_file():
            return plugin
    return templates / "job_submit.lua"


def install_job_submit(text: str, recommendations_tsv: str) -> str:
    """``text`` of a job_submit.lua with its ``local RECOMMENDATIONS_FILE = "..."`` line
    pointed at ``recommendations_tsv``; a script without that line is returned as is."""
    if any(ch in recommendations_tsv for ch in '"\\\n\r'):
        raise RenderError(
            f"the recommendations path cannot go in a Lua string: {recommendations_tsv!r}"
        )
    line = f'local RECOMMENDATIONS_FILE = "{recommendations_tsv}"'
    new, count = _RECOMMENDATIONS_LINE.subn(lambda _m: line, text)
    if count > 1:
        raise RenderError("job_submit.lua sets RECOMMENDATIONS_FILE more than once")
    return new


def _substitute(path: Path, variables: Mapping[str, str]) -> str:
    try:
        return Template(path.read_text()).substitute(variables)
    except KeyError as exc:
        raise RenderError(f"{path}: unknown placeholder ${{{exc.args[0]}}}") from exc
    except ValueError as exc:
        raise RenderError(f"{path}: bad placeholder syntax: {exc}") from exc


def render(config: ClusterConfig, templates: Path | str | None = None) -> dict[str, str]:
    """Render every config file; returns ``{file name: content}``."""
    tdir = find_templates(templates)
    variables = config.variables()
    out: dict[str, str] = {}
    for name, template in CONFIG_FILES.items():
        path = tdir / template
        if name == "cgroup.conf":
            text = path.read_text()
            if not text.endswith("\n"):
                text += "\n"
            out[name] = text + config.cgroup_line() + "\n"
        elif name == "job_submit.lua":
            source = job_submit_source(tdir)
            # The plugin is a thin script over this module, which it looks up next to
            # itself: written first, so a running slurmctld reloading the script finds it.
            module = source.with_name(SUBMIT_MODULE)
            if module.is_file():
                out[SUBMIT_MODULE] = module.read_text()
            out[name] = install_job_submit(source.read_text(), config.recommendations_tsv)
        else:
            out[name] = _substitute(path, variables)
    if config.accounting:
        dbd_name, dbd_template = _DBD_FILE
        if not (tdir / dbd_template).is_file():
            raise RenderError(f"accounting needs {tdir / dbd_template}")
        out[dbd_name] = _substitute(tdir / dbd_template, variables)
    return out


def write(
    config: ClusterConfig, out_dir: Path | str, templates: Path | str | None = None
) -> dict[str, Path]:
    """Render into ``out_dir`` (created if needed); returns ``{file name: path}``.

    Files are replaced atomically; slurmdbd.conf is written 0600 as slurmdbd demands.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for name, text in render(config, templates).items():
        target = out_dir / name
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o600 if name == "slurmdbd.conf" else 0o644)
        tmp.replace(target)
        written[name] = target
    return written


_VERSION_RE = re.compile(r"(\d+)\.(\d+)")


def detect_slurm_version(binary: str | Path | None = None) -> tuple[int, int] | None:
    """``(major, minor)`` of the installed Slurm (``slurmctld -V`` or ``sinfo -V``), or None."""
    candidates = [str(binary)] if binary is not None else []
    candidates += ["/usr/sbin/slurmctld-wlm", "slurmctld", "slurmd", "sinfo"]
    for candidate in candidates:
        exe = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if not exe or not os.access(exe, os.X_OK):
            continue
        try:
            proc = subprocess.run(
                [exe, "-V"], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        match = _VERSION_RE.search(proc.stdout + proc.stderr)
        if proc.returncode == 0 and match:
            return int(match.group(1)), int(match.group(2))
    return None


def _parse_version(text: str) -> tuple[int, int]:
    match = _VERSION_RE.fullmatch(text.strip()) or _VERSION_RE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a Slurm version like 22.05, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slurmgpu.lab.cluster",
        description="Render the lab cluster's slurm.conf, gres.conf, cgroup.conf, job_submit.lua.",
    )
    parser.add_argument("--mode", choices=["native", "docker"], default="native")
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--root", type=Path, help="native mode: the cluster's state directory")
    parser.add_argument("--port", type=int, default=6817, help="native mode: slurmctld port")
    parser.add_argument("--slurmd-port-base", type=int, default=17001, help="native mode")
    parser.add_argument("--accounting", action="store_true", help="docker mode: use slurmdbd")
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="default",
        help="site: accounts, users, fairshare, QOS preemption (implies --accounting)",
    )
    parser.add_argument(
        "--sharing",
        choices=SHARINGS,
        default="none",
        help="native mode: mig-mps makes gpu2's GPUs MIG slices and gpu3's serve MPS",
    )
    parser.add_argument("--slurm-user", default="root")
    parser.add_argument(
        "--slurm-version",
        type=_parse_version,
        help="Slurm major.minor the config is for (default: detect the installed one, else 22.05)",
    )
    parser.add_argument("--templates", type=Path, help=f"template dir (default ${TEMPLATES_ENV})")
    args = parser.parse_args(argv)

    version: tuple[int, int] | None = args.slurm_version or detect_slurm_version()
    try:
        if args.mode == "docker":
            config = ClusterConfig.docker(
                nodes=args.nodes,
                accounting=args.accounting or args.profile == "site",
                slurm_user=args.slurm_user,
                slurm_version=version,
                profile=args.profile,
            )
        else:
            config = ClusterConfig.native(
                args.root or args.out.parent,
                nodes=args.nodes,
                ctld_port=args.port,
                slurmd_port_base=args.slurmd_port_base,
                slurm_user=args.slurm_user,
                slurm_version=version,
                accounting=args.accounting or args.profile == "site",
                profile=args.profile,
                sharing=args.sharing,
            )
        written = write(config, args.out, args.templates)
    except (RenderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written.values():
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``sgpu cluster``: bring a local multi-node Slurm lab cluster (fake GPUs) up and down.

``slurmgpu.cli.main`` adds this group with ``main.add_command(cluster)``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Literal

import click

from slurmgpu.lab.cluster import LabCluster, LabClusterError

__all__ = ["DEFAULT_ROOT", "ROOT_ENV", "cluster"]

ROOT_ENV = "SGPU_LAB_ROOT"
# a per-host lab directory that survives reboots less often than /tmp; root owns it
DEFAULT_ROOT = "/var/tmp/slurmgpu-lab"  # noqa: S108 - documented default, override with --root

_root_option = click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=ROOT_ENV,
    default=DEFAULT_ROOT,
    show_default=True,
    help=f"State directory of the lab cluster (env {ROOT_ENV}).",
)


def _export_lines(lab: LabCluster) -> list[str]:
    lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(lab.env().items())]
    if lab.bin_dir is not None:  # the chroot's client commands come first on PATH
        lines.append(f'export PATH={shlex.quote(str(lab.bin_dir))}:"$PATH"')
    return lines


@click.group("cluster")
def cluster() -> None:
    """Run a local Slurm lab cluster: slurmctld + N slurmd, 4 fake GPUs per node."""


@cluster.command("up")
@_root_option
@click.option(
    "--nodes",
    type=click.IntRange(1, 64),
    default=None,
    help="Number of nodes  [default: 4; 16 with --profile site]",
)
@click.option(
    "--port", type=click.IntRange(1, 65535), default=6817, show_default=True, help="slurmctld port."
)
@click.option(
    "--slurmd-port-base",
    type=click.IntRange(1, 65535),
    default=17001,
    show_default=True,
    help="Port of gpu1; gpuN gets base+N-1.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for all nodes to become idle.",
)
@click.option(
    "--slurm-root",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Run the Slurm of this chroot (scripts/slurm_chroot.sh build trixie|sid) "
    "instead of the host's.",
)
@click.option(
    "--accounting",
    is_flag=True,
    help="Also slurmdbd + MariaDB (the chroot's with --slurm-root, else this host's).",
)
@click.option(
    "--profile",
    type=click.Choice(["default", "site"]),
    default="default",
    show_default=True,
    help="site: accounting, 3 accounts, 8 users (sgpu-u1..8), fairshare, QOS preemption, "
    "partitions gpu and debug (docs/admin-guide.md).",
)
@click.option(
    "--sharing",
    type=click.Choice(["none", "mig-mps"]),
    default="none",
    show_default=True,
    help="mig-mps: gpu2's GPUs are MIG slices (gpu:1g.10gb...), gpu3's serve MPS "
    "(mps:400); needs 3 nodes or more.",
)
def up(
    root: Path,
    nodes: int | None,
    port: int,
    slurmd_port_base: int,
    timeout: float,
    slurm_root: Path | None,
    accounting: bool,
    profile: Literal["default", "site"],
    sharing: Literal["none", "mig-mps"],
) -> None:
    """Install Slurm/munge if needed, start the cluster, wait until every node is idle."""
    try:
        lab = LabCluster(
            root,
            nodes=nodes,
            ctld_port=port,
            slurmd_port_base=slurmd_port_base,
            slurm_root=slurm_root,
            accounting=accounting,
            profile=profile,
            sharing=sharing,
        )
        elapsed = lab.up(timeout_s=timeout, progress=click.echo)
    except LabClusterError as exc:
        raise click.ClickException(_one_line(exc, root)) from exc
    click.echo(f"cluster up: {lab.nodes}/{lab.nodes} nodes idle after {elapsed:.1f} s")
    for line in _export_lines(lab):
        click.echo(line)


@cluster.command("down")
@_root_option
@click.option("--keep-jobs", is_flag=True, help="Do not cancel jobs first (state is kept).")
def down(root: Path, keep_jobs: bool) -> None:
    """Stop the daemons this cluster started (and only those)."""
    try:
        lab = LabCluster.from_root(root)
        lab.down(cancel_jobs=not keep_jobs)
    except LabClusterError as exc:
        raise click.ClickException(_one_line(exc, root)) from exc
    click.echo(f"cluster down: {root}")


@cluster.command("status")
@_root_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(root: Path, as_json: bool) -> None:
    """Show which daemons are alive and each node's state."""
    try:
        info = LabCluster.from_root(root).status()
    except LabClusterError as exc:
        raise click.ClickException(_one_line(exc, root)) from exc
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    click.echo(f"root {info['root']}  SLURM_CONF={info['slurm_conf']}  up={info['up']}")
    for name, daemon in info["daemons"].items():
        state = "alive" if daemon["alive"] else "dead"
        click.echo(f"  {name:<14} {daemon['pid'] or '-':>8}  {state}")
    for node, state in info["nodes"].items():
        click.echo(f"  node {node:<9} {state}")


@cluster.command("env")
@_root_option
def env(root: Path) -> None:
    """Print `export SLURM_CONF=...` for: eval "$(sgpu cluster env)"."""
    lab = LabCluster.from_root(root)
    if not lab.conf_path.exists():
        click.echo(f"warning: {lab.conf_path} does not exist yet (run: sgpu cluster up)", err=True)
    for line in _export_lines(lab):
        click.echo(line)


def _one_line(exc: Exception, root: Path) -> str:
    """The first line of an error; the log tail that follows it in the library's message is
    replaced by where the logs are."""
    first, _, rest = str(exc).strip().partition("\n")
    return f"{first} (logs: {Path(root).absolute() / 'log'})" if rest else first

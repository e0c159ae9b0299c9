"""``sgpu agent``: sample what every job on this GPU node uses and send it to the daemon.

Run on each GPU node, as root (to read every process's cgroup and environment)::

    sgpu agent --daemon http://head:8787             # NVML GPUs, MUNGE or the node token
    sgpu agent --probe sim --gres-conf lab/gres.conf  # simulated GPUs of the lab cluster

Also runnable as ``python -m slurmgpu.cli.agent`` (same options; it sets up logging itself).

Exit codes: 0 stopped by SIGTERM/SIGINT, or ``--once`` sent its batch; 1 cannot run (no
GPU probe, no credentials, spool unusable), or ``--once`` could not send (the batch is
spooled or was refused); 2 usage error.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import click

from slurmgpu.agent.loop import DEFAULT_INTERVAL_S, AgentLoop
from slurmgpu.agent.sampler import NodeSampler
from slurmgpu.agent.sender import (
    DEFAULT_DAEMON_URL,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TOKEN_FILE,
    AgentAuthError,
    Authenticator,
    Backoff,
    DaemonClient,
    choose_auth,
)
from slurmgpu.agent.spool import DEFAULT_MAX_BYTES, DEFAULT_SPOOL_DIR, BatchSpool, SpoolError
from slurmgpu.telemetry.gpupower import DEFAULT_MODEL, GPU_POWER
from slurmgpu.telemetry.gresconf import GresConfError, minors_by_index, read_gres_conf
from slurmgpu.telemetry.probe import GpuProbe, ProbeUnavailableError
from slurmgpu.telemetry.simgpu import SimulatedGpuProbe, default_state_dir
from slurmgpu.units import parse_duration, parse_size_mib
from slurmgpu.wire import NODE_NAME

log = logging.getLogger("slurmgpu.agent")

_MIB = 1024 * 1024


class _Fail(click.ClickException):
    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"sgpu: {self.format_message()}", err=True)


def _duration_s(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value).total_seconds()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds < 0.05:
        raise click.BadParameter("must be at least 0.05s")
    return seconds


def _size_bytes(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        mib = parse_size_mib(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if mib < 1:
        raise click.BadParameter("must be at least 1MiB")
    return mib * _MIB


def default_gres_conf() -> Path:
    """Return the gres.conf next to ``$SLURM_CONF``, else ``/etc/slurm/gres.conf``."""
    slurm_conf = os.environ.get("SLURM_CONF")
    if slurm_conf:
        return Path(slurm_conf).with_name("gres.conf")
    return Path("/etc/slurm/gres.conf")


def _slurm_minors(gres_conf: Path, node: str, explicit: bool) -> dict[int, int] | None:
    """Return Slurm index → device minor from gres.conf; None (with a log line) if unknown."""
    if not gres_conf.exists():
        if explicit:
            raise _Fail(f"gres.conf {gres_conf} does not exist")
        log.warning(
            "no gres.conf at %s: Slurm GPU indices are taken to follow the probe's order "
            "(pass --gres-conf to match by device minor)",
            gres_conf,
        )
        return None
    try:
        return minors_by_index(read_gres_conf(gres_conf, node))
    except OSError as exc:
        raise _Fail(f"cannot read {gres_conf}: {exc.strerror or exc}") from None
    except GresConfError as exc:
        raise _Fail(f"{gres_conf}: {exc}") from None


def _open_probe(
    kind: str, node: str, gres_conf: Path, sim_dir: Path, sim_model: str | None = None
) -> GpuProbe:
    if kind == "sim":
        if not gres_conf.exists():
            raise _Fail(
                f"the simulated probe needs the node's gres.conf; {gres_conf} does not exist "
                "(pass --gres-conf PATH)"
            )
        try:
            probe = SimulatedGpuProbe(node, gres_conf, None, sim_dir, gpu_model=sim_model)
        except ProbeUnavailableError as exc:
            raise _Fail(str(exc)) from None
        if not probe.devices:
            log.warning("%s lists no GPU for %s: only host usage will be sampled", gres_conf, node)
        return probe
    from slurmgpu.telemetry.nvml import NvmlProbe

    try:
        return NvmlProbe()
    except ProbeUnavailableError as exc:
        if kind == "auto":
            raise _Fail(
                f"no usable NVIDIA GPU ({exc}); on a test cluster with simulated GPUs "
                "pass --probe sim"
            ) from None
        raise _Fail(str(exc)) from None


@click.command("agent", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--node", default=None, help="This node's Slurm name (default: short host name).")
@click.option(
    "--daemon",
    "daemon_url",
    default=DEFAULT_DAEMON_URL,
    show_default=True,
    envvar="SGPU_DAEMON_URL",
    metavar="URL",
    help="The slurmgpu daemon's base URL.",
)
@click.option(
    "--interval",
    "interval_s",
    default=f"{DEFAULT_INTERVAL_S:g}s",
    show_default=True,
    callback=_duration_s,
    metavar="DURATION",
    help="Sampling period.",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=f"{DEFAULT_TIMEOUT_S:g}s",
    show_default=True,
    callback=_duration_s,
    metavar="DURATION",
    help="How long one request to the daemon may take.",
)
@click.option(
    "--probe",
    "probe_kind",
    type=click.Choice(["auto", "nvml", "sim"]),
    default="auto",
    show_default=True,
    help="GPU probe: NVML, the lab cluster's simulated GPUs, or NVML when it starts.",
)
@click.option(
    "--sim-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Declarations of the simulated probe "
    "(default $SGPU_SIMGPU_DIR or /var/tmp/slurmgpu-simgpu).",
)
@click.option(
    "--gres-conf",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The node's gres.conf, to match probed GPUs to Slurm indices "
    "(default: next to $SLURM_CONF, else /etc/slurm/gres.conf).",
)
@click.option(
    "--auth",
    "auth_mode",
    type=click.Choice(["auto", "munge", "hmac"]),
    default="auto",
    show_default=True,
    help="MUNGE credentials, the node token (HMAC), or MUNGE when munged answers.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=str(DEFAULT_TOKEN_FILE),
    show_default=True,
    help="This node's token (mode 600), used when munged is not running.",
)
@click.option(
    "--daemon-uid",
    "daemon_uids",
    type=click.IntRange(min=0),
    multiple=True,
    default=(0,),
    show_default=True,
    help="With MUNGE: a uid the daemon runs as (root, or SlurmUser); repeatable. A reply "
    "signed by any other uid is not the daemon's, and nothing is deleted on its word.",
)
@click.option(
    "--spool-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=str(DEFAULT_SPOOL_DIR),
    show_default=True,
    help="Where batches wait while the daemon is unreachable.",
)
@click.option(
    "--spool-max",
    "spool_max_bytes",
    default=f"{DEFAULT_MAX_BYTES // _MIB}MiB",
    show_default=True,
    callback=_size_bytes,
    metavar="SIZE",
    help="Spool size bound; the oldest batches are dropped (and counted) beyond it.",
)
@click.option(
    "--sim-gpu-model",
    "sim_model",
    type=click.Choice(sorted(GPU_POWER)),
    default=None,
    help=f"Simulated probe: the GPU model whose power to simulate where gres.conf gives "
    f"no Type= [default: {DEFAULT_MODEL}].",
)
@click.option("--once", is_flag=True, help="Run one cycle and exit (exit 1 if not sent).")
@click.option(
    "--cycles", type=click.IntRange(min=1), default=None, help="Stop after this many cycles."
)
def agent(
    node: str | None,
    daemon_url: str,
    interval_s: float,
    timeout_s: float,
    probe_kind: str,
    sim_dir: Path | None,
    gres_conf: Path | None,
    auth_mode: str,
    token_file: Path,
    daemon_uids: tuple[int, ...],
    spool_dir: Path,
    spool_max_bytes: int,
    sim_model: str | None,
    once: bool,
    cycles: int | None,
) -> None:
    """Run the node agent: sample each job's GPU, CPU and memory use; send it to the daemon."""
    import re

    node_name = node or socket.gethostname().split(".")[0]
    if not re.fullmatch(NODE_NAME, node_name):
        raise click.BadParameter(f"{node_name!r} is not a node name", param_hint="'--node'")
    if not daemon_url.startswith(("http://", "https://")):
        raise click.BadParameter(
            f"{daemon_url!r} is not an http:// or https:// URL", param_hint="'--daemon'"
        )
    if os.geteuid() != 0:
        log.warning("not running as root: processes of other users cannot be attributed to jobs")
    try:
        auth = choose_auth(auth_mode, token_file, frozenset(daemon_uids))
    except AgentAuthError as exc:
        raise _Fail(str(exc)) from None
    gres_path = gres_conf if gres_conf is not None else default_gres_conf()
    probe = _open_probe(
        probe_kind,
        node_name,
        gres_path,
        sim_dir if sim_dir is not None else default_state_dir(),
        sim_model,
    )
    try:
        minors = _slurm_minors(gres_path, node_name, gres_conf is not None)
        try:
            spool = BatchSpool(spool_dir, max_bytes=spool_max_bytes)
        except SpoolError as exc:
            raise _Fail(str(exc)) from None
        with spool:
            _run(
                node_name,
                probe,
                minors,
                auth,
                daemon_url,
                timeout_s,
                interval_s,
                spool,
                once,
                cycles,
                lambda: choose_auth(auth_mode, token_file, frozenset(daemon_uids)),
            )
    finally:
        probe.close()


def _run(
    node: str,
    probe: GpuProbe,
    minors: dict[int, int] | None,
    auth: Authenticator,
    daemon_url: str,
    timeout_s: float,
    interval_s: float,
    spool: BatchSpool,
    once: bool,
    cycles: int | None,
    reauth: Callable[[], Authenticator],
) -> None:
    from slurmgpu.telemetry.host import HostUsageSampler

    sampler = NodeSampler(node, probe, HostUsageSampler(), slurm_minors_by_index=minors)
    client = DaemonClient(
        daemon_url,
        node,
        auth,
        timeout_s=timeout_s,
        # Back off from one interval up to 5 min after failures; re-make the credentials
        # (token file re-read, munged re-checked) after a 401/403.
        backoff=Backoff(base_s=interval_s, cap_s=max(300.0, interval_s)),
        reauth=reauth,
    )
    loop = AgentLoop(sampler, client, spool, interval_s=interval_s)
    if once:
        report = loop.run_once()
        if report.sent:
            click.echo(
                f"sent {report.gpu_samples} GPU and {report.host_samples} host samples to "
                f"{daemon_url}; drained {report.drained} spooled batch(es), "
                f"{report.spool_batches} left"
            )
            return
        if report.spooled:
            raise _Fail(
                f"daemon {daemon_url} unreachable ({report.error}); "
                f"batch spooled in {spool.directory}"
            )
        raise _Fail(f"daemon {daemon_url} refused the batch ({report.error})")
    loop.install_signal_handlers()
    log.info(
        "agent started on %s: probe %s, Slurm GPU indices by %s, auth %s, daemon %s, every %gs",
        node,
        probe.name,
        "device minor (gres.conf)" if minors else "probe order",
        auth.method,
        daemon_url,
        interval_s,
    )
    loop.run(max_cycles=cycles)


def _standalone() -> None:
    from slurmgpu.cli import logs

    logs.configure(fmt=os.environ.get("SGPU_LOG_FORMAT", "text"))
    agent(prog_name="sgpu agent")


if __name__ == "__main__":
    _standalone()

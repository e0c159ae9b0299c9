"""``sgpu daemon``: observe Slurm every poll interval and store what changed."""

from __future__ import annotations

import logging
from datetime import timedelta

import click

from slurmgpu.cli.main import EXIT_SLURM, EXIT_STORE, AppContext, duration_option, fail, pass_app
from slurmgpu.daemon.loop import DaemonLoop
from slurmgpu.daemon.observer import Observer

log = logging.getLogger("slurmgpu.daemon")


@click.command()
@click.option(
    "--once", is_flag=True, help="Run one cycle and exit (exit 5 if Slurm was unavailable)."
)
@click.option("--interval", metavar="DURATION", help='Poll interval, e.g. "30s" (default: config).')
@click.option("--cycles", type=click.IntRange(min=1), help="Stop after this many cycles.")
@pass_app
def daemon(app: AppContext, once: bool, interval: str | None, cycles: int | None) -> None:
    """Run the slurmgpu daemon (observe → store; policies come in later releases)."""
    settings = app.settings
    poll = (
        timedelta(seconds=duration_option(interval)) if interval else settings.daemon.poll_interval
    )
    if poll.total_seconds() < 0.1:
        fail("--interval must be at least 0.1s", 2)
    store = app.store(migrate=True)
    slurm = app.slurm()
    try:
        observer = Observer(slurm, store, vanish_after_cycles=settings.daemon.vanish_after_cycles)
    except Exception as exc:  # the store could not be read back
        fail(f"cannot load state from {settings.daemon.database}: {exc}", EXIT_STORE)
    loop = DaemonLoop(observer, interval=poll, max_backoff=settings.daemon.max_backoff)
    if once:
        result = loop.run_once()
        if not result.ok:
            fail(result.error, EXIT_SLURM)
        click.echo(
            f"observed {result.jobs_seen} jobs: {result.new} new, {result.changed} changed, "
            f"{result.gone} gone; {result.nodes_changed} nodes updated in {result.seconds:.2f}s"
        )
        return
    loop.install_signal_handlers()
    log.info(
        "daemon started: database %s, poll every %.0fs, mode %s",
        settings.daemon.database,
        poll.total_seconds(),
        settings.daemon.mode,
    )
    loop.run(max_cycles=cycles)

"""``sgpu daemon``: observe Slurm every poll interval, serve the agent API, store it all.

Only the command: its options and exit statuses. The wiring is slurmgpu/daemon/app.py.
"""

from __future__ import annotations

from datetime import timedelta

import click

from slurmgpu.cli import logs
from slurmgpu.cli.context import (
    EXIT_DAMAGED,
    EXIT_SLURM,
    EXIT_STORE,
    AppContext,
    duration_option,
    fail,
    pass_app,
)
from slurmgpu.daemon.app import DaemonError, run_daemon
from slurmgpu.listen_address import parse_listen

# How each kind of DaemonError leaves the command (exit statuses: cli/context.py).
_EXIT_CODES = {
    "usage": 2,
    "store": EXIT_STORE,
    "damaged": EXIT_DAMAGED,
    "slurm": EXIT_SLURM,
    "other": 1,
}


@click.command()
@click.option(
    "--once",
    is_flag=True,
    help="Run one cycle and exit (exit 4 if it met a database error, 6 on a corrupt "
    "database, 5 if Slurm was unavailable).",
)
@click.option("--interval", metavar="DURATION", help='Poll interval, e.g. "30s" (default: config).')
@click.option("--cycles", type=click.IntRange(min=1), help="Stop after this many cycles.")
@click.option(
    "--listen", metavar="HOST:PORT", help="API address (default: config, 127.0.0.1:8787)."
)
@click.option("--no-api", is_flag=True, help="Do not serve the agent ingest API.")
@click.option("--no-policies", is_flag=True, help="Observe only: run no policy at all.")
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default=None,
    help="Log lines as text or JSON, one object a line (journald); overrides sgpu's own.",
)
@click.option(
    "--standby",
    is_flag=True,
    help="Passive mode: wait until the daemon holding the database lease stops, then take over.",
)
@pass_app
def daemon(
    app: AppContext,
    once: bool,
    interval: str | None,
    cycles: int | None,
    listen: str | None,
    no_api: bool,
    no_policies: bool,
    log_format: str | None,
    standby: bool,
) -> None:
    """Run the slurmgpu daemon: observe → store, and ingest agents' usage samples."""
    if log_format is not None:
        logs.set_format(log_format)
    if listen is not None:
        try:
            parse_listen(listen)
        except ValueError as exc:
            fail(f"--listen {listen[:80]!r}: {exc}", 2)
    settings = app.settings
    poll = (
        timedelta(seconds=duration_option(interval)) if interval else settings.daemon.poll_interval
    )
    if poll.total_seconds() < 0.1:
        fail("--interval must be at least 0.1s", 2)
    # The store's integrity is checked before anything writes to it: a corrupt one is
    # refused with one line (exit 6), never migrated or run on.
    store = app.store(migrate=True, check=True)
    try:
        result = run_daemon(
            settings,
            store,
            app.slurm(),
            poll=poll,
            policies=not no_policies,
            standby=standby,
            once=once,
            listen=listen,
            api=settings.daemon.api and not no_api,
            cycles=cycles,
        )
    except DaemonError as exc:
        fail(str(exc), _EXIT_CODES[exc.kind])
    if result is not None:
        click.echo(
            f"observed {result.jobs_seen} jobs: {result.new} new, {result.changed} changed, "
            f"{result.gone} gone; {result.nodes_changed} nodes updated in "
            f"{result.seconds:.2f}s"
        )

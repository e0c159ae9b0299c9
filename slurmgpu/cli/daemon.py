"""``sgpu daemon``: observe Slurm every poll interval, serve the agent API, store it all.

Only the command: its options and exit statuses. The wiring is slurmgpu/daemon/app.py.
"""

from __future__ import annotations

from datetime import timedelta

import click

from slurmgpu.cli import logs
from slurmgpu.cli.context import EXIT_SLURM, EXIT_STORE, AppContext, duration_option, fail, pass_app
from slurmgpu.daemon.app import Daemon, DaemonError, wait_for_lease
from slurmgpu.daemon.lease import DaemonLease, LeaseError

# How each kind of DaemonError leaves the command (exit statuses: cli/context.py).
_EXIT_CODES = {"usage": 2, "store": EXIT_STORE, "slurm": EXIT_SLURM, "other": 1}


@click.command()
@click.option(
    "--once", is_flag=True, help="Run one cycle and exit (exit 5 if Slurm was unavailable)."
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
    settings = app.settings
    poll = (
        timedelta(seconds=duration_option(interval)) if interval else settings.daemon.poll_interval
    )
    if poll.total_seconds() < 0.1:
        fail("--interval must be at least 0.1s", 2)
    store = app.store(migrate=True)
    # The lease comes before any state is read or recovered: a second daemon must not
    # mark the first one's in-flight decisions as interrupted.
    lease = DaemonLease(store.engine, ttl=settings.daemon.lease_ttl)
    if standby:
        if not wait_for_lease(lease):
            return
    else:
        try:
            lease.acquire()
        except LeaseError as exc:
            fail(str(exc), 1)
    try:
        running = Daemon(settings, store, app.slurm(), lease, poll=poll, policies=not no_policies)
        if once:
            result = running.run_once()
            click.echo(
                f"observed {result.jobs_seen} jobs: {result.new} new, {result.changed} changed, "
                f"{result.gone} gone; {result.nodes_changed} nodes updated in "
                f"{result.seconds:.2f}s"
            )
            return
        running.serve(listen=listen, api=settings.daemon.api and not no_api, cycles=cycles)
    except DaemonError as exc:
        fail(str(exc), _EXIT_CODES[exc.kind])
    finally:
        lease.release()

"""``sgpu daemon``: observe Slurm every poll interval, serve the agent API, store it all."""

from __future__ import annotations

import logging
import signal
import threading
from datetime import timedelta
from pathlib import Path

import click

from slurmgpu.cli import logs
from slurmgpu.cli.context import EXIT_SLURM, EXIT_STORE, AppContext, duration_option, fail, pass_app
from slurmgpu.daemon.api import ApiServer, Authenticator, IngestService, NodeDirectory, parse_listen
from slurmgpu.daemon.lease import DaemonLease, LeaseError, LeaseKeeper
from slurmgpu.daemon.loop import DaemonLoop
from slurmgpu.daemon.metrics import DaemonMetrics
from slurmgpu.daemon.munge_watch import MungeWatch
from slurmgpu.daemon.observer import CycleResult, Observer
from slurmgpu.daemon.placement import SnapshotPlacement
from slurmgpu.daemon.policy_cycle import build_policy_cycle
from slurmgpu.daemon.summary import Summarizer
from slurmgpu.store import JobStore
from slurmgpu.store.retention import Retention
from slurmgpu.store.usage import SKEW_LIMIT_S, UsageStore
from slurmgpu.wire import AuthError, load_or_create_site_secret, munge_available

log = logging.getLogger("slurmgpu.daemon")


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
        if not _wait_for_lease(lease):
            return
    else:
        try:
            lease.acquire()
        except LeaseError as exc:
            fail(str(exc), 1)
    try:
        _run(app, store, lease, poll, once, cycles, listen, no_api, no_policies)
    finally:
        lease.release()


def _wait_for_lease(lease: DaemonLease) -> bool:
    stop = threading.Event()

    def _stop(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return lease.wait_acquire(stop)


def _run(
    app: AppContext,
    store: JobStore,
    lease: DaemonLease,
    poll: timedelta,
    once: bool,
    cycles: int | None,
    listen: str | None,
    no_api: bool,
    no_policies: bool,
) -> None:
    settings = app.settings
    slurm = app.slurm()
    usage = UsageStore(store.engine, store.cluster)
    try:
        observer = Observer(slurm, store, vanish_after_cycles=settings.daemon.vanish_after_cycles)
    except Exception as exc:  # the store could not be read back
        fail(f"cannot load state from {settings.daemon.database}: {exc}", EXIT_STORE)
    # Samples are kept only for jobs that ran on the posting node, on that node's GPUs.
    usage.placement = SnapshotPlacement(lambda: observer.latest, store.engine, store.cluster)
    summarizer = Summarizer(usage, slurm, admin_comment=settings.daemon.admin_comment)
    policies = None if no_policies else build_policy_cycle(settings, store, slurm)
    metrics = DaemonMetrics(store.engine, store.cluster, snapshot=lambda: observer.latest)
    retention = Retention(
        store.engine,
        store.cluster,
        sample_retention=settings.daemon.sample_retention,
        rollup_retention=settings.daemon.rollup_retention,
    )
    metrics.watch(
        "sgpu_samples_pruned",
        "Raw samples deleted by the retention (rolled up per job and hour first).",
        lambda: float(retention.deleted_total),
    )
    metrics.watch(
        "sgpu_samples_refused",
        "Agent samples left out: job not on the posting node, unknown job, no such GPU.",
        lambda: dict(usage.refused),
        label="reason",
    )
    metrics.watch(
        "sgpu_samples_skewed",
        f"Samples stamped over {SKEW_LIMIT_S:.0f}s from the daemon's clock (stored), by node.",
        lambda: dict(usage.skewed),
        label="node",
    )
    metrics.watch(
        "sgpu_agent_spool_dropped_samples",
        "Samples an agent's spool dropped so far (as the agent last reported), by node.",
        lambda: dict(usage.spool_dropped),
        label="node",
    )
    if policies is not None:
        errors = policies.errors
        metrics.watch(
            "sgpu_policy_errors",
            "Exceptions a policy raised (on one job, or for a whole cycle), by policy.",
            lambda: dict(errors),
            label="policy",
        )

    def on_cycle(result: CycleResult) -> None:
        if result.snapshot is None:
            return
        ended = set(result.ended)
        for job in result.snapshot.jobs:
            if job.job_id in ended:
                try:
                    summarizer.job_ended(job, result.at)
                except Exception:  # one job's summary must not cost the others theirs
                    log.exception("summary of job %d failed; other jobs go on", job.job_id)
        # No lease (lapsed while the database refused writes, or taken over): no action.
        if policies is not None and lease.valid():
            policies.run(result.snapshot, result.at)
        if lease.valid():
            retention.maybe_run(result.at)

    loop = DaemonLoop(
        observer,
        interval=poll,
        max_backoff=settings.daemon.max_backoff,
        on_cycle=on_cycle,
        busy=policies.busy if policies is not None else None,
        busy_interval=settings.policy.resize.cycle_interval,
        metrics=metrics,
    )
    if once:
        result = loop.run_once()
        if not result.ok:
            fail(result.error, EXIT_SLURM)
        click.echo(
            f"observed {result.jobs_seen} jobs: {result.new} new, {result.changed} changed, "
            f"{result.gone} gone; {result.nodes_changed} nodes updated in {result.seconds:.2f}s"
        )
        return
    server = None
    munge: MungeWatch | None = None
    if settings.daemon.api and not no_api:
        try:
            host, port = parse_listen(listen or settings.daemon.listen)
        except ValueError as exc:
            fail(str(exc), 2)
        try:
            secret = load_or_create_site_secret(Path(settings.daemon.secret_file))
        except (AuthError, OSError) as exc:
            fail(f"site secret: {exc}", 1)
        directory = NodeDirectory(lambda: observer.latest)
        auth = Authenticator(
            site_secret=secret,
            allow_munge=munge_available(),
            node_addresses=directory.addresses,
            admin_uids=frozenset(settings.daemon.admin_uids),
        )
        # Re-checked every poll interval: a munged that dies or comes back is said once.
        munge = MungeWatch(
            up=auth.allow_munge,
            on_change=lambda up: setattr(auth, "allow_munge", up),
            interval_s=poll.total_seconds(),
        )
        watched = munge
        metrics.watch(
            "sgpu_munge_up",
            "1 while the local munged answers (agents' MUNGE credentials can be checked).",
            lambda: 1.0 if watched.up else 0.0,
            kind="gauge",
        )
        if not auth.allow_munge:
            log.warning("MUNGE is not available at start: agents need node tokens until it is")
        munge.start()
        service = IngestService(usage, auth, directory, metrics=metrics.exposition)
        metrics.watch_ingest(lambda: (service.accepted, service.rejected))
        try:
            server = ApiServer(service, host, port)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror}", 1)
        server.export_metrics(metrics.registry)
        server.start()
        log.info(
            "API listening on http://%s:%d (MUNGE auth %s)",
            host,
            server.address[1],
            "on" if auth.allow_munge else "off",
        )
    keeper = LeaseKeeper(lease, on_lost=loop.stop_event.set)
    keeper.start()
    loop.install_signal_handlers()
    log.info(
        "daemon started: database %s, poll every %gs, mode %s",
        settings.daemon.database,
        poll.total_seconds(),
        settings.daemon.mode,
    )
    try:
        loop.run(max_cycles=cycles)
    finally:
        keeper.stop()
        if munge is not None:
            munge.stop()
        if server is not None:
            server.stop()
    if lease.lost:
        fail("stopped: another daemon took over the database lease", 1)

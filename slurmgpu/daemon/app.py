"""The daemon's wiring: observer, store, usage ingest, policies, metrics, retention, API, lease.

``sgpu daemon`` (cli/daemon.py) only reads its options and turns :class:`DaemonError` into
an exit status; everything that builds and runs the daemon's parts lives here, so a test or
another front end can start the same daemon without going through click.
"""

from __future__ import annotations

import logging
import signal
from datetime import timedelta
from pathlib import Path
from typing import Literal

from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.config import Settings
from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.hold_release import HoldRelease
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.lease import DaemonLease, LeaseError, LeaseKeeper
from slurmgpu.daemon.limit_restore import LimitRestore
from slurmgpu.daemon.loop import DaemonLoop
from slurmgpu.daemon.metrics import DaemonMetrics
from slurmgpu.daemon.munge_watch import MungeWatch
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.daemon.observer import CycleResult, Observer
from slurmgpu.daemon.placement import SnapshotPlacement
from slurmgpu.daemon.policy_cycle import build_policy_cycle
from slurmgpu.daemon.rightsize_undo import RightsizeUndo
from slurmgpu.daemon.store_watch import StoreWatch
from slurmgpu.daemon.summary import Summarizer
from slurmgpu.listen_address import parse_listen
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.slurm.client import SlurmClient
from slurmgpu.stop_flag import StopFlag
from slurmgpu.store import JobStore, StoreDamagedError
from slurmgpu.store.database import database_name, store_error
from slurmgpu.store.health import StoreHealth, one_line
from slurmgpu.store.retention import Retention
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import AuthError, load_or_create_site_secret, munge_available

log = logging.getLogger("slurmgpu.daemon")

# What went wrong, for the front end's exit status: a bad option, the store, a damaged
# store (corrupt, not a database: restore it), Slurm, or anything else that stops the
# daemon from starting or running.
ErrorKind = Literal["usage", "store", "damaged", "slurm", "other"]


class DaemonError(Exception):
    """The daemon cannot start or had to stop; one line, with the kind of problem."""

    def __init__(self, message: str, kind: ErrorKind = "other") -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind


def wait_for_lease(lease: DaemonLease) -> bool:
    """Standby: block until the lease is ours (True) or SIGTERM/SIGINT came (False)."""
    stop = StopFlag()  # set by a signal handler

    def _stop(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return lease.wait_acquire(stop)


class Daemon:
    """The daemon's parts, wired: one observe → summarise → decide → prune cycle per poll."""

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        slurm: SlurmClient,
        lease: DaemonLease,
        *,
        poll: timedelta,
        policies: bool = True,
    ) -> None:
        self.settings = settings
        self.lease = lease
        self.poll = poll
        self.usage = usage = UsageStore(store.engine, store.cluster)
        # Every store error on the engine is recorded (any thread); a cycle's, an upload's
        # commit says writes work. /healthz answers from it; the watch stops the daemon
        # on a corrupt store (daemon/store_watch.py).
        self.health = health = StoreHealth()
        health.watch(store.engine)
        usage.health = health
        self.store_watch = StoreWatch(store.engine, health)
        self.fatal: str | None = None  # why the daemon stops (a damaged store)
        try:
            observer = Observer(
                slurm, store, vanish_after_cycles=settings.daemon.vanish_after_cycles
            )
        except SQLAlchemyError as exc:  # the store could not be read back
            error = store_error(store.engine.url, exc, "cannot be loaded")
            kind: ErrorKind = "damaged" if isinstance(error, StoreDamagedError) else "store"
            raise DaemonError(str(error), kind) from None
        except Exception as exc:
            raise DaemonError(
                f"cannot load state from {database_name(store.engine)}: {exc}", "store"
            ) from None
        self.observer = observer
        # Samples are kept only where and when their job ran (node, its GPUs, its run);
        # those of jobs not seen yet are held until a cycle lists them, as long as raw
        # samples are kept at most.
        usage.placement = placement = SnapshotPlacement(
            lambda: observer.latest, store.engine, store.cluster
        )
        usage.hold.ttl = settings.daemon.sample_retention
        summarizer = Summarizer(usage, slurm, admin_comment=settings.daemon.admin_comment)
        hold_release = HoldRelease(usage, placement, store, summarizer)
        cycle = build_policy_cycle(settings, store, slurm) if policies else None
        # Jobs that ran into a limit the daemon lowered go back with the one they had.
        restore = LimitRestore(cycle.actuator, cycle.audit) if cycle is not None else None
        undo: RightsizeUndo | None = None
        self.metrics = metrics = DaemonMetrics(
            store.engine,
            store.cluster,
            snapshot=lambda: observer.latest,
            max_users=settings.daemon.metrics_max_users,
        )
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
        metrics.watch_usage(usage)
        gres = observer.gres
        metrics.watch(
            "sgpu_node_gres_disagreements",
            "Times a node's gres_used (Slurm) started to disagree with its running jobs' "
            "allocations, by kind (gpus, shards, shard_overcommit: a GPU holding more "
            "shards than it has).",
            lambda: {k: float(v) for k, v in gres.started.items()},
            label="kind",
        )
        metrics.watch(
            "sgpu_node_gres_disagreeing",
            "(node, kind) disagreements standing now (the allocations' figure is used).",
            lambda: {k: float(v) for k, v in gres.open_by_kind().items()},
            kind="gauge",
            label="kind",
        )
        if cycle is not None:
            errors = cycle.errors
            metrics.watch(
                "sgpu_policy_errors",
                "Exceptions a policy raised (on one job, or for a whole cycle), by policy.",
                lambda: dict(errors),
                label="policy",
            )
            rightsize = next(
                (p for p, _ in cycle.engine.policies if isinstance(p, RightsizePolicy)), None
            )
            if restore is not None:
                metrics.watch(
                    "sgpu_rightsize_limit_restores",
                    "Jobs that ran into a time limit the daemon lowered, requeued with the "
                    "limit they had (since the daemon started).",
                    lambda: float(restore.restored),
                )
            # Rightsized jobs a site limit stops for ever get their request back, and
            # their key is not lowered that way again.
            undo = undone = RightsizeUndo(cycle.actuator, cycle.audit, rightsize)
            metrics.watch(
                "sgpu_rightsize_undos",
                "Pending jobs that waited with a site limit reason they never leave "
                "(QOSMin..., BadConstraints...) after rightsizing, given their request "
                "back (since the daemon started).",
                lambda: float(undone.undone),
            )
            if rightsize is not None:
                metrics.watch(
                    "sgpu_rightsize_backlog_jobs",
                    "Pending jobs rightsizing has yet to judge: more than "
                    "policy.rightsize.max_judged_per_cycle were new (a first cycle on a "
                    "deep queue) or had their history change; 0 once all are judged.",
                    lambda: float(rightsize.backlog),
                    kind="gauge",
                )

        def act(result: CycleResult) -> None:
            if result.snapshot is None:
                return
            if lease.valid():  # before the summaries: they count what it releases
                hold_release.after_cycle(result)
            ended = set(result.ended)
            for job in result.snapshot.jobs:
                if job.job_id in ended:
                    try:
                        summarizer.job_ended(job, result.at)
                    except SQLAlchemyError as exc:  # recorded by health; checked below
                        log.warning("summary of job %d failed: %s", job.job_id, one_line(exc))
                    except Exception:  # one job's summary must not cost the others theirs
                        log.exception("summary of job %d failed; other jobs go on", job.job_id)
            if restore is not None and lease.valid():
                try:
                    restore.after_cycle(result.snapshot.jobs, result.ended, result.at)
                except Exception:  # a bug here must not cost the cycle its decisions
                    log.exception("restoring lowered time limits failed; the cycle goes on")
            if undo is not None and lease.valid():
                try:
                    undo.after_cycle(result.snapshot.jobs, result.at)
                except Exception:  # a bug here must not cost the cycle its decisions
                    log.exception("undoing stuck rightsizes failed; the cycle goes on")
            # No lease (lapsed while the database refused writes, or taken over): no action.
            if cycle is not None and lease.valid():
                cycle.run(result.snapshot, result.at)
            if lease.valid():
                retention.maybe_run(result.at)

        def on_cycle(result: CycleResult) -> None:
            if result.ok:
                health.wrote()  # the cycle's transaction committed
            try:
                act(result)
            finally:
                self._check_store()

        self.loop = DaemonLoop(
            observer,
            interval=poll,
            max_backoff=settings.daemon.max_backoff,
            on_cycle=on_cycle,
            busy=cycle.busy if cycle is not None else None,
            busy_interval=settings.policy.resize.cycle_interval,
            metrics=metrics,
        )

    def _check_store(self) -> None:
        """After each cycle: stop the loop when the store turned out to be damaged."""
        fatal = self.store_watch.after_cycle()
        if fatal is not None:
            self.fatal = fatal
            self.loop.stop_event.set()

    def run_once(self) -> CycleResult:
        """One cycle (``sgpu daemon --once``). DaemonError: "damaged" when the store is
        corrupt, "store" when any store error met the cycle (its write, a policy's read,
        a summary), "slurm" when Slurm did not answer."""
        errors = self.health.failures
        result = self.loop.run_once()
        if self.fatal is not None:
            raise DaemonError(self.fatal, "damaged")
        last = self.health.last_error
        if self.health.failures != errors and last is not None:
            where = database_name(self.usage.engine)
            raise DaemonError(last.sentence(where, "failed during the cycle"), "store")
        if not result.ok:
            raise DaemonError(result.error, "slurm")
        return result

    def serve(self, *, listen: str | None, api: bool, cycles: int | None) -> None:
        """Serve the agent API (when ``api``) and run cycles until stopped or ``cycles`` ran."""
        settings = self.settings
        server = None
        munge: MungeWatch | None = None
        if api:
            server, munge = self._start_api(listen or settings.daemon.listen)
        keeper = LeaseKeeper(self.lease, on_lost=self.loop.stop_event.set)
        keeper.start()
        self.loop.install_signal_handlers()
        log.info(
            "daemon started: database %s, poll every %gs, mode %s",
            settings.daemon.database,
            self.poll.total_seconds(),
            settings.daemon.mode,
        )
        try:
            self.loop.run(max_cycles=cycles)
        finally:
            keeper.stop()
            if munge is not None:
                munge.stop()
            if server is not None:
                server.stop()
        if self.fatal is not None:
            raise DaemonError(self.fatal, "damaged")
        if self.lease.lost:
            raise DaemonError("stopped: another daemon took over the database lease")

    def _start_api(self, listen: str) -> tuple[ApiServer, MungeWatch]:
        settings, metrics, observer = self.settings, self.metrics, self.observer
        try:
            host, port = parse_listen(listen)
        except ValueError as exc:
            raise DaemonError(f"listen address {listen[:80]!r}: {exc}", "usage") from None
        try:
            secret = load_or_create_site_secret(Path(settings.daemon.secret_file))
        except (AuthError, OSError) as exc:
            raise DaemonError(f"site secret: {exc}") from None
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
            interval_s=self.poll.total_seconds(),
        )
        metrics.watch(
            "sgpu_munge_up",
            "1 while the local munged answers (agents' MUNGE credentials can be checked).",
            lambda: 1.0 if munge.up else 0.0,
            kind="gauge",
        )
        if not auth.allow_munge:
            log.warning("MUNGE is not available at start: agents need node tokens until it is")
        munge.start()
        service = IngestService(self.usage, auth, directory, metrics=metrics.exposition)
        service.health = self.health.healthz
        metrics.watch_ingest(lambda: (service.accepted, service.rejected))
        metrics.watch_agents(lambda: dict(service.last_seen))
        try:
            server = ApiServer(service, host, port)
        except OSError as exc:
            raise DaemonError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        server.export_metrics(metrics.registry)
        server.start()
        log.info(
            "API listening on http://%s:%d (MUNGE auth %s)",
            host,
            server.address[1],
            "on" if auth.allow_munge else "off",
        )
        return server, munge


def run_daemon(
    settings: Settings,
    store: JobStore,
    slurm: SlurmClient,
    *,
    poll: timedelta,
    policies: bool = True,
    standby: bool = False,
    once: bool = False,
    listen: str | None = None,
    api: bool = True,
    cycles: int | None = None,
) -> CycleResult | None:
    """Hold the database lease, build the daemon and run it: one cycle (``once``, its
    result returned) or until stopped. ``standby`` waits for the lease instead of failing
    when another daemon holds it (None: stopped while waiting). The lease comes before
    any state is read or recovered, so a second daemon never marks the first one's
    in-flight decisions as interrupted; it is released however the run ends."""
    lease = DaemonLease(store.engine, ttl=settings.daemon.lease_ttl)
    if standby:
        if not wait_for_lease(lease):
            return None
    else:
        try:
            lease.acquire()
        except LeaseError as exc:
            raise DaemonError(str(exc)) from None
    try:
        running = Daemon(settings, store, slurm, lease, poll=poll, policies=policies)
        if once:
            return running.run_once()
        running.serve(listen=listen, api=api, cycles=cycles)
        return None
    finally:
        lease.release()

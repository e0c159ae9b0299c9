"""``AgentLoop``: every interval, fetch this node's jobs, sample, send one batch; spool on failure.

One cycle:

1. ``GET`` the node's running jobs; when that fails, keep sampling with the last list known
   (processes are still attributed to jobs from their cgroups; only allocations go stale).
2. Sample (``NodeSampler``) and encode one ``SampleBatch``.
3. ``POST`` it. Sent: then drain the spool oldest-first, at most ``drain_batches`` batches and
   ``drain_budget_s`` seconds per cycle, so a long outage's backlog cannot starve sampling.
   Daemon away or busy: append the batch to the spool. Refused for good (4xx): log the
   daemon's error, count the samples as dropped, move on.

The log gets one line per change of state (daemon unreachable or busy; taking samples again, with
N spooled batches drained; a new kind of refusal), not one per cycle.

SIGTERM and SIGINT stop the loop after the current step: a batch already sampled is still
sent once (into the spool if that fails), the spool drain stops, and the loop exits; so
nothing sampled is lost by a restart, and a stop waits only for the requests in flight.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from slurmgpu import __version__
from slurmgpu.agent.sampler import NodeSampler
from slurmgpu.agent.sender import DaemonClient, JobsUnavailableError, SendOutcome, SendResult
from slurmgpu.agent.spool import BatchSpool, SpoolError
from slurmgpu.stop_flag import StopFlag
from slurmgpu.wire import NodeJobs, SampleBatch, encode

log = logging.getLogger("slurmgpu.agent")

DEFAULT_INTERVAL_S = 10.0
DEFAULT_DRAIN_BATCHES = 100
AGENT_NAME = f"slurmgpu-agent/{__version__}"


@dataclass(frozen=True, slots=True)
class CycleReport:
    """What one cycle did (for ``--once``, tests and the bench)."""

    seq: int
    gpu_samples: int
    host_samples: int
    sent: bool  # this cycle's batch reached the daemon
    spooled: bool  # this cycle's batch went to the spool
    rejected: bool  # the daemon refused this cycle's batch for good
    drained: int  # spooled batches sent this cycle
    spool_batches: int  # batches left in the spool
    jobs_fresh: bool  # the job list came from the daemon this cycle
    error: str = ""


class AgentLoop:
    """Runs agent cycles until stopped.

    >>> loop = AgentLoop(sampler, DaemonClient(url, node, auth), BatchSpool(d))  # doctest: +SKIP
    >>> loop.run_once().sent  # doctest: +SKIP
    True
    """

    def __init__(
        self,
        sampler: NodeSampler,
        client: DaemonClient,
        spool: BatchSpool,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        drain_batches: int = DEFAULT_DRAIN_BATCHES,
        drain_budget_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sampler = sampler
        self.client = client
        self.spool = spool
        self.node = sampler.node
        self.interval_s = interval_s
        self.drain_batches = drain_batches
        self.drain_budget_s = drain_budget_s if drain_budget_s is not None else interval_s / 2
        self._clock = clock
        self.stop_event = StopFlag()  # set by a signal handler
        self.cycles = 0
        self.jobs = NodeJobs(node=self.node, jobs=[])
        self._daemon_up: bool | None = None  # None: not tried yet
        self._jobs_error: str | None = None
        self._last_rejection: str | None = None
        self._spool_error: str | None = None
        self._cycle_error: str | None = None
        self._draining_backlog = 0  # batches drained since the daemon came back, while some remain

    # -- control -------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def _stop(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, stopping after this step", signal.Signals(signum).name)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    def stop(self) -> None:
        self.stop_event.set()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    # -- state changes, one log line each --------------------------------------------

    def _daemon_down(self, error: str) -> None:
        if self._daemon_up is not False:
            log.warning(
                "cannot send to daemon %s (%s); spooling batches in %s",
                self.client.base_url,
                error,
                self.spool.directory,
            )
        self._daemon_up = False
        self._draining_backlog = 0

    def _rejected(self, result: SendResult, samples: int, spooled: bool) -> None:
        what = "a spooled batch" if spooled else "a batch"
        if result.error != self._last_rejection:
            log.error(
                "daemon refused %s of %d samples (%s); dropped, not retried",
                what,
                samples,
                result.error,
            )
            self._last_rejection = result.error
        else:
            log.debug("daemon refused %s of %d samples again (%s)", what, samples, result.error)
        self.spool.add_dropped(samples)

    def _fetch_jobs(self) -> tuple[bool, SendResult | None]:
        """Refresh ``self.jobs``; return (fresh, the failure when the daemon was unreachable)."""
        try:
            jobs = self.client.fetch_jobs()
        except JobsUnavailableError as exc:
            if exc.result.unreachable:
                return False, exc.result
            if exc.result.error != self._jobs_error:
                log.warning(
                    "cannot get this node's jobs from the daemon (%s); using the last list "
                    "(%d jobs)",
                    exc.result.error,
                    len(self.jobs.jobs),
                )
                self._jobs_error = exc.result.error
            return False, None
        if self._jobs_error is not None:
            log.info("job list from the daemon again (%d jobs)", len(jobs.jobs))
            self._jobs_error = None
        self.jobs = jobs
        return True, None

    def _spool(self, body: bytes, samples: int) -> bool:
        try:
            stored = self.spool.append(body, samples=samples)
        except SpoolError as exc:
            if str(exc) != self._spool_error:
                log.error("%s; dropping unsent batches until it works", exc)
                self._spool_error = str(exc)
            self.spool.add_dropped(samples)
            return False
        if self._spool_error is not None:
            log.info("spool %s writable again", self.spool.directory)
            self._spool_error = None
        return stored

    # -- one cycle -----------------------------------------------------------------

    def run_once(self) -> CycleReport:
        """Fetch jobs, sample, send (or spool) one batch, drain the spool; never raises
        for daemon or disk trouble."""
        self.cycles += 1
        jobs_fresh, unreachable = self._fetch_jobs()
        now = self._clock()
        gpu, host = self.sampler.sample(self.jobs, now)
        samples = len(gpu) + len(host)
        batch = SampleBatch(
            node=self.node,
            gpu=gpu,
            host=host,
            agent=AGENT_NAME,
            dropped=self.spool.dropped_samples,
        )
        body = encode(batch)

        def report(
            *,
            sent: bool = False,
            spooled: bool = False,
            rejected: bool = False,
            drained: int = 0,
            error: str = "",
        ) -> CycleReport:
            return CycleReport(
                seq=self.sampler.seq,
                gpu_samples=len(gpu),
                host_samples=len(host),
                sent=sent,
                spooled=spooled,
                rejected=rejected,
                drained=drained,
                spool_batches=len(self.spool),
                jobs_fresh=jobs_fresh,
                error=error,
            )

        # Both calls go to the same daemon: when the GET got no answer, the POST would not.
        result = unreachable if unreachable is not None else self.client.post_samples(body)
        if result.outcome is SendOutcome.RETRY:
            self._daemon_down(result.error)
            return report(spooled=self._spool(body, samples), error=result.error)
        if result.outcome is SendOutcome.REJECTED:
            self._rejected(result, samples, spooled=False)
            return report(rejected=True, error=result.error)
        self._last_rejection = None
        came_back = self._daemon_up is not True
        self._daemon_up = True
        backlog = len(self.spool)
        drained = self._drain()
        self._log_drain(came_back, backlog, drained)
        return report(sent=True, drained=drained)

    def _drain(self) -> int:
        """Send spooled batches oldest-first within this cycle's budget; return how many."""
        drained = 0
        started = time.monotonic()
        while (
            drained < self.drain_batches
            and not self.stopping
            and time.monotonic() - started < self.drain_budget_s
        ):
            item = self.spool.peek_oldest()
            if item is None:
                break
            result = self.client.post_samples(item.data)
            if result.outcome is SendOutcome.RETRY:
                self._daemon_down(result.error)
                break
            if result.outcome is SendOutcome.REJECTED:
                self._rejected(result, item.samples, spooled=True)
            self.spool.ack_oldest()
            drained += 1
        return drained

    def _log_drain(self, came_back: bool, backlog: int, drained: int) -> None:
        left = len(self.spool)
        if came_back and (backlog or self.cycles > 1):
            tail = f", {left} left" if left else ""
            log.info(
                "daemon %s takes samples again; drained %d spooled batch(es)%s",
                self.client.base_url,
                drained,
                tail,
            )
            self._draining_backlog = drained if left else 0
        elif self._draining_backlog:
            self._draining_backlog += drained
            if not left:
                log.info("spool drained: %d batch(es) sent", self._draining_backlog)
                self._draining_backlog = 0

    # -- many cycles ---------------------------------------------------------------

    def run(self, *, max_cycles: int | None = None) -> None:
        """Run cycles every ``interval_s`` (fixed rate, missed ticks skipped) until stopped."""
        next_at = time.monotonic()
        done = 0
        while not self.stopping:
            try:
                self.run_once()
                if self._cycle_error is not None:
                    log.info("agent cycles work again")
                    self._cycle_error = None
            except Exception as exc:  # a bug or an unexpected OS error: keep the agent alive
                if str(exc) != self._cycle_error:
                    log.exception("agent cycle failed: %s", exc)
                    self._cycle_error = str(exc)
            done += 1
            if max_cycles is not None and done >= max_cycles:
                break
            next_at += self.interval_s
            now = time.monotonic()
            next_at = max(next_at, now)  # after a slow cycle (timeouts), go on at once
            self.stop_event.wait(next_at - now)
        log.info(
            "agent stopped after %d cycle(s); %d batch(es) in the spool, %d samples dropped so far",
            done,
            len(self.spool),
            self.spool.dropped_samples,
        )

"""The daemon's main loop: observe every poll interval, back off when Slurm is away.

SIGTERM and SIGINT end the loop after the current cycle (the cycle's writes are one
transaction, so stopping never leaves half a cycle stored).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Protocol

from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.daemon.observer import CycleResult, Observer
from slurmgpu.stop_flag import StopFlag
from slurmgpu.store.health import one_line

log = logging.getLogger("slurmgpu.daemon")


class CycleMetrics(Protocol):
    """Counts cycles: duration, outcome, Slurm errors (daemon.metrics.DaemonMetrics)."""

    def cycle_done(self, result: CycleResult) -> None: ...


def next_delay(interval: timedelta, failures: int, max_backoff: timedelta) -> float:
    """Return seconds to wait: the interval, doubled per consecutive failure, capped."""
    if failures <= 0:
        return interval.total_seconds()
    return float(
        min(interval.total_seconds() * 2.0 ** min(failures, 16), max_backoff.total_seconds())
    )


class DaemonLoop:
    """Runs :class:`Observer` cycles until stopped."""

    def __init__(
        self,
        observer: Observer,
        *,
        interval: timedelta,
        max_backoff: timedelta,
        on_cycle: Callable[[CycleResult], None] | None = None,
        busy: Callable[[], bool] | None = None,
        busy_interval: timedelta = timedelta(seconds=1),
        metrics: CycleMetrics | None = None,
    ) -> None:
        self.observer = observer
        self.interval = interval
        self.max_backoff = max_backoff
        self.on_cycle = on_cycle
        # While ``busy()`` (a resize in flight), cycles come every ``busy_interval``: each
        # step of a resize waits for the next observation.
        self.busy = busy
        self.busy_interval = busy_interval
        self.metrics = metrics
        self.stop_event = StopFlag()  # set by a signal handler
        self.failures = 0
        self.cycles = 0
        self.crashes = 0  # cycles that raised (a bug, logged with its traceback)
        self._last_error: str | None = None

    def install_signal_handlers(self) -> None:
        def _stop(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, stopping after this cycle", signal.Signals(signum).name)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    def run_once(self) -> CycleResult:
        result = self.observer.cycle()
        self.cycles += 1
        if self.metrics is not None:
            self.metrics.cycle_done(result)
        if result.ok:
            if self.failures:
                # Say what came back: Slurm, or the database that refused the cycle's writes.
                what = (
                    "slurm reachable"
                    if (self._last_error or "").startswith("slurm")
                    else "observe cycles stored"
                )
                log.info("%s again after %d failed cycle(s)", what, self.failures)
            self.failures = 0
            self._last_error = None
            level = (
                logging.INFO
                if (result.new or result.changed or result.gone or result.vanished)
                else logging.DEBUG
            )
            log.log(
                level,
                "cycle: %d jobs (%d new, %d changed, %d gone, %d vanished), "
                "%d nodes changed, %.2fs",
                result.jobs_seen,
                result.new,
                result.changed,
                result.gone,
                result.vanished,
                result.nodes_changed,
                result.seconds,
            )
        else:
            self.failures += 1
            delay = next_delay(self.interval, self.failures, self.max_backoff)
            # One warning per outage (and per new kind of error), not one per retry.
            level = logging.WARNING if result.error != self._last_error else logging.DEBUG
            self._last_error = result.error
            log.log(level, "%s; keeping previous state, retrying in %.0fs", result.error, delay)
        if self.on_cycle is not None:
            self.on_cycle(result)
        return result

    def run(self, *, max_cycles: int | None = None) -> None:
        while not self.stop_event.is_set():
            counted = self.cycles
            try:
                self.run_once()
            except SQLAlchemyError as exc:
                # The store (recorded and checked by the daemon's store watch): one line,
                # not a traceback every cycle.
                self.cycles = counted + 1
                self.failures += 1
                line = f"cycle failed: {one_line(exc)}"
                level = logging.WARNING if line != self._last_error else logging.DEBUG
                self._last_error = line
                log.log(level, "%s; the next one runs as usual", line)
            except Exception:
                # A bug met by one record must cost a cycle, not the daemon: the next
                # cycle starts from Slurm's listing again, after the usual back-off.
                self.cycles = counted + 1
                self.failures += 1
                self.crashes += 1
                log.exception("cycle failed unexpectedly; the next one runs as usual")
            if max_cycles is not None and self.cycles >= max_cycles:
                break
            delay = next_delay(self.interval, self.failures, self.max_backoff)
            if self.busy is not None and not self.failures and self.busy():
                delay = min(delay, self.busy_interval.total_seconds())
            self.stop_event.wait(delay)
        log.info("daemon stopped after %d cycle(s)", self.cycles)

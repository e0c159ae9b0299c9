"""Whether the local munged answers, re-checked while the daemon runs.

MUNGE was checked once at start: a munged that died later made every agent's MUNGE
credential fail to decode (401s, and agents that gave up), with nothing in the daemon's
log to say why; one that came back after a start without it stayed unused until a
restart. :class:`MungeWatch` checks every ``interval_s`` in its own thread (a hung
munged must not stall observe cycles), says once when MUNGE is gone and once when it is
back, and hands the new state to the API's authenticator.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from slurmgpu.wire import munge_available

__all__ = ["MungeWatch"]

log = logging.getLogger("slurmgpu.daemon")


class MungeWatch:
    """Polls ``check`` (``munge -n | unmunge``); ``on_change(up)`` runs when it flips."""

    def __init__(
        self,
        *,
        up: bool,
        on_change: Callable[[bool], None],
        check: Callable[[], bool] = munge_available,
        interval_s: float = 30.0,
    ) -> None:
        self.up = up
        self.on_change = on_change
        self.check = check
        self.interval_s = interval_s
        self.changes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """Check once; log and call ``on_change`` if MUNGE came or went. Returns the state."""
        try:
            now_up = bool(self.check())
        except Exception as exc:  # a check that breaks says "not available"
            log.debug("MUNGE check failed: %s", exc)
            now_up = False
        if now_up != self.up:
            self.up = now_up
            self.changes += 1
            if now_up:
                log.warning("MUNGE is available again: agents' MUNGE credentials accepted")
            else:
                log.warning(
                    "MUNGE is not available (munge -n | unmunge fails): agents using MUNGE "
                    "are refused until munged answers again; token agents are unaffected"
                )
            self.on_change(now_up)
        return now_up

    def start(self) -> None:
        def run() -> None:
            while not self._stop.wait(self.interval_s):
                self.poll()

        self._thread = threading.Thread(target=run, name="sgpu-munge-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

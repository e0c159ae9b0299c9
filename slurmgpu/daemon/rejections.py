"""What the API refused, counted by reason and logged at most once per reason, peer and
interval: a peer sending 1,500 bad requests a second costs one log line a minute, with the
count of the ones not logged, not 1,500 lines.

The first refusal of a (reason, peer) is logged at once; later ones in the same interval
are counted only; the next one after the interval is logged with how many were left out
since that pair's last line (those left out and never followed by another are in /metrics only).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_INTERVAL_S = 60.0
MAX_TRACKED = 4096  # (reason, peer) pairs remembered; beyond it the oldest are forgotten


@dataclass
class _Seen:
    logged_at: float
    suppressed: int = 0


@dataclass
class RejectionLog:
    """Counts refusals by reason; logs one line per reason and peer per ``interval_s``."""

    logger: logging.Logger
    interval_s: float = DEFAULT_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    counts: dict[str, int] = field(default_factory=dict)  # reason → refusals, for /metrics
    lines: int = 0  # lines logged
    _seen: dict[tuple[str, str], _Seen] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, reason: str, peer: str, message: str) -> None:
        """Count one refusal of ``peer`` for ``reason``; log it unless one was this interval."""
        now = self.clock()
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + 1
            key = (reason, peer)
            seen = self._seen.get(key)
            if seen is not None and now - seen.logged_at < self.interval_s:
                seen.suppressed += 1
                return
            left_out = seen.suppressed if seen is not None else 0
            self._seen.pop(key, None)
            self._seen[key] = _Seen(logged_at=now)
            if len(self._seen) > MAX_TRACKED:
                del self._seen[next(iter(self._seen))]
            self.lines += 1
        tail = (
            f" (and {left_out} more like it from {peer} since the last such line)"
            if left_out
            else ""
        )
        self.logger.warning("rejected request from %s: %s%s", peer, message, tail)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

"""Signal storms for the tests of handlers that must never wedge a process."""

from __future__ import annotations

import signal
import subprocess
import time


def storm(
    proc: subprocess.Popen[str], signum: signal.Signals, seconds: float = 1.5, burst: int = 20
) -> None:
    """Send ``signum`` to ``proc`` for ``seconds``: bursts of ``burst`` back to back (a
    handler lands inside another's) with a breath between them (without one, Python's
    handlers nest without end: RecursionError, which no real signal source causes)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for _ in range(burst):
            proc.send_signal(signum)
        time.sleep(0.001)

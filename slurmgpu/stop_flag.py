"""An event a signal handler may set: :class:`StopFlag`.

``threading.Event.set`` takes the event's lock. Python runs a signal handler in the main
thread between two bytecodes, so a handler that calls it deadlocks when the signal lands
while that thread already holds the lock (inside ``Event.wait``'s ``with`` block, or in
the handler of an earlier signal: two SIGTERMs in a row). :class:`StopFlag` keeps the
state in an attribute and wakes waiters through a non-blocking pipe (the self-pipe
trick): ``set`` takes no lock, so it is safe in a handler and from any thread.
"""

from __future__ import annotations

import contextlib
import os
import select
import time

__all__ = ["StopFlag"]


class StopFlag:
    """``set`` / ``is_set`` / ``wait`` / ``clear`` like ``threading.Event``; ``set`` takes
    no lock. Every waiter returns once it is set, until ``clear``."""

    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        self._set = True  # first: a waiter woken by the byte sees it
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write, b"\0")  # a full pipe already wakes every waiter

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._read, 4096):
                pass

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when ``timeout`` seconds passed first. A signal whose
        handler does not set it does not end the wait early."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while not self._set:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            select.select([self._read], [], [], left)
        return True

    def __del__(self) -> None:  # nobody can be waiting: release the pipe
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

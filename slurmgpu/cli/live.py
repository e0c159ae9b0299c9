"""``--watch``: redraw a table in place every few seconds until Ctrl-C (rich Live)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from types import FrameType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from slurmgpu.cli.context import fail


def header(what: str, interval_s: float, at: datetime, problem: str | None = None) -> Text:
    """The line above a live table: what, how often, when last read, and any trouble."""
    text = Text(f"{what}: every {interval_s:g}s, updated {at:%H:%M:%S}; Ctrl-C to quit", "dim")
    if problem:
        text.append(f"\n{problem}; showing the last table read", "yellow")
    return text


def watch(
    render: Callable[[], RenderableType],
    interval_s: float,
    *,
    console: Console | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Show ``render()`` and redraw it every ``interval_s`` until Ctrl-C or ``stop``.

    ``render`` must not raise for a passing trouble (a locked database): it says so in its
    own output instead. Ctrl-C leaves the last table on the screen and returns normally.
    """
    console = console or Console()
    if not console.is_terminal:
        fail("--watch needs a terminal; use --json (or no --watch) in scripts", 2)
    stop = stop or threading.Event()
    with _ctrl_c_sets(stop) as stopped:
        try:
            with Live(render(), console=console, auto_refresh=False, transient=False) as live:
                while not _wait(stopped, interval_s):
                    live.update(render(), refresh=True)
        except KeyboardInterrupt:  # a Ctrl-C from before the handler was in place
            pass


# How often a wait looks at the flags: the most a Ctrl-C waits before the watch ends.
_SLICE_S = 0.05


def _wait(stopped: Callable[[], bool], seconds: float) -> bool:
    """Sleep ``seconds`` in short slices, returning early (True) once ``stopped()``."""
    end = time.monotonic() + seconds
    while not stopped():
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, _SLICE_S))
    return True


@contextmanager
def _ctrl_c_sets(stop: threading.Event) -> Iterator[Callable[[], bool]]:
    """While watching, Ctrl-C (SIGINT) only raises a flag; yields "was Ctrl-C pressed or
    ``stop`` set?".

    A KeyboardInterrupt raised wherever the main thread happens to be (inside a database
    read, or rich's redraw) could leave it stuck instead of quitting (seen once in CI); a
    flag read between redraws cannot. The handler only sets a plain flag (Event.set from a
    signal handler can deadlock on the Event's own lock), and the watch loop sleeps in
    short slices, so it sees the flag without a helper thread.
    """
    asked = [False]

    def stopped() -> bool:
        return asked[0] or stop.is_set()

    if threading.current_thread() is not threading.main_thread():
        yield stop.is_set
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        asked[0] = True

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGINT, previous)


def stacked(*parts: RenderableType) -> RenderableType:
    return Group(*parts)

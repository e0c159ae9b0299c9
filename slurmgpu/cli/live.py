"""``--watch``: redraw a table in place every few seconds until Ctrl-C (rich Live)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

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
    try:
        with Live(render(), console=console, auto_refresh=False, transient=False) as live:
            while not stop.wait(interval_s):
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        pass


def stacked(*parts: RenderableType) -> RenderableType:
    return Group(*parts)

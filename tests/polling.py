"""Waiting on real processes with a deadline, never a fixed sleep (one helper for all tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = 90.0,
    *,
    until_not_none: bool = False,
) -> T:
    """Poll ``check`` until it returns something truthy (or, with ``until_not_none``, any
    value but None); fail naming ``what`` at the deadline. Polls fast at first, then
    backs off to once a second."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        value = check()
        if (value is not None) if until_not_none else bool(value):
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)

"""Counts of inputs the property tests tried, per parser or endpoint, printed at the end.

Each ``test_props_*`` module makes one :class:`Tally` and the ``tally_report`` fixture
(module-scoped, autouse in those modules) prints its lines in the terminal summary, e.g.::

    props: parse_tres                 tried   612  accepted   301  refused   311

A refused input is one that raised the module's own error type with a one-line message;
anything else fails the test, so "tried = accepted + refused" always holds.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

# Where the counts of a run are appended as JSON lines (docs/reliability.md quotes them).
COUNTS_FILE = os.environ.get("SGPU_PROPS_COUNTS")


class Tally:
    """Per-target counts of accepted and refused inputs."""

    def __init__(self) -> None:
        self.accepted: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    def run(
        self,
        target: str,
        call: Callable[[], T],
        errors: type[BaseException] | tuple[type[BaseException], ...],
    ) -> T | None:
        """Call ``call``; count it; a refusal must be ``errors`` with a one-line message."""
        try:
            value = call()
        except errors as exc:
            self.refuse(target, exc)
            return None
        self.accepted[target] += 1
        return value

    def refuse(self, target: str, exc: BaseException) -> None:
        message = str(exc)
        assert message.strip(), f"{target}: {type(exc).__name__} without a message"
        # A config file with several bad keys gets one line per key (ConfigError.others).
        lines = message.split("\n")
        assert len(lines) == 1 + len(getattr(exc, "others", ())), (
            f"{target}: multi-line error: {message!r}"
        )
        for line in lines:
            assert line.strip() and len(line) <= 600, f"{target}: error line {line[:80]!r}"
        assert len(set(lines)) == len(lines), f"{target}: a line repeated: {message!r}"
        self.refused[target] += 1

    def accept(self, target: str) -> None:
        self.accepted[target] += 1

    def lines(self) -> list[str]:
        out = []
        for target in sorted(set(self.accepted) | set(self.refused)):
            a, r = self.accepted[target], self.refused[target]
            out.append(f"props: {target:<34} tried {a + r:>6}  accepted {a:>6}  refused {r:>6}")
        return out

    def dump(self, module: str) -> None:
        if not COUNTS_FILE:
            return
        with Path(COUNTS_FILE).open("a") as f:
            for target in sorted(set(self.accepted) | set(self.refused)):
                row = {
                    "module": module,
                    "target": target,
                    "accepted": self.accepted[target],
                    "refused": self.refused[target],
                }
                f.write(json.dumps(row) + "\n")


def report(tally: Tally) -> Callable[[pytest.FixtureRequest], Iterator[None]]:
    """A module fixture that prints ``tally``'s counts when the module's tests are done."""

    @pytest.fixture(scope="module", autouse=True)
    def tally_report(request: pytest.FixtureRequest) -> Iterator[None]:
        yield
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        lines = tally.lines()
        if reporter is not None and lines:
            # Outside pytest's output capture, like capsys.disabled(), so it always shows.
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                reporter.write_line("")
                for line in lines:
                    reporter.write_line(line)
        tally.dump(request.module.__name__)

    return tally_report

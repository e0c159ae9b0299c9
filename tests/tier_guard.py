"""A run that asked for tests must test something (issue 36, item 7).

A pytest plugin (``tests/conftest.py`` registers it; ``-p tests.tier_guard`` loads it
elsewhere). When the run made a selection -- a marker expression (``-m``), a keyword
expression (``-k``) or explicit paths / node ids -- the session fails, with one line
naming what was missing, if:

- **every selected test skipped**: nothing was tested, whatever the skips say; or
- **an asked-for tier's prerequisite is missing**: ``-m`` asks for a tier when the
  expression holds for a test carrying only that tier's marker and not for an unmarked
  one (``-m docker``, ``-m "slurm and not docker"``, ``-m release``; not the unit tier's
  ``-m "not slow and not slurm and not docker"``), and a test skipped through
  :func:`skip_missing` naming that tier (the lab cluster's root and Slurm packages for
  slurm and release, the engine for docker, torch for release's torchrun test), even if
  other tests of the run passed.

Other skips stay skips (the slurm tier has a few that depend on the machine, e.g. munge
as a second user); a run without a selection (plain ``pytest``) is never failed here.

A tool a test runs (``promtool``, ``prometheus``) is looked up with :func:`need_tool`:
where ``SGPU_REQUIRE_TOOLS`` names it (``scripts/test.sh`` sets it to what
``scripts/bootstrap.sh`` installed), a missing tool fails the test outright, in any tier,
the unit tier too (which asks for no tier marker); elsewhere it skips as above.
The verdict is the controller's under xdist (reports from every worker reach it).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import NoReturn

import pytest
from _pytest.mark.expression import Expression

__all__ = ["TIERS", "TierGuard", "asked_tiers", "need_tool", "prerequisite", "skip_missing"]

# The tier markers (pyproject.toml; "hypothesis" is the hypothesis plugin's own).
TIERS = ("slurm", "slow", "release", "docker", "hypothesis")
PREREQUISITE = "missing prerequisite "
# A file to write the tiers of the selected tests to, one a line (scripts/test.sh).
SELECTED_TIERS_ENV = "SGPU_SELECTED_TIERS"
# Tools a run must have (space- or comma-separated): missing, their tests fail.
REQUIRE_TOOLS_ENV = "SGPU_REQUIRE_TOOLS"
_PREREQUISITE_RE = re.compile(
    r"missing prerequisite \((?P<tiers>[a-z, ]+) tiers?\): (?P<what>.*)", re.S
)


def skip_missing(tiers: str | tuple[str, ...], what: str) -> NoReturn:
    """Skip this test because ``what``, a prerequisite of ``tiers``, is missing; a run
    that asks for one of those tiers (``-m``) then fails, naming ``what``."""
    names = (tiers,) if isinstance(tiers, str) else tiers
    unknown = [t for t in names if t not in TIERS]
    if unknown:
        raise ValueError(f"not a tier: {unknown}")
    plural = "s" * (len(names) > 1)
    pytest.skip(f"{PREREQUISITE}({', '.join(names)} tier{plural}): {what}")


def need_tool(name: str, install: str, tiers: str | tuple[str, ...] = ()) -> str:
    """The path of the program ``name``. Missing: the test fails where
    ``SGPU_REQUIRE_TOOLS`` names it (CI installed it, so it must be there), else skips --
    through :func:`skip_missing` when ``tiers`` are given; ``install`` says how to get it."""
    path = shutil.which(name)
    if path is not None:
        return path
    what = f"{name} is not installed ({install})"
    required = os.environ.get(REQUIRE_TOOLS_ENV, "").replace(",", " ").split()
    if name in required:
        pytest.fail(f"{what}, and {REQUIRE_TOOLS_ENV} requires it", pytrace=False)
    if tiers:
        skip_missing(tiers, what)
    pytest.skip(what)


def prerequisite(reason: str) -> tuple[list[str], str] | None:
    """``(tiers, what)`` of a :func:`skip_missing` reason, else None."""
    match = _PREREQUISITE_RE.match(reason)
    if match is None:
        return None
    return [t.strip() for t in match["tiers"].split(",")], match["what"]


def asked_tiers(markexpr: str) -> list[str]:
    """The tiers ``markexpr`` asks for: those whose marker alone makes it hold where no
    marker at all does not."""
    if not markexpr.strip():
        return []
    expr = Expression.compile(markexpr)

    def holds(markers: frozenset[str]) -> bool:
        return expr.evaluate(lambda name, /, **kwargs: not kwargs and name in markers)

    if holds(frozenset()):
        return []
    return [tier for tier in TIERS if holds(frozenset({tier}))]


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _counted(reasons: Counter[str]) -> str:
    return "; ".join(f"{r} ({n} test{'s' * (n != 1)})" for r, n in reasons.most_common())


class TierGuard:
    """The plugin: reports in, a verdict at the session's end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        markexpr: str = config.getoption("markexpr", "") or ""
        keywordexpr: str = config.getoption("keyword", "") or ""
        explicit = config.args_source == pytest.Config.ArgsSource.ARGS
        self.selection = " ".join(
            part
            for part in (
                f'-m "{markexpr}"' if markexpr else "",
                f'-k "{keywordexpr}"' if keywordexpr else "",
                " ".join(config.args) if explicit else "",
            )
            if part
        )
        self.asked = asked_tiers(markexpr)
        self.tested: set[str] = set()  # ran: passed, failed, errored, xfailed
        self.skipped: dict[str, str] = {}  # nodeid -> reason
        self.missing: Counter[str] = Counter()  # prerequisite of an asked tier -> tests
        self.short: set[str] = set()  # the asked tiers it is missing for
        self.verdict: str | None = None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # scripts/test.sh asks which tiers a selection holds (pytest --collect-only ARGS)
        # and prepares what they need, e.g. the docker engine for docker tests.
        path = os.environ.get(SELECTED_TIERS_ENV)
        if path and not hasattr(self.config, "workerinput"):
            tiers = {t for item in session.items for t in TIERS if item.get_closest_marker(t)}
            Path(path).write_text("".join(f"{t}\n" for t in sorted(tiers)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if (
            hasattr(report, "wasxfail")
            or report.failed
            or (report.when == "call" and report.passed)
        ):
            self.tested.add(report.nodeid)
        elif report.skipped:
            reason = _reason(report)
            self.skipped[report.nodeid] = reason
            needed = prerequisite(reason)
            short = set(needed[0]) & set(self.asked) if needed is not None else set()
            if needed is not None and short:
                self.missing[needed[1]] += 1
                self.short |= short

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a whole module skipped (importorskip at import)
            self.skipped[report.nodeid] = _reason(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if (
            hasattr(self.config, "workerinput")  # the controller judges
            or not self.selection  # nothing was asked for
            or self.config.option.collectonly  # nothing was to be run
        ):
            return
        skipped_only = set(self.skipped) - self.tested
        if self.missing:
            tiers = [t for t in self.asked if t in self.short]
            self.verdict = (
                f"{self.selection} asked for the {', '.join(tiers)} "
                f"tier{'s' * (len(tiers) > 1)}, but a prerequisite is missing: "
                f"{_counted(self.missing)}"
            )
        elif skipped_only and not self.tested:
            reasons = Counter(self.skipped[n] for n in skipped_only)
            self.verdict = (
                f"nothing was tested: every test that {self.selection} selected skipped: "
                f"{_counted(reasons)}"
            )
        if self.verdict is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        # After pytest's own last line ("12 skipped in 0.1s"), so a log's tail shows it.
        if self.verdict is not None:
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            line = f"FAILED (tier guard): {self.verdict}"
            if reporter is not None:
                reporter.write_line(line, red=True, bold=True)
            else:
                print(line, file=sys.stderr)


def pytest_configure(config: pytest.Config) -> None:
    """Register the guard for this session (``-p tests.tier_guard`` or the conftest)."""
    if not config.pluginmanager.has_plugin("sgpu-tier-guard"):
        config.pluginmanager.register(TierGuard(config), "sgpu-tier-guard")

"""Job names, accounts and partitions are the users': every renderer shows them literally.

A name is Rich markup, a terminal escape, a forged log line or an undecodable byte; the
terminal tables (``sgpu jobs``, ``sgpu eff``, ``sgpu report``), CSV, HTML, email and the
logs must neither crash nor interpret it, and must show it with controls escaped.
"""

from __future__ import annotations

import csv
import io
import itertools
import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from sqlalchemy import Engine, update

from slurmgpu.cli.main import main
from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.notify import AlertTemplates, JobFacts, alert_context
from slurmgpu.plaintext import EscapingLogFilter, csv_cell, shown
from slurmgpu.policy.base import Action
from slurmgpu.report.build import build_report
from slurmgpu.report.eff import job_efficiency
from slurmgpu.report.eff_advice import notes
from slurmgpu.report.eff_render import render_report
from slurmgpu.report.html_page import render_html
from slurmgpu.report.render import render_table, to_csv
from slurmgpu.store import open_store, schema
from tests.hypothesis_profiles import examples
from tests.unit import report_store
from tests.unit.report_store import SINCE, UNTIL

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)

# What a hostile user puts in a name: markup tags (closing ones crash a markup parser),
# escape sequences, line breaks, bidi overrides, lone surrogates (bytes a decoder kept).
_PIECES = [
    "[/bold]",
    "[bold red]",
    "[/]",
    "[link=http://x]",
    "\x1b[31m",
    "\x1b]0;pwned\x07",
    "\n2026-01-01 ERROR forged",
    "\r",
    "\t",
    "\u202e",
    "\udcff",
    "\x00",
    "\x9b",
    "=cmd|' /C calc'!A0",
    "<script>",
    "{{ 7*7 }}",
    "%s%d",
    "train",
]
hostile_names = st.one_of(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=4).map("".join),
    st.text(min_size=1, max_size=24),
)
# What reaches the store: Slurm output is decoded with replacement (slurm/jsonformat.py),
# so a lone surrogate never gets that far (SQLite could not encode it).
stored_names = hostile_names.map(lambda s: s.encode("utf-8", "replace").decode())


def _no_raw_controls(text: str, allowed: str = "\n") -> None:
    bad = [
        ch
        for ch in text
        if ch not in allowed and (ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ch == "\u202e")
    ]
    assert not bad, f"raw control characters reached the output: {bad!r}"
    assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text), "a lone surrogate got through"


def _job(job_id: int, name: str, account: str = "ml", partition: str = "gpu") -> Job:
    return Job(
        job_id=job_id,
        name=name,
        user="alice",
        account=account,
        partition=partition,
        state=JobState.COMPLETED,
        start_time=T0,
        end_time=T0 + timedelta(hours=1),
        time_limit=timedelta(hours=2),
        cpus=4,
        node_count=1,
        tasks=1,
        gpus=GpuRequest(gpus=1),
        nodes=("gpu1",),
        gpu_allocations=(NodeGpuAllocation("gpu1", (0,)),),
    )


def test_shown_escapes_controls_and_keeps_everything_else() -> None:
    assert shown("train-v2 [/bold] é ✓") == "train-v2 [/bold] é ✓"
    assert shown("a\x1b[31mb") == "a\\x1b[31mb"
    assert shown("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert shown("\u202eevil") == "\\u202eevil"
    assert shown("\udcff") == "\\udcff"
    assert shown("\x9b") == "\\x9b"
    assert csv_cell("=1+1") == "'=1+1" and csv_cell("-x") == "'-x" and csv_cell("ok") == "ok"


# -- sgpu jobs and sgpu eff, end to end against a real store ------------------------------


@pytest.fixture
def db_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("SGPU_DB", raising=False)
    monkeypatch.setenv("SGPU_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    open_store(url)
    return url


def _store(url: str, job: Job) -> None:
    store = open_store(url)
    store.apply_cycle(diff_jobs({}, [job]), {}, [], T0 + timedelta(hours=1))
    store.engine.dispose()


def test_a_job_named_like_a_closing_tag_is_listed_by_jobs_and_eff(db_url: str) -> None:
    _store(db_url, _job(7, "[/bold]x\x1b[2J", account="[red]acct", partition="p[/]"))
    listed = CliRunner().invoke(main, ["--db", db_url, "jobs"])
    assert listed.exit_code == 0, listed.output
    assert "[/bold]x\\x1b[2J" in listed.output
    _no_raw_controls(listed.output)
    eff = CliRunner().invoke(main, ["--db", db_url, "eff", "7"])
    assert eff.exit_code == 0, eff.output
    assert "[/bold]x\\x1b[2J" in eff.output and "[red]acct" in eff.output
    _no_raw_controls(eff.output)


_ids = itertools.count(1000)


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=stored_names)
def test_jobs_shows_any_name_literally(db_url: str, name: str) -> None:
    job_id = next(_ids)
    _store(db_url, _job(job_id, name))
    out = CliRunner().invoke(main, ["--db", db_url, "jobs", "--limit", "1"])
    assert out.exit_code == 0, out.output
    _no_raw_controls(out.output)


@settings(max_examples=examples(80), deadline=None)
@given(name=hostile_names, account=hostile_names, partition=hostile_names)
def test_eff_report_renders_any_name_literally(name: str, account: str, partition: str) -> None:
    job = _job(1, name, account=account, partition=partition)
    report = job_efficiency(job, [], [], T0 + timedelta(hours=1))
    console = Console(file=io.StringIO(), width=400, force_terminal=True)
    console.print(render_report(report, notes(report)))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    # The terminal output has Rich's own SGR sequences; user text adds none of its own.
    _no_raw_controls(out.replace("\x1b[", "<SGR>"))
    plain_console = Console(file=io.StringIO(), width=400, color_system=None)
    plain_console.print(render_report(report, notes(report)))
    assert shown(name) in plain_console.file.getvalue()  # type: ignore[attr-defined]


@settings(max_examples=examples(80), deadline=None)
@given(name=hostile_names)
def test_email_shows_any_name_on_one_line_with_controls_escaped(name: str) -> None:
    action = Action("p", "warn", 4242, "alice", "idle", {}, alert="generic")
    job = JobFacts(4242, name=name, nodes="gpu1", gpus=1)
    message = AlertTemplates().render("generic", alert_context(action, at=T0, job=job))
    assert "\n" not in message.subject and shown(name).strip() in message.body
    _no_raw_controls(message.subject, allowed="")
    _no_raw_controls(message.body)


@settings(max_examples=examples(80), deadline=None)
@given(name=hostile_names)
def test_a_log_line_cannot_be_forged_by_a_name(name: str) -> None:
    record = logging.LogRecord("x", logging.INFO, "f", 1, "job %s (%s) idle", (name, 3), None)
    assert EscapingLogFilter().filter(record)
    line = logging.Formatter("%(levelname)s %(message)s").format(record)
    _no_raw_controls(line, allowed="")
    assert line == f"INFO job {shown(name)} (3) idle"


# -- sgpu report: table, CSV and HTML --------------------------------------------------


@pytest.fixture(scope="module")
def report_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'state.db'}"
    store = open_store(url)
    report_store.fill(store.engine)
    yield store.engine
    store.engine.dispose()


@settings(max_examples=examples(10), deadline=None, suppress_health_check=list(HealthCheck))
@given(user=stored_names, partition=stored_names)
def test_report_renders_any_user_and_partition_literally(
    report_engine: Engine, user: str, partition: str
) -> None:
    with report_engine.begin() as conn:
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.job_id == 101)
            .values(user=user[:64], partition=partition)
        )
    for by in ("user", "partition"):
        r = build_report(report_engine, since=SINCE, until=UNTIL, by=by, now=UNTIL)
        console = Console(file=io.StringIO(), width=300, color_system=None)
        console.print(render_table(r))
        _no_raw_controls(console.file.getvalue())  # type: ignore[attr-defined]
        rows = list(csv.reader(io.StringIO(to_csv(r))))
        groups = [row[0] for row in rows[1:]]
        assert csv_cell(user[:64] if by == "user" else partition) in groups
        for g in groups:
            _no_raw_controls(g, allowed="")
            assert not g.startswith(("=", "+", "-", "@"))
        _no_raw_controls(render_html(r))


def test_rich_markup_in_a_note_or_name_is_not_applied() -> None:
    job = replace(_job(1, "[bold]loud[/bold]"), comment="x")
    report = job_efficiency(job, [], [], T0 + timedelta(hours=1))
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_report(report, notes(report)))
    assert "[bold]loud[/bold]" in console.file.getvalue()  # type: ignore[attr-defined]

"""``sgpu report``: figures against hand-computed totals, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, insert

from slurmgpu.cli.main import main
from slurmgpu.cli.report import parse_moment
from slurmgpu.report.build import GroupBy, Report, build_report
from slurmgpu.report.render import render_table, to_csv, to_json
from slurmgpu.store import open_store, schema
from slurmgpu.store.summary_columns import summary_columns
from tests.unit import report_store
from tests.unit.report_store import EXPECTED, SINCE, UNTIL

approx = pytest.approx


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    store = open_store(store_url)
    report_store.fill(store.engine)
    yield store.engine
    store.engine.dispose()


def _report(engine: Engine, by: GroupBy = "user") -> Report:
    return build_report(engine, since=SINCE, until=UNTIL, by=by, now=UNTIL)


def test_totals_match_the_hand_computed_figures(engine: Engine) -> None:
    t = _report(engine).totals
    assert t.jobs == EXPECTED["jobs"]
    assert t.jobs_with_usage == EXPECTED["jobs_with_usage"]
    assert t.gpu_hours_allocated == approx(EXPECTED["allocated"], rel=1e-6)
    assert t.gpu_hours_with_usage == approx(EXPECTED["with_usage"], rel=1e-6)
    assert t.gpu_hours_used == approx(EXPECTED["used"], rel=1e-6)
    assert t.gpu_hours_idle == approx(EXPECTED["idle"], rel=1e-6)
    assert t.gpu_hours_unused == approx(EXPECTED["unused"], rel=1e-6)
    assert t.efficiency_pct == approx(100 * EXPECTED["used"] / EXPECTED["with_usage"], rel=1e-6)
    assert t.flags == EXPECTED["flags"]
    assert t.jobs_flagged == EXPECTED["flagged"]
    assert t.wait_mean_s == approx(EXPECTED["wait_mean_s"], abs=0.01)
    assert t.wait_max_s == approx(EXPECTED["wait_max_s"], abs=0.01)


def test_groups_wasters_and_flagged_jobs(engine: Engine) -> None:
    r = _report(engine)
    assert [g.name for g in r.groups] == list(EXPECTED["users"])  # by allocated, descending
    for g in r.groups:
        assert g.figures.gpu_hours_allocated == approx(EXPECTED["users"][g.name], rel=1e-6)
    assert sum(g.figures.jobs for g in r.groups) == r.totals.jobs
    assert [w.group.name for w in r.wasters] == EXPECTED["wasters"]
    assert [j.job_id for j in r.wasters[0].worst] == EXPECTED["alice_worst"]
    assert r.wasters[0].worst[0].flags == ("idle", "over-time", "over-memory", "over-gpus")
    assert [j.job_id for j in r.flagged] == EXPECTED["flagged_jobs"]
    assert r.flagged[1].flags == ("low-util", "over-time")
    by_partition = _report(engine, "partition")
    assert {g.name: g.figures.gpu_hours_allocated for g in by_partition.groups} == approx(
        EXPECTED["partitions"], rel=1e-6
    )
    by_account = _report(engine, "account")
    assert {g.name for g in by_account.groups} == {"acct-a", "acct-b"}


def test_histogram_waits_and_series(engine: Engine) -> None:
    r = _report(engine)
    known = {int(b.lo_pct): (b.jobs, b.gpu_hours) for b in r.histogram if b.lo_pct is not None}
    for lo, (jobs, hours) in known.items():
        want_jobs, want_hours = EXPECTED["histogram"].get(lo, (0, 0.0))
        assert jobs == want_jobs, lo
        assert hours == approx(want_hours, rel=1e-6, abs=1e-9), lo
    unknown = [b for b in r.histogram if b.lo_pct is None]
    assert [(b.jobs, b.gpu_hours) for b in unknown] == [approx(EXPECTED["unknown"], rel=1e-6)]
    assert [b.jobs for b in r.waits] == EXPECTED["waits"]
    assert r.bucket_s == 86400
    assert len(r.series) == 7  # every day of the window, empty ones included
    assert r.series[0].start == SINCE
    got = {i: p.gpu_hours_allocated for i, p in enumerate(r.series) if p.jobs}
    assert got == approx(EXPECTED["series"], rel=1e-6)


def test_actions_and_what_they_reclaimed(engine: Engine) -> None:
    r = _report(engine)
    assert {(a.policy, a.kind, a.mode, a.outcome): a.count for a in r.actions} == EXPECTED[
        "actions"
    ]
    got = {
        (x.policy, x.kind): (
            x.actions,
            x.estimated,
            x.gpu_hours_returned,
            x.reserved_gpu_hours_released,
        )
        for x in r.reclaimed
    }
    assert set(got) == set(EXPECTED["reclaimed"])
    for key, want in EXPECTED["reclaimed"].items():
        assert got[key] == approx(want, rel=1e-6, abs=1e-6), key
    day = int(SINCE.timestamp())
    series: dict[int, dict[str, int]] = {}
    for p in r.action_series:
        series.setdefault((int(p.start.timestamp()) - day) // 86400, {})[p.outcome] = p.count
    assert series == EXPECTED["action_series"]


def test_a_job_id_reused_later_does_not_take_the_older_jobs_summary(engine: Engine) -> None:
    """Job 102 comes back as a new job (slurmctld lost its state) with no summary yet."""
    start = datetime(2026, 3, 7, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(schema.jobs),
            {
                "cluster": "",
                "job_id": 102,
                "user": "bob",
                "state": "COMPLETED",
                "gpus": 1,
                "start_time": start,
                "end_time": start + timedelta(hours=1),
                "first_seen": start,
                "last_seen": start,
                "updated_at": start,
            },
        )
    t = _report(engine).totals
    assert t.jobs == EXPECTED["jobs"] + 1
    assert t.jobs_with_usage == EXPECTED["jobs_with_usage"]
    assert t.gpu_hours_allocated == approx(EXPECTED["allocated"] + 1.0, rel=1e-6)
    assert t.gpu_hours_used == approx(EXPECTED["used"], rel=1e-6)


def test_an_empty_window_reports_zeros_not_errors(engine: Engine) -> None:
    r = build_report(engine, since=UNTIL, until=UNTIL + timedelta(days=1))
    assert r.totals.jobs == 0
    assert r.totals.gpu_hours_allocated == 0.0
    assert r.totals.efficiency_pct is None
    assert r.groups == () and r.wasters == () and r.flagged == ()
    assert r.actions == () and r.reclaimed == ()
    assert r.bucket_s == 3600 and len(r.series) == 24
    assert "no decisions" in _text(r)


def test_bad_window_and_grouping_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="after its start"):
        build_report(engine, since=UNTIL, until=SINCE)
    with pytest.raises(ValueError, match="cannot group by"):
        build_report(engine, since=SINCE, until=UNTIL, by="qos")  # type: ignore[arg-type]


def _text(r: Report) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    console.print(render_table(r))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_renderings_carry_the_same_figures(engine: Engine) -> None:
    r = _report(engine)
    doc = to_json(r)
    assert doc["totals"]["gpu_hours_allocated"] == approx(EXPECTED["allocated"], rel=1e-6)
    assert [w["name"] for w in doc["top_wasters"]] == EXPECTED["wasters"]
    assert doc["top_wasters"][0]["worst_jobs"][0]["job_id"] == 101
    json.dumps(doc)  # serialisable as it is
    rows = list(csv.DictReader(io.StringIO(to_csv(r))))
    assert [row["group"] for row in rows] == [*EXPECTED["users"], "TOTAL"]
    assert float(rows[-1]["gpu_hours_used"]) == approx(EXPECTED["used"], abs=1e-4)
    assert int(rows[-1]["flag_over_time"]) == 2
    table = _text(r)
    assert "alice" in table and "over-gpus" in table
    assert f"{EXPECTED['allocated']:,.1f}" in table


def test_summary_columns_count_silent_gpus_as_idle_and_unused() -> None:
    busy = {"util_pct_mean": 60.0, "idle_trailing_s": 1800, "never_busy": False}
    cols = summary_columns(
        {"elapsed_s": 3600, "gpus_requested": 3, "nodes": {"n": {"gpus": {"0": busy}}}}
    )
    assert cols["gpus_reported"] == 1 and cols["gpus_busy"] == 1
    assert cols["gpu_util_pct"] == approx(20.0)  # 60 % on one of three GPUs
    assert cols["gpu_idle_pct"] == approx((50.0 + 100.0 + 100.0) / 3)
    assert summary_columns({"nodes": {}})["gpu_util_pct"] is None  # nothing known: unknown
    assert summary_columns({"nodes": "garbage", "elapsed_s": "x"})["gpu_idle_pct"] is None


def test_parse_moment_reads_durations_dates_and_now() -> None:
    now = datetime(2026, 3, 8, 12, tzinfo=UTC)
    assert parse_moment("7d", now, "--since") == now - timedelta(days=7)
    assert parse_moment("now", now, "--until") == now
    assert parse_moment("2026-03-01", now, "--since") == SINCE
    assert parse_moment("2026-03-01T02:00+02:00", now, "--since") == SINCE


def test_cli_writes_every_format_and_refuses_bad_input(engine: Engine, tmp_path: Path) -> None:
    if engine.dialect.name != "sqlite":
        pytest.skip("the CLI path is the same on PostgreSQL; checked once on SQLite")
    db = str(engine.url)
    runner = CliRunner()
    args = ["--db", db, "report", "--since", "2026-03-01", "--until", "2026-03-08"]
    out = runner.invoke(main, [*args, "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["totals"]["jobs"] == EXPECTED["jobs"]
    html = tmp_path / "r.html"
    out = runner.invoke(main, [*args, "--format", "html", "-o", str(html)])
    assert out.exit_code == 0, out.output
    assert "GPU-hours by user" in html.read_text()
    out = runner.invoke(main, [*args, "--by", "partition", "--format", "csv"])
    assert out.exit_code == 0 and out.output.splitlines()[1].startswith("gpu,")
    out = runner.invoke(main, [*args])
    assert out.exit_code == 0 and "Top wasters" in out.output
    bad = runner.invoke(main, ["--db", db, "report", "--since", "last tuesday"])
    assert bad.exit_code == 2 and "neither a duration" in bad.output
    backwards = runner.invoke(main, ["--db", db, "report", "--since", "1d", "--until", "2d"])
    assert backwards.exit_code == 2 and "must come after" in backwards.output
    bare = tmp_path / "bare.db"  # a database that was never migrated
    sqlite3.connect(bare).execute("CREATE TABLE unrelated (x INTEGER)").connection.close()
    empty = runner.invoke(main, ["--db", f"sqlite:///{bare}", "report"])
    assert empty.exit_code == 4 and "sgpu db upgrade" in empty.output

"""The report's GPU energy section, per user/account, in every format, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import pytest
from rich.console import Console, RenderableType
from sqlalchemy import Engine, text, update

from slurmgpu.report.build import GroupBy, Report, build_report
from slurmgpu.report.html_page import render_html
from slurmgpu.report.render import render_table, to_csv, to_json
from slurmgpu.store import open_store, schema
from tests.unit import report_store
from tests.unit.report_store import SINCE, UNTIL

KWH = 3.6e6


def render_text(renderable: RenderableType) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    store = open_store(store_url)
    report_store.fill(store.engine)
    s = schema.job_summaries
    with store.engine.begin() as conn:
        # 101 alice: 12 kWh, 6 idle; 102 bob: 20 kWh, 1 idle (its older summary, of an
        # earlier run, says 99 kWh and must not count); 104 carol: 0.5 kWh, none idle.
        for job_id, kwh, idle in ((101, 12.0, 6.0), (102, 99.0, 0.0), (104, 0.5, 0.0)):
            conn.execute(
                update(s)
                .where(s.c.job_id == job_id)
                .values(energy_j=kwh * KWH, idle_energy_j=idle * KWH)
            )
        newest = conn.execute(text("SELECT max(id) FROM job_summaries WHERE job_id = 102"))
        conn.execute(
            update(s)
            .where(s.c.id == newest.scalar())
            .values(energy_j=20.0 * KWH, idle_energy_j=1.0 * KWH)
        )
    yield store.engine
    store.engine.dispose()


def _report(engine: Engine, by: GroupBy = "user") -> Report:
    return build_report(engine, since=SINCE, until=UNTIL, by=by, now=UNTIL)


def test_energy_per_user_and_account_with_idle_share(engine: Engine) -> None:
    r = _report(engine)
    assert r.energy is not None
    t = r.energy.totals
    assert (t.jobs, t.jobs_measured) == (5, 3)  # 103 has no summary, 108 no energy
    assert t.kwh == pytest.approx(32.5) and t.idle_kwh == pytest.approx(7.0)
    assert t.kwh_per_job == pytest.approx(32.5 / 3)
    users = r.energy.by_name()
    assert [g.name for g in r.energy.groups] == ["bob", "alice", "carol"]  # most kWh first
    assert users["bob"].kwh == pytest.approx(20.0) and users["bob"].jobs == 2
    assert users["alice"].idle_pct == pytest.approx(50.0)
    accounts = _report(engine, "account").energy
    assert accounts is not None
    assert accounts.by_name()["acct-a"].kwh == pytest.approx(12.5)


def test_energy_in_json_csv_html_and_the_terminal(engine: Engine) -> None:
    r = _report(engine)
    data = to_json(r)["energy"]
    assert data["totals"]["kwh"] == pytest.approx(32.5)
    assert data["groups"][0] == {
        "name": "bob", "jobs": 2, "jobs_measured": 1, "kwh": 20.0, "idle_kwh": 1.0,
        "idle_pct": 5.0, "kwh_per_job": 20.0,
    }  # fmt: skip
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(to_csv(r)))}
    assert float(rows["alice"]["energy_kwh"]) == pytest.approx(12.0)
    assert float(rows["alice"]["idle_energy_kwh"]) == pytest.approx(6.0)
    assert float(rows["TOTAL"]["energy_kwh"]) == pytest.approx(32.5)
    html = render_html(r)
    assert 'data-chart="energy-by-group"' in html
    assert "bob: 19.00 kWh busy" in html and "alice: 6.00 kWh idle" in html
    out = render_text(render_table(r))
    assert "GPU energy by user" in out and "32.50" in out

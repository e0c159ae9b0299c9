"""``sgpu whatif``: the store's own jobs replayed through the simulator (issue 38 item 4)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, insert

from slurmgpu.cli.main import main
from slurmgpu.report.build import build_report
from slurmgpu.report.html_page import render_html
from slurmgpu.sim.fromstore import priors, to_trace
from slurmgpu.sim.whatif import compare, site_shape
from slurmgpu.store import open_store, schema
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.whatif import StoredRun, read_window
from slurmgpu.whatif_figures import signed_duration
from tests.unit import report_store
from tests.unit.report_store import SINCE, UNTIL, _gpu, _job, _summary

H = 3600.0
WINDOW = ["--since", "2026-03-01", "--until", "2026-03-08"]


def _over_askers(engine: Engine) -> None:
    """dana's ``train`` asks 4 GPUs six times and keeps one busy (25 % mean util): the
    rightsize set's case. Submitted together on the store's one 4-GPU node, so they queue."""
    at = datetime(2026, 3, 7, tzinfo=UTC)
    rows = [
        _job(
            200 + i,
            "dana",
            "acct-d",
            "gpu",
            name="train",
            gpus=4,
            submit_time=at,
            start_time=at + timedelta(hours=2 * i),
            end_time=at + timedelta(hours=2 * i + 2),
            time_limit_s=4 * 3600,
            memory_mib=32000,
        )
        for i in range(6)
    ]
    with engine.begin() as conn:
        conn.execute(insert(schema.jobs), rows)
    usage = UsageStore(engine)
    for i in range(6):
        per_gpu = [_gpu(100.0), *[_gpu(0.0, never_busy=True) for _ in range(3)]]
        s = _summary(2 * H, 4, per_gpu, 8000.0)
        usage.save_summary(200 + i, s, at + timedelta(hours=2 * i + 2, minutes=1))


@pytest.fixture
def db(tmp_path: object) -> Iterator[str]:
    url = f"sqlite:///{tmp_path}/whatif.db"
    store = open_store(url)
    report_store.fill(store.engine)
    _over_askers(store.engine)
    yield url
    store.engine.dispose()


def test_the_reader_takes_finished_gpu_jobs_with_their_usage(db: str) -> None:
    store = open_store(db, migrate=False)
    window = read_window(store.engine, "", SINCE, UNTIL)
    ids = [r.job_id for r in window.runs]
    # 105 ended before the window, 106 asked no GPU, 107 still runs
    assert sorted(ids) == [101, 102, 103, 104, 108, *range(200, 206)]
    by_id = {r.job_id: r for r in window.runs}
    assert not by_id[103].has_usage  # FAILED with no summary: counted, not dropped
    assert by_id[102].util_pct == pytest.approx(95.0)  # the older run's 5 % is ignored
    assert by_id[200].gpus_busy == 1 and by_id[200].gpus == 4
    assert window.node_gpus == (4,)
    store.engine.dispose()


def test_conversion_is_pure_and_keeps_what_jobs_asked() -> None:
    run = StoredRun(
        job_id=7,
        name="n",
        user="u",
        account="a",
        partition="p",
        gpus=8,
        shards=0,
        time_limit_s=None,
        memory_mib=None,
        submit_s=1000.0,
        start_s=1600.0,
        end_s=1600.0 + 3 * H,
        util_pct=None,
    )
    [job] = to_trace([run], seed=2, gpus_per_node=4, max_gpus=4)
    assert job.submit_s == 0.0 and job.gpus == 4 and job.user == "u" and job.partition == "p"
    assert job.model.work == pytest.approx(3 * H) and job.model.util_pct == 100.0
    assert job.time_limit_s is not None and job.time_limit_s >= 3 * H  # drawn, seeded
    assert priors([run]) == ()  # no usage: nothing for the priors to learn


def test_whatif_json_gives_per_set_figures_and_rightsize_returns_gpu_hours(db: str) -> None:
    out = CliRunner().invoke(
        main,
        [
            "--db",
            db,
            "whatif",
            *WINDOW,
            "--json",
            "--seeds",
            "2",
            "--policies",
            "rightsize,colocate",
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["jobs"] == 11 and doc["jobs_without_usage"] == 1 and doc["cluster"] == "1x4"
    assert set(doc["sets"]) == {"slurm", "rightsize", "colocate"}
    for figures in doc["sets"].values():
        for key in ("gpu_hours_returned", "avg_queue_s", "avg_jct_s", "p99_jct_s", "energy_kwh"):
            assert key in figures
    right = doc["sets"]["rightsize"]
    assert right["gpu_hours_returned"] > 0 and right["jobs_touched"] > 0
    assert any("simulator figures, not measurements" in n for n in doc["notes"])
    assert doc["measured_energy_kwh"] is None  # the test store has no metered energy
    assert any(n.startswith("1 of 11 jobs have no usage summary") for n in doc["notes"])


def test_a_mixed_site_is_replayed_node_by_node(db: str) -> None:
    """An 8-GPU node beside the 4-GPU one: the simulated cluster is 1x8,1x4 (not 3x4)."""
    store = open_store(db, migrate=False)
    with store.engine.begin() as conn:
        conn.execute(
            insert(schema.nodes),
            {"cluster": "", "name": "big1", "state": "idle", "gpus": 8, "last_seen": SINCE},
        )
    store.engine.dispose()
    out = CliRunner().invoke(
        main, ["--db", db, "whatif", *WINDOW, "--json", "--seeds", "1", "--policies", "rightsize"]
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["cluster"] == "1x8,1x4"
    assert "cluster 1x8,1x4 (the 2 stored GPU nodes, each at its own GPU count)" in doc["notes"]


def test_whatif_table_says_what_it_is(db: str) -> None:
    out = CliRunner().invoke(
        main, ["--db", db, "whatif", *WINDOW, "--seeds", "1", "--policies", "rightsize"]
    )
    assert out.exit_code == 0, out.output
    assert "GPU-h returned" in out.output and "rightsize" in out.output
    assert "simulator figures, not measurements" in out.output


def test_an_empty_window_says_so_in_one_line(db: str) -> None:
    args = ["--db", db, "whatif", "--since", "2020-01-01", "--until", "2020-02-01"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0
    assert out.output.count("\n") == 1 and "no finished GPU jobs" in out.output


def test_bad_options_are_refused(db: str) -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["--db", db, "whatif", *WINDOW, "--policies", "nope"])
    assert bad.exit_code == 2 and "unknown policy set" in bad.output
    shape = runner.invoke(main, ["--db", db, "whatif", *WINDOW, "--cluster", "x"])
    assert shape.exit_code == 2


def _cells(page: str, policy_set: str) -> list[str]:
    row = re.search(rf'<tr data-set="{policy_set}">(.*?)</tr>', page, re.S)
    assert row is not None, f"no row for {policy_set} in the whatif section"
    return [html.unescape(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row[1], re.S)]


def _check_section(section: str, expected: dict[str, Any]) -> None:
    for name, f in expected["sets"].items():
        cells = _cells(section, name)
        assert cells[0] == name and cells[1] == f"{f['gpu_hours']:,.1f}"
        if name == "slurm":
            assert cells[2] == "-" and cells[4] == "-" and cells[10] == "-"
            continue
        returned = f"{f['gpu_hours_returned']:,.1f}"
        if expected["seeds"] > 1:
            returned += f" ± {f['gpu_hours_spread']:,.1f}"
        assert cells[2] == returned
        assert cells[4] == signed_duration(-f["avg_queue_saved_s"])
        assert cells[6] == signed_duration(-f["avg_jct_saved_s"])
        assert cells[7] == signed_duration(f["p99_jct_s"]).lstrip("+")
        assert cells[9] == f"{f['energy_saved_kwh']:,.1f}"
        assert cells[10] == str(f["jobs_touched"])
    notes = [html.unescape(n) for n in re.findall(r'<div class="note">(.*?)</div>', section)]
    assert notes == expected["notes"] and "simulator figures, not measurements" in notes[0]


def test_the_html_whatif_section_renders_the_figures_from_the_store(db: str) -> None:
    """The store's window through compare() into render_html: every cell is the figure
    ``as_json`` (the ``--json`` document) holds, and rightsize returns GPU-hours."""
    store = open_store(db, migrate=False)
    window = read_window(store.engine, "", SINCE, UNTIL)
    report = build_report(store.engine, since=SINCE, until=UNTIL, cluster="", now=UNTIL)
    store.engine.dispose()
    shape, note = site_shape(window.node_gpus, window.shards_per_gpu)
    figures = compare(
        window.runs, shape, window="w", shape_note=note, policies=["rightsize"], seeds=1
    )
    page = render_html(report, figures)
    section = page[page.index('<h2 id="whatif">') :]
    _check_section(section, figures.as_json())
    assert float(_cells(section, "rightsize")[2]) > 0  # the over-askers' idle GPUs
    missing = render_html(report, "no finished GPU jobs in the store from x: nothing to replay")
    assert 'id="whatif"' in missing and "nothing to replay" in missing
    assert 'id="whatif"' not in render_html(report)


@pytest.mark.slow
def test_the_report_whatif_section_shows_the_whatif_json_figures(db: str, tmp_path: Path) -> None:
    """One code path: ``sgpu report --whatif`` (HTML and JSON) shows what ``sgpu whatif
    --json`` prints for the same window, set for set, with the fidelity caveat."""
    runner = CliRunner()
    alone = runner.invoke(main, ["--db", db, "whatif", *WINDOW, "--json"])
    assert alone.exit_code == 0, alone.output
    expected = json.loads(alone.output)
    as_json = runner.invoke(main, ["--db", db, "report", *WINDOW, "--format", "json", "--whatif"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["whatif"] == expected
    page_path = tmp_path / "report.html"
    as_html = runner.invoke(
        main, ["--db", db, "report", *WINDOW, "--format", "html", "--whatif", "-o", str(page_path)]
    )
    assert as_html.exit_code == 0, as_html.output
    page = page_path.read_text(encoding="utf-8")
    section = page[page.index('<h2 id="whatif">') :]
    assert set(expected["sets"]) == {"slurm", "rightsize", "colocate", "malleable", "all"}
    _check_section(section, expected)


def test_report_whatif_needs_a_format_that_can_hold_it(db: str) -> None:
    out = CliRunner().invoke(main, ["--db", db, "report", *WINDOW, "--whatif"])
    assert out.exit_code == 2 and "--whatif goes with --format html or json" in out.output
    old = ["--since", "2020-01-01", "--until", "2020-02-01", "--format", "json", "--whatif"]
    empty = CliRunner().invoke(main, ["--db", db, "report", *old])
    assert empty.exit_code == 0, empty.output
    assert "no finished GPU jobs" in json.loads(empty.output)["whatif"]["message"]

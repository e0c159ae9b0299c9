"""``sgpu whatif``: the store's own jobs replayed through the simulator (issue 38 item 4)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, insert

from slurmgpu.cli.main import main
from slurmgpu.sim.fromstore import infer_shape, priors, to_trace
from slurmgpu.store import open_store, schema
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.whatif import StoredRun, read_window
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
    assert infer_shape([4, 4, 8, 4]) == (5, 4) and infer_shape([]) is None


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
    assert any("issue 33" in n for n in doc["notes"])
    assert doc["measured_energy_kwh"] is None  # the test store has no metered energy
    assert any(n.startswith("1 of 11 jobs have no usage summary") for n in doc["notes"])


def test_whatif_table_says_what_it_is(db: str) -> None:
    out = CliRunner().invoke(
        main, ["--db", db, "whatif", *WINDOW, "--seeds", "1", "--policies", "rightsize"]
    )
    assert out.exit_code == 0, out.output
    assert "GPU-h returned" in out.output and "rightsize" in out.output
    assert "not yet measured" in out.output


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

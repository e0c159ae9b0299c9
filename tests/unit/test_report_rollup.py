"""Per-day report rollups: the same figures as reading every job, kept fresh by triggers.

On SQLite and PostgreSQL alike. The hand-computed figures of the small store are checked
in test_report.py (whose 7-day window reads rollups); here every report built from
rollups is compared, figure by figure, with the same report read from the jobs
(``rollups=False``), on windows with partial days at both ends, after every kind of
change the triggers must notice, and on a generated store of a few thousand jobs.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, delete, func, insert, select, text, update

from slurmgpu.report.build import GroupBy, Report, ReportThresholds, build_report
from slurmgpu.report.rollup import DAY_S, HOUR_S, split_window
from slurmgpu.store import open_store, schema
from slurmgpu.store.usage import UsageStore
from tests.unit import report_store
from tests.unit.report_store import EXPECTED, SINCE, UNTIL

approx = pytest.approx


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    store = open_store(store_url)
    yield store.engine
    store.engine.dispose()


def _same(got: Any, want: Any, where: str = "report") -> None:
    """Equal, floats to 1e-9 relative (sums in another order)."""
    if dataclasses.is_dataclass(got) and not isinstance(got, type):
        assert dataclasses.is_dataclass(want), where
        for f in dataclasses.fields(got):
            _same(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    elif isinstance(got, tuple | list):
        assert len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(got, dict):
        assert got.keys() == want.keys(), where
        for key in got:
            _same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(got, float) and not isinstance(want, bool):
        assert got == approx(want, rel=1e-9, abs=1e-9), where
    else:
        assert got == want, where


def _both(
    engine: Engine, since: datetime, until: datetime, by: GroupBy = "user", **kw: Any
) -> Report:
    """The report from rollups, checked equal to the one read from the jobs."""
    fast = build_report(engine, since=since, until=until, by=by, now=until, **kw)
    slow = build_report(engine, since=since, until=until, by=by, now=until, rollups=False, **kw)
    _same(fast, slow)
    return fast


def _built(engine: Engine, span: int = DAY_S) -> int:
    b = schema.report_built
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).select_from(b).where(b.c.span == span)).scalar() or 0
        )


def _dirty_days(engine: Engine) -> set[int]:
    """The marked days of the test window (job 105, before it, stays marked: never read)."""
    d = schema.report_dirty
    with engine.connect() as conn:
        marked = set(conn.execute(select(d.c.bucket).where(d.c.span == DAY_S)).scalars())
    return marked & set(range(_day(SINCE), _day(UNTIL) + 1))


def _dirty_hours(engine: Engine) -> set[int]:
    d = schema.report_dirty
    with engine.connect() as conn:
        marked = set(conn.execute(select(d.c.bucket).where(d.c.span == HOUR_S)).scalars())
    return marked & set(
        range(int(SINCE.timestamp()) // HOUR_S, int(UNTIL.timestamp()) // HOUR_S + 1)
    )


def _day(moment: datetime) -> int:
    return int(moment.timestamp()) // 86400


# slow tier: hundreds of jobs through every rollup on SQLite, 3-5 s each
@pytest.mark.slow
def test_rollups_and_partial_days_give_the_figures_of_the_jobs(engine: Engine) -> None:
    report_store.fill(engine)
    r = _both(engine, SINCE, UNTIL)
    assert r.totals.gpu_hours_allocated == approx(EXPECTED["allocated"], rel=1e-9)
    assert r.notes == (f"1 of {EXPECTED['jobs']} jobs have no usage summary (no agent "
                       "reported for them): counted in allocated GPU-hours only",)  # fmt: skip
    assert _built(engine) == 7  # every whole day built, empty ones too
    assert _built(engine, HOUR_S) == 0  # no partial day
    assert _dirty_days(engine) == set()
    # Job 101 ends at 04:00 on day 2 (a whole hour of a partial day), 108 at 00:03:20 on
    # day 6 (in the partial hour at the end).
    since = SINCE + timedelta(days=1, hours=2, minutes=30)
    until = SINCE + timedelta(days=5, minutes=10)
    split = split_window(since, until, days=True)
    assert [(p.span, p.last - p.first) for p in split.pieces] == [(DAY_S, 3), (HOUR_S, 21)]
    assert [b - a for a, b in split.partial] == [timedelta(minutes=30), timedelta(minutes=10)]
    for by in ("user", "account", "partition"):
        part = _both(engine, since, until, by)
    assert part.totals.jobs == 5 and [j.job_id for j in part.flagged] == [101, 104]
    assert _built(engine, HOUR_S) == 21
    hourly = _both(engine, since, since + timedelta(days=2))  # hour rollups, hourly series
    assert hourly.bucket_s == HOUR_S and hourly.totals.jobs == 3  # 101, 102, 103
    _both(engine, SINCE - timedelta(days=30), UNTIL + timedelta(days=2))  # beyond the data
    _both(engine, SINCE, UNTIL, top=1)
    slow = build_report(engine, since=SINCE, until=UNTIL, now=UNTIL, worst=50, flagged_limit=99)
    assert [j.job_id for j in slow.wasters[0].worst] == EXPECTED["alice_worst"]  # read the jobs


# slow tier: hundreds of jobs through every rollup on SQLite, 3-5 s each
@pytest.mark.slow
def test_every_change_to_a_finished_job_or_its_summary_is_seen(engine: Engine) -> None:
    report_store.fill(engine)
    base = _both(engine, SINCE, UNTIL).totals
    day4 = SINCE + timedelta(days=3)
    new = report_store._job(  # 2 GPUs x 3 h, ended on day 4
        201, "erin", "acct-b", "gpu", gpus=2, start_time=day4, end_time=day4 + timedelta(hours=3)
    )
    hours = _dirty_hours(engine)  # hours never built keep their marks: no report read them
    with engine.begin() as conn:
        conn.execute(insert(schema.jobs), new)
    assert _dirty_days(engine) == {_day(day4)}
    assert _dirty_hours(engine) - hours == {int(day4.timestamp()) // HOUR_S + 3}
    t = _both(engine, SINCE, UNTIL).totals
    assert t.jobs == base.jobs + 1
    assert t.gpu_hours_allocated == approx(base.gpu_hours_allocated + 6.0, rel=1e-9)
    assert _dirty_days(engine) == set()

    j = schema.jobs
    with engine.begin() as conn:  # 103 asked for 4 GPUs: now 2
        conn.execute(update(j).where(j.c.job_id == 103).values(gpus=2))
    t = _both(engine, SINCE, UNTIL).totals
    assert t.gpu_hours_allocated == approx(base.gpu_hours_allocated + 6.0 - 2.0, rel=1e-9)

    summary = report_store._summary(3600, 2, [report_store._gpu(50.0)] * 2, None)
    UsageStore(engine).save_summary(103, summary, SINCE + timedelta(days=3, hours=1.01))
    t = _both(engine, SINCE, UNTIL).totals
    assert t.jobs_with_usage == base.jobs_with_usage + 1
    assert t.gpu_hours_used == approx(base.gpu_hours_used + 1.0, rel=1e-9)  # 2 GPU-h x 50 %

    with engine.begin() as conn:  # 32 shards on 4 GPUs: carol's 4 shards are half a GPU
        conn.execute(update(schema.nodes).values(shards=32))
    t = _both(engine, SINCE, UNTIL).totals
    assert t.gpu_hours_allocated == approx(base.gpu_hours_allocated + 4.0 + 0.5, rel=1e-9)

    with engine.begin() as conn:  # job 108 moves to another day, then goes away
        conn.execute(update(j).where(j.c.job_id == 108).values(end_time=UNTIL - timedelta(hours=1)))
    assert _both(engine, SINCE, UNTIL).series[6].jobs == 1
    with engine.begin() as conn:
        conn.execute(delete(schema.job_summaries).where(schema.job_summaries.c.job_id == 108))
        conn.execute(delete(j).where(j.c.job_id == 108))
    t = _both(engine, SINCE, UNTIL).totals
    assert t.jobs == base.jobs
    assert t.gpu_hours_idle == approx(base.gpu_hours_idle - report_store.SHORT, rel=1e-9)

    strict = ReportThresholds(low_util_pct=50.0)  # other thresholds: the days are rebuilt
    flagged = _both(engine, SINCE, UNTIL, thresholds=strict).totals.flags["low-util"]
    assert flagged == 3  # 101 (40 %), 103 (50 %) and 104 (10 %)
    assert flagged == _both(engine, SINCE, UNTIL, thresholds=strict).totals.flags["low-util"]


def test_bookkeeping_updates_leave_the_days_clean(engine: Engine) -> None:
    """The observer touches last_seen of every job each cycle, running jobs' rows often:
    neither may mark a day (each mark costs a rebuild of the whole day)."""
    report_store.fill(engine)
    build_report(engine, since=SINCE, until=UNTIL, now=UNTIL)
    hours = _dirty_hours(engine)
    j = schema.jobs
    with engine.begin() as conn:
        conn.execute(update(j).values(last_seen=UNTIL, updated_at=UNTIL))
        conn.execute(
            update(j).where(j.c.job_id == 107).values(end_time=UNTIL, time_limit_s=7200)
        )  # running
    assert _dirty_days(engine) == set() and _dirty_hours(engine) == hours
    with engine.begin() as conn:  # 107 finishes
        conn.execute(update(j).where(j.c.job_id == 107).values(state="COMPLETED"))
    assert _dirty_days(engine) == {_day(UNTIL)}


def test_without_the_triggers_the_report_reads_the_jobs(engine: Engine) -> None:
    report_store.fill(engine)
    with engine.begin() as conn:
        on = " ON jobs" if engine.dialect.name == "postgresql" else ""
        conn.execute(text(f"DROP TRIGGER report_dirty_jobs_insert{on}"))
    r = build_report(engine, since=SINCE, until=UNTIL, now=UNTIL)
    assert r.totals.gpu_hours_allocated == approx(EXPECTED["allocated"], rel=1e-9)
    assert any("sgpu db upgrade" in note for note in r.notes)
    assert _built(engine) == 0


def _generated(engine: Engine, n: int, start: datetime, days: int) -> None:
    """``n`` finished jobs over ``days`` days: ties in waste, shard jobs, no-summary jobs."""
    rng = random.Random(8)
    jobs, summaries = [], []
    for i in range(n):
        end = start + timedelta(seconds=rng.uniform(0, days * 86400))
        run = timedelta(seconds=rng.choice((120, 600, 3600, 3600, 4 * 3600)))
        gpus = rng.choice((0, 1, 1, 2, 4))
        jobs.append(
            report_store._job(
                10_000 + i,
                f"u{rng.randrange(12)}",
                f"a{rng.randrange(3)}",
                rng.choice(("gpu", "debug", "long")),
                gpus=gpus,
                shards=0 if gpus else rng.choice((0, 4, 8)),
                state=rng.choice(("COMPLETED", "COMPLETED", "FAILED", "TIMEOUT")),
                start_time=end - run,
                end_time=end,
                submit_time=end - run - timedelta(seconds=rng.choice((0, 30, 900, 7200))),
                time_limit_s=rng.choice((None, 3600, 86400)),
                memory_mib=rng.choice((None, 16000)),
            )
        )
        if rng.random() < 0.8:
            util = rng.choice((0.0, 5.0, 50.0, 50.0, 100.0))  # repeated values: ties
            summaries.append({
                "cluster": "",
                "job_id": 10_000 + i,
                "created_at": end + timedelta(seconds=30),
                "summary": {},
                "gpus_reported": max(gpus, 1),
                "gpus_busy": 1 if util > 0 else 0,
                "gpu_util_pct": util,
                "gpu_idle_pct": rng.choice((0.0, 50.0, 100.0 - util)),
                "cpu_memory_max_mib": rng.choice((None, 1000.0)),
            })  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(schema.jobs), jobs)
        conn.execute(insert(schema.job_summaries), summaries)
        conn.execute(
            insert(schema.nodes),
            {"cluster": "", "name": "n1", "state": "idle", "gpus": 4, "shards": 32,
             "last_seen": start},
        )  # fmt: skip


@pytest.mark.slow  # 1500 generated jobs, 12 reports twice
def test_a_generated_store_gives_the_same_figures_either_way(engine: Engine) -> None:
    start = datetime(2026, 2, 1, tzinfo=UTC)
    _generated(engine, 1500, start, 20)
    windows = [
        (start, start + timedelta(days=20)),
        (start + timedelta(days=2, hours=7), start + timedelta(days=17, hours=3, minutes=5)),
        (start + timedelta(hours=30), start + timedelta(days=4, hours=1)),
        (start + timedelta(days=5), start + timedelta(days=6, hours=12)),  # hourly buckets
    ]
    for since, until in windows:
        for by in ("user", "account", "partition"):
            r = _both(engine, since, until, by)
            assert r.totals.jobs > 0 and r.wasters and r.flagged
    assert _built(engine) == 20


def test_the_table_lists_the_biggest_groups_and_says_how_many_more(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from rich.console import Console

    from slurmgpu.report import render

    start = datetime(2026, 2, 1, tzinfo=UTC)
    _generated(engine, 300, start, 3)
    r = build_report(engine, since=start, until=start + timedelta(days=4), now=start)
    assert len(r.groups) == 12
    monkeypatch.setattr(render, "TABLE_GROUPS", 5)
    console = Console(file=io.StringIO(), width=200)
    console.print(render.render_table(r))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "(the 5 with most GPU-hours)" in out and "and 7 more" in out
    by_user = out.split("Top wasters")[0]
    assert f"│ {r.groups[4].name} " in by_user and f"│ {r.groups[5].name} " not in by_user
    assert len(list(render.to_csv(r).splitlines())) == 1 + 12 + 1  # CSV: all of them


def _read_only(engine: Engine, tmp_path: Path) -> Engine:
    """The same store through a connection that may not write."""
    if engine.dialect.name == "sqlite":
        return create_engine(f"sqlite:///file:{engine.url.database}?mode=ro&uri=true")
    with engine.begin() as conn:
        conn.execute(text("DROP ROLE IF EXISTS sgpu_ro"))
        conn.execute(text("CREATE ROLE sgpu_ro LOGIN"))
        conn.execute(text("GRANT USAGE ON SCHEMA public TO sgpu_ro"))
        conn.execute(text("GRANT SELECT ON ALL TABLES IN SCHEMA public TO sgpu_ro"))
    return create_engine(engine.url.set(username="sgpu_ro"))


def test_a_read_only_store_is_reported_from_the_jobs(engine: Engine, tmp_path: Path) -> None:
    report_store.fill(engine)
    ro = _read_only(engine, tmp_path)
    try:
        r = build_report(ro, since=SINCE, until=UNTIL, now=UNTIL)
    finally:
        ro.dispose()
    assert r.totals.gpu_hours_allocated == approx(EXPECTED["allocated"], rel=1e-9)
    assert [j.job_id for j in r.flagged] == EXPECTED["flagged_jobs"]
    assert any("could not be brought up to date" in note for note in r.notes), r.notes
    assert _built(engine) == 0
    _both(engine, SINCE, UNTIL)  # and once writable again, the rollups are built
    assert _built(engine) == 7


def test_old_hour_rollups_are_dropped(engine: Engine) -> None:
    start = datetime(2026, 2, 1, tzinfo=UTC)
    _generated(engine, 300, start, 3)
    since = start + timedelta(hours=12, minutes=30)
    _both(engine, since, start + timedelta(days=5))
    assert _built(engine, HOUR_S) == 11  # 13:00 to midnight of the first day
    later = start + timedelta(days=60, hours=12, minutes=30)  # the February hours are old
    r = build_report(engine, since=later, until=later + timedelta(days=4), now=later)
    assert r.totals.jobs == 0
    b = schema.report_built
    with engine.connect() as conn:
        hours = set(conn.execute(select(b.c.bucket).where(b.c.span == HOUR_S)).scalars())
        rows = conn.execute(
            select(func.count())
            .select_from(schema.report_rollup_groups)
            .where(schema.report_rollup_groups.c.span == HOUR_S)
        ).scalar()
    assert hours and min(hours) >= int(later.timestamp()) // HOUR_S and rows == 0
    assert _built(engine) == 4 + 3  # day rollups stay: 4 days of February, 3 of April
    _both(engine, since, start + timedelta(days=5))  # rebuilt when a window needs them

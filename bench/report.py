"""Benchmark: ``sgpu report --since 30d`` on a store of 1,000,000 finished jobs with summaries.

The store is generated in a temporary directory (never committed) with plain
``executemany``: 1,000,000 finished GPU jobs ending over the last 30 days (500 users,
50 accounts, 4 partitions), each with an end-of-job summary, plus 20,000 audit rows.
Then, in the same run, on the same database file:

- baseline: ``SELECT count(*) FROM jobs`` (a full walk of the jobs table) and
  ``SELECT sum(gpus) FROM jobs`` (a full scan that reads a column);
- ``build_report`` in-process (the SQL only): read from every job (``rollups=False``), and
  the first report after the bulk load, which builds the 30 days' rollups (one run);
- ``sgpu report --since 30d`` as a fresh process (what an admin waits for: interpreter
  start, imports, SQL, rendering) with the rollups up to date, and with one whole day
  marked changed before each run (a late summary: that day is rebuilt first).

Medians of ``--repeat`` runs (default 3); the target is < 5 s for the command.

    .venv/bin/python bench/report.py [--jobs 1000000] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.report.build import build_report
from slurmgpu.store import open_store

JOB_COLUMNS = (
    "cluster", "job_id", "name", "user", "account", "partition", "qos", "state",
    "state_flags", "reason", "submit_time", "eligible_time", "start_time", "end_time",
    "time_limit_s", "cpus", "memory_mib", "node_count", "tasks", "gpus", "shards",
    "gpu_sources", "nodes", "gpu_alloc", "restart_count", "requeue", "comment",
    "admin_comment", "work_dir", "command", "batch", "first_seen", "last_seen",
    "updated_at", "gone",
)  # fmt: skip
SUMMARY_COLUMNS = (
    "cluster", "job_id", "created_at", "summary", "gpus_reported", "gpus_busy",
    "gpu_util_pct", "gpu_idle_pct", "gpu_memory_max_mib", "cpu_memory_max_mib",
)  # fmt: skip
STATES = ("COMPLETED",) * 8 + ("FAILED", "CANCELLED", "TIMEOUT")
PARTITIONS = ("gpu", "gpu-long", "debug", "interactive")


def _ts(epoch: float) -> str:
    """The text SQLAlchemy stores for a UTC timestamp on SQLite."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def generate(db: Path, n_jobs: int, now: datetime) -> float:
    """Fill ``db`` (already migrated); return the seconds it took."""
    t0 = time.perf_counter()
    rng = random.Random(8)
    end_max = now.timestamp()
    span = 30 * 86400 - 3600
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA synchronous=OFF")
    quoted = ", ".join(f'"{c}"' for c in JOB_COLUMNS)  # "user" is an SQL keyword
    job_sql = f"INSERT INTO jobs ({quoted}) VALUES ({', '.join('?' * len(JOB_COLUMNS))})"
    sum_sql = (
        f"INSERT INTO job_summaries ({', '.join(SUMMARY_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(SUMMARY_COLUMNS))})"
    )
    batch = 100_000
    for lo in range(0, n_jobs, batch):
        jobs, sums = [], []
        for i in range(lo, min(lo + batch, n_jobs)):
            job_id = 1_000_000 + i
            gpus = rng.choice((1, 1, 1, 2, 4, 8))
            run = rng.uniform(300, 12 * 3600)
            end = end_max - rng.uniform(0, span)
            start = end - run
            submit = start - rng.expovariate(1 / 900)
            limit = int(run * rng.uniform(1.1, 4)) + 60
            seen = _ts(end)
            user = rng.randrange(500)
            jobs.append((
                "", job_id, f"train-{i % 97}", f"user{user:03d}", f"acct{user % 50:02d}",
                PARTITIONS[i % 4], "normal", rng.choice(STATES), "", "", _ts(submit), None,
                _ts(start), seen, limit, 8 * gpus, 32768 * gpus, 1, 1, gpus, 0,
                "tres_per_node", "gpu1", "[]", 0, 0, "", "", "/home", "train.sh", 1, seen,
                seen, seen, 1,
            ))  # fmt: skip
            util = min(max(rng.gauss(45, 30), 0.0), 100.0)
            busy = gpus if util > 1 else 0
            summary = json.dumps({"version": 1, "job_id": job_id, "elapsed_s": int(run)})
            sums.append((
                "", job_id, _ts(end + 30), summary, gpus, busy, util * busy / gpus,
                rng.uniform(0, 100 - util), 20000.0, 16000.0 * gpus,
            ))  # fmt: skip
        conn.executemany(job_sql, jobs)
        conn.executemany(sum_sql, sums)
        conn.commit()
    actions = [
        (
            _ts(end_max - rng.uniform(0, span)), "", 1_000_000 + rng.randrange(n_jobs),
            rng.choice(("idle_gpu", "rightsize", "colocate")), rng.choice(("warn", "update")),
            "enforce", 0, "bench", json.dumps({"idle_gpus": 1, "gpus_current": 2,
                                               "gpus_proposed": 1}),
            "", "", 0, 0, "", rng.choice(("done", "skipped")),
        )
        for _ in range(20_000)
    ]  # fmt: skip
    conn.executemany(
        "INSERT INTO actions (at, cluster, job_id, policy, kind, mode, taken, reason, numbers,"
        ' "user", alert, execute, notify, suppressed, outcome)'
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        actions,
    )
    conn.commit()
    conn.execute("ANALYZE")
    conn.close()
    return time.perf_counter() - t0


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="generate into DIR and keep it")
    add_arguments(ap, "5,000 jobs, one repeat")
    args = ap.parse_args()
    if args.smoke:
        args.jobs, args.repeat = 5_000, 1
    run = BenchRun.from_args("report", args)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="sgpu-bench-report-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "state.db"
    url = f"sqlite:///{db}"
    now = datetime.now(UTC)
    if not db.exists():
        store = open_store(url)
        store.engine.dispose()
        gen_s = generate(db, args.jobs, now)
        print(f"generated {args.jobs:,} jobs + summaries in {gen_s:.1f} s ({db})")
    size_mib = db.stat().st_size / 2**20
    raw = sqlite3.connect(db)
    count_s = median_s(lambda: raw.execute("SELECT count(*) FROM jobs").fetchone(), args.repeat)
    scan_s = median_s(lambda: raw.execute("SELECT sum(gpus) FROM jobs").fetchone(), args.repeat)
    (n,) = raw.execute("SELECT count(*) FROM jobs").fetchone()
    raw.close()
    store = open_store(url)  # a kept database from before migration 0006 gets the rollups
    since = now - timedelta(days=30)
    with store.engine.begin() as conn:  # nothing built, as after a bulk load
        conn.execute(text("DELETE FROM report_built"))
    t0 = time.perf_counter()
    report = build_report(store.engine, since=since, until=now)
    first_s = time.perf_counter() - t0
    sql_s = median_s(lambda: build_report(store.engine, since=since, until=now), args.repeat)
    raw_s = median_s(
        lambda: build_report(store.engine, since=since, until=now, rollups=False), args.repeat
    )
    env = {**os.environ, "SGPU_DB": url}
    cmd = [sys.executable, "-m", "slurmgpu", "report", "--since", "30d", "--format", "table"]

    def cli() -> None:
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)

    cli_s = median_s(cli, args.repeat)
    html = [*cmd[:-1], "html", "-o", str(workdir / "report.html")]
    html_s = median_s(
        lambda: subprocess.run(html, env=env, check=True, stderr=subprocess.DEVNULL),
        args.repeat,
    )
    yesterday = _ts(now.timestamp() - 86400)

    def one_day_changed() -> None:
        with store.engine.begin() as conn:  # a job of yesterday changes: its day is marked
            conn.execute(
                text(
                    "UPDATE jobs SET name = name || '.' WHERE id = (SELECT id FROM jobs"
                    " WHERE end_time < :t ORDER BY end_time DESC LIMIT 1)"
                ),
                {"t": yesterday},
            )
        cli()

    dirty_s = median_s(one_day_changed, args.repeat)
    startup_s = median_s(
        lambda: subprocess.run(
            [sys.executable, "-m", "slurmgpu", "--version"], check=True, stdout=subprocess.DEVNULL
        ),
        args.repeat,
    )
    print(f"database: {n:,} jobs, {size_mib:,.0f} MiB; report window: {report.totals.jobs:,} jobs,"
          f" {report.totals.gpu_hours_allocated:,.0f} GPU-hours allocated")  # fmt: skip
    print(f"baseline SELECT count(*) FROM jobs:   {count_s:6.3f} s")
    print(f"baseline SELECT sum(gpus) FROM jobs:  {scan_s:6.3f} s")
    print(f"build_report, every job read:         {raw_s:6.3f} s = {raw_s / scan_s:5.1f}x sum scan")
    print(f"build_report, first (builds 30 days): {first_s:6.3f} s (one run)")
    print(f"build_report, rollups up to date:     {sql_s:6.3f} s = {sql_s / scan_s:5.1f}x sum scan")
    print(f"sgpu --version (interpreter+imports): {startup_s:6.3f} s")
    print(f"sgpu report --since 30d (table):      {cli_s:6.3f} s = {cli_s / count_s:5.1f}x count(*)"
          f"  target < 5 s: {'met' if cli_s < 5 else 'MISSED'}")  # fmt: skip
    print(f"  the same, one day changed before:   {dirty_s:6.3f} s")
    print(f"sgpu report --since 30d --format html:{html_s:6.3f} s")
    print(f"(medians of {args.repeat})")
    run.baseline = {"count_jobs_s": count_s, "sum_gpus_scan_s": scan_s}
    run.figures = {
        "jobs": n,
        "database_mib": size_mib,
        "build_report_every_job_s": raw_s,
        "build_report_first_s": first_s,
        "build_report_rollups_s": sql_s,
        "cli_startup_s": startup_s,
        "cli_report_table_s": cli_s,
        "cli_report_one_day_changed_s": dirty_s,
        "cli_report_html_s": html_s,
    }
    run.target("cli_report_table_s", cli_s, "< 5", cli_s < 5)
    run.write(args.json_out)
    store.engine.dispose()
    if args.keep is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

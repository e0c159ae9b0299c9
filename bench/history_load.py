"""Measure the daemon's history reload: whole reads against the incremental loader.

Fills a SQLite store (the daemon's schema and pragmas) with ``--jobs`` finished jobs
(200,000: 2,000 users x 10 job names, ended over 60 days), each with a jobstats-like
summary of one node and 4 GPUs, and reads the 90-day window as the daemon does at its
start (``HistoryLoader.load``, a whole read). Then ``--reloads`` times: ``--new`` jobs end
and are stored with their summaries (the rate this history implies: 200,000 over 60
days is 23 per 10 minutes), and the history is reloaded both ways in the same run:

- baseline: ``load_history``, the whole window read again (what every reload cost
  before the incremental loader);
- ``HistoryLoader.load``: only the rows and summaries written since the last load.

Each reload checks that both give the same records. Figures are medians of process CPU
time (the machine is shared). Target: a reload costs at most a tenth of a whole read.
Run: ``.venv/bin/python bench/history_load.py [--jobs 200000] [--smoke] [--json-out PATH]``
(smoke: 2,000 jobs, 2 reloads).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import insert

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.policy.base import HistoryRecord
from slurmgpu.store import JobStore, open_store, schema
from slurmgpu.store.history import HistoryLoader, load_history

NOW = datetime(2026, 12, 5, tzinfo=UTC)
WINDOW = timedelta(days=90)
SUMMARY = {
    "version": 1,
    "nodes": {
        "gpu1": {
            "host": {"memory_max_mib": 5000.0, "cpu_pct_mean": 800.0},
            "gpus": {
                str(g): {"util_pct_mean": 50.0, "memory_max_mib": 1000.0, "never_busy": False}
                for g in range(4)
            },
        }
    },
}


def _job(
    store: JobStore, job_id: int, end: datetime, written: datetime, rng: random.Random
) -> dict[str, Any]:
    start = end - timedelta(seconds=rng.randrange(60, 86400))
    return {
        "cluster": store.cluster,
        "job_id": job_id,
        "name": f"train-{job_id % 10}",
        "user": f"user{job_id % 2000:04d}",
        "partition": "gpu",
        "state": "COMPLETED",
        "submit_time": start,
        "start_time": start,
        "end_time": end,
        "time_limit_s": 86400,
        "cpus": 32,
        "memory_mib": 128000,
        "gpus": 4,
        "first_seen": start,
        "last_seen": end,
        "updated_at": written,
        "gone": True,
    }


def _store(store: JobStore, rows: list[dict[str, Any]], written: datetime | None = None) -> None:
    with store.engine.begin() as conn:
        conn.execute(insert(schema.jobs), rows)
        conn.execute(
            insert(schema.job_summaries),
            [
                {
                    "cluster": store.cluster,
                    "job_id": r["job_id"],
                    "created_at": written or r["end_time"],
                    "summary": SUMMARY,
                }
                for r in rows
            ],
        )


def _order(r: HistoryRecord) -> tuple[datetime, str, timedelta]:
    return (r.ended_at, r.user, r.run_time)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--new", type=int, default=23, help="jobs ending between two reloads")
    ap.add_argument("--reloads", type=int, default=5)
    add_arguments(ap, "2,000 jobs, 2 reloads")
    args = ap.parse_args()
    if args.smoke:
        args.jobs, args.reloads = 2_000, 2
    run = BenchRun.from_args("history_load", args)
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'history.db'}")
        t = time.perf_counter()
        rows = []
        for i in range(args.jobs):
            end = NOW - timedelta(minutes=rng.randrange(10, 60 * 24 * 60))
            rows.append(_job(store, i + 1, end, end, rng))
        for chunk in range(0, len(rows), 50_000):
            _store(store, rows[chunk : chunk + 50_000])
        print(
            f"store: {args.jobs:,} finished jobs with summaries ({time.perf_counter() - t:.1f} s)"
        )

        loader = HistoryLoader(store.engine, store.cluster)
        cpu = time.process_time()
        first = loader.load(NOW - WINDOW, NOW)
        start_s = time.process_time() - cpu
        print(f"start: whole read of {len(first):,} records {start_s * 1000:9.0f} ms CPU")
        incremental, whole, read = [], [], []
        at, next_id = NOW, args.jobs + 1
        for _ in range(args.reloads):
            at += timedelta(minutes=10)
            new = [
                _job(store, next_id + i, at - timedelta(minutes=rng.randrange(1, 10)), at, rng)
                for i in range(args.new)
            ]
            next_id += args.new
            _store(store, new, written=at)
            cpu = time.process_time()
            got = loader.load(at - WINDOW, at)
            incremental.append(time.process_time() - cpu)
            read.append(loader.last_read)
            cpu = time.process_time()
            again = load_history(store.engine, store.cluster, at - WINDOW)
            whole.append(time.process_time() - cpu)
            if sorted(got, key=_order) != sorted(again, key=_order):
                raise SystemExit("the incremental reload differs from a whole read: a bug")
        store.engine.dispose()
    inc_s, whole_s = statistics.median(incremental), statistics.median(whole)
    ratio = inc_s / whole_s
    print(f"reload, whole read (baseline):       {whole_s * 1000:9.0f} ms CPU (median)")
    print(
        f"reload, incremental:                 {inc_s * 1000:9.0f} ms CPU (median; "
        f"{statistics.median(read):.0f} rows read)  {ratio:.3f}x the whole read; "
        "the same records every reload"
    )
    run.baseline = {"whole_read_s": whole_s}
    run.figures = {
        "start_whole_read_s": start_s,
        "reload_incremental_s": inc_s,
        "reload_rows_read": statistics.median(read),
        "ratio": ratio,
    }
    run.target("reload_vs_whole_read", ratio, "<= 0.1", ratio <= 0.1)
    run.write(args.json_out)


if __name__ == "__main__":
    main()

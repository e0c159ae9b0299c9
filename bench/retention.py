"""Measure what a sample and an hourly rollup cost on disk, and what the retention keeps.

Fills a SQLite store (WAL, the daemon's pragmas) with one simulated hour of a
``--gpus``-GPU site sampled every ``--interval`` seconds (agent-style ids, 8 GPUs and one
host sample per job per node per interval), checkpoints it and measures the file: bytes
per raw sample. Then rolls that hour up (store/retention.py), vacuums, and measures bytes
per ``sample_hours`` row (energy and I/O wait included: every GPU sample carries the NVML
counter, every host sample its iowait). From both, in the same run, the footprint of a
1,000-GPU site sampled every 10 s: without retention (the baseline: per day and after 30
days) and with the defaults (6 h raw + 90 days of hourly rollups).

Target (issue 22): the defaults keep a 1,000-GPU site under 2 GB. Also printed: the
longest write transaction of the prune (what ingest and the observe cycle may wait), against
the same hour pruned in one transaction on a copy of the store.
Run: ``.venv/bin/python bench/retention.py [--gpus 128] [--interval 10] [--smoke]
[--json-out PATH]`` (smoke: 256 GPUs every 300 s, 4,608 samples and 384 rollup rows:
per-row sizes within a few pages of SQLite).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.store import open_store
from slurmgpu.store.retention import (
    DEFAULT_MAX_SAMPLES,
    DEFAULT_ROLLUP_RETENTION,
    DEFAULT_SAMPLE_RETENTION,
    roll_up_and_prune,
)
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, HostSampleIn, SampleBatch

GPUS_PER_NODE = 8


def _size(path: Path) -> int:
    """Bytes in use: pages not on the free list (what a VACUUM would leave)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()
    return (pages - free) * size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--interval", type=float, default=10.0)
    add_arguments(ap, "256 GPUs sampled every 300 s for the hour")
    args = ap.parse_args(argv)
    if args.smoke:
        args.gpus, args.interval = 256, 300.0
    run = BenchRun.from_args("retention", args)
    tmp = Path(tempfile.mkdtemp(prefix="sgpu-retention-"))
    db = tmp / "s.db"
    store = open_store(f"sqlite:///{db}")
    empty = _size(db)
    usage = UsageStore(store.engine)
    start = datetime(2026, 3, 1, tzinfo=UTC)
    steps = int(3600 / args.interval)
    nodes = max(args.gpus // GPUS_PER_NODE, 1)
    samples = 0
    t0 = time.perf_counter()
    for n in range(nodes):
        node = f"gpu{n:04d}"
        gpu, host = [], []
        for step in range(steps):
            at = (start + timedelta(seconds=step * args.interval)).timestamp()
            for g in range(GPUS_PER_NODE):
                job = 100_000 + n * 4 + g // 2
                gpu.append(
                    GpuSampleIn(
                        sample_uid=f"{node}:67a1b2c3d4e5f6a7:{step}:{g}:{job}", at=at,
                        gpu_index=g, job_id=job, util_pct=float((step * 7 + g) % 100),
                        memory_used_mib=30_000.0, memory_total_mib=81_559.0, power_w=300.0,
                        temperature_c=60.0, processes=1, shared=False, source="process",
                        energy_mj=int(300_000 * args.interval) * step,
                    )
                )  # fmt: skip
            for j in range(4):
                job = 100_000 + n * 4 + j
                host.append(
                    HostSampleIn(
                        sample_uid=f"{node}:67a1b2c3d4e5f6a7:{step}:h:{job}", at=at,
                        job_id=job, cpu_pct=350.0, cpus_allocated=16, rss_mib=20_000.0,
                        cgroup_memory_mib=24_000.0, iowait_pct=4.0,
                    )
                )  # fmt: skip
        usage.ingest(SampleBatch(node=node, gpu=gpu, host=host))
        samples += len(gpu) + len(host)
    fill_s = time.perf_counter() - t0
    raw = _size(db) - empty
    # The same hour pruned in one write transaction (as before chunking: the baseline
    # for what other writers wait), on a copy, then with the defaults on the original.
    whole_db = tmp / "whole.db"
    shutil.copy2(db, whole_db)
    whole = open_store(f"sqlite:///{whole_db}")
    t0 = time.perf_counter()
    one = roll_up_and_prune(whole.engine, "", now=start + timedelta(days=1), max_samples=2**62)
    whole_s = time.perf_counter() - t0
    whole.engine.dispose()
    t0 = time.perf_counter()
    result = roll_up_and_prune(store.engine, "", now=start + timedelta(days=1))
    prune_s = time.perf_counter() - t0
    assert (one.deleted, one.rolled_up) == (result.deleted, result.rolled_up)
    rolled = _size(db) - empty
    conn = sqlite3.connect(db)
    try:
        rows = int(conn.execute("SELECT count(*) FROM sample_hours").fetchone()[0])
    finally:
        conn.close()
    store.engine.dispose()
    shutil.rmtree(tmp, ignore_errors=True)
    per_sample = raw / samples
    per_row = max(rolled, 0) / max(rows, 1)
    print(f"store: {samples:,} samples of {args.gpus} GPUs x 1 h in {fill_s:.1f} s")
    print(f"raw samples:   {raw:,} bytes = {per_sample:.0f} bytes/sample")
    print(
        f"rollups:       {rows:,} rows (one per job, node, GPU or host, hour), "
        f"{rolled:,} bytes = {per_row:.0f} bytes/row; prune {prune_s:.2f} s, "
        f"{result.deleted:,} samples deleted"
    )
    # A 1,000-GPU site, 10 s: per GPU 360 samples/h, plus one host sample per job per node
    # (4 jobs on 8 GPUs here: 0.5 per GPU).
    site_gpus, interval = 1000, 10.0
    per_hour = site_gpus * (3600 / interval) * (1 + 4 / GPUS_PER_NODE)
    raw_day = per_hour * 24 * per_sample
    rows_day = site_gpus * 24 * (1 + 4 / GPUS_PER_NODE)
    keep_raw = per_hour * DEFAULT_SAMPLE_RETENTION.total_seconds() / 3600 * per_sample
    keep_rollups = rows_day * DEFAULT_ROLLUP_RETENTION.days * per_row
    print(
        f"longest write transaction: {result.longest_transaction_s:.2f} s in "
        f"{result.transactions} of at most {DEFAULT_MAX_SAMPLES:,} samples (prune {prune_s:.2f}"
        f" s); baseline, the hour in one: {one.longest_transaction_s:.2f} s (prune "
        f"{whole_s:.2f} s)"
    )
    print(f"1,000 GPUs every 10 s, baseline (no retention): {raw_day / 1e9:.2f} GB/day, "
          f"{30 * raw_day / 1e9:.1f} GB after 30 days")  # fmt: skip
    print(
        f"with the defaults ({DEFAULT_SAMPLE_RETENTION} raw, {DEFAULT_ROLLUP_RETENTION.days} d "
        f"rollups): {keep_raw / 1e9:.2f} GB raw + {keep_rollups / 1e9:.2f} GB rollups = "
        f"{(keep_raw + keep_rollups) / 1e9:.2f} GB (target < 2 GB: "
        f"{'met' if keep_raw + keep_rollups < 2e9 else 'MISSED'})"
    )
    run.baseline = {
        "no_retention_gb_per_day": raw_day / 1e9,
        "no_retention_gb_30d": 30 * raw_day / 1e9,
        "one_transaction_longest_s": one.longest_transaction_s,
        "one_transaction_prune_s": whole_s,
    }
    run.figures = {
        "samples": samples,
        "fill_s": fill_s,
        "bytes_per_sample": per_sample,
        "rollup_rows": rows,
        "bytes_per_rollup_row": per_row,
        "prune_s": prune_s,
        "transactions": result.transactions,
        "longest_transaction_s": result.longest_transaction_s,
        "samples_deleted": result.deleted,
        "site_kept_raw_gb": keep_raw / 1e9,
        "site_kept_rollups_gb": keep_rollups / 1e9,
        "site_total_gb": (keep_raw + keep_rollups) / 1e9,
    }
    total_gb = (keep_raw + keep_rollups) / 1e9
    run.target("site_1000_gpus_gb", total_gb, "< 2", total_gb < 2)
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

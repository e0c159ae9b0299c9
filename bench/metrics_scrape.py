"""Measure one /metrics scrape of a big site, with the per-user series (issue 38).

Fills a SQLite store with the last 2 minutes of agent samples of a ``--nodes`` x 8-GPU
site sampled every 10 s (every GPU held by a running 2-GPU job of one of ``--users``
users; a third of the GPUs idle), gives the daemon's metrics a snapshot of those jobs and
nodes, and times :meth:`DaemonMetrics.exposition` (median of 5). The per-user series
needed the busy-GPU query to group by job too: that query is timed against the one the
partition gauges ran before (grouped by node and GPU only), the baseline, in the same run
on the same rows. Also printed: the ``sgpu_user_*`` series a scrape exports (at most
``daemon.metrics_max_users`` + 1 per metric, whatever the number of users).

Run: ``.venv/bin/python bench/metrics_scrape.py [--nodes 1000] [--users 800] [--smoke]
[--json-out PATH]`` (smoke: 20 nodes, 30 users).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Select, insert, select

from slurmgpu.daemon.metrics import USED_WINDOW, DaemonMetrics
from slurmgpu.daemon.user_metrics import user_families, user_gpus
from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.store import open_store, schema
from slurmgpu.store.energy_rule import IDLE_UTIL_PCT

GPUS = 8
INTERVAL_S = 10


def _median_s(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--users", type=int, default=800)
    add_arguments(ap, "20 nodes, 30 users")
    args = ap.parse_args(argv)
    if args.smoke:
        args.nodes, args.users = 20, 30
    run = BenchRun.from_args("metrics_scrape", args)
    now = datetime.now(UTC)
    nodes, jobs, rows = [], [], []
    job_id = 1000
    for n in range(args.nodes):
        name = f"gpu{n:04d}"
        nodes.append(
            Node(
                name,
                "allocated",
                gpus=GPUS,
                gpus_used=GPUS,
                gpu_indices_used=tuple(range(GPUS)),
                partitions=("gpu",),
            )
        )
        for pair in range(GPUS // 2):
            job_id += 1
            held = (2 * pair, 2 * pair + 1)
            jobs.append(
                Job(
                    job_id=job_id,
                    name="train",
                    user=f"user{job_id % args.users:04d}",
                    state=JobState.RUNNING,
                    gpus=GpuRequest(gpus=2),
                    nodes=(name,),
                    gpu_allocations=(NodeGpuAllocation(name, held),),
                )
            )
            for g in held:
                util = 0.0 if (job_id + g) % 3 == 0 else 85.0
                for k in range(int(USED_WINDOW.total_seconds()) // INTERVAL_S):
                    rows.append(
                        {
                            "sample_uid": f"{name}-{g}-{k}",
                            "cluster": "",
                            "node": name,
                            "kind": "gpu",
                            "job_id": job_id,
                            "gpu_index": g,
                            "at": now - timedelta(seconds=k * INTERVAL_S + 1),
                            "util_pct": util,
                        }
                    )
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/scrape.db")
        with store.engine.begin() as conn:
            conn.execute(insert(schema.samples), rows)
        snap = ClusterSnapshot(taken_at=now, jobs=tuple(jobs), nodes=tuple(nodes))
        metrics = DaemonMetrics(store.engine, "", snapshot=lambda: snap, clock=lambda: now)
        s = schema.samples
        where = (
            s.c.cluster == "",
            s.c.kind == "gpu",
            s.c.at >= now - USED_WINDOW,
            s.c.job_id.is_not(None),
            s.c.util_pct > IDLE_UTIL_PCT,
        )
        before = select(s.c.node, s.c.gpu_index).where(*where).group_by(s.c.node, s.c.gpu_index)
        after = (
            select(s.c.job_id, s.c.node, s.c.gpu_index)
            .where(*where)
            .group_by(s.c.job_id, s.c.node, s.c.gpu_index)
        )

        def query(stmt: Select[Any]) -> None:
            with store.engine.connect() as conn:
                conn.execute(stmt).all()

        base_s = _median_s(lambda: query(before))
        busy_s = _median_s(lambda: query(after))
        scrape_s = _median_s(metrics.exposition)
        by_job = {j.job_id: 2 for j in jobs}
        users_s = _median_s(lambda: list(user_families(user_gpus(snap.jobs, by_job), 20)))
        text = metrics.exposition().decode()
        series = {
            f.name: len(f.samples)
            for f in text_string_to_metric_families(text)
            if f.name.startswith("sgpu_user_gpus_")
        }
        idle = sum(
            sample.value
            for f in text_string_to_metric_families(text)
            if f.name == "sgpu_user_gpus_idle"
            for sample in f.samples
        )
        store.engine.dispose()
    run.params.update(gpus=args.nodes * GPUS, jobs=len(jobs), samples=len(rows))
    run.baseline = {"busy_query_by_node_gpu_s": base_s}
    run.figures = {
        "busy_query_by_job_s": busy_s,
        "ratio": busy_s / base_s,
        "scrape_s": scrape_s,
        "user_series_build_s": users_s,
        "user_series": series,
        "idle_gpus_in_user_series": idle,
    }
    limit = 20 + 1
    run.target(
        "user series per metric", max(series.values()), f"<= {limit}", max(series.values()) <= limit
    )
    print(
        f"{args.nodes * GPUS:,} GPUs, {len(jobs):,} jobs of {args.users} users, "
        f"{len(rows):,} samples in the last 2 min"
    )
    print(f"busy-GPU query, by node and GPU (baseline): {base_s * 1000:,.1f} ms")
    print(
        f"busy-GPU query, by job, node and GPU:       {busy_s * 1000:,.1f} ms "
        f"({busy_s / base_s:.2f}x)"
    )
    print(f"the per-user series from the snapshot: {users_s * 1000:,.1f} ms")
    print(
        f"whole scrape: {scrape_s * 1000:,.1f} ms; user series: {series}; "
        f"idle GPUs in them: {idle:,.0f}"
    )
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time one malleable-policy decision over a large synthetic cluster.

The snapshot: ``--nodes`` nodes of 8 GPUs, ``--running`` running jobs (half malleable,
1-8 GPUs, measured throughput at one or two sizes) and ``--pending`` waiting jobs, with a
few GPUs idle. Printed: the median time of ``MalleablePolicy.propose`` with the fit cache
cold (new measurements every cycle) and warm (the same ones again, as between daemon
cycles), and as the baseline the idle-GPU policy (``IdleGpuPolicy.propose``) on the same
snapshot, measured in the same run.

Run: ``.venv/bin/python bench/malleable_policy.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, MalleableSpec, Node
from slurmgpu.model import NodeGpuAllocation as Alloc
from slurmgpu.policy.base import PolicySnapshot
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.malleable import MalleablePolicy
from slurmgpu.policy.speedup import _fit

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def build(nodes: int, running: int, pending: int, seed: int, salt: float) -> PolicySnapshot:
    rng = random.Random(seed)
    free = {f"n{i}": 8 for i in range(nodes)}
    order = list(free)
    jobs: list[Job] = []
    specs: dict[int, MalleableSpec] = {}
    rates: dict[int, dict[int, float]] = {}
    jid = 1
    for _ in range(running):
        g = rng.choice((1, 2, 4, 8))
        node = next((n for n in order if free[n] >= g), None)
        if node is None:
            break
        idx = tuple(range(8 - free[node], 8 - free[node] + g))
        free[node] -= g
        jobs.append(
            Job(
                jid,
                "train",
                f"u{jid % 50}",
                JobState.RUNNING,
                start_time=T0 - timedelta(minutes=rng.randrange(5, 600)),
                submit_time=T0 - timedelta(hours=12),
                time_limit=timedelta(hours=24),
                node_count=1,
                gpus=GpuRequest(gpus=g, per_job=g),
                nodes=(node,),
                gpu_allocations=(Alloc(node, idx),),
            )
        )
        if jid % 2 == 0:
            specs[jid] = MalleableSpec(jid, 1, 16)
            rates[jid] = {g: 100.0 * g**0.9 + salt}
            if g > 1 and rng.random() < 0.5:
                rates[jid][g // 2] = 100.0 * (g // 2) ** 0.9 + salt
        jid += 1
    for _ in range(pending):
        g = rng.choice((1, 2, 4, 8, 16))
        jobs.append(
            Job(
                jid,
                "train",
                f"u{jid % 50}",
                JobState.PENDING,
                submit_time=T0 - timedelta(minutes=rng.randrange(1, 600)),
                time_limit=timedelta(hours=rng.choice((1, 4, 24))),
                gpus=GpuRequest(gpus=g, per_job=g),
                reason="Resources",
            )
        )
        jid += 1
    node_list = tuple(Node(n, "mixed", gpus=8, gpus_used=8 - free[n]) for n in order)
    return PolicySnapshot(
        at=T0,
        cluster=ClusterSnapshot(T0, tuple(jobs), node_list),
        malleable=specs,
        throughput=rates,
    )


def median_time(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=600)
    ap.add_argument("--running", type=int, default=2000)
    ap.add_argument("--pending", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    add_arguments(ap, "40 nodes, 120 running, 60 pending, 2 repeats")
    args = ap.parse_args(argv)
    if args.smoke:
        args.nodes, args.running, args.pending, args.repeats = 40, 120, 60, 2
    run = BenchRun.from_args("malleable_policy", args)
    snap = build(args.nodes, args.running, args.pending, 1, 0.0)
    policy = MalleablePolicy()
    idle = IdleGpuPolicy()
    free = sum(n.gpus - n.gpus_used for n in snap.cluster.nodes)
    actions = policy.propose(snap)
    warm = median_time(lambda: policy.propose(snap), args.repeats)
    colds = []
    for r in range(args.repeats):
        fresh = build(args.nodes, args.running, args.pending, 1, 1e-3 * (r + 1))
        _fit.cache_clear()
        t = time.perf_counter()
        policy.propose(fresh)
        colds.append(time.perf_counter() - t)
    base = median_time(lambda: idle.propose(snap), args.repeats)
    jobs = len(snap.cluster.jobs)
    print(
        f"malleable policy: {jobs} jobs ({len(snap.malleable)} malleable running), "
        f"{len(snap.cluster.nodes)} nodes, {free} GPUs idle; {len(actions)} resizes proposed"
    )
    print(f"  propose, fits memoised (warm): {warm * 1000:8.1f} ms")
    print(f"  propose, every fit new (cold): {statistics.median(colds) * 1000:8.1f} ms")
    print(
        f"  baseline idle-GPU policy, same snapshot: {base * 1000:8.1f} ms "
        f"(malleable warm / idle = {warm / base:.1f}x)"
    )
    run.baseline = {"idle_gpu_propose_s": base}
    run.figures = {
        "propose_warm_s": warm,
        "propose_cold_s": statistics.median(colds),
        "resizes_proposed": len(actions),
        "jobs": jobs,
    }
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

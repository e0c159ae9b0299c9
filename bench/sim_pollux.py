"""Benchmark: Pollux workloads 1-5 and 7 on 16x4 at load 1.0, every policy set and baseline.

Prints each workload's average JCT per set, the mean over the six, the runs killed at
their time limit per set, and the published means beside them (Tiresias 3,959 s, Pollux
2,769 s, from shared/data/ATTRIBUTION.md),
then the speed figures: one 160-job workload through every set (target < 10 s), and the
82k-job Philly trace through one set (target < 5 min on one core), each as CPU seconds
(process time, so a busy shared machine does not inflate it) and wall seconds.

    .venv/bin/python bench/sim_pollux.py [--philly-set slurm] [--philly-cluster 100x8]
    [--skip-philly]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from slurmgpu.sim.loaders import load_trace
from slurmgpu.sim.metrics import summarise
from slurmgpu.sim.policysets import PolicySetUnavailable
from slurmgpu.sim.profiles import load_profiles
from slurmgpu.sim.published import PUBLISHED_AVG_JCT_S, published_mean
from slurmgpu.sim.run import ClusterShape, simulate

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux"
SETS = ("slurm", "rightsize", "colocate", "malleable", "all", "tiresias", "qssf")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--philly-set", default="slurm")
    ap.add_argument("--philly-cluster", default="100x8")
    ap.add_argument("--skip-philly", action="store_true")
    args = ap.parse_args()
    if not (args.data / "profiles").is_dir():
        print(f"skipped: no Pollux data under {args.data}")
        return 0
    profiles = load_profiles(args.data / "profiles")
    shape = ClusterShape(16, 4)
    avg: dict[str, list[float]] = {s: [] for s in SETS}
    timeouts: dict[str, int] = dict.fromkeys(SETS, 0)
    unavailable: dict[str, str] = {}
    speed_cpu: list[float] = []
    speed_wall: list[float] = []
    print(f"{'workload':>8} " + " ".join(f"{s:>10}" for s in SETS) + "   published P / T")
    for n in PUBLISHED_AVG_JCT_S:
        trace = load_trace(args.data / "workloads" / f"workload-{n}.csv", profiles, seed=1)
        cells = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for s in SETS:
            try:
                r = summarise(simulate(trace, shape, s))
            except PolicySetUnavailable as exc:
                unavailable[s] = str(exc)
                cells.append(f"{'n/a':>10}")
                continue
            avg[s].append(r.avg_jct_s)
            timeouts[s] += r.timeouts
            cells.append(f"{r.avg_jct_s:>10,.0f}")
        speed_cpu.append(time.process_time() - cpu0)
        speed_wall.append(time.perf_counter() - wall0)
        pub = PUBLISHED_AVG_JCT_S[n]
        print(f"{n:>8} " + " ".join(cells) + f"   {pub['pollux']:,} / {pub['tiresias']:,}")
    print(
        f"{'mean':>8} "
        + " ".join(f"{statistics.mean(v):>10,.0f}" if v else f"{'n/a':>10}" for v in avg.values())
        + f"   {published_mean('pollux'):,.0f} / {published_mean('tiresias'):,.0f}"
    )
    print(
        f"{'timeouts':>8} "
        + " ".join(f"{timeouts[s]:>10}" if avg[s] else f"{'n/a':>10}" for s in SETS)
        + "   (runs killed at their limit, all workloads)"
    )
    for s, why in unavailable.items():
        print(f"  {s}: {why}")
    base = statistics.mean(avg["slurm"])
    for s, v in avg.items():
        if v and s != "slurm":
            print(f"  {s}: mean avg JCT {statistics.mean(v) / base:.2f}x plain slurm")
    print(
        f"speed: 160 jobs x {len(SETS) - len(unavailable)} sets: median "
        f"{statistics.median(speed_cpu):.2f} s CPU ({statistics.median(speed_wall):.2f} s wall) "
        "per workload (target < 10 s)"
    )
    if args.skip_philly or not (args.data / "philly.csv").exists():
        return 0
    t0 = time.process_time()
    w0 = time.perf_counter()
    trace = load_trace(args.data / "philly.csv", None, max_gpus=10**6)
    load_cpu = time.process_time() - t0
    cluster = ClusterShape.parse(args.philly_cluster)
    t1 = time.process_time()
    r = summarise(simulate(trace, cluster, args.philly_set))
    sim_cpu = time.process_time() - t1
    print(
        f"speed: Philly {len(trace):,} jobs, set {args.philly_set}, {args.philly_cluster}: "
        f"load {load_cpu:.1f} s + simulate {sim_cpu:.1f} s CPU "
        f"({time.perf_counter() - w0:.1f} s wall; target < 300 s); "
        f"avg JCT {r.avg_jct_s:,.0f} s, alloc util {r.allocated_util_pct:.1f} %"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

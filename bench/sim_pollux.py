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

from slurmgpu.benchrun import BenchRun, add_arguments
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
    add_arguments(ap, "workload 1 only, first 40 jobs, sets slurm and all, no Philly")
    args = ap.parse_args()
    run = BenchRun.from_args("sim_pollux", args)
    if not (args.data / "profiles").is_dir():
        print(f"skipped: no Pollux data under {args.data}")
        run.figures = {"skipped": f"no Pollux data under {args.data}"}
        run.write(args.json_out)
        return 0
    sets = ("slurm", "all") if args.smoke else SETS
    workloads = list(PUBLISHED_AVG_JCT_S)[:1] if args.smoke else list(PUBLISHED_AVG_JCT_S)
    profiles = load_profiles(args.data / "profiles")
    shape = ClusterShape(16, 4)
    avg: dict[str, list[float]] = {s: [] for s in sets}
    timeouts: dict[str, int] = dict.fromkeys(sets, 0)
    unavailable: dict[str, str] = {}
    speed_cpu: list[float] = []
    speed_wall: list[float] = []
    print(f"{'workload':>8} " + " ".join(f"{s:>10}" for s in sets) + "   published P / T")
    for n in workloads:
        trace = load_trace(args.data / "workloads" / f"workload-{n}.csv", profiles, seed=1)
        if args.smoke:
            trace = trace[:40]
        cells = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for s in sets:
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
        + " ".join(f"{timeouts[s]:>10}" if avg[s] else f"{'n/a':>10}" for s in sets)
        + "   (runs killed at their limit, all workloads)"
    )
    for s, why in unavailable.items():
        print(f"  {s}: {why}")
    base = statistics.mean(avg["slurm"])
    for s, v in avg.items():
        if v and s != "slurm":
            print(f"  {s}: mean avg JCT {statistics.mean(v) / base:.2f}x plain slurm")
    workload_cpu = statistics.median(speed_cpu)
    print(
        f"speed: {len(trace)} jobs x {len(sets) - len(unavailable)} sets: median "
        f"{workload_cpu:.2f} s CPU ({statistics.median(speed_wall):.2f} s wall) "
        "per workload (target < 10 s)"
    )
    run.baseline = {
        "slurm_mean_avg_jct_s": base,
        "published_mean_avg_jct_s": {
            "pollux": published_mean("pollux"),
            "tiresias": published_mean("tiresias"),
        },
    }
    run.figures = {
        "mean_avg_jct_s": {s: statistics.mean(v) for s, v in avg.items() if v},
        "vs_slurm": {s: statistics.mean(v) / base for s, v in avg.items() if v},
        "timeouts": timeouts,
        "unavailable": unavailable,
        "workload_cpu_s": workload_cpu,
        "workload_wall_s": statistics.median(speed_wall),
    }
    run.target("workload_cpu_s", workload_cpu, "< 10", workload_cpu < 10)
    if args.smoke or args.skip_philly or not (args.data / "philly.csv").exists():
        run.write(args.json_out)
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
    philly_cpu = load_cpu + sim_cpu
    run.figures["philly"] = {
        "jobs": len(trace),
        "set": args.philly_set,
        "cluster": args.philly_cluster,
        "load_cpu_s": load_cpu,
        "simulate_cpu_s": sim_cpu,
        "wall_s": time.perf_counter() - w0,
        "avg_jct_s": r.avg_jct_s,
    }
    run.target("philly_cpu_s", philly_cpu, "< 300", philly_cpu < 300)
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

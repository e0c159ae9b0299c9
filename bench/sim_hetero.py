"""Benchmark: type-aware vs type-blind malleable sets on heterogeneous simulated clusters.

The Pollux workloads (1-5 and 7, ``shared/data/pollux``) on clusters of two GPU types
(``8xa100:4,8xv100:4``, ``8xa100:4,8xt4:4`` and ``8xv100:4,8xt4:4`` by default), each
application running at its measured speed on each type (``slurmgpu.sim.gputypes``: Sia's
profiles of the same applications, SOSP'23). Sets, measured in
the same run on the same traces: ``slurm`` (no policy, Slurm's placement),
``malleable`` (type-blind resizing: the baseline) and ``malleable-types`` (the same
policy with ``type_aware``: grow and start jobs on the type where they run fastest).

Per cluster it prints, per set, the mean average JCT over workloads and seeds with its
95 % confidence interval over the seeds, its ratio to the type-blind set, p99 JCT,
makespan, energy (kWh, kWh per job, ratio), GPU-hours per type and resizes per job;
then how many (workload, seed) runs the type-aware set won, and the issue-24 target
(type-aware avg JCT below type-blind) checked against this run.

    .venv/bin/python bench/sim_hetero.py [--smoke] [--json-out FILE]
        [--seeds 1-3] [--workloads 1,2,3,4,5,7] [--clusters 8xa100:4,8xv100:4;...]

``--smoke``: workload 1, seed 1 (seconds); the target is still checked on what ran.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.sim.loaders import load_trace
from slurmgpu.sim.metrics import summarise, type_use
from slurmgpu.sim.profiles import load_profiles
from slurmgpu.sim.run import ClusterShape, simulate

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux"
SETS = ("slurm", "malleable", "malleable-types")
BLIND, AWARE = "malleable", "malleable-types"
CLUSTERS = "8xa100:4,8xv100:4;8xa100:4,8xt4:4;8xv100:4,8xt4:4"
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def _ints(text: str) -> list[int]:
    lo, sep, hi = text.partition("-")
    return list(range(int(lo), int(hi) + 1)) if sep else [int(x) for x in text.split(",")]


def _ci(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    return T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--workloads", default="1,2,3,4,5,7")
    ap.add_argument("--clusters", default=CLUSTERS, help="';'-separated --cluster texts")
    add_arguments(ap, "workload 1, seed 1")
    args = ap.parse_args()
    record = BenchRun.from_args("sim_hetero", args)
    if not (args.data / "profiles").is_dir():
        print(f"skipped: no Pollux data under {args.data}")
        record.figures = {"skipped": f"no Pollux data under {args.data}"}
        record.write(args.json_out)
        return 0
    seeds = [1] if args.smoke else _ints(args.seeds)
    workloads = [1] if args.smoke else _ints(args.workloads)
    clusters = [c.strip() for c in args.clusters.split(";") if c.strip()]
    profiles = load_profiles(args.data / "profiles")
    traces = {
        (w, seed): load_trace(args.data / "workloads" / f"workload-{w}.csv", profiles, seed=seed)
        for w in workloads
        for seed in seeds
    }
    wall0 = time.perf_counter()
    cpu: list[float] = []
    out: dict[str, object] = {"seeds": seeds, "workloads": workloads, "clusters": {}}
    met_all = True
    for text in clusters:
        shape = ClusterShape.parse(text)
        # runs[set][(workload, seed)] = figures
        runs: dict[str, dict[tuple[int, int], dict[str, float]]] = defaultdict(dict)
        for key, trace in traces.items():
            for s in SETS:
                t0 = time.process_time()
                run = simulate(trace, shape, s)
                r = summarise(run)
                cpu.append(time.process_time() - t0)
                fig = {
                    "avg_jct_s": r.avg_jct_s,
                    "p99_jct_s": r.p99_jct_s,
                    "makespan_s": r.makespan_s,
                    "energy_kwh": r.energy_kwh,
                    "kwh_per_job": r.kwh_per_job,
                    "resizes_per_job": r.resizes_per_job,
                }
                for t, u in type_use(run).items():
                    fig[f"gpu_hours_{t}"] = u.gpu_hours
                    fig[f"kwh_{t}"] = u.energy_kwh
                runs[s][key] = fig
        types = [t for _, t in shape.types]
        table = _table(runs, seeds, types)
        blind, aware = table[BLIND]["avg_jct_s"], table[AWARE]["avg_jct_s"]
        wins = sum(1 for k in traces if runs[AWARE][k]["avg_jct_s"] < runs[BLIND][k]["avg_jct_s"])
        met = aware < blind
        met_all &= met
        _print(text, table, types, wins, len(traces), met)
        clusters_out = out["clusters"]
        assert isinstance(clusters_out, dict)
        clusters_out[text] = {
            "sets": table,
            "per_run": {
                s: {f"{w}/{seed}": v for (w, seed), v in d.items()} for s, d in runs.items()
            },
            "aware_wins": wins,
            "runs": len(traces),
            "avg_jct_ratio_aware_to_blind": aware / blind,
            "target_met": met,
        }
    wall = time.perf_counter() - wall0
    print(
        f"\nspeed: {len(cpu)} runs in {wall:.1f} s wall, "
        f"median {statistics.median(cpu):.2f} CPU s per run"
    )
    out["wall_s"] = wall
    out["median_cpu_s_per_run"] = statistics.median(cpu)
    out["target_met"] = met_all
    clusters_out = out["clusters"]
    assert isinstance(clusters_out, dict)
    # the baseline measured in the same run: the type-blind malleable set on each cluster
    record.baseline = {
        text: {"type_blind_avg_jct_s": c["sets"][BLIND]["avg_jct_s"]}
        for text, c in clusters_out.items()
    }
    record.figures = out
    for text, c in clusters_out.items():
        ratio = float(c["avg_jct_ratio_aware_to_blind"])
        record.target(f"aware_vs_blind[{text}]", ratio, "< 1", ratio < 1)
    record.write(args.json_out)
    return 0


def _table(
    runs: dict[str, dict[tuple[int, int], dict[str, float]]], seeds: list[int], types: list[str]
) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for s, by_key in runs.items():
        keys = sorted(by_key)
        row = {f: statistics.fmean(by_key[k][f] for k in keys) for f in by_key[keys[0]]}
        per_seed = [
            statistics.fmean(by_key[k]["avg_jct_s"] for k in keys if k[1] == seed) for seed in seeds
        ]
        row["avg_jct_ci_s"] = _ci(per_seed)
        table[s] = row
    for row in table.values():
        row["jct_ratio_to_blind"] = row["avg_jct_s"] / table[BLIND]["avg_jct_s"]
        row["kwh_ratio_to_blind"] = row["energy_kwh"] / table[BLIND]["energy_kwh"]
    return table


def _print(
    text: str,
    table: dict[str, dict[str, float]],
    types: list[str],
    wins: int,
    runs: int,
    met: bool,
) -> None:
    print(f"\ncluster {text}  (mean over workloads x seeds; ratio: to type-blind {BLIND})")
    head = (
        f"{'set':<16} {'avg JCT s':>10} {'+-95%':>7} {'ratio':>6} {'p99 JCT s':>10} "
        f"{'makespan s':>10} {'kWh':>8} {'kWh/job':>8} {'kWh ratio':>9} "
        + " ".join(f"{'GPU-h ' + t:>11}" for t in types)
        + f" {'resizes/job':>11}"
    )
    print(head)
    print("-" * len(head))
    for s, r in table.items():
        ci = r["avg_jct_ci_s"]
        print(
            f"{s:<16} {r['avg_jct_s']:>10.0f} {'' if math.isnan(ci) else f'{ci:.0f}':>7} "
            f"{r['jct_ratio_to_blind']:>6.3f} {r['p99_jct_s']:>10.0f} {r['makespan_s']:>10.0f} "
            f"{r['energy_kwh']:>8.1f} {r['kwh_per_job']:>8.3f} {r['kwh_ratio_to_blind']:>9.3f} "
            + " ".join(f"{r.get('gpu_hours_' + t, 0.0):>11.1f}" for t in types)
            + f" {r['resizes_per_job']:>11.2f}"
        )
    ratio = table[AWARE]["avg_jct_s"] / table[BLIND]["avg_jct_s"]
    print(
        f"type-aware won {wins}/{runs} runs; target (issue 24: type-aware avg JCT below "
        f"type-blind): {'met' if met else 'NOT met'}, ratio {ratio:.3f}"
    )


if __name__ == "__main__":
    sys.exit(main())

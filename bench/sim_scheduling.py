"""What Slurm's own passes (sim.slurmsched) cost the simulator and change in its figures.

Runs each Pollux workload of ``--workloads`` (seed ``--seed``, 16x4, the default cost
set) per set of ``--sets`` twice in the same process: SimSlurm's EASY pass at every
change (the default, the baseline) and Slurm's main + conservative backfill passes at
Slurm's default periods (``SimOptions.scheduling``). Prints per run the CPU seconds
(median of ``--repeat``) and avg JCT and makespan, and the ratios on / off.

    .venv/bin/python bench/sim_scheduling.py --workloads 1 --sets slurm,all
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmgpu.lab.benchrun import BenchRun, add_arguments  # noqa: E402
from slurmgpu.sim.costs import DEFAULT as DEFAULT_COSTS  # noqa: E402
from slurmgpu.sim.costs import cost_set  # noqa: E402
from slurmgpu.sim.loaders import load_trace  # noqa: E402
from slurmgpu.sim.metrics import summarise  # noqa: E402
from slurmgpu.sim.profiles import load_profiles  # noqa: E402
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate  # noqa: E402
from slurmgpu.sim.slurmsched import SlurmScheduling  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "pollux"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--workloads", default="1,2", help="Pollux workload numbers")
    ap.add_argument("--sets", default="slurm,all")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per case (median)")
    add_arguments(ap, "workload 1, first 40 jobs, the slurm set, one run")
    args = ap.parse_args()
    if not (args.data / "workloads").is_dir():
        print(f"sim_scheduling: skipped: no Pollux data under {args.data}", flush=True)
        return 0
    limit = 40 if args.smoke else None
    if args.smoke:
        args.workloads, args.sets, args.repeat = "1", "slurm", 1
    run = BenchRun.from_args("sim_scheduling", args)
    profiles = load_profiles(args.data / "profiles")
    base = SimOptions.of_costs(cost_set(DEFAULT_COSTS))
    modes = {"easy": base, "slurm": replace(base, scheduling=SlurmScheduling())}
    print(
        f"{'workload':<9} {'set':<8} {'scheduler':<9} {'cpu s':>7} {'avg JCT h':>10} "
        f"{'makespan h':>11}"
    )
    ratios: dict[str, list[float]] = {"cpu": [], "avg_jct": [], "makespan": []}
    for w in args.workloads.split(","):
        trace = load_trace(
            args.data / "workloads" / f"workload-{w.strip()}.csv", profiles, seed=args.seed
        )
        trace = trace[:limit] if limit is not None else trace
        for policy_set in args.sets.split(","):
            row: dict[str, tuple[float, float, float]] = {}
            for name, options in modes.items():
                times = []
                for _ in range(max(1, args.repeat)):
                    cpu = time.process_time()
                    r = summarise(simulate(trace, ClusterShape(16, 4), policy_set, options))
                    times.append(time.process_time() - cpu)
                row[name] = (statistics.median(times), r.avg_jct_s, r.makespan_s)
                print(
                    f"{w:<9} {policy_set:<8} {name:<9} {row[name][0]:>7.2f} "
                    f"{r.avg_jct_s / 3600:>10.2f} {r.makespan_s / 3600:>11.2f}",
                    flush=True,
                )
            on, off = row["slurm"], row["easy"]
            for key, i in (("cpu", 0), ("avg_jct", 1), ("makespan", 2)):
                ratios[key].append(on[i] / off[i] if off[i] else float("nan"))
    print(
        "\nSlurm's passes / EASY (median over runs): "
        + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in ratios.items())
    )
    run.figures = {k: statistics.median(v) for k, v in ratios.items()}
    run.baseline = {"scheduler": "easy"}
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

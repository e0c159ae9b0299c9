"""Benchmark: co-location in the simulator on a fractional-GPU workload built from Lucid's pairs.

For each offered load and seed, one seeded trace (slurmgpu/sim/lucid.py: 1-GPU jobs
``--gres=gpu:1``, each a Lucid configuration with its solo GPU util and memory, 16 users
with 3 configurations each, log-normal run times, Poisson arrivals) runs twice on the
same simulated cluster, same options: the ``slurm`` set (no sharing: every job holds a
whole GPU) and the ``colocate`` set (the daemon's ColocatePolicy through its
PolicyEngine, enforce mode, every job a candidate, gpu -> shard conversion allowed;
4 shards per GPU, 32 GiB GPUs). Jobs sharing a GPU slow each other by Lucid's *measured*
speeds for that pair of configurations (``--slowdown measured``, default; the policy
admits with its fitted model, so it is not graded against itself), or by the model
(``--slowdown model``).

Printed per run, without / with sharing and their ratio:

- avg, p50 and p99 JCT, average queueing delay (seconds);
- used utilisation: productive GPU time (util x time computing x co-location speed) over
  GPUs x makespan (``slurmgpu.sim.metrics``);
- busy share of allocated GPU time: used / allocated GPU-hours -- how busy the GPUs the
  jobs hold really are;
- allocated GPU-hours, jobs packed (shard updates done), separations, timeouts.

Then the medians over the seeds per load, and the CPU time of the runs.

    .venv/bin/python bench/colocate_sim.py [--cluster 4x4] [--jobs 600]
        [--loads 1.0,1.2,1.5] [--seeds 1,2,3] [--slowdown measured|model]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.sim.lucid import LucidWorkload, lucid_setup, lucid_workload
from slurmgpu.sim.metrics import RunSummary, summarise
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate

DEFAULT_DATA = Path(
    os.environ.get("SGPU_SHARED_DATA", str(Path(__file__).resolve().parents[2] / "shared/data"))
)


@dataclass(frozen=True, slots=True)
class Measured:
    summary: RunSummary
    packed: int
    separated: int
    cpu_s: float

    @property
    def busy_of_allocated_pct(self) -> float:
        s = self.summary
        return 100.0 * s.used_util_pct / s.allocated_util_pct if s.allocated_util_pct else 0.0


def _run(trace: Sequence[object], shape: ClusterShape, name: str, options: SimOptions) -> Measured:
    cpu = time.process_time()
    result = simulate(trace, shape, name, options)  # type: ignore[arg-type]
    cpu = time.process_time() - cpu
    kinds = Counter((d.policy, d.kind) for d in result.decisions if d.outcome == "done")
    return Measured(
        summarise(result, cpu),
        packed=kinds[("colocate", "update")],
        separated=kinds[("colocate", "requeue")],
        cpu_s=cpu,
    )


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared/data directory")
    ap.add_argument("--cluster", default="4x4", help="NODESxGPUS (4 shards per GPU)")
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--loads", default="1.0,1.2,1.5", help="offered loads (1.0 = the GPUs)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--slowdown", choices=("measured", "model"), default="measured")
    add_arguments(ap, "60 jobs, load 1.2, seed 1")
    args = ap.parse_args(argv)
    if args.smoke:
        args.jobs, args.loads, args.seeds = 60, "1.2", "1"
    run = BenchRun.from_args("colocate_sim", args)
    path = args.data / "lucid" / "colocate_info.csv"
    if not path.is_file():
        print(f"bench/colocate_sim: {path} is absent; nothing to measure", file=sys.stderr)
        return 1
    shape = ClusterShape.parse(args.cluster, 4)
    profiles, slowdown = lucid_setup(path, args.slowdown)
    options = SimOptions(interference=slowdown, record_decisions=True)
    loads = _floats(args.loads)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    light = sum(1 for p in profiles.values() if p.util_pct <= 40.0)
    print(
        f"Lucid workload: {args.jobs} 1-GPU jobs over {len(profiles)} configurations "
        f"({light} at <= 40 % util alone), cluster {args.cluster} x 4 shards, "
        f"slowdown of sharers: {args.slowdown}"
    )
    header = (
        f"{'load':>5} {'seed':>4} {'set':<9}{'avg JCT':>9}{'p50':>8}{'p99':>8}{'queue':>8}"
        f"{'used %':>8}{'busy/alloc %':>13}{'GPU-h':>8}{'packed':>7}{'separ.':>7}{'t/o':>5}"
    )
    print(header)
    rows: dict[float, list[tuple[Measured, Measured]]] = {load: [] for load in loads}
    cpu_total = 0.0
    for load in loads:
        for seed in seeds:
            trace = lucid_workload(
                profiles,
                shape.gpus,
                seed=seed,
                shape=LucidWorkload(jobs=args.jobs, load=load),
            )
            plain = _run(trace, shape, "slurm", options)
            shared = _run(trace, shape, "colocate", options)
            cpu_total += plain.cpu_s + shared.cpu_s
            rows[load].append((plain, shared))
            for label, m in (("no share", plain), ("colocate", shared)):
                s = m.summary
                print(
                    f"{load:>5.2f} {seed:>4} {label:<9}{s.avg_jct_s:>9.0f}{s.p50_jct_s:>8.0f}"
                    f"{s.p99_jct_s:>8.0f}{s.avg_queue_s:>8.0f}{s.used_util_pct:>8.1f}"
                    f"{m.busy_of_allocated_pct:>13.1f}{s.gpu_hours:>8.0f}{m.packed:>7}"
                    f"{m.separated:>7}{s.timeouts:>5}"
                )
    print()
    print(f"medians over seeds {args.seeds}: colocate / no sharing, same traces")
    print(
        f"{'load':>5} {'avg JCT':>16} {'ratio':>6} {'p99 JCT':>16} {'ratio':>6}"
        f" {'used util %':>14} {'busy/alloc %':>14}"
    )
    for load, pairs_of_runs in rows.items():
        run.baseline[f"load {load:g}"] = {
            "avg_jct_s": [p.summary.avg_jct_s for p, _ in pairs_of_runs],
            "p99_jct_s": [p.summary.p99_jct_s for p, _ in pairs_of_runs],
            "used_util_pct": [p.summary.used_util_pct for p, _ in pairs_of_runs],
        }
        run.figures[f"load {load:g}"] = {
            "avg_jct_s": [c.summary.avg_jct_s for _, c in pairs_of_runs],
            "p99_jct_s": [c.summary.p99_jct_s for _, c in pairs_of_runs],
            "used_util_pct": [c.summary.used_util_pct for _, c in pairs_of_runs],
        }

        def med(values: list[float]) -> float:
            return float(statistics.median(values))

        jct0 = med([p.summary.avg_jct_s for p, _ in pairs_of_runs])
        jct1 = med([c.summary.avg_jct_s for _, c in pairs_of_runs])
        p990 = med([p.summary.p99_jct_s for p, _ in pairs_of_runs])
        p991 = med([c.summary.p99_jct_s for _, c in pairs_of_runs])
        u0 = med([p.summary.used_util_pct for p, _ in pairs_of_runs])
        u1 = med([c.summary.used_util_pct for _, c in pairs_of_runs])
        b0 = med([p.busy_of_allocated_pct for p, _ in pairs_of_runs])
        b1 = med([c.busy_of_allocated_pct for _, c in pairs_of_runs])
        print(
            f"{load:>5.2f} {jct0:>7.0f} -> {jct1:>6.0f} {jct1 / jct0:>6.2f}"
            f" {p990:>7.0f} -> {p991:>6.0f} {p991 / p990:>6.2f}"
            f" {u0:>5.1f} -> {u1:>5.1f} {b0:>5.1f} -> {b1:>5.1f}"
        )
    runs = 2 * len(loads) * len(seeds)
    print(f"CPU: {cpu_total:.1f} s for {runs} simulations ({cpu_total / runs:.2f} s each)")
    run.figures["cpu_s_per_simulation"] = cpu_total / runs
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: shards, MPS and MIG compared in the simulator on a Lucid fractional workload.

For each offered load and seed, one seeded trace (slurmgpu/sim/lucid.py: 1-GPU jobs
``--gres=gpu:1``, each a Lucid configuration with its solo GPU util and memory) runs on
the same 16 GPUs of 80 GB (4x4) presented each way ``sgpu simulate --sharing`` knows
(slurmgpu/sim/sharing.py): ``none`` under the ``slurm`` set is the baseline, measured in
the same run; then the ``colocate`` set (the daemon's ColocatePolicy, enforce, every job a
candidate) on ``shards`` (4 per GPU), ``mps`` (100 per GPU) and ``mig`` (``--mig-gpus``
GPUs of each node split 3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb, the lab's layout; the
others whole), plus the ``slurm`` set on that MIG cluster (the cost of a static layout
nobody asks for). SimSlurm answers as Slurm 24.11 (it lets a pending ``gpu:1`` become a
slice or a share).

Speeds: shard sharers by Lucid's *measured* pair speeds (``--slowdown measured``) or the
model; MPS and MIG always by the policy's model (nobody measured MPS or MIG pairs):
MIG slices capped at their SM share, isolated; MPS shares capped at theirs and slowed by
the model's contention terms, without time-slicing.

Printed per load: each row's medians over the seeds of avg and p99 JCT (and the avg's
ratio to the baseline), makespan, GPU-hours held, used utilisation and the jobs narrowed
(on a share at their end), then the CPU time.

    .venv/bin/python bench/sharing_sim.py [--cluster 4x4] [--jobs 600]
        [--loads 1.0,1.2,1.5] [--seeds 1,2,3] [--mig-gpus 1,2] [--slowdown measured|model]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.sim.lucid import LucidWorkload, lucid_setup, lucid_workload
from slurmgpu.sim.metrics import RunSummary, summarise
from slurmgpu.sim.policysets import SimPolicies
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.sharing import SHARING_SLURM_VERSION, SharingMode
from slurmgpu.sim.sharingreport import narrowed
from slurmgpu.sim.workload import TraceJob

DEFAULT_DATA = Path(
    os.environ.get("SGPU_SHARED_DATA", str(Path(__file__).resolve().parents[2] / "shared/data"))
)


@dataclass(frozen=True, slots=True)
class Variant:
    label: str
    mode: SharingMode
    policy_set: str
    mig_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class Measured:
    summary: RunSummary
    narrowed: int
    cpu_s: float


def _variants(mig_gpus: Sequence[int]) -> list[Variant]:
    out = [
        Variant("none/slurm", "none", "slurm"),
        Variant("shards/colocate", "shards", "colocate"),
        Variant("mps/colocate", "mps", "colocate"),
    ]
    for k in mig_gpus:
        out.append(Variant(f"mig{k}/colocate", "mig", "colocate", k))
        out.append(Variant(f"mig{k}/slurm", "mig", "slurm", k))
    return out


def _run(
    trace: Sequence[TraceJob], base: ClusterShape, v: Variant, options: SimOptions
) -> Measured:
    shape = base.with_sharing(v.mode, mig_gpus=v.mig_gpus)
    opts = SimOptions(
        interference=options.interference,
        slurm_version=SHARING_SLURM_VERSION,
        policies=SimPolicies(device_memory_mib=shape.device_memory_mib),
    )
    cpu = time.process_time()
    result = simulate(trace, shape, v.policy_set, opts)
    cpu = time.process_time() - cpu
    return Measured(summarise(result, cpu), sum(narrowed(result.jobs).values()), cpu)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared/data directory")
    ap.add_argument("--cluster", default="4x4", help="NODESxGPUS")
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--loads", default="1.0,1.2,1.5", help="offered loads (1.0 = the GPUs)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--mig-gpus", default="1,2", help="MIG GPUs per node, one row set each")
    ap.add_argument("--slowdown", choices=("measured", "model"), default="measured")
    add_arguments(ap, "60 jobs, load 1.2, seed 1")
    args = ap.parse_args(argv)
    if args.smoke:
        args.jobs, args.loads, args.seeds = 60, "1.2", "1"
    run = BenchRun.from_args("sharing_sim", args)
    path = args.data / "lucid" / "colocate_info.csv"
    if not path.is_file():
        print(f"bench/sharing_sim: {path} is absent; nothing to measure", file=sys.stderr)
        return 1
    base = ClusterShape.parse(args.cluster, 4)
    profiles, slowdown = lucid_setup(path, args.slowdown)
    options = SimOptions(interference=slowdown)
    loads = [float(x) for x in args.loads.split(",") if x.strip()]
    seeds = _ints(args.seeds)
    variants = _variants(_ints(args.mig_gpus))
    print(
        f"Lucid workload: {args.jobs} 1-GPU jobs over {len(profiles)} configurations, "
        f"cluster {args.cluster} of 80 GB GPUs, shard sharers slowed by: {args.slowdown}; "
        "MPS and MIG by the policy's model"
    )
    cpu_total = 0.0
    header = (
        f"{'load':>5} {'row':<16}{'avg JCT':>9}{'x base':>8}{'p99 JCT':>9}{'makespan':>10}"
        f"{'GPU-h':>8}{'used %':>8}{'narrowed':>9}"
    )
    for load in loads:
        per: dict[str, list[Measured]] = {v.label: [] for v in variants}
        for seed in seeds:
            trace = lucid_workload(
                profiles, base.gpus, seed=seed, shape=LucidWorkload(jobs=args.jobs, load=load)
            )
            for v in variants:
                m = _run(trace, base, v, options)
                cpu_total += m.cpu_s
                per[v.label].append(m)

        def med(ms: list[Measured], key: str) -> float:
            return float(statistics.median(float(getattr(m.summary, key)) for m in ms))

        print(f"\nload {load:g}: medians over seeds {args.seeds}")
        print(header)
        base_jct = med(per["none/slurm"], "avg_jct_s")
        for v in variants:
            ms = per[v.label]
            jct = med(ms, "avg_jct_s")
            figures = {
                "avg_jct_s": [m.summary.avg_jct_s for m in ms],
                "p99_jct_s": [m.summary.p99_jct_s for m in ms],
                "makespan_s": [m.summary.makespan_s for m in ms],
                "gpu_hours": [m.summary.gpu_hours for m in ms],
                "narrowed": [m.narrowed for m in ms],
            }
            target = run.baseline if v.label == "none/slurm" else run.figures
            target[f"load {load:g} {v.label}"] = figures
            print(
                f"{load:>5.2f} {v.label:<16}{jct:>9.0f}{jct / base_jct:>8.2f}"
                f"{med(ms, 'p99_jct_s'):>9.0f}{med(ms, 'makespan_s'):>10.0f}"
                f"{med(ms, 'gpu_hours'):>8.1f}{med(ms, 'used_util_pct'):>8.1f}"
                f"{statistics.median(m.narrowed for m in ms):>9.0f}"
            )
    runs = len(loads) * len(seeds) * len(variants)
    print(f"\nCPU: {cpu_total:.1f} s for {runs} simulations ({cpu_total / runs:.2f} s each)")
    run.figures["cpu_s_per_simulation"] = cpu_total / runs
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Analysis: where one policy set loses to the Pollux baseline, job by job (issue 34).

Runs a set of ours (default ``all``) and a Pollux baseline (default ``pollux-slurm``,
:mod:`slurmgpu.sim.pollux`) on the same Pollux workloads, seeds and loads, matches the
jobs by their trace line, and prints side by side:

- **per workload**: mean JCT, queueing delay (submission to first start), run time
  (first start to end), GPU-hours held, restarts per job (resizes and preemptions),
  the share of the cluster held, and the GPU-hours left idle while some job waited
  (submitted, unfinished, holding nothing);
- **per job class** (the trace's GPUs x the job's run time alone at them, the trace's
  batch): jobs, mean JCT, queue and run time, mean GPUs held while running, restarts,
  nodes spanned, the share of jobs that end later under the set, and the class's share
  of the whole JCT difference;
- **per application**: the GPU-time-weighted global batch each trains at and its GPUs.

The baseline is the Pollux run on the same jobs in the same process; ``--set`` and
``--against`` pick any two (a Pollux label or a policy set).

    .venv/bin/python bench/pollux_gap.py [--seeds 1-5] [--loads 1.0,2.0]
    [--workloads 1,2,3,4,5,7] [--set all] [--against pollux-slurm] [--pollux-search 20x10]
    [--costs slurm-22.05-lab]

``--costs``: the simulator's cost set (sim.costs; the measured default, or ``legacy``
for the figures recorded before 2026-12-07), charged to our set as ``SimOptions`` and to
``pollux-slurm`` as its restart costs, as bench/sim_pollux.py does.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.sim.costs import COST_SETS, CostError, CostSet, cost_set
from slurmgpu.sim.costs import DEFAULT as DEFAULT_COSTS
from slurmgpu.sim.loaders import load_trace
from slurmgpu.sim.pollux import POLLUX_BATCH_CEILINGS, PolluxSearch, RestartCosts, simulate_pollux
from slurmgpu.sim.profiles import load_profiles
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.workload import ProfiledJob, TraceJob

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux"
POLLUX = ("pollux-30s", "pollux-slurm")
NODES, PER_NODE = 16, 4
STEP_S = 60.0  # the grid the cluster's occupancy is sampled on
SIZES = ((1, 1), (2, 4), (5, 8), (9, 64))
LENGTHS_H = ((0.0, 0.5), (0.5, 2.0), (2.0, 8.0), (8.0, math.inf))


@dataclass(frozen=True, slots=True)
class JobView:
    """One job's course under one set, in the terms both simulators share."""

    line: int
    app: str
    submit_s: float
    first_start_s: float
    end_s: float
    # (start, end, GPUs per node) of every stretch it held GPUs
    spans: tuple[tuple[float, float, tuple[int, ...]], ...]
    restarts: int
    # (GPU-seconds, global batch) of every stretch
    batches: tuple[tuple[float, int], ...]

    @property
    def jct(self) -> float:
        return self.end_s - self.submit_s

    @property
    def queue(self) -> float:
        return self.first_start_s - self.submit_s

    @property
    def run(self) -> float:
        return self.end_s - self.first_start_s

    @property
    def gpu_s(self) -> float:
        return sum((b - a) * sum(p) for a, b, p in self.spans)

    @property
    def held_s(self) -> float:
        return sum(b - a for a, b, _ in self.spans)

    @property
    def nodes(self) -> float:
        """Nodes spanned, weighted by time held."""
        held = self.held_s
        if held <= 0:
            return math.nan
        return sum((b - a) * sum(1 for g in p if g) for a, b, p in self.spans) / held


def _ours(
    trace: Sequence[TraceJob], policy_set: str, costs: CostSet, ceiling: str
) -> dict[int, JobView]:
    ceilings = POLLUX_BATCH_CEILINGS if ceiling == "pollux" else ()
    options = SimOptions.of_costs(costs, batch_ceilings=ceilings)
    run = simulate(trace, ClusterShape(NODES, PER_NODE), policy_set, options)
    out: dict[int, JobView] = {}
    for j in run.jobs:
        spans = tuple(
            (r.start_s, r.end_s if not math.isnan(r.end_s) else run.end_s, r.placement)
            for r in j.runs
            if r.kind == "gpu"
        )
        model = j.model
        batches = tuple(
            ((b - a) * sum(p), model.best(p).batch if isinstance(model, ProfiledJob) else 0)
            for a, b, p in spans
            if sum(p)
        )
        out[j.spec.line] = JobView(
            j.spec.line,
            j.name,
            j.origin_s,
            j.first_start_s,
            j.end_s,
            spans,
            max(0, len(j.runs) - 1),
            batches,
        )
    return out


def _pollux(
    trace: Sequence[TraceJob], label: str, seed: int, search: str, costs: CostSet
) -> dict[int, JobView]:
    pop, _, gens = search.partition("x")
    opts = PolluxSearch(population=int(pop), generations=int(gens), seed=seed)
    restart = RestartCosts.pollux() if label == "pollux-30s" else RestartCosts.of_costs(costs)
    res = simulate_pollux(trace, costs=restart, search=opts)
    out: dict[int, JobView] = {}
    for tj, j in zip(trace, res.jobs, strict=True):
        spans: list[tuple[float, float, tuple[int, ...]]] = []
        for i, (at, alloc) in enumerate(j.history):
            until = j.history[i + 1][0] if i + 1 < len(j.history) else j.end_s
            if alloc:
                spans.append((at, min(until, j.end_s), alloc))
        batches = []
        for a, b, p in spans:
            placement = tuple(g for g in p if g)
            # its batch in the first noise slice (it grows later in training)
            batches.append(((b - a) * sum(p), j.goodputs.on(placement, 0)[1]))
        out[tj.line] = JobView(
            tj.line,
            j.app.name,
            j.submit_s,
            spans[0][0] if spans else math.nan,
            j.end_s,
            tuple(spans),
            j.resizes + j.preemptions,
            tuple(batches),
        )
    return out


def _views(
    trace: Sequence[TraceJob],
    which: str,
    seed: int,
    search: str,
    costs: CostSet,
    ceiling: str = "submitted",
) -> dict[int, JobView]:
    if which in POLLUX:
        return _pollux(trace, which, seed, search, costs)
    return _ours(trace, which, costs, ceiling)


Occupancy = tuple[float, float, float]


def _occupancy(jobs: Iterable[JobView]) -> Occupancy:
    """(mean share of the cluster held over the makespan, GPU-hours idle while a job
    waits, of them while a job that never ran waits), on a ``STEP_S`` grid. The rest of
    the idle time beside waiting jobs is beside restarting ones (a resize, a preemption)."""
    views = list(jobs)
    if not views:
        return math.nan, math.nan, math.nan
    t0 = min(v.submit_s for v in views)
    t1 = max(v.end_s for v in views)
    n = math.ceil((t1 - t0) / STEP_S) + 1
    held = np.zeros(n + 1)
    active = np.zeros(n + 1)
    running = np.zeros(n + 1)
    new = np.zeros(n + 1)  # submitted, not yet started

    def idx(t: float) -> int:
        return min(n, max(0, math.ceil((t - t0) / STEP_S)))

    for v in views:
        active[idx(v.submit_s)] += 1
        active[idx(v.end_s)] -= 1
        new[idx(v.submit_s)] += 1
        new[idx(v.first_start_s if not math.isnan(v.first_start_s) else v.end_s)] -= 1
        for a, b, p in v.spans:
            held[idx(a)] += sum(p)
            held[idx(b)] -= sum(p)
            running[idx(a)] += 1
            running[idx(b)] -= 1
    gpus = np.cumsum(held)[:n]
    waiting = (np.cumsum(active) - np.cumsum(running))[:n] > 0
    cap = NODES * PER_NODE
    idle = np.clip(cap - gpus, 0, None)
    fresh = np.cumsum(new)[:n] > 0
    return (
        float(gpus.mean() / cap),
        float(idle[waiting].sum() * STEP_S / 3600.0),
        float(idle[fresh].sum() * STEP_S / 3600.0),
    )


def _size_class(gpus: int) -> str:
    for lo, hi in SIZES:
        if lo <= gpus <= hi:
            return f"{lo}" if lo == hi else f"{lo}-{hi}"
    return "?"


def _length_class(hours: float) -> str:
    for lo, hi in LENGTHS_H:
        if lo <= hours < hi:
            return f"{lo:g}-{hi:g}h" if hi != math.inf else f">{lo:g}h"
    return "?"


def _mean(values: Iterable[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.mean(vals) if vals else math.nan


def _seeds(text: str) -> list[int]:
    lo, sep, hi = text.partition("-")
    return list(range(int(lo), int(hi) + 1)) if sep else [int(x) for x in text.split(",")]


Pair = tuple[JobView, JobView, TraceJob]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--seeds", default="1-5")
    ap.add_argument("--loads", default="1.0,2.0")
    ap.add_argument("--workloads", default="1,2,3,4,5,7")
    ap.add_argument("--set", dest="ours", default="all")
    ap.add_argument("--against", default="pollux-slurm")
    ap.add_argument("--pollux-search", default="20x10")
    ap.add_argument(
        "--costs",
        default=DEFAULT_COSTS,
        help=f"the simulator's cost set (sim.costs: {', '.join(COST_SETS)})",
    )
    ap.add_argument(
        "--batch-ceiling",
        choices=("submitted", "pollux"),
        default="submitted",
        help="our batch-adaptive sets' upper batch limit: the batch each job was submitted "
        "with (default), or the largest Pollux's artifact lets the application train at",
    )
    add_arguments(ap, "workload 1, first 40 jobs, seed 1, load 1.0")
    args = ap.parse_args()
    try:
        costs = cost_set(args.costs)
    except CostError as exc:
        ap.error(str(exc))
    run = BenchRun.from_args("pollux_gap", args)
    if not (args.data / "profiles").is_dir():
        print(f"skipped: no Pollux data under {args.data}")
        run.figures = {"skipped": f"no Pollux data under {args.data}"}
        run.write(args.json_out)
        return 0
    profiles = load_profiles(args.data / "profiles")
    seeds = [1] if args.smoke else _seeds(args.seeds)
    loads = [1.0] if args.smoke else [float(x) for x in args.loads.split(",")]
    workloads = [1] if args.smoke else [int(x) for x in args.workloads.split(",")]
    limit = 40 if args.smoke else None
    a, b = args.ours, args.against
    print(f"costs: {costs.label}; our batch-adaptive sets' batch ceiling: {args.batch_ceiling}")
    cpu0 = time.process_time()
    figures: dict[str, dict[str, float]] = {}
    for load in loads:
        folder = args.data / ("workloads" if load == 1.0 else f"workloads-{load:.1f}")
        pairs: list[Pair] = []
        rows = []
        for w in workloads:
            for seed in seeds:
                trace = load_trace(folder / f"workload-{w}.csv", profiles, seed=seed)
                trace = trace[:limit] if limit is not None else trace
                ours = _views(trace, a, seed, args.pollux_search, costs, args.batch_ceiling)
                theirs = _views(trace, b, seed, args.pollux_search, costs, args.batch_ceiling)
                matched = [(ours[t.line], theirs[t.line], t) for t in trace]
                matched = [m for m in matched if not (math.isnan(m[0].end_s + m[1].end_s))]
                pairs.extend(matched)
                rows.append(
                    (w, seed, matched, _occupancy(ours.values()), _occupancy(theirs.values()))
                )
        figures[f"{load:g}"] = _report(load, a, b, rows, pairs)
    cpu = time.process_time() - cpu0
    print(
        f"\n{len(loads)} load(s) x {len(workloads)} workload(s) x {len(seeds)} seed(s): "
        f"{cpu:.1f} s CPU"
    )
    run.figures = {"by_load": figures, "cpu_s": cpu}
    run.baseline = {"against": b, "costs": costs.name, "batch_ceiling": args.batch_ceiling}
    run.write(args.json_out)
    return 0


def _report(
    load: float,
    a: str,
    b: str,
    rows: Sequence[tuple[int, int, list[Pair], Occupancy, Occupancy]],
    pairs: Sequence[Pair],
) -> dict[str, float]:
    print(f"\nload {load:g}: {a} (A) against {b} (B), {len(pairs)} matched jobs")
    print(
        f"{'workload':>8} {'JCT A':>7} {'JCT B':>7} {'A/B':>5} {'queue A':>7} {'queue B':>7} "
        f"{'run A':>7} {'run B':>7} {'GPUh A':>6} {'GPUh B':>6} {'rst A':>5} {'rst B':>5} "
        f"{'held A':>6} {'held B':>6} {'idleW A':>7} {'idleW B':>7} {'idleN A':>7} {'idleN B':>7}"
    )
    by_w: dict[int, list[tuple[list[Pair], Occupancy, Occupancy]]] = defaultdict(list)
    for w, _seed, matched, occ_a, occ_b in rows:
        by_w[w].append((matched, occ_a, occ_b))
    for w, runs in sorted(by_w.items()):
        ps = [p for m, _, _ in runs for p in m]
        n_runs = len(runs)
        print(
            f"{w:>8} {_mean(x.jct for x, _, _ in ps):>7,.0f} "
            f"{_mean(y.jct for _, y, _ in ps):>7,.0f} "
            f"{_mean(x.jct for x, _, _ in ps) / _mean(y.jct for _, y, _ in ps):>5.2f} "
            f"{_mean(x.queue for x, _, _ in ps):>7,.0f} {_mean(y.queue for _, y, _ in ps):>7,.0f} "
            f"{_mean(x.run for x, _, _ in ps):>7,.0f} {_mean(y.run for _, y, _ in ps):>7,.0f} "
            f"{sum(x.gpu_s for x, _, _ in ps) / 3600 / n_runs:>6,.0f} "
            f"{sum(y.gpu_s for _, y, _ in ps) / 3600 / n_runs:>6,.0f} "
            f"{_mean(x.restarts for x, _, _ in ps):>5.2f} "
            f"{_mean(y.restarts for _, y, _ in ps):>5.2f} "
            f"{100 * _mean(o[0] for _, o, _ in runs):>5.0f}% "
            f"{100 * _mean(o[0] for _, _, o in runs):>5.0f}% "
            f"{_mean(o[1] for _, o, _ in runs):>7,.1f} {_mean(o[1] for _, _, o in runs):>7,.1f} "
            f"{_mean(o[2] for _, o, _ in runs):>7,.1f} {_mean(o[2] for _, _, o in runs):>7,.1f}"
        )
    print(
        "  (queue: submission to first start; run: first start to end; GPUh: held per run; "
        "rst: restarts per job; held: mean share of the cluster held; idleW: GPU-hours idle "
        "while a job waited, per run; idleN: of them while a job that never ran waited)"
    )
    total_diff = sum(x.jct - y.jct for x, y, _ in pairs)
    classes: dict[tuple[str, str], list[Pair]] = defaultdict(list)
    for p in pairs:
        t = p[2]
        alone_h = t.model.run_time(t.gpus, PER_NODE) / 3600.0
        classes[(_size_class(t.gpus), _length_class(alone_h))].append(p)
    print(
        f"\n{'GPUs':>5} {'alone':>7} {'jobs':>5} {'JCT A':>7} {'JCT B':>7} {'queue A':>7} "
        f"{'queue B':>7} {'run A':>7} {'run B':>7} {'gpus A':>6} {'gpus B':>6} {'rst A':>5} "
        f"{'rst B':>5} {'nodes A':>7} {'nodes B':>7} {'later':>5} {'of diff':>7}"
    )
    order = {f"{lo}" if lo == hi else f"{lo}-{hi}": i for i, (lo, hi) in enumerate(SIZES)}
    for (size, length), ps in sorted(
        classes.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1])
    ):
        diff = sum(x.jct - y.jct for x, y, _ in ps)
        print(
            f"{size:>5} {length:>7} {len(ps):>5} {_mean(x.jct for x, _, _ in ps):>7,.0f} "
            f"{_mean(y.jct for _, y, _ in ps):>7,.0f} {_mean(x.queue for x, _, _ in ps):>7,.0f} "
            f"{_mean(y.queue for _, y, _ in ps):>7,.0f} {_mean(x.run for x, _, _ in ps):>7,.0f} "
            f"{_mean(y.run for _, y, _ in ps):>7,.0f} "
            f"{_mean(x.gpu_s / x.held_s for x, _, _ in ps if x.held_s):>6.1f} "
            f"{_mean(y.gpu_s / y.held_s for _, y, _ in ps if y.held_s):>6.1f} "
            f"{_mean(x.restarts for x, _, _ in ps):>5.2f} "
            f"{_mean(y.restarts for _, y, _ in ps):>5.2f} "
            f"{_mean(x.nodes for x, _, _ in ps):>7.2f} {_mean(y.nodes for _, y, _ in ps):>7.2f} "
            f"{100 * sum(x.jct > y.jct for x, y, _ in ps) / len(ps):>4.0f}% "
            f"{100 * diff / total_diff if total_diff else math.nan:>6.0f}%"
        )
    print(
        "  (alone: run time at the trace's GPUs and batch; gpus: mean GPUs while holding any; "
        "later: jobs ending later under A; of diff: share of the total JCT difference A - B)"
    )
    apps: dict[str, list[Pair]] = defaultdict(list)
    for p in pairs:
        apps[p[0].app].append(p)
    print(
        f"\n{'app':>12} {'jobs':>5} {'JCT A':>7} {'JCT B':>7} {'batch A':>8} {'batch B':>8} "
        f"{'gpus A':>6} {'gpus B':>6}"
    )
    for app, ps in sorted(apps.items()):
        print(
            f"{app:>12} {len(ps):>5} {_mean(x.jct for x, _, _ in ps):>7,.0f} "
            f"{_mean(y.jct for _, y, _ in ps):>7,.0f} "
            f"{_weighted_batch(x for x, _, _ in ps):>8,.0f} "
            f"{_weighted_batch(y for _, y, _ in ps):>8,.0f} "
            f"{_mean(x.gpu_s / x.held_s for x, _, _ in ps if x.held_s):>6.1f} "
            f"{_mean(y.gpu_s / y.held_s for _, y, _ in ps if y.held_s):>6.1f}"
        )
    print(
        "  (batch: GPU-time-weighted global batch; B's at the first noise slice, the least "
        "it trains at)"
    )
    return {
        "avg_jct_a_s": _mean(x.jct for x, _, _ in pairs),
        "avg_jct_b_s": _mean(y.jct for _, y, _ in pairs),
        "avg_queue_a_s": _mean(x.queue for x, _, _ in pairs),
        "avg_queue_b_s": _mean(y.queue for _, y, _ in pairs),
        "avg_run_a_s": _mean(x.run for x, _, _ in pairs),
        "avg_run_b_s": _mean(y.run for _, y, _ in pairs),
    }


def _weighted_batch(views: Iterable[JobView]) -> float:
    num = den = 0.0
    for v in views:
        for gs, batch in v.batches:
            num += gs * batch
            den += gs
    return num / den if den else math.nan


if __name__ == "__main__":
    sys.exit(main())

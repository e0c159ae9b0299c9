"""A trace slice replayed through the real site lab, per policy set (issue 33 item 2).

Starts a lab cluster with the site profile (slurmdbd, accounts, 8 Unix users, fairshare,
QOS preemption; ``--nodes`` of 4 fake GPUs each), loads a trace (``--trace``: a Pollux
workload with the profiles under ``--profiles``, read from ../shared/data and never
copied; or any format ``sgpu simulate`` reads, sacct's included), takes its first
``--first`` jobs (or those of the first ``--window`` trace seconds) and compresses time
by ``--compression`` C: each job is submitted at ``submit / C`` as its trace user
(``user3`` → ``sgpu-u3``) with ``sgpu submit --malleable``, and runs the stand-in
``slurmgpu.lab.replayload``, which must do the job's work at its profile's speed times C
on its current GPU count. For each set of ``--sets`` a fresh daemon stack runs that
set's policies in enforce mode (sim/replayplan.policy_sections: the simulator's
settings, their pacing divided by C), and every job is watched to its end. Printed per
set: a table per job (JCT, GPU-hours, resizes, preemptions), the set's average and p99
JCT, makespan and median resize phases; then each set against ``slurm`` (no policy: the
baseline, replayed in the same run on the same lab), and the simulator on the same jobs
(their one-node sizes, ranges and limits; trace time, its own costs) divided by C,
simulator ÷ real.

Every job is capped at one node (4 GPUs): the stand-in is one process on fake GPUs; jobs
that would then run longer than ``--max-run`` wall seconds are left out (counted).
Figures are wall seconds of the compressed replay (times C for trace seconds). The
daemon runs as root (the lab's administrator), the jobs as the site users.

    .venv/bin/python bench/replay_real.py --first 30 --compression 60 --sets slurm,malleable
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmgpu.lab.benchrun import BenchRun, add_arguments  # noqa: E402
from slurmgpu.lab.chroot_python import ChrootPythonError, chroot_python  # noqa: E402
from slurmgpu.lab.cluster import LabCluster, site  # noqa: E402
from slurmgpu.lab.jobcosts import JobCostSamples, PlannedJob, job_cost_samples  # noqa: E402
from slurmgpu.lab.replay import (  # noqa: E402
    ReplayLabError,
    ctld_timeline,
    first_calculation_s,
    replay_on_lab,
    site_python,
    toml_text,
)
from slurmgpu.sim import metrics  # noqa: E402
from slurmgpu.sim.costs import CostError, CostSet, cost_set  # noqa: E402
from slurmgpu.sim.fairshare import (  # noqa: E402
    FairShareConfig,
    parse_fairshare,
)
from slurmgpu.sim.loaders import TraceError, load_trace  # noqa: E402
from slurmgpu.sim.policysets import BATCH_ADAPTIVE  # noqa: E402
from slurmgpu.sim.profiles import load_profiles  # noqa: E402
from slurmgpu.sim.replayplan import (  # noqa: E402
    JobOutcome,
    ReplayError,
    ReplayJob,
    outcomes,
    plan_replay,
    policy_sections,
    render,
    replay_options,
    replayed_trace,
    summarise,
)
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate  # noqa: E402
from slurmgpu.sim.slurmsched import SlurmScheduling  # noqa: E402
from slurmgpu.sim.workload import TraceJob, elastic_batch  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "pollux"


def runuser(user: str) -> list[str]:
    """How the bench (root) becomes a site user to submit as them."""
    return ["runuser", "-u", user, "--"]


def site_fairshare(usage: Mapping[str, float] | None = None) -> FairShareConfig:
    """The site lab's priority as the simulator models it (sim.fairshare), in wall
    seconds (lab.cluster.site.fairshare_toml); ``usage``: what earlier sets on the same
    lab left (:func:`earlier_usage`, ``--one-lab`` only)."""
    config = parse_fairshare(site.fairshare_toml(), "the site lab")
    return replace(config, usage=dict(usage or {}))


def earlier_usage(
    jobs_by_set: Mapping[str, Sequence[Mapping[str, object]]],
    order: Sequence[str],
    policy_set: str,
    compression: float,
) -> dict[str, float]:
    """What the sets replayed before ``policy_set`` on the same lab left in its fair
    share: per user, the seconds its jobs ran (first start to end; billing one per job),
    times C (the simulator's trace seconds). The decay over the minutes between sets
    (half-life a day: under 1 %) is left out."""
    usage: dict[str, float] = {}
    for name in order:
        if name == policy_set:
            break
        for r in jobs_by_set.get(name, ()):
            start, end, user = r.get("started_s"), r.get("ended_s"), r.get("user")
            if isinstance(start, int | float) and isinstance(end, int | float) and end > start:
                usage[str(user)] = usage.get(str(user), 0.0) + (end - start) * compression
    return usage


def lab_scheduling(compression: float) -> SlurmScheduling:
    """The site lab's scheduler as the simulator models it (sim.slurmsched): its
    slurm.conf sets no SchedulerParameters, so Slurm's defaults, in wall seconds, times
    the compression factor (the simulator runs in trace time)."""
    return SlurmScheduling().scaled(compression)


def scheduler_line(args: argparse.Namespace) -> str:
    """One line: the order and the scheduler the simulator side runs."""
    order = "submit order" if args.fifo else "the lab's Fair Tree"
    if args.easy:
        return f"{order}, one EASY-backfill pass at every change"
    s = lab_scheduling(args.compression)
    return (
        f"{order}, Slurm's main pass at every change and backfill every "
        f"{s.bf_interval_s:g} s (resolution {s.bf_resolution_s:g} s, trace time)"
    )


def plan(
    args: argparse.Namespace, policy_set: str, max_gpus: int
) -> tuple[list[TraceJob], list[ReplayJob]]:
    profiles = load_profiles(args.profiles) if args.profiles.is_dir() else None
    trace = load_trace(args.trace, profiles, seed=args.seed, max_gpus=max_gpus)
    if policy_set in BATCH_ADAPTIVE:  # as the simulator runs these sets
        trace = elastic_batch(trace)
    return trace, plan_replay(
        trace,
        compression=args.compression,
        users=[u.name for u in site.USERS],
        first=args.first,
        window_s=args.window,
        max_run_s=args.max_run,
    )


def simulated(
    trace: list[TraceJob],
    args: argparse.Namespace,
    policy_set: str,
    costs: str | None = None,
    per_job: dict[int, tuple[float, ...]] | None = None,
    usage: Mapping[str, float] | None = None,
    first_calc: float | None = None,
    shift: tuple[float, float] = (0.0, 0.0),
    origin_s: float | None = None,
) -> dict[str, float]:
    """The simulator on the replayed jobs (trace time, its 60 s cycle: 1 s of the replay
    at C = 60), its figures divided by C: wall seconds like the replay's. Its costs: the
    cost set ``costs`` (default ``--costs``) measured in wall seconds, and the executor's
    pacing, both times C (sim.replayplan.replay_options); ``"unscaled"``: the bare
    simulator as before 2026-12-07 (the legacy costs in trace time, as if they
    compressed). Its scheduler: Slurm's main and backfill passes with the lab's
    (default) SchedulerParameters, their periods times C (``--easy``: one EASY pass at
    every change, as before). ``usage``: the fair share the lab's earlier sets left;
    ``first_calc``: wall seconds from the replay's start to the lab's first fair-share
    calculation (:func:`first_calculation_s`; None: a period after the first job).
    ``shift``: wall seconds added to the cost set's per-job start-up (first and restarts)
    and to its submission delay (:func:`sensitivity`). ``origin_s``: the replay's start
    in trace time (default: the first submission; :func:`ensemble` moves those)."""
    name = costs or args.costs
    fairshare = None if args.fifo else site_fairshare(None if args.fresh_usage else usage)
    options: SimOptions | None = None
    if name != "unscaled":
        options = replay_options(shifted(cost_set(name), *shift), args.compression, fairshare)
        if options.fairshare is not None and first_calc is not None:
            t0 = origin_s if origin_s is not None else min(j.submit_s for j in trace)
            at = replace(options.fairshare, first_calc_s=t0 + first_calc * args.compression)
            options = replace(options, fairshare=at)
        if not args.easy:
            options = replace(options, scheduling=lab_scheduling(args.compression))
    run = simulate(trace, ClusterShape(args.nodes, 4), policy_set, options)
    r = metrics.summarise(run)
    c = args.compression
    if per_job is not None:  # trace line -> (submit, first start, end, restarts), wall s
        t0 = origin_s if origin_s is not None else min(j.submit_s for j in trace)
        for job in run.jobs:
            per_job[job.spec.line] = (
                (job.submit_s - t0) / c,
                (job.first_start_s - t0) / c,
                (job.end_s - t0) / c,
                float(job.restarts),
            )
    return {
        "avg_jct_s": r.avg_jct_s / c,
        "p99_jct_s": r.p99_jct_s / c,
        "makespan_s": r.makespan_s / c,
    }


def shifted(costs: CostSet, startup_s: float, submit_s: float) -> CostSet:
    """``costs`` with ``startup_s`` added to its per-job start-up (a first start and a
    restart's) and ``submit_s`` to its submission delay, none below zero."""
    if not startup_s and not submit_s:
        return costs
    why = f"shifted by {startup_s:+g} / {submit_s:+g} s (sensitivity)"
    out = costs
    for key, delta in (("first_startup", startup_s), ("startup", startup_s)):
        out = out.with_cost(key, max(0.0, out.cost(key).seconds + delta), why)
    return out.with_cost("submit_delay", max(0.0, out.submit_delay.seconds + submit_s), why)


def sensitivity(
    run: Callable[[tuple[float, float]], dict[str, float]], delta_s: float
) -> dict[str, tuple[float, float]]:
    """The least and the most each figure of ``run`` (the simulator on one set, given a
    shift of its per-job start-up and submission delay) reaches over the 3 x 3 grid of
    both shifted by -``delta_s``, 0 and +``delta_s`` wall seconds: how far the prediction
    moves within that much uncertainty in the two per-job costs it was given. On a
    time-compressed replay half a second is tens of trace seconds per job, and the
    queue (fair-share ranks, whole-node starts) amplifies it."""
    grid = [(a * delta_s, b * delta_s) for a in (-1, 0, 1) for b in (-1, 0, 1)]
    runs = [run(g) for g in grid]
    return {k: (min(r[k] for r in runs), max(r[k] for r in runs)) for k in runs[0]}


def ensemble(
    run: Callable[..., dict[str, float]],
    trace: Sequence[TraceJob],
    compression: float,
    runs: int,
    jitter_s: float,
) -> dict[str, list[float]]:
    """Each figure of ``run`` (the simulator on one set, given a trace and the replay's
    start) over ``runs`` runs: the first as planned, the others with every job submitted
    late by a draw of U(0, ``jitter_s``) wall seconds (seeded by the run's number). A
    replay's schedule is chaotic at the second: one job's start a second apart moves
    which job a free GPU goes to, and the queue carries it on. The mean over the runs is
    the simulator's prediction for a replay whose arrivals are that uncertain; its
    spread is how far one run of it may fall."""
    t0 = min(j.submit_s for j in trace)
    out: dict[str, list[float]] = {}
    for k in range(max(1, runs)):
        draw = random.Random(k)
        late = [0.0 if k == 0 else draw.uniform(0.0, jitter_s) for _ in trace]
        moved = [
            replace(j, submit_s=j.submit_s + d * compression)
            for j, d in zip(trace, late, strict=True)
        ]
        for key, value in run(moved, origin_s=t0).items():
            out.setdefault(key, []).append(value)
    return out


def ensemble_line(name: str, runs: Mapping[str, Sequence[float]], real: Mapping[str, float]) -> str:
    """One set's ensemble: the mean of simulator / real and its p10-p90, per figure."""
    cells = []
    for key, label in (("avg_jct_s", "avg JCT"), ("p99_jct_s", "p99"), ("makespan_s", "makespan")):
        ratios = sorted(v / real[key] for v in runs[key]) if real.get(key) else []
        if not ratios:
            cells.append(f"{label} -")
            continue
        lo, hi = _decile(ratios, 0.1), _decile(ratios, 0.9)
        cells.append(f"{label} {statistics.mean(ratios):.3f} ({lo:.2f}-{hi:.2f})")
    return f"{name:<10} " + ", ".join(cells)


def ensemble_header(args: argparse.Namespace) -> str:
    return (
        f"\n{args.costs} over {max(1, args.ensemble)} runs, every submission late by "
        f"U(0, {args.ensemble_jitter:g} s) in all but the first: mean simulator / real "
        "(p10-p90)"
    )


def _decile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``ordered`` (sorted)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def band_line(name: str, band: Mapping[str, tuple[float, float]], real: Mapping[str, float]) -> str:
    """``slurm: avg JCT 0.94-1.09, p99 ... (simulator / real as the costs move)``."""
    cells = []
    for key, label in (("avg_jct_s", "avg JCT"), ("p99_jct_s", "p99"), ("makespan_s", "makespan")):
        lo, hi = band[key]
        cells.append(f"{label} {lo / real[key]:.2f}-{hi / real[key]:.2f}")
    return f"{name:<10} " + ", ".join(cells)


def lab_job_costs(
    args: argparse.Namespace,
    policy_set: str,
    ctld_log: Path,
    records: Mapping[str, Sequence[Mapping[str, Any]]],
) -> JobCostSamples:
    """The per-job costs (start-up, submission delay, completing) one set's lab logged,
    its jobs as the run planned them (lab.jobcosts)."""
    _, jobs = plan(args, policy_set, max_gpus=4 * args.nodes)
    planned: dict[int, PlannedJob] = {}
    for record in records.get(policy_set, []):
        index, job_id = record.get("index"), record.get("job_id")
        if isinstance(index, int) and isinstance(job_id, int) and 0 <= index < len(jobs):
            job = jobs[index]
            resized = bool(record.get("resizes")) or bool(record.get("restarts"))
            planned[job_id] = PlannedJob(job.gpus, None if resized else job.run_s)
    timeline = ctld_timeline(ctld_log.read_text(errors="replace"))
    return job_cost_samples(timeline, planned, gpus_per_node=4)


def from_json(args: argparse.Namespace) -> int:
    """The simulator side of a saved run, recomputed: its slice planned again from its
    parameters, each set simulated bare (as the run did) and with ``--costs`` x C, both
    against the run's real figures."""
    try:
        doc = json.loads(args.from_json.read_text())
        params = doc["params"]
        real = {**doc.get("baseline", {}), **doc["figures"]}
        for key in ("first", "window", "max_run", "seed", "nodes"):
            setattr(args, key, params[key])
        args.trace, args.profiles = Path(params["trace"]), Path(params["profiles"])
        args.compression = float(params["compression"])
        sets = [s for s in params["sets"].split(",") if s in real and "avg_jct_s" in real[s]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"replay_real: cannot use {args.from_json}: {exc}", file=sys.stderr)
        return 2
    print(
        f"{args.from_json.name}: {doc.get('at', '?')}, C = {args.compression:g}; simulator / "
        f"real, bare (as the run) and with {args.costs} x C (costs and the executor's pacing)"
    )
    print("\n".join(cost_set(args.costs).lines()) if args.costs != "unscaled" else "")
    print(f"with {args.costs}: {scheduler_line(args)}")
    print(f"{'set':<10} {'costs':<16} {'avg JCT':>8} {'p99':>6} {'makespan':>8}")
    figures: dict[str, dict[str, dict[str, float]]] = {}
    bands: dict[str, dict[str, tuple[float, float]]] = {}
    ensembles: dict[str, dict[str, list[float]]] = {}
    lines: dict[str, dict[int, tuple[float, ...]]] = {}
    calc_at: dict[str, float] = dict(doc["figures"].get("first_calc_s", {}))
    if args.labs is not None:  # the run's kept labs: their slurmctld logs
        for policy_set in sets:
            log = args.labs / f"lab-{policy_set}" / "log" / "slurmctld.log"
            found = (
                first_calculation_s(log.read_text(), site.CALC_PERIOD_S) if log.is_file() else None
            )
            if found is not None:
                calc_at[policy_set] = found
    if args.labs is not None:
        for policy_set in sets:
            lab_dir = args.labs / f"lab-{policy_set}"
            if (lab_dir / "log" / "slurmctld.log").is_file():
                same, differ, notes = check_priorities(lab_dir, policy_set)
                print(
                    f"{policy_set}: {same} of {same + differ} initial priorities as Slurm's "
                    "(the fair-share model on the lab's own runs)"
                    + (": " + "; ".join(notes) if notes else "")
                )
    if args.labs is not None:
        pooled = JobCostSamples((), (), ())
        for policy_set in sets:
            log = args.labs / f"lab-{policy_set}" / "log" / "slurmctld.log"
            if log.is_file():
                samples = lab_job_costs(args, policy_set, log, doc["figures"].get("jobs", {}))
                pooled = pooled + samples
                print(f"{policy_set}: per-job costs measured on the lab (slurmctld's log)")
                print("\n".join(f"  {line}" for line in samples.lines()))
        if pooled.startup:
            print("every set's, pooled (what a cost set from this run would take)")
            print("\n".join(f"  {line}" for line in pooled.lines()))
    if calc_at:
        print(
            "first fair-share calculation (s after the replay's start): "
            + ", ".join(f"{k} {v:.1f}" for k, v in calc_at.items())
        )
    for policy_set in sets:
        trace, jobs = plan(args, policy_set, max_gpus=4 * args.nodes)
        replayed = replayed_trace(trace, jobs, args.compression)
        figures[policy_set] = {}
        for name in ("unscaled", args.costs):
            per_job: dict[int, tuple[float, ...]] = {}
            # a run on one lab (all before 2026-12-07 05:24): each set began with the
            # fair-share usage of the sets before it; a lab per set began with none
            usage = (
                earlier_usage(
                    doc["figures"].get("jobs", {}),
                    params["sets"].split(","),
                    policy_set,
                    args.compression,
                )
                if params.get("one_lab", True)
                else {}
            )
            sim = simulated(
                replayed, args, policy_set, name, per_job, usage, calc_at.get(policy_set)
            )
            if name == args.costs:
                lines[policy_set] = {
                    i: per_job[trace[j.source].line]
                    for i, j in enumerate(jobs)
                    if trace[j.source].line in per_job
                }
            ratios = {k: sim[k] / real[policy_set][k] for k in sim}
            figures[policy_set][name] = ratios
            if name == args.costs and name != "unscaled" and args.sensitivity > 0:
                calc = calc_at.get(policy_set)
                bands[policy_set] = sensitivity(
                    partial(simulated, replayed, args, policy_set, name, None, usage, calc),
                    args.sensitivity,
                )
            if name == args.costs and name != "unscaled" and args.ensemble > 0:
                ensembles[policy_set] = ensemble(
                    partial(
                        simulated,
                        args=args,
                        policy_set=policy_set,
                        costs=name,
                        usage=usage,
                        first_calc=calc_at.get(policy_set),
                    ),
                    replayed,
                    args.compression,
                    args.ensemble,
                    args.ensemble_jitter,
                )
            print(
                f"{policy_set:<10} {name:<16} {ratios['avg_jct_s']:>8.3f} "
                f"{ratios['p99_jct_s']:>6.3f} {ratios['makespan_s']:>8.3f}"
            )
    for name in ("unscaled", args.costs):
        off = [abs(figures[s][name][k] - 1) for s in figures for k in figures[s][name]]
        if off:
            print(f"{name}: mean |sim / real - 1| {statistics.mean(off):.3f}, worst {max(off):.3f}")
    if bands:
        print(
            f"\n{args.costs} with its per-job start-up and submission delay each "
            f"-{args.sensitivity:g}, 0, +{args.sensitivity:g} wall s: simulator / real ranges"
        )
        for policy_set, band in bands.items():
            print(band_line(policy_set, band, real[policy_set]))
    if ensembles:
        print(ensemble_header(args))
        for policy_set, runs in ensembles.items():
            print(ensemble_line(policy_set, runs, real[policy_set]))
    if args.per_job:
        for policy_set in sets:
            print_per_job(policy_set, doc["figures"]["jobs"].get(policy_set, []), lines[policy_set])
    return 0


def rebuild(args: argparse.Namespace) -> int:
    """A record for ``--from-json`` out of kept replay directories (a run that stopped
    before writing its own): ``--rebuild-from`` holds ``replay-SET`` for each set of
    ``--sets``, in the order they ran (or is the one set's directory). Per set, each
    job's Slurm start and end (whole seconds) from the daemon's store (``state.db``),
    its plan index from its stand-in log (``job-INDEX.jsonl``, which names its job id),
    its arrival from the replay plan of this command's parameters; the set's start is
    put at the least-delayed submission (Slurm's submit time - the plan's arrival)."""
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not sets or args.json_out is None:
        print("replay_real: --rebuild-from needs --sets and --json-out", file=sys.stderr)
        return 2
    figures: dict[str, object] = {"rebuilt_from": str(args.rebuild_from)}
    jobs_by_set: dict[str, list[dict[str, object]]] = {}
    for policy_set in sets:
        src = args.rebuild_from / f"replay-{policy_set}"
        if len(sets) == 1 and not src.is_dir():
            src = args.rebuild_from
        try:
            outs = _rebuilt_set(args, policy_set, src)
        except (OSError, ValueError, KeyError, sqlite3.Error, TraceError, ReplayError) as exc:
            print(f"replay_real: cannot rebuild {policy_set} from {src}: {exc}", file=sys.stderr)
            return 2
        summary = summarise(outs)
        figures[policy_set] = summary.as_dict()
        jobs_by_set[policy_set] = [o.as_dict() for o in outs]
        print(f"{len(outs)} jobs of {policy_set} rebuilt from {src}: {summary.as_dict()}")
    figures["jobs"] = jobs_by_set
    run = BenchRun.from_args("replay_real", args)
    run.figures = figures
    run.write(args.json_out)
    return 0


def _rebuilt_set(args: argparse.Namespace, policy_set: str, src: Path) -> list[JobOutcome]:
    _, jobs = plan(args, policy_set, max_gpus=4 * args.nodes)
    index_of: dict[int, int] = {}
    for log in src.glob("job-*.jsonl"):
        with log.open() as fh:
            first = json.loads(fh.readline())
        index_of[int(first["job_id"])] = int(log.stem.split("-", 1)[1])
    with sqlite3.connect(f"file:{src / 'state.db'}?mode=ro", uri=True) as db:
        listed = db.execute(
            "select job_id, name, user, submit_time, start_time, end_time, state, "
            "restart_count from jobs"
        ).fetchall()

    def at(text: str | None) -> float | None:
        return None if not text else datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()

    rows = {index_of[r[0]]: r for r in listed if r[0] in index_of and index_of[r[0]] < len(jobs)}
    if not rows:
        raise ValueError("no job there matches the plan")
    t0 = min(float(at(r[3]) or math.inf) - jobs[i].at_s for i, r in rows.items())
    outs = []
    for i, (_, name, user, _, start, end, state, restarts) in sorted(rows.items()):
        s0, e0 = at(start), at(end)
        outs.append(
            JobOutcome(
                i,
                None,
                name,
                user,
                jobs[i].at_s,
                None if s0 is None else s0 - t0,
                None if e0 is None else e0 - t0,
                state,
                0.0,
                int(restarts or 0),
                0,
                0,
            )
        )
    return outs


def check_priorities(lab_dir: Path, policy_set: str) -> tuple[int, int, list[str]]:
    """The simulator's fair-share model held to what Slurm computed: each job's initial
    priority in the lab's slurmctld log (``InitPrio``) against the model's (sim.fairshare)
    fed the lab's own runs (the log's allocations and ends), its users (the daemon's
    store) and its calculation times (every PriorityCalcPeriod from the decay thread's
    start). Returns (as Slurm's, differing, the first differences)."""
    timeline = ctld_timeline((lab_dir / "log" / "slurmctld.log").read_text(errors="replace"))
    store = lab_dir / f"replay-{policy_set}" / "state.db"
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        users = {int(j): str(u) for j, u in db.execute("SELECT job_id, user FROM jobs")}
    config = site_fairshare()
    start = timeline.decay_start
    same, differ, notes = 0, 0, list[str]()
    for job_id, (at, prio) in sorted(timeline.submitted.items()):
        if start is None or job_id not in users:
            continue
        ticks = int((at - start).total_seconds() // config.calc_period_s)
        tick = start + timedelta(seconds=ticks * config.calc_period_s)
        usage: dict[str, float] = {}
        for other, runs in timeline.runs.items():
            for begin, end in runs:
                ran = ((min(end, tick) if end else tick) - begin).total_seconds()
                if ran > 0 and other in users:
                    usage[users[other]] = usage.get(users[other], 0.0) + ran
        factors = config.factors(usage)
        model = config.base + config.weight_fairshare * factors.get(users[job_id], 0.0)
        if abs(model - prio) < 1:
            same += 1
        else:
            differ += 1
            if len(notes) < 5:
                notes.append(f"job {job_id} ({users[job_id]}): Slurm {prio}, model {model:.0f}")
    return same, differ, notes


def print_per_job(
    policy_set: str, real_jobs: list[dict[str, object]], sim: dict[int, tuple[float, ...]]
) -> None:
    """Each job's wait and JCT, real beside simulated (wall s), largest JCT gap first."""
    rows = []
    for r in real_jobs:
        index = r.get("index")
        if not isinstance(index, int) or index not in sim:
            continue
        sub, start, end, restarts = sim[index]
        real_wait = float(str(r["started_s"])) - float(str(r["submitted_s"]))
        real_jct = float(str(r["jct_s"]))
        rows.append(
            (end - sub - real_jct, index, r, start - sub, end - sub, real_wait, real_jct, restarts)
        )
    rows.sort(key=lambda row: -abs(row[0]))
    print(f"\n== {policy_set}: per job, simulated - real (wall s), largest gap first")
    if rows:
        waits = [abs(w - rw) for _, _, _, w, _, rw, _, _ in rows]
        print(
            f"mean |wait gap| {statistics.mean(waits):.1f} s, "
            f"median {statistics.median(waits):.1f}; "
            f"start order agreement (Kendall tau) {_start_order_tau(real_jobs, sim):.2f}"
        )
    print(
        f"{'#':>3} {'name':<12} {'user':<8} {'resz':>4} {'sim':>3} {'wait real':>9} {'sim':>6} "
        f"{'JCT real':>8} {'sim':>7} {'gap':>7}"
    )
    for gap, index, r, wait, jct, real_wait, real_jct, restarts in rows:
        print(
            f"{index:>3} {r['name']!s:<12} {r['user']!s:<8} {r['resizes']!s:>4} {restarts:>3.0f} "
            f"{real_wait:>9.1f} {wait:>6.1f} {real_jct:>8.1f} {jct:>7.1f} {gap:>+7.1f}"
        )


def _start_order_tau(
    real_jobs: list[dict[str, object]], sim: dict[int, tuple[float, ...]]
) -> float:
    """Kendall's tau between the real and the simulated start times of the same jobs
    (1: every pair starts in the same order; pairs tied in either count as neither)."""
    starts = [
        (float(str(r["started_s"])), sim[i][1])
        for r in real_jobs
        if isinstance(i := r.get("index"), int) and i in sim
    ]
    agree = disagree = 0
    for a in range(len(starts)):
        for b in range(a + 1, len(starts)):
            d = (starts[a][0] - starts[b][0]) * (starts[a][1] - starts[b][1])
            agree += d > 0
            disagree += d < 0
    pairs = len(starts) * (len(starts) - 1) // 2
    return (agree - disagree) / pairs if pairs else math.nan


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=DATA / "workloads" / "workload-1.csv")
    p.add_argument("--profiles", type=Path, default=DATA / "profiles")
    p.add_argument("--first", type=int, default=30, help="the first N jobs of the trace")
    p.add_argument("--window", type=float, default=None, help="or those of the first S s")
    p.add_argument("--compression", type=float, default=60.0, help="trace s per wall s")
    p.add_argument("--sets", default="slurm,malleable", help="comma-separated policy sets")
    p.add_argument(
        "--max-run", type=float, default=300.0, help="leave out jobs longer than S wall s"
    )
    p.add_argument("--nodes", type=int, default=4, help="site lab nodes (4 GPUs each)")
    p.add_argument("--seed", type=int, default=1, help="the trace's seeded users and limits")
    p.add_argument("--timeout", type=float, default=1200.0, help="wall s per set at most")
    p.add_argument("--no-sim", action="store_true", help="no simulator run to compare")
    p.add_argument(
        "--costs",
        default="replay-stand-in",
        help="the simulator's cost set (sim.costs; 'unscaled': the bare simulator as before)",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="RUN.json",
        help="no lab: the simulator side only, on the slice of a saved run (its --json-out), "
        "beside that run's real figures, unscaled and with --costs",
    )
    p.add_argument(
        "--fifo",
        action="store_true",
        help="the simulator orders its queue by submission, not by the lab's fair share",
    )
    p.add_argument(
        "--labs",
        type=Path,
        metavar="DIR",
        help="with --from-json: the run's kept labs (DIR/lab-SET), whose slurmctld logs "
        "say when each lab's fair-share calculations fell",
    )
    p.add_argument(
        "--one-lab",
        action="store_true",
        help="one lab for every set (faster; each set then inherits the earlier sets' "
        "history and fair-share usage; the simulator starts from that usage, not the "
        "history)",
    )
    p.add_argument(
        "--fresh-usage",
        action="store_true",
        help="the simulator starts every set from no fair-share usage, not from what the "
        "sets replayed before it on the same lab left",
    )
    p.add_argument(
        "--easy",
        action="store_true",
        help="the simulator runs one EASY-backfill pass at every change, not Slurm's main "
        "and conservative backfill passes at the lab's periods",
    )
    p.add_argument(
        "--sensitivity",
        type=float,
        default=0.5,
        metavar="S",
        help="also the simulator with its per-job start-up and submission delay each "
        "shifted by -S, 0 and +S wall seconds: the range of simulator / real (0: off)",
    )
    p.add_argument(
        "--ensemble",
        type=int,
        default=0,
        metavar="K",
        help="also the simulator over K runs, every job's submission late by U(0, "
        "--ensemble-jitter) wall seconds in all but the first: the mean of simulator / "
        "real and its p10-p90 (0: off)",
    )
    p.add_argument(
        "--ensemble-jitter",
        type=float,
        default=1.0,
        metavar="S",
        help="the ensemble's largest lateness per submission, wall s (default 1: the "
        "replay's submissions were 0-1.2 s late on its 1 s tick until 2026-12-07)",
    )
    p.add_argument(
        "--per-job",
        action="store_true",
        help="with --from-json: each job's wait and JCT, real beside simulated",
    )
    p.add_argument(
        "--rebuild-from",
        type=Path,
        metavar="REPLAY_DIR",
        help="no lab: a record for --from-json out of a kept replay directory of one set "
        "(--sets NAME; the daemon's state.db and the jobs' job-N.jsonl), with this "
        "command's --first/--compression/... as the run's",
    )
    p.add_argument(
        "--slurm-root",
        type=Path,
        default=None,
        help="a Slurm chroot (scripts/slurm_chroot.sh) to run the lab's release from",
    )
    p.add_argument(
        "--running-lab",
        action="store_true",
        help="replay on the site lab SLURM_CONF points at (--nodes of it) instead of one's own",
    )
    p.add_argument("--ctld-port", type=int, default=6951)
    p.add_argument("--slurmd-port-base", type=int, default=17401)
    add_arguments(p, "8 jobs, the slurm set only")
    args = p.parse_args()
    if args.costs != "unscaled":
        try:
            cost_set(args.costs)
        except CostError as exc:
            p.error(str(exc))
    if args.from_json is not None:
        return from_json(args)
    if args.rebuild_from is not None:
        return rebuild(args)
    if args.smoke:
        args.first, args.sets = 8, "slurm"
    if not args.trace.is_file():
        print(f"replay_real: skipped: no trace at {args.trace} (see shared/data)", flush=True)
        return 0
    try:
        python = site_python()
    except ReplayLabError as exc:
        print(f"replay_real: {exc}", file=sys.stderr)
        return 2
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    try:
        for policy_set in sets:  # a bad trace, slice or set: one line, before any lab
            policy_sections(policy_set, args.compression)
            plan(args, policy_set, max_gpus=4 * args.nodes)
    except (TraceError, ReplayError) as exc:
        print(f"replay_real: {exc}", file=sys.stderr)
        return 2
    run = BenchRun.from_args("replay_real", args)
    tmp = Path(tempfile.mkdtemp(prefix="sgpu-bench-replay-", dir="/tmp"))
    tmp.chmod(0o755)
    lab: LabCluster | None = None
    as_user: Callable[[str], list[str]] = runuser
    users_env: dict[str, str] = {}
    if args.running_lab:  # the site lab SLURM_CONF points at (a test's), host Slurm
        conf = Path(os.environ.get("SLURM_CONF", ""))
        if not conf.is_file():
            p.error("--running-lab needs SLURM_CONF set to a running site lab's slurm.conf")
        lab_env = {"SLURM_CONF": str(conf)}
        gres_conf, bin_dir = conf.parent / "gres.conf", None
        work_root = tmp
    else:  # set by bring_up
        lab_env, gres_conf, bin_dir, work_root = {}, tmp, None, tmp

    def bring_up(name: str) -> LabCluster:
        """A fresh site lab under ``tmp/name``: its own slurmdbd, so no set inherits the
        history (rightsizing) or the fair-share usage of the sets before it, as each of
        the simulator's runs starts empty."""
        nonlocal lab_env, gres_conf, bin_dir, work_root, python, users_env, as_user
        fresh = LabCluster(
            tmp / name,
            nodes=args.nodes,
            ctld_port=args.ctld_port,
            slurmd_port_base=args.slurmd_port_base,
            slurm_root=str(args.slurm_root) if args.slurm_root else None,
            profile="site",
        )
        print(f"site lab: {args.nodes} nodes under {tmp / name}", flush=True)
        elapsed = fresh.up(timeout_s=180)
        print(f"site lab idle after {elapsed:.1f} s", flush=True)
        if fresh.chroot is not None:  # the users' commands and jobs run inside the chroot
            try:
                python, users_env = chroot_python(
                    fresh, Path(site_python()[0]), fresh.root / "python", ROOT
                )
            except ChrootPythonError as exc:
                fresh.down(cancel_jobs=True)
                raise SystemExit(f"replay_real: {exc}") from exc
            chroot = str(args.slurm_root)
            as_user = lambda user: ["chroot", chroot, *runuser(user)]  # noqa: E731
        lab_env, gres_conf, bin_dir = fresh.env(), fresh.etc_dir / "gres.conf", fresh.bin_dir
        work_root = fresh.root  # what a chroot lab's jobs see at the same path
        return fresh

    nodes = [f"gpu{i}" for i in range(1, args.nodes + 1)]
    calc_at: dict[str, float] = {}  # set -> its lab's first fair-share calculation, s
    results: dict[str, dict[str, object]] = {}
    failed: list[str] = []
    try:
        for policy_set in sets:
            if not args.running_lab and (lab is None or not args.one_lab):
                if lab is not None:
                    lab.down(cancel_jobs=True)
                    lab = None
                lab = bring_up(f"lab-{policy_set}")
            trace, jobs = plan(args, policy_set, max_gpus=4 * args.nodes)
            print(
                f"\n== set {policy_set}: {len(jobs)} jobs over {jobs[-1].at_s:.0f} s "
                f"(C = {args.compression:g}; {args.first - len(jobs) if args.first else '?'} left "
                f"out, longer than {args.max_run:g} s), no-resize run times "
                f"{min(j.run_s for j in jobs):.0f}-{max(j.run_s for j in jobs):.0f} s",
                flush=True,
            )
            try:
                observed = replay_on_lab(
                    jobs,
                    work=work_root / f"replay-{policy_set}",
                    nodes=nodes,
                    gres_conf=gres_conf,
                    lab_env=lab_env,
                    policy_toml=toml_text(policy_sections(policy_set, args.compression)),
                    python=python,
                    checkout=ROOT,
                    bin_dir=bin_dir,
                    as_user=as_user,
                    user_env_extra=users_env,
                    timeout_s=args.timeout,
                    progress=lambda line: print(f"  {line}", flush=True),
                )
            except ReplayLabError as exc:  # this set's stack failed: say so, go on
                print(f"replay_real: set {policy_set}: {exc}", file=sys.stderr, flush=True)
                failed.append(policy_set)
                continue
            rows = outcomes(observed)
            summary = summarise(rows)
            print(render(rows, summary), flush=True)
            results[policy_set] = {
                "summary": summary.as_dict(),
                "jobs": [r.as_dict() for r in rows],
            }
            if lab is not None:  # when this lab's fair-share calculations fell
                log = lab.root / "log" / "slurmctld.log"
                found = (
                    first_calculation_s(log.read_text(errors="replace"), site.CALC_PERIOD_S)
                    if log.is_file()
                    else None
                )
                if found is not None:
                    calc_at[policy_set] = found
            if not args.no_sim:
                earlier = {n: r["jobs"] for n, r in results.items() if n != policy_set}
                shared_lab = args.one_lab or args.running_lab  # usage left by earlier sets
                replayed = replayed_trace(trace, jobs, args.compression)
                usage = (
                    earlier_usage(earlier, sets, policy_set, args.compression)  # type: ignore[arg-type]
                    if shared_lab
                    else None
                )
                calc = None if args.one_lab else calc_at.get(policy_set)
                results[policy_set]["sim"] = simulated(
                    replayed, args, policy_set, usage=usage, first_calc=calc
                )
                if args.costs != "unscaled" and args.sensitivity > 0:
                    results[policy_set]["band"] = sensitivity(
                        partial(simulated, replayed, args, policy_set, None, None, usage, calc),
                        args.sensitivity,
                    )
                if args.costs != "unscaled" and args.ensemble > 0:
                    results[policy_set]["ensemble"] = ensemble(
                        partial(
                            simulated,
                            args=args,
                            policy_set=policy_set,
                            usage=usage,
                            first_calc=calc,
                        ),
                        replayed,
                        args.compression,
                        args.ensemble,
                        args.ensemble_jitter,
                    )
    finally:
        if lab is not None:
            lab.down(cancel_jobs=True)
    base = results.get("slurm", {}).get("summary")
    print("\nset        avg JCT s  p99 JCT s  makespan s  finished  resizes  vs slurm (avg)")
    for name, res in results.items():
        s = res["summary"]
        assert isinstance(s, dict)
        ratio = (
            s["avg_jct_s"] / base["avg_jct_s"]
            if isinstance(base, dict) and base["avg_jct_s"] and not math.isnan(base["avg_jct_s"])
            else math.nan
        )
        print(
            f"{name:<10} {s['avg_jct_s']:>9.1f} {s['p99_jct_s']:>10.1f} {s['makespan_s']:>11.1f} "
            f"{s['finished']:>5}/{s['jobs']:<3} {s['resizes']:>7}  {ratio:>8.2f}"
        )
    sims = {name: res["sim"] for name, res in results.items() if "sim" in res}
    if sims:
        print(
            "\nsimulator / real (same jobs, sizes and limits; simulator in trace time / C, "
            f"costs {args.costs}" + (" x C)" if args.costs != "unscaled" else ")")
        )
        if args.costs != "unscaled":
            print("\n".join(cost_set(args.costs).lines()))
        print("set        avg JCT sim  ratio   p99 sim  ratio  makespan sim  ratio")
    for name, sim in sims.items():
        real = results[name]["summary"]
        assert isinstance(real, dict) and isinstance(sim, dict)
        cells = []
        for key in ("avg_jct_s", "p99_jct_s", "makespan_s"):
            ratio = sim[key] / real[key] if real[key] else math.nan
            cells.append(f"{sim[key]:>11.1f} {ratio:>6.2f}")
        print(f"{name:<10} " + "  ".join(cells))
    bands = {name: res["band"] for name, res in results.items() if "band" in res}
    if bands:
        print(
            f"the same with its per-job start-up and submission delay each "
            f"-{args.sensitivity:g}, 0, +{args.sensitivity:g} wall s: simulator / real ranges"
        )
        for name, band in bands.items():
            real = results[name]["summary"]
            assert isinstance(band, dict) and isinstance(real, dict)
            print(band_line(name, band, real))
    ensembles = {name: res["ensemble"] for name, res in results.items() if "ensemble" in res}
    if ensembles:
        print(ensemble_header(args))
        for name, runs in ensembles.items():
            real = results[name]["summary"]
            assert isinstance(runs, dict) and isinstance(real, dict)
            print(ensemble_line(name, runs, real))
    run.figures = {name: res["summary"] for name, res in results.items() if name != "slurm"}
    run.figures["simulator"] = sims
    run.figures["simulator_band"] = {"shift_s": args.sensitivity, "sets": bands}
    if ensembles:
        run.figures["simulator_ensemble"] = {
            "runs": args.ensemble,
            "jitter_s": args.ensemble_jitter,
            "sets": ensembles,
        }
    run.figures["simulator_costs"] = (
        cost_set(args.costs).as_dict() if args.costs != "unscaled" else "unscaled"
    )
    run.figures["simulator_scheduling"] = (
        "easy" if args.easy else asdict(lab_scheduling(args.compression))
    )
    run.figures["jobs"] = {name: res["jobs"] for name, res in results.items()}
    run.figures["first_calc_s"] = calc_at
    if isinstance(base, dict):
        run.baseline = {"slurm": base}
    for name, res in results.items():
        s = res["summary"]
        assert isinstance(s, dict)
        run.target(
            f"{name}_all_finished", s["finished"], f"== {s['jobs']}", s["finished"] == s["jobs"]
        )
    for name in failed:
        run.target(f"{name}_replayed", 0, "== 1", False)
    run.write(args.json_out)
    print(json.dumps({k: v["summary"] for k, v in results.items()}, default=str)[:2000])
    ok = all(t.met for t in run.targets.values())
    if ok and not os.environ.get("SGPU_KEEP_LAB"):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp} (the daemon's and agents' logs, each job's log)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

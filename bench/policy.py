"""Benchmark one policy cycle at scale: 100,000 pending and 20,000 running jobs.

Builds a synthetic PolicySnapshot (200,000 history records over 2,000 users x 10 job
names x 2 partitions, per-GPU usage for every running job, a few prior alerts) and
measures in one process:

- baseline: a bare pass over ``snapshot.cluster.jobs`` touching two fields per job;
- priors build: ``Priors.from_history`` (grouping only: keys are computed on first use),
  and the same followed by ``Priors.prepare()`` (every key computed);
- decide, steady state: ``PolicyEngine.decide`` with idle GPU + rightsize policies in
  enforce mode, one call per daemon cycle. Each cycle gets a snapshot of its own, 30 s
  after the last: every job parsed anew (new ``Job`` objects and strings, as from a fresh
  ``squeue``), ``--churn`` of the pending jobs gone and as many new ones submitted, then
  passed through the observer's ``diff_jobs`` (outside the timing: the observer's stage),
  which hands an unchanged job over as last cycle's object. The
  history tuple is the same object (the daemon reloads it every 10 minutes), so the
  policy keeps its priors and last cycle's verdicts for jobs that did not change;
- decide, first cycle: a fresh engine whose priors are already built and prepared, so
  every pending job is to be judged from scratch (the first cycle after a daemon start).
  A cycle judges at most ``max_judged_per_cycle`` jobs anew (``--max-judged``; the
  settings' default, 25,000), oldest first: the rest are judged in the next cycles,
  which the bench runs on the same snapshot until none is left ("catch-up") and then
  checks that the decisions are exactly those of one cycle that judged every job (the
  same-run reference, timed too: "every job judged");
- decide, history reload: the same engine given a new history tuple (records out of the
  window, as many new ones; the others the same objects, as the daemon's
  ``HistoryLoader`` hands out every record it reads again unchanged, or with
  ``--fresh-records`` every record a new object, as a loader without that gives), priors
  built inside the timing; the statistics and verdicts of users whose runs are the same
  are carried over (``Priors.carry_over``). Two sizes: the rate of this history (its
  records ended over 60 days) and the rate the running jobs imply (``--mean-run-hours``);
- decide cold: fresh policies, so priors are built and computed inside (what every
  history reload cost before statistics were carried over).

Each figure is the median of ``--repeat`` runs (steady state: of ``--cycles`` cycles); the
decide figures come with the process CPU time beside them (wall time on a shared box
counts other processes).
Every decision of every timed cycle is recorded (whole, as JSON) and hashed: ``--dump
FILE`` writes them, ``--check-against FILE`` fails unless a run (of the same size) decides
exactly the same, which is how a faster policy path is shown to change nothing.
Target (issue 4): decide <= 1 s, in the steady state and on a history reload; (issue 23)
the first cycle after a start <= 1 s.
Run: ``.venv/bin/python bench/policy.py [--pending 100000 --running 20000]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from slurmgpu.jobdiff import diff_jobs
from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.policy import (
    Decision,
    EngineSettings,
    GpuStat,
    HistoryRecord,
    IdleGpuPolicy,
    JobUsage,
    Mode,
    PolicyEngine,
    PolicySnapshot,
    PriorAlert,
    Priors,
    RightsizePolicy,
    RightsizeSettings,
)

T_NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
STATES = ["COMPLETED"] * 8 + ["TIMEOUT", "FAILED", "CANCELLED by 1000", "OUT_OF_MEMORY"]


def make_snapshot(
    n_pending: int, n_running: int, n_history: int, n_users: int, seed: int = 1
) -> PolicySnapshot:
    """Return a synthetic snapshot; sizes as given, shapes drawn with a fixed seed."""
    rng = random.Random(seed)
    users = [f"user{i:04d}" for i in range(n_users)]
    names = [f"train-{i}" for i in range(10)]
    partitions = ["gpu", "a100"]

    history = []
    for _ in range(n_history):
        gpus = rng.choice([1, 1, 2, 4, 8])
        cpus = gpus * rng.choice([8, 12, 16, 32])
        history.append(
            HistoryRecord(  # strings interned, as load_history gives them
                user=sys.intern(rng.choice(users)),
                name=sys.intern(rng.choice(names)),
                partition=sys.intern(rng.choice(partitions)),
                script_hash=None,
                state=sys.intern(rng.choice(STATES)),
                run_time=timedelta(seconds=rng.randrange(60, 3 * 86400)),
                time_limit=timedelta(days=3),
                gpus_requested=gpus,
                gpus_used=rng.randint(1, gpus) if rng.random() < 0.9 else None,
                cpus=cpus,
                memory_requested_mib=cpus * 4096,
                peak_memory_mib=rng.uniform(1000, cpus * 4096),
                mean_cpu_pct=rng.uniform(50, cpus * 100),
                mean_gpu_util_pct=rng.uniform(0, 100),
                peak_gpu_memory_mib=rng.uniform(0, 80_000),
                ended_at=T_NOW - timedelta(hours=rng.randrange(1, 24 * 60)),
            )
        )

    jobs: list[Job] = []
    usage: dict[int, JobUsage] = {}
    alerts: list[PriorAlert] = []
    job_id = 1_000_000
    for i in range(n_pending + n_running):
        job_id += 1
        gpus = rng.choice([1, 1, 2, 4, 8])
        cpus = gpus * rng.choice([8, 12, 16, 32])
        user, name = rng.choice(users), rng.choice(names)
        limit = timedelta(hours=rng.choice([1, 4, 24, 48, 72]))
        common = {
            "job_id": job_id,
            "name": name,
            "user": user,
            "account": "ml",
            "partition": rng.choice(partitions),
            "submit_time": T_NOW - timedelta(seconds=rng.randrange(86400)),
            "time_limit": limit,
            "cpus": cpus,
            "memory_mib": cpus * 4096,
            "node_count": 1,
            "tasks": 1,
            "gpus": GpuRequest(gpus=gpus, per_node=gpus, sources=("tres_per_node",)),
            "requeue": rng.random() < 0.5,
        }
        if i < n_pending:
            jobs.append(Job(state=JobState.PENDING, **common))  # type: ignore[arg-type]
            continue
        node = f"gpu{rng.randrange(5000):04d}"
        started = T_NOW - timedelta(minutes=rng.randrange(1, 600))
        job = Job(
            state=JobState.RUNNING,
            start_time=started,
            nodes=(node,),
            gpu_allocations=(NodeGpuAllocation(node, tuple(range(gpus))),),
            **common,  # type: ignore[arg-type]
        )
        jobs.append(job)
        elapsed = T_NOW - started
        idle_job = rng.random() < 0.2
        stats = []
        for g in range(gpus):
            never = idle_job and rng.random() < 0.8
            idle = elapsed if never else timedelta(minutes=rng.randrange(0, 20))
            stats.append(
                GpuStat(
                    node=node,
                    gpu_index=g,
                    samples=max(2, int(elapsed.total_seconds() // 30)),
                    mean_util_pct=0.0 if never else rng.uniform(5, 100),
                    max_util_pct=0.0 if never else 100.0,
                    max_memory_mib=0.0,
                    memory_total_mib=81559.0,
                    trailing_idle=idle,
                    never_busy=never,
                    last_sample_at=T_NOW - timedelta(seconds=rng.randrange(30)),
                )
            )
        usage[job_id] = JobUsage(job_id=job_id, gpus=tuple(stats), mean_cpu_pct=100.0)
        if idle_job and elapsed > timedelta(minutes=80):
            alerts.append(
                PriorAlert(job_id, "idle_gpu", "idle_gpu_warning_1", T_NOW - timedelta(minutes=20))
            )
    rng.shuffle(jobs)
    return PolicySnapshot(
        at=T_NOW,
        cluster=ClusterSnapshot(
            taken_at=T_NOW, jobs=tuple(jobs), nodes=(), slurm_version="24.05.4"
        ),
        usage=usage,
        history=tuple(history),
        alerts=tuple(alerts),
        last_action_at={},
        user_actions_last_hour={},
        opted_in=frozenset(j.job_id for j in jobs[::3]),
    )


def _fresh(text: str) -> str:
    """An equal string that is a new object, as a parsed squeue gives every cycle."""
    return (text + ".")[:-1]


def next_cycle(
    snap: PolicySnapshot, churn: float, seed: int, volatile: float = 0.1
) -> PolicySnapshot:
    """The snapshot a daemon would see 30 s later: every Job a new object with new
    strings, ``churn`` of the pending jobs gone (started or cancelled) and as many new
    submissions (copies of other pending jobs' shapes under new ids), and ``volatile`` of
    the other pending jobs with a new projected start time (backfill moves them: a change
    the observer sees and rightsizing ignores)."""
    rng = random.Random(seed)
    at = snap.at + timedelta(seconds=30)
    jobs = list(snap.cluster.jobs)
    pending = [i for i, j in enumerate(jobs) if j.state is JobState.PENDING]
    gone = set(rng.sample(pending, int(len(pending) * churn)))
    next_id = max(j.job_id for j in jobs) + 1
    out: list[Job] = []
    for i, j in enumerate(jobs):
        if i in gone:
            template = jobs[rng.choice(pending)]
            out.append(
                dataclasses.replace(
                    template,
                    job_id=next_id,
                    user=_fresh(template.user),
                    name=_fresh(template.name),
                    partition=_fresh(template.partition),
                    submit_time=at,
                )
            )
            next_id += 1
        else:
            moved = j.state is JobState.PENDING and rng.random() < volatile
            out.append(
                dataclasses.replace(
                    j,
                    user=_fresh(j.user),
                    name=_fresh(j.name),
                    partition=_fresh(j.partition),
                    start_time=at + timedelta(minutes=rng.randrange(1, 600))
                    if moved
                    else j.start_time,
                )
            )
    # What the daemon's observer hands the engine: the listing with every unchanged job
    # as last cycle's object (slurmgpu.jobdiff), the rest as parsed.
    listing = diff_jobs(snap.cluster.jobs_by_id(), out).listing
    return dataclasses.replace(
        snap,
        at=at,
        cluster=ClusterSnapshot(
            taken_at=at, jobs=tuple(listing), nodes=(), slurm_version=snap.cluster.slurm_version
        ),
        opted_in=frozenset(j.job_id for j in out[::3]),
    )


def reloaded(
    history: tuple[HistoryRecord, ...],
    n: int,
    at: datetime,
    users: int,
    seed: int,
    fresh: bool = False,
) -> tuple[HistoryRecord, ...]:
    """The history a daemon's reload gives ``history_refresh`` later: the ``n`` first
    (oldest) records out of its window, ``n`` jobs that ended since in, strings interned
    as ``load_history`` interns them. The other records are the same objects, as
    ``HistoryLoader`` gives them; ``fresh``: each a new object, as read from the store."""
    rng = random.Random(seed)
    replace = msgspec.structs.replace
    kept = (
        [
            replace(
                r,
                user=sys.intern(_fresh(r.user)),
                name=sys.intern(_fresh(r.name)),
                partition=sys.intern(_fresh(r.partition)),
                state=sys.intern(_fresh(r.state)),
            )
            for r in history[n:]
        ]
        if fresh
        else list(history[n:])
    )
    new = [
        replace(
            rng.choice(history),
            user=sys.intern(f"user{rng.randrange(users):04d}"),
            run_time=timedelta(seconds=rng.randrange(60, 3 * 86400)),
            ended_at=at,
        )
        for _ in range(n)
    ]
    return (*kept, *new)


def decision_record(decisions: Sequence[Decision]) -> list[str]:
    """Every decision, whole (action with its fields, numbers and reason, mode, execute,
    notify, suppressed), one JSON text each, sorted: what ``--dump`` writes and
    ``--check-against`` compares, so a change to the policy code can be shown to decide
    exactly as before."""
    return sorted(msgspec.json.encode(d).decode() for d in decisions)


def digest(record: Sequence[str]) -> str:
    """A short hash of a decision record, to quote."""
    return hashlib.sha256("\n".join(record).encode()).hexdigest()[:16]


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()  # start each run from the same heap, not with the last run's garbage
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--running", type=int, default=20_000)
    ap.add_argument("--history", type=int, default=200_000)
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=5, help="steady-state cycles timed")
    ap.add_argument("--churn", type=float, default=0.01, help="pending jobs new per cycle")
    ap.add_argument(
        "--volatile",
        type=float,
        default=0.1,
        help="other pending jobs with a new projected start per cycle",
    )
    ap.add_argument(
        "--mean-run-hours",
        type=float,
        default=5.0,
        help="mean run time of the running jobs, for the heavier reload (see below)",
    )
    ap.add_argument(
        "--fresh-records",
        action="store_true",
        help="make every record of a reloaded history a new object (a loader that does not "
        "hand out the last load's object for an unchanged record, as HistoryLoader does)",
    )
    ap.add_argument(
        "--dump",
        type=Path,
        metavar="FILE",
        help="write every decision of the first cycle, each steady cycle and each reload "
        "cycle to FILE (JSON), to compare a later run with (--check-against)",
    )
    ap.add_argument(
        "--check-against",
        type=Path,
        metavar="FILE",
        help="fail unless every decision is the one a --dump of the same size wrote to FILE",
    )
    ap.add_argument(
        "--max-judged",
        type=int,
        default=None,
        help="the rightsize policy's max_judged_per_cycle (default: the settings' "
        f"{RightsizeSettings().max_judged_per_cycle:,}; smoke: 500; 0: every pending job "
        "judged in one cycle, as before issue 23)",
    )
    add_arguments(ap, "2,000 pending, 400 running, 4,000 history records, 2 cycles")
    args = ap.parse_args()
    if args.smoke:
        args.pending, args.running, args.history, args.users = 2_000, 400, 4_000, 100
        args.repeat, args.cycles = 1, 2
        if args.max_judged is None:
            args.max_judged = 500  # so the smoke run catches up over cycles too
    if args.max_judged is None:
        args.max_judged = RightsizeSettings().max_judged_per_cycle
    run = BenchRun.from_args("policy", args)

    t = time.perf_counter()
    snap = make_snapshot(args.pending, args.running, args.history, args.users)
    print(
        f"snapshot: {args.pending:,} pending + {args.running:,} running jobs, "
        f"{len(snap.history):,} history records, {len(snap.alerts):,} alerts "
        f"(built in {time.perf_counter() - t:.1f} s)"
    )

    def baseline() -> int:
        n = 0
        for j in snap.cluster.jobs:
            if j.state is JobState.PENDING:
                n += j.cpus
        return n

    def engine_with(rightsize: RightsizePolicy) -> PolicyEngine:
        return PolicyEngine(
            [(IdleGpuPolicy(), Mode.ENFORCE), (rightsize, Mode.ENFORCE)],
            EngineSettings(max_actions_per_cycle=20),
        )

    def rightsize_policy(max_judged: int | None = None) -> RightsizePolicy:
        """A fresh rightsize policy judging ``max_judged`` jobs a cycle (the run's)."""
        judged = args.max_judged if max_judged is None else max_judged
        return RightsizePolicy(RightsizeSettings(max_judged_per_cycle=judged))

    def key_of(decisions: Sequence[Decision]) -> list[tuple[object, ...]]:
        return [(d.action.job_id, d.action.kind, d.action.intents, d.suppressed) for d in decisions]

    def catch_up(
        engine: PolicyEngine, rightsize: RightsizePolicy, at: PolicySnapshot
    ) -> tuple[list[Decision] | None, list[float]]:
        """Decide on ``at`` again until the rightsize policy has judged every pending job
        (its backlog is 0): the last cycle's decisions (None: none was needed) and each
        catch-up cycle's CPU time."""
        decisions, cpus = None, []
        while rightsize.backlog:
            gc.collect()
            cpu = time.process_time()
            decisions = engine.decide(at)
            cpus.append(time.process_time() - cpu)
        return decisions, cpus

    def cold() -> object:
        return engine_with(rightsize_policy()).decide(snap)

    def prepared() -> int:
        return Priors.from_history(snap.history).prepare()

    base_s = median_time(baseline, args.repeat)
    group_s = median_time(lambda: Priors.from_history(snap.history), args.repeat)
    prepare_s = median_time(prepared, args.repeat)

    # First cycle: priors built and prepared outside the timing, nothing else known.
    # Also in process CPU time (the wall figure counts other processes on a shared box),
    # and the history's priors build (grouping + every key computed, which the daemon's
    # first cycle pays too unless the recommendation export built them at history load).
    # The same, judging every pending job in that one cycle (max_judged_per_cycle 0: the
    # first cycle before issue 23, the reference), in the same repeat, after it.
    records: dict[str, list[str]] = {}
    first_times, first_cpu, load_cpu, first_backlog = [], [], [], 0
    whole_times, whole_cpu, catch_cpu = [], [], []
    for _ in range(args.repeat):
        rightsize = rightsize_policy()
        gc.collect()
        cpu = time.process_time()
        rightsize.priors(snap.history).prepare()
        load_cpu.append(time.process_time() - cpu)
        engine = engine_with(rightsize)
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        decisions = engine.decide(snap)
        first_cpu.append(time.process_time() - cpu)
        first_times.append(time.perf_counter() - start)
        first_backlog = rightsize.backlog
        record = decision_record(decisions)
        if records.setdefault("first cycle", record) != record:
            raise SystemExit("two first cycles on the same snapshot decided differently: a bug")
        caught, cpus = catch_up(engine, rightsize, snap)
        catch_cpu.append(cpus)

        whole_rs = rightsize_policy(0)
        whole_rs.priors(snap.history).prepare()
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        whole = engine_with(whole_rs).decide(snap)
        whole_cpu.append(time.process_time() - cpu)
        whole_times.append(time.perf_counter() - start)
        if decision_record(caught if caught is not None else decisions) != decision_record(whole):
            raise SystemExit(
                "the first cycles, once caught up, decided otherwise than one cycle judging "
                "every job: a bug"
            )
        # what the first cycle executes is what judging every job executes
        if [d for d in decisions if d.execute] != [d for d in whole if d.execute]:
            print("note: the first cycle executes other changes than judging every job would")
    first_s = statistics.median(first_times)
    whole_s = statistics.median(whole_times)

    # Steady state: the last engine goes on, one fresh snapshot per cycle.
    t = time.perf_counter()
    cycles = []
    current = snap
    for k in range(args.cycles):
        current = next_cycle(current, args.churn, seed=100 + k, volatile=args.volatile)
        cycles.append(current)
    print(
        f"cycles: {args.cycles} snapshots 30 s apart, {args.churn:.0%} of pending jobs new "
        f"and {args.volatile:.0%} with a new projected start in each "
        f"(built in {time.perf_counter() - t:.1f} s)"
    )
    steady_times, steady_cpu = [], []
    for k, cycle in enumerate(cycles):
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        decisions = engine.decide(cycle)
        steady_cpu.append(time.process_time() - cpu)
        steady_times.append(time.perf_counter() - start)
        records[f"steady cycle {k + 1}"] = decision_record(decisions)
    steady_s = statistics.median(steady_times)
    # The verdicts the steady state reused must be the ones a fresh policy gives.
    fresh_rs = rightsize_policy(0)
    fresh_rs.priors(snap.history)
    again = engine_with(fresh_rs).decide(cycles[-1])
    if key_of(again) != key_of(decisions):
        raise SystemExit("steady-state decisions differ from a fresh policy's: a bug")

    # History reloads (the daemon's every 10 minutes): a new history tuple, the same
    # engine going on. Before priors carried statistics over, a reload cycle cost what
    # "decide cold" costs. Two sizes of reload: the records this history's own rate
    # puts in and out of a 10-minute window (its records ended over 60 days), and the
    # rate the running jobs imply (--running jobs of --mean-run-hours on average).
    sizes = {
        "history's rate": max(1, round(len(snap.history) * 600 / (60 * 86400))),
        "running jobs' rate": max(1, round(args.running * 600 / (args.mean_run_hours * 3600))),
    }
    reload_s: dict[str, tuple[float, int, int]] = {}
    reload_cpu: dict[str, float] = {}
    reload_backlog: dict[str, int] = {}
    reload_catch_cpu: dict[str, list[float]] = {}
    current, history = cycles[-1], snap.history
    for label, n in sizes.items():
        times, cpus, changed_users = [], [], []
        for k in range(args.repeat):
            current = next_cycle(current, args.churn, seed=200 + k, volatile=args.volatile)
            gone = {r.user for r in history[:n]}
            history = reloaded(
                history, n, current.at, args.users, seed=300 + k, fresh=args.fresh_records
            )
            changed_users.append(len(gone | {r.user for r in history[len(history) - n :]}))
            current = dataclasses.replace(current, history=history)
            gc.collect()
            start, cpu = time.perf_counter(), time.process_time()
            decisions = engine.decide(current)
            cpus.append(time.process_time() - cpu)
            times.append(time.perf_counter() - start)
            records[f"reload ({label}) {k + 1}"] = decision_record(decisions)
            reload_backlog[label] = max(reload_backlog.get(label, 0), rightsize.backlog)
            caught, catch = catch_up(engine, rightsize, current)
            reload_catch_cpu.setdefault(label, []).extend(catch)
            decisions = caught if caught is not None else decisions
        reload_s[label] = (statistics.median(times), n, int(statistics.median(changed_users)))
        reload_cpu[label] = statistics.median(cpus)
        fresh_rs = rightsize_policy(0)
        fresh_rs.priors(history)
        again = engine_with(fresh_rs).decide(current)
        if key_of(again) != key_of(decisions):
            raise SystemExit("decisions after a history reload differ from a fresh policy's")
    cold_s = median_time(cold, args.repeat)

    by_kind: dict[str, int] = {}
    for d in decisions:
        key = f"{d.action.kind}{'' if not d.suppressed else ' (suppressed)'}"
        by_kind[key] = by_kind.get(key, 0) + 1
    print(
        f"decisions (last cycle): {len(decisions):,}  "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(by_kind.items()))
        + "; identical to a fresh policy's"
    )
    print(f"executed: {sum(d.execute for d in decisions)} (cycle limit 20)")
    print(
        "decision hashes: "
        + ", ".join(f"{label} {len(r):,} {digest(r)}" for label, r in records.items())
    )
    if args.dump:
        args.dump.write_text(json.dumps(records))
        print(f"decisions written to {args.dump}")
    if args.check_against:
        expected = json.loads(args.check_against.read_text())
        if expected != records:
            differ = sorted(set(expected) ^ set(records)) + [
                label
                for label in records
                if label in expected and expected[label] != records[label]
            ]
            raise SystemExit(f"decisions differ from {args.check_against}'s: {', '.join(differ)}")
        print(f"decisions identical to {args.check_against}'s ({len(records)} cycles)")
    print(f"history: {len(snap.history):,} records")
    print(f"baseline (iterate jobs):             {base_s * 1000:9.1f} ms")
    print(f"priors build, grouping:              {group_s * 1000:9.1f} ms")
    print(f"priors build, every key computed:    {prepare_s * 1000:9.1f} ms")
    print(
        f"decide, steady state (per cycle):    {steady_s * 1000:9.1f} ms  "
        f"{steady_s / base_s:5.0f}x baseline  target <= 1000 ms: "
        f"{'OK' if steady_s <= 1.0 else 'MISSED'}"
    )
    print(f"  steady state, CPU time:            {statistics.median(steady_cpu) * 1000:9.1f} ms")
    for label, (took, n, users) in reload_s.items():
        print(
            f"decide, history reload:             {took * 1000:9.1f} ms  "
            f"{took / base_s:5.0f}x baseline  target <= 1000 ms: "
            f"{'OK' if took <= 1.0 else 'MISSED'}  ({label}: {n} records in and {n} out, "
            f"{users} of {args.users} users changed; priors built inside; "
            f"{'every record a new object' if args.fresh_records else 'unchanged records kept'})"
        )
        print(f"  history reload, CPU time:          {reload_cpu[label] * 1000:9.1f} ms")
        catch = reload_catch_cpu.get(label, [])
        if catch:
            print(
                f"  left for later cycles:             {reload_backlog[label]:,} jobs at most; "
                f"{len(catch)} catch-up cycle(s) in {args.repeat} reloads, median "
                f"{statistics.median(catch) * 1000:.1f} ms CPU"
            )
    judged = (
        f"at most {args.max_judged:,} jobs judged a cycle"
        if args.max_judged
        else "every job judged in it"
    )
    print(
        f"decide, first cycle (priors built):  {first_s * 1000:9.1f} ms  "
        f"{first_s / base_s:5.0f}x baseline  target <= 1000 ms: "
        f"{'OK' if first_s <= 1.0 else 'MISSED'}  ({judged})"
    )
    print(
        f"  first cycle, CPU time:             {statistics.median(first_cpu) * 1000:9.1f} ms  "
        f"(priors build + prepare before it: {statistics.median(load_cpu) * 1000:.1f} ms CPU)"
    )
    catch_cycles = [len(c) for c in catch_cpu]
    if any(catch_cycles):
        flat = [t for c in catch_cpu for t in c]
        print(
            f"  left for later cycles:             {first_backlog:,} jobs; judged in "
            f"{max(catch_cycles)} more cycle(s), median {statistics.median(flat) * 1000:.1f} ms "
            "CPU each; then decided exactly as the cycle below"
        )
    print(
        f"decide, every job judged at once:    {whole_s * 1000:9.1f} ms  "
        f"{whole_s / base_s:5.0f}x baseline  (max_judged_per_cycle = 0; "
        f"{statistics.median(whole_cpu) * 1000:.1f} ms CPU)"
    )
    print(
        f"decide cold (priors built inside):   {cold_s * 1000:9.1f} ms  "
        f"{cold_s / base_s:5.0f}x baseline  (a reload cycle, before statistics were "
        f"carried over)"
    )
    run.baseline = {"iterate_jobs_s": base_s}
    run.figures = {
        "priors_grouping_s": group_s,
        "priors_prepared_s": prepare_s,
        "steady_cycle_s": steady_s,
        "first_cycle_s": first_s,
        "cold_cycle_s": cold_s,
        "reload_cycle_s": {label: took for label, (took, _, _) in reload_s.items()},
        # process CPU time (the wall figures count other processes on a shared box)
        "steady_cycle_cpu_s": statistics.median(steady_cpu),
        "first_cycle_cpu_s": statistics.median(first_cpu),
        "first_cycle_backlog": first_backlog,
        "catch_up_cycles": max(catch_cycles, default=0),
        "every_job_judged_cycle_s": whole_s,
        "every_job_judged_cycle_cpu_s": statistics.median(whole_cpu),
        "max_judged_per_cycle": args.max_judged,
        "reload_cycle_cpu_s": reload_cpu,
        "decisions_last_cycle": len(decisions),
    }
    run.target("steady_cycle_s", steady_s, "<= 1", steady_s <= 1.0)
    for label, (took, _, _) in reload_s.items():
        run.target(f"reload_cycle_s ({label})", took, "<= 1", took <= 1.0)
    run.target("first_cycle_s", first_s, "<= 1", first_s <= 1.0)
    run.write(args.json_out)


if __name__ == "__main__":
    main()

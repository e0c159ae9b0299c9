"""Benchmark one policy cycle at scale: 100,000 pending and 20,000 running jobs.

Builds a synthetic PolicySnapshot (200,000 history records over 2,000 users x 10 job
names x 2 partitions, per-GPU usage for every running job, a few prior alerts) and
measures in one process:

- baseline: a bare pass over ``snapshot.cluster.jobs`` touching two fields per job;
- priors build: ``Priors.from_history`` (grouping only: keys are computed on first use),
  and the same followed by ``Priors.prepare()`` (every key computed);
- decide: ``PolicyEngine.decide`` with idle GPU + rightsize policies in enforce mode,
  priors already built and used once (the steady state: the daemon keeps the history
  tuple, so the policy keeps its priors);
- decide cold: the same with fresh policies, so priors are built and computed inside.

Each figure is the median of ``--repeat`` runs. Target (issue 7): decide <= 1 s.
Run: ``.venv/bin/python bench/policy.py [--pending 100000 --running 20000]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.policy import (
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
            HistoryRecord(
                user=rng.choice(users),
                name=rng.choice(names),
                partition=rng.choice(partitions),
                script_hash=None,
                state=rng.choice(STATES),
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
    args = ap.parse_args()

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

    rightsize = RightsizePolicy()
    engine = PolicyEngine(
        [(IdleGpuPolicy(), Mode.ENFORCE), (rightsize, Mode.ENFORCE)],
        EngineSettings(max_actions_per_cycle=20),
    )

    def cold() -> object:
        fresh = PolicyEngine([(IdleGpuPolicy(), Mode.ENFORCE), (RightsizePolicy(), Mode.ENFORCE)])
        return fresh.decide(snap)

    def prepared() -> int:
        return Priors.from_history(snap.history).prepare()

    base_s = median_time(baseline, args.repeat)
    group_s = median_time(lambda: Priors.from_history(snap.history), args.repeat)
    prepare_s = median_time(prepared, args.repeat)
    rightsize.priors(snap.history).prepare()
    decisions = engine.decide(snap)  # warm: every pending job's key resolved once
    decide_s = median_time(lambda: engine.decide(snap), args.repeat)
    cold_s = median_time(cold, args.repeat)

    by_kind: dict[str, int] = {}
    for d in decisions:
        key = f"{d.action.kind}{'' if not d.suppressed else ' (suppressed)'}"
        by_kind[key] = by_kind.get(key, 0) + 1
    print(
        f"decisions: {len(decisions):,}  "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(by_kind.items()))
    )
    print(f"executed: {sum(d.execute for d in decisions)} (cycle limit 20)")
    print(f"history: {len(snap.history):,} records")
    print(f"baseline (iterate jobs):           {base_s * 1000:9.1f} ms")
    print(f"priors build, grouping:            {group_s * 1000:9.1f} ms")
    print(f"priors build, every key computed:  {prepare_s * 1000:9.1f} ms")
    print(
        f"decide (priors built):             {decide_s * 1000:9.1f} ms  "
        f"{decide_s / base_s:5.0f}x baseline  target <= 1000 ms: "
        f"{'OK' if decide_s <= 1.0 else 'MISSED'}"
    )
    print(
        f"decide cold (priors built inside): {cold_s * 1000:9.1f} ms  "
        f"{cold_s / base_s:5.0f}x baseline"
    )


if __name__ == "__main__":
    main()

"""One small scenario replayed on the real lab cluster and in the simulator (issue 7).

The scenario, at t = 0 on a 4 x 4-GPU cluster with three past runs of root's
``sv-train`` (20 min each of a 10 h limit) in the history:

- ``opted``: ``sv-train``, held, 1 GPU, 10 h, opted in to rightsizing (``sgpu:rightsize``);
- ``other``: the same job without the opt-in;
- ``idle``: ``sv-idle``, 1 GPU, requeueable, whose GPU stays at 0 %.

With the daemon's config below (idle windows in seconds), the decisions taken are, in
order: rightsize the opted-in job's limit to 30 min (1.3 x 20 min, rounded up to 5 min;
the other job's identical proposal is suppressed: not opted in), warn about the idle job
(idle >= 4 s), requeue it (idle >= 10 s, warning >= 3 s old). The real-cluster test
(``tests/slurm/test_sim_vs_real.py``) checks the daemon takes these; the unit test
(``tests/unit/test_sim_replay.py``) checks the simulator does, both through the engine
``build_policy_cycle`` builds from this config.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from slurmgpu.config import load_settings
from slurmgpu.daemon.observer import Observer
from slurmgpu.daemon.policy_cycle import build_policy_cycle, opted_in
from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import HistoryRecord
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.workload import RigidJob, TraceJob
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.history import load_history
from tests.configs import QUICK_IDLE_ENFORCE, QUICK_POLICY, config_toml
from tests.fakes import FakeSlurm

CONFIG = config_toml(QUICK_POLICY, QUICK_IDLE_ENFORCE, {"policy.rightsize": {"mode": "enforce"}})

USER = "root"
PARTITION = "gpu"
TRAIN, IDLE = "sv-train", "sv-idle"
LIMIT_S = 10 * 3600
IDLE_LIMIT_S = 3600
HISTORY_RUN = timedelta(minutes=20)

# (policy, kind, role, fields, outcome), in the order they are taken.
Taken = tuple[str, str, str, tuple[tuple[str, str], ...], str]
EXPECTED: list[Taken] = [
    ("rightsize", "update", "opted", (("TimeLimit", "00:30:00"),), "done"),
    ("idle_gpu", "warn", "idle", (), "notified"),
    ("idle_gpu", "requeue", "idle", (), "done"),
]
TAKEN_OUTCOMES = frozenset({"done", "notified", "failed"})


def role_of(name: str, comment: str) -> str:
    if name == IDLE:
        return "idle"
    return "opted" if opted_in(comment) else "other"


def until_first_requeue(taken: Sequence[Taken]) -> list[Taken]:
    """The decisions up to the idle job's first requeue (what happens after is not replayed)."""
    out: list[Taken] = []
    for t in taken:
        out.append(t)
        if t[1] == "requeue":
            break
    return out


def store_history(store: JobStore, now: datetime) -> list[HistoryRecord]:
    """Write three finished ``sv-train`` runs into ``store`` the way the daemon's observer
    does; return them as the daemon's history loader reads them back."""
    finished = [
        Job(
            job_id=900_100 + i,
            name=TRAIN,
            user=USER,
            state=JobState.COMPLETED,
            partition=PARTITION,
            submit_time=now - timedelta(hours=3 + i),
            start_time=now - timedelta(hours=3 + i),
            end_time=now - timedelta(hours=3 + i) + HISTORY_RUN,
            time_limit=timedelta(seconds=LIMIT_S),
            cpus=1,
        )
        for i in range(3)
    ]
    Observer(FakeSlurm(finished), store, clock=lambda: now).cycle()
    return load_history(store.engine, store.cluster, now - timedelta(days=1))


def trace() -> list[TraceJob]:
    def train(comment: str) -> TraceJob:
        return TraceJob(
            0.0,
            TRAIN,
            USER,
            RigidJob(600.0, 1),
            gpus=1,
            time_limit_s=LIMIT_S,
            partition=PARTITION,
            comment=comment,
            extra={"hold": "1"},
        )

    idle = TraceJob(
        0.0,
        IDLE,
        USER,
        RigidJob(300.0, 1, util_pct=0.0),
        gpus=1,
        time_limit_s=IDLE_LIMIT_S,
        partition=PARTITION,
    )
    return [train("sgpu:rightsize"), train(""), idle]


def simulated(config: Path, history: Sequence[HistoryRecord], tmp: Path) -> list[Taken]:
    """Run the scenario in SimSlurm through the engine the daemon builds from ``config``."""
    settings = load_settings(config)
    engine = build_policy_cycle(settings, open_store(f"sqlite:///{tmp / 'sim.db'}"), FakeSlurm())
    options = SimOptions(
        period_s=1.0,  # the daemon runs with --interval 1s
        quiet_period_s=1.0,
        requeue_delay_s=11.0,  # the lab cluster's cred_expire=10 + 1
        history_refresh_s=1.0,
        history=tuple(history),
        opted_in=lambda j: opted_in(j.comment),
        sample_interval_s=1.0,  # the agents sample every second
        record_decisions=True,
        max_virtual_s=30.0,
    )
    run = simulate(trace(), ClusterShape(4, 4, 4), "slurm", options, engine=engine.engine)
    roles = {j.job_id: role_of(j.name, j.comment) for j in run.all_jobs}
    return until_first_requeue(
        [(d.policy, d.kind, roles[d.job_id], d.fields, d.outcome) for d in run.decisions]
    )

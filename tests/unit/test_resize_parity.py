"""One resize path, two wirings: the same snapshot sequences through the simulator (its
runner: ``cycle.core.PolicyCycle`` with SimSlurm, ``sim.resizes.SimResizes`` over
``MemoryTransactions`` and ``SimAcks``) and through the daemon's (``daemon.policy_cycle``:
the Actuator and the MalleableActuator on a FakeSlurm, the SQLite audit, the transactions
in ``MemoryTransactions``) give the same decisions, the same intents and the same
transaction phases, cycle by cycle and observation by observation.

The simulator runs first and every observation its resize dispatcher makes is kept: the
policy cycles (the listing, and what the sources gave: usage, history, opt-in, the
malleable jobs' specs and measured speeds, which differ by nature between a workload
model and agents' files) and, between them, the one-second observations of jobs whose
transactions are open, with the acknowledgement SimSlurm's runtime gave at each. The
daemon is then fed the same listings at the same times; its prior alerts, guardrail
records, resizes in flight, resize cost and last resize are its own (audit and
transactions), which is what is compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.actuate.malleable import MalleableActuator
from slurmgpu.cycle.core import MalleableView
from slurmgpu.cycle.transactions import GuardedAckReader, MemoryTransactions, TransactionRow
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.elastic.spec import Ack
from slurmgpu.model import ClusterSnapshot, Job
from slurmgpu.policy.base import Decision, HistoryRecord, JobUsage, Mode, PolicySnapshot
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.settings import AttainedServiceSettings
from slurmgpu.sim.lucid import model_interference
from slurmgpu.sim.policysets import SimPolicies, build_engine
from slurmgpu.sim.run import ClusterShape, SimOptions, _Runner
from slurmgpu.sim.workload import MalleableRange, RigidJob, TraceJob
from slurmgpu.store import open_store
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from tests.fakes import FakeSlurm


class RecordingEngine(PolicyEngine):
    """A set's real engine; every decide() is kept with the snapshot it saw."""

    def __init__(self, engine: PolicyEngine) -> None:
        super().__init__(list(engine.policies), engine.settings)
        self.seen: list[tuple[PolicySnapshot, list[Decision]]] = []

    def decide(self, snapshot: PolicySnapshot) -> list[Decision]:
        out = super().decide(snapshot)
        self.seen.append((snapshot, out))
        return out


@dataclass
class Recorded:
    """What the simulator's resize dispatcher saw, in order, and the acks it read."""

    # (at, listing): every advance of the transactions (a cycle's confirm, or an
    # in-flight observation)
    observed: list[tuple[datetime, ClusterSnapshot]] = field(default_factory=list)
    acks: dict[tuple[int, datetime], Ack | None] = field(default_factory=dict)


def _simulate(
    trace: Sequence[TraceJob], shape: ClusterShape, policy_set: str, options: SimOptions
) -> tuple[RecordingEngine, Recorded, _Runner]:
    engine = RecordingEngine(build_engine(policy_set, options.policies))
    runner = _Runner(trace, shape, policy_set, options, None, engine)
    rec = Recorded()
    dispatch = runner.resizer.dispatch
    advance, sim = dispatch.advance, runner.sim

    def recording_advance(cluster: ClusterSnapshot, at: datetime) -> None:
        rec.observed.append((at, cluster))
        advance(cluster, at)

    dispatch.advance = recording_advance  # type: ignore[method-assign]
    guarded = dispatch.jobs.read_ack
    assert isinstance(guarded, GuardedAckReader)
    reader = guarded.reader

    def recording_reader(state_dir: str, job_id: int) -> Ack | None:
        ack = reader(state_dir, job_id)
        rec.acks[(job_id, sim.at(sim.now))] = ack
        return ack

    guarded.reader = recording_reader
    runner.run()
    return engine, rec, runner


class Replayed(PolicyCycle):
    """The daemon's wiring; the sources that differ by nature replay the simulator's."""

    snaps: dict[datetime, PolicySnapshot]
    now_at: datetime

    def job_usage(self, cluster: ClusterSnapshot, at: datetime) -> dict[int, JobUsage]:
        return dict(self.snaps[at].usage)

    def history(self, at: datetime) -> tuple[HistoryRecord, ...]:
        return self.snaps[at].history

    def opted_in(self, job: Job) -> bool:
        return job.job_id in self.snaps[self.now_at].opted_in

    def malleable_view(self, cluster: ClusterSnapshot, at: datetime) -> MalleableView:
        snap = self.snaps[at]
        own = super().malleable_view(cluster, at)  # the transactions' view (no directory)
        assert self.malleable is not None
        cost, last = self.malleable.history() if snap.malleable else (None, {})
        return MalleableView(
            specs=snap.malleable,
            resizing=own.resizing,
            throughput=snap.throughput,
            resize_cost=cost,
            last_resize_at=last,
        )


def _key(decisions: Sequence[Decision]) -> list[tuple[object, ...]]:
    return [
        (
            d.action.policy,
            d.action.kind,
            d.action.job_id,
            d.action.intents,
            d.execute,
            d.notify,
            d.suppressed,
        )
        for d in decisions
    ]


def _phases(rows: Sequence[TransactionRow]) -> list[tuple[object, ...]]:
    return [
        (
            r.job_id,
            r.kind,
            r.state,
            r.error,
            r.payload.get("fields"),
            r.payload.get("old_fields"),
            r.payload.get("t"),
        )
        for r in sorted(rows, key=lambda r: r.id)
    ]


def _replay(
    tmp_path: Path, engine: RecordingEngine, rec: Recorded, runner: _Runner
) -> tuple[RecordingEngine, MemoryTransactions, AuditStore]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    audit = AuditStore(store.engine)
    slurm = FakeSlurm()
    transactions = MemoryTransactions()
    now: list[datetime] = []

    def acks(state_dir: str, job_id: int) -> Ack | None:
        return rec.acks.get((job_id, now[-1]))

    malleable = MalleableActuator(slurm, transactions, audit, runner.options.resize, acks)
    daemon_engine = RecordingEngine(engine)
    daemon = Replayed(
        daemon_engine,
        UsageStore(store.engine),
        audit,
        Actuator(slurm, audit),
        malleable=malleable,
    )
    snaps = {snap.at: snap for snap, _ in engine.seen}
    cycles = {id(snap.cluster) for snap, _ in engine.seen}
    daemon.snaps = snaps
    for at, cluster in rec.observed:
        now.append(at)
        daemon.now_at = at
        slurm.set_jobs(cluster.jobs)
        if id(cluster) in cycles:
            daemon.run(cluster, at)
        else:
            malleable.advance(cluster, at)  # an observation while a resize is in flight
    return daemon_engine, transactions, audit


def _compare(
    tmp_path: Path,
    trace: Sequence[TraceJob],
    shape: ClusterShape,
    policy_set: str,
    options: SimOptions,
) -> tuple[list[Decision], list[tuple[object, ...]]]:
    engine, rec, runner = _simulate(trace, shape, policy_set, options)
    daemon_engine, transactions, _ = _replay(tmp_path, engine, rec, runner)
    assert len(daemon_engine.seen) == len(engine.seen)
    every: list[Decision] = []
    for (snap, sim_out), (_, daemon_out) in zip(engine.seen, daemon_engine.seen, strict=True):
        assert _key(daemon_out) == _key(sim_out), f"decisions differ at {snap.at}"
        every += sim_out
    sim_rows = runner.resizer.transactions.recent(["resize", "pool"], limit=10_000)
    daemon_rows = transactions.recent(["resize", "pool"], limit=10_000)
    assert _phases(daemon_rows) == _phases(sim_rows)
    return every, _phases(sim_rows)


def _malleable(name: str, at: float, gpus: int, run_s: float, lo: int, user: str) -> TraceJob:
    return TraceJob(
        submit_s=at,
        name=name,
        user=user,
        model=RigidJob(run_s, gpus),
        gpus=gpus,
        time_limit_s=run_s * 4,
        malleable=MalleableRange(lo, gpus),
    )


def test_malleable_shrink_and_growth_take_the_same_path_in_the_daemon_and_the_simulator(
    tmp_path: Path,
) -> None:
    # A (malleable 2:4) fills the node; B (rigid, 2 GPUs) arrives and A is shrunk for
    # it; once B ends A grows back into the freed GPUs.
    trace = [
        _malleable("A", 0, 4, 4 * 3600, 2, "alice"),
        TraceJob(600, "B", "bob", RigidJob(1800, 2), gpus=2, time_limit_s=3600),
    ]
    decisions, phases = _compare(tmp_path, trace, ClusterShape(1, 4), "malleable", SimOptions())
    resizes = [(d.action.job_id, d.execute) for d in decisions if d.action.kind == "resize"]
    assert resizes.count((1, True)) >= 2, resizes  # a shrink and a growth, executed
    assert [(p[0], p[2]) for p in phases][:2] == [(1, "running"), (1, "running")], phases
    shrink = phases[0]
    assert shrink[4] is not None and "gpu:2" in str(shrink[4])
    t = shrink[6]
    assert isinstance(t, dict)
    assert {"signaled", "acked", "requeued", "pending", "updated", "released", "running"} <= set(t)


def test_las_preemption_takes_the_same_path_in_the_daemon_and_the_simulator(
    tmp_path: Path,
) -> None:
    trace = [
        _malleable("long", 0, 4, 4 * 3600, 1, "long"),
        _malleable("short", 1800, 2, 600, 1, "s"),
    ]
    las = AttainedServiceSettings(
        enabled=True, mode=Mode.ENFORCE, queue_limits=(1.0,), shrink=False
    )
    options = SimOptions(policies=SimPolicies(las=las))
    decisions, phases = _compare(tmp_path, trace, ClusterShape(1, 4), "las", options)
    preempts = [d for d in decisions if d.action.kind == "resize" and d.execute]
    assert preempts, "the scenario must preempt for the check to mean much"
    assert phases and all(p[2] == "running" for p in phases), phases
    assert any("Nice" in str(p[4]) for p in phases), phases  # the held job's queue


def test_las_shrink_and_grow_back_take_the_same_path_in_the_daemon_and_the_simulator(
    tmp_path: Path,
) -> None:
    # the long job (malleable 1:4) gives the short one its 2 GPUs and keeps running on
    # 2; once the short one is gone, LAS (no malleable policy beside it) grows it back
    trace = [
        _malleable("long", 0, 4, 4 * 3600, 1, "long"),
        _malleable("short", 1800, 2, 600, 1, "s"),
    ]
    las = AttainedServiceSettings(enabled=True, mode=Mode.ENFORCE, queue_limits=(1.0,))
    options = SimOptions(policies=SimPolicies(las=las))
    decisions, phases = _compare(tmp_path, trace, ClusterShape(1, 4), "las", options)
    sizes = [
        (d.action.numbers["from_gpus"], d.action.numbers["to_gpus"])
        for d in decisions
        if d.action.kind == "resize" and d.execute
    ]
    assert sizes == [(4, 2), (2, 4)], sizes
    assert [(p[0], p[2]) for p in phases] == [(1, "running"), (1, "running")], phases
    shrink, grow = phases
    assert "gpu:2" in str(shrink[4]) and "TimeLimit" in str(shrink[4])  # raised for 2 GPUs
    assert "Nice" not in str(shrink[4])  # it keeps its place
    assert "gpu:4" in str(grow[4])


def test_co_location_decides_the_same_intents_in_the_daemon_and_the_simulator(
    tmp_path: Path,
) -> None:
    share = "sgpu:shareable sgpu:gpu-mem=4096"

    def one(name: str, at: float, run_s: float, util: float, comment: str = "") -> TraceJob:
        return TraceJob(
            submit_s=at,
            name=name,
            user="bob" if name.startswith("light") else "alice",
            model=RigidJob(run_s, 1, util_pct=util, memory_mib=4096),
            gpus=1,
            gpus_per_node=1,
            comment=comment,
        )

    trace = [
        one("blocker", 0.0, 2000.0, 90.0),
        one("light-a", 1.0, 3600.0, 20.0, share),
        one("light-b", 1.5, 3600.0, 20.0, share),
    ]
    options = SimOptions(interference=model_interference())
    decisions, phases = _compare(tmp_path, trace, ClusterShape(1, 1, 4), "colocate", options)
    packed = [d for d in decisions if d.action.policy == "colocate" and d.execute]
    assert len(packed) == 2, decisions
    assert phases == []  # co-location is one update, no transaction


@pytest.mark.parametrize("fast_start", [True, False])
def test_the_simulator_paces_resizes_by_the_daemons_settings(fast_start: bool) -> None:
    # fast_start off is Slurm's plain requeue path: the job waits out the requeue delay.
    from slurmgpu.cycle.resize import ResizeSettings, durations

    trace = [
        _malleable("A", 0, 4, 4 * 3600, 2, "alice"),
        TraceJob(600, "B", "bob", RigidJob(1800, 2), gpus=2, time_limit_s=3600),
    ]
    options = SimOptions(resize=ResizeSettings(fast_start=fast_start))
    _, _, runner = _simulate(trace, ClusterShape(1, 4), "malleable", options)
    first = min(runner.resizer.transactions.recent(["resize"]), key=lambda r: r.id)
    assert first.state == "running"
    delay = durations(first)["requeue_delay"]
    assert delay == (2.0 if fast_start else options.requeue_delay_s)


def test_a_shrunk_job_overtaken_while_requeued_closes_alike_in_the_daemon_and_the_simulator(
    tmp_path: Path,
) -> None:
    # A (malleable 2:4) fills the node; C (rigid, 4 GPUs) waits first in line, then B
    # (rigid, 2 GPUs) arrives and A is shrunk for it. Requeued, A frees the whole node
    # for a moment and Slurm starts C, first by submission: A, released at 2 GPUs,
    # waits behind it, and its transaction closes as overtaken instead of holding it.
    trace = [
        _malleable("A", 0, 4, 4 * 3600, 2, "alice"),
        TraceJob(300, "C", "carol", RigidJob(3 * 3600, 4), gpus=4, time_limit_s=4 * 3600),
        TraceJob(600, "B", "bob", RigidJob(1800, 2), gpus=2, time_limit_s=3600),
    ]
    _, phases = _compare(tmp_path, trace, ClusterShape(1, 4), "malleable", SimOptions())
    assert [(p[0], p[2]) for p in phases][:1] == [(1, "overtaken")], phases
    error = phases[0][3]
    assert isinstance(error, str) and error.startswith("overtaken: still pending"), error

"""SimSlurm on small hand-checked traces whose right answer is worked out by hand."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from slurmgpu.cycle.resize import ResizeSettings
from slurmgpu.intent import Resize, SetGpus, SetNodes, SetTimeLimit, StartSoon
from slurmgpu.model import ClusterSnapshot, JobState, MalleableSpec
from slurmgpu.policy.base import Action, Decision, HistoryRecord, Mode, PolicySnapshot
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.settings import EngineSettings, MalleableSettings
from slurmgpu.sim.policysets import SimPolicies
from slurmgpu.sim.resizes import SimResizes
from slurmgpu.sim.run import ClusterShape, SimOptions, SimRun, simulate
from slurmgpu.sim.slurm import ElasticRuntime, SimSlurm
from slurmgpu.sim.workload import MalleableRange, RigidJob, TraceJob
from slurmgpu.slurm.client import SlurmClient, SlurmCommandError
from slurmgpu.slurm.parse import parse_time_limit


def job(
    name: str, gpus: int, run_s: float, limit_s: float | None, at: float = 0.0, **kw: object
) -> TraceJob:
    return TraceJob(
        submit_s=at,
        name=name,
        user="alice",
        model=RigidJob(run_s, gpus),
        gpus=gpus,
        time_limit_s=limit_s,
        **kw,  # type: ignore[arg-type]
    )


def by_name(sim: SimSlurm) -> dict[str, tuple[float, float]]:
    return {j.name: (j.first_start_s, j.end_s) for j in sim.all_jobs.values()}


def test_simslurm_implements_the_slurmclient_protocol() -> None:
    assert isinstance(SimSlurm(1, 4), SlurmClient)


def test_backfill_fills_a_hole_without_delaying_the_reserved_job() -> None:
    # One node, 4 GPUs. A (2 GPUs, 100 s) runs; B wants all 4 and gets a reservation
    # at t=100 (A's limit). C (2 GPUs, limit 60 s) ends before that: backfilled at t=0.
    # D (2 GPUs, limit 300 s) would run past t=100 on B's GPUs: it waits until B ends.
    sim = SimSlurm(1, 4)
    sim.submit_job(job("A", 2, 100, 100))
    sim.submit_job(job("B", 4, 100, 100))
    sim.submit_job(job("C", 2, 50, 60))
    sim.submit_job(job("D", 2, 200, 300))
    sim.run_until(10_000)
    t = by_name(sim)
    assert t["A"] == (0, 100)
    assert t["C"] == (0, 50)
    assert t["B"] == (100, 200)
    assert t["D"] == (200, 400)


def test_backfill_uses_time_limits_not_real_run_times() -> None:
    # C really runs 50 s but asks for 500 s: by its limit it would delay B, so no backfill.
    sim = SimSlurm(1, 4)
    sim.submit_job(job("A", 2, 100, 100))
    sim.submit_job(job("B", 4, 100, 100))
    sim.submit_job(job("C", 2, 50, 500))
    sim.run_until(10_000)
    t = by_name(sim)
    assert t["B"] == (100, 200)
    assert t["C"][0] == 200


def test_a_run_past_its_limit_times_out() -> None:
    sim = SimSlurm(1, 4)
    sim.submit_job(job("A", 1, 100, 60))
    sim.run_until(1000)
    (a,) = sim.all_jobs.values()
    assert a.state is JobState.TIMEOUT and a.end_s == 60


def test_a_requeue_costs_the_requeue_delay_and_the_startup() -> None:
    # A runs 100 s of work. Requeued at t=40 after a checkpoint signal at t=10 (the
    # checkpoint takes 20 s and saves the 10 s done before it): A waits 121 s, starts
    # again at 161, loads for 30 s, then does the 90 s left: ends at 161 + 30 + 90.
    runtime = ElasticRuntime(checkpoint_s=20, startup_s=30)
    sim = SimSlurm(1, 4, runtime=runtime)
    jid = sim.submit_job(job("A", 1, 100, None))
    sim.call_at(10, lambda: sim.signal(jid, "USR2"))
    sim.call_at(40, lambda: sim.requeue(jid))
    sim.run_until(50)
    pending = {j.job_id: j for j in sim.jobs()}[jid]
    assert pending.state is JobState.PENDING
    assert pending.reason == "BeginTime"
    assert pending.restart_count == 1
    sim.run_until(10_000)
    a = sim.job(jid)
    assert a.state is JobState.COMPLETED
    assert a.runs[-1].start_s == 40 + 121
    assert a.end_s == pytest.approx(161 + 30 + 90)


def test_a_requeue_without_a_checkpoint_loses_the_work_done() -> None:
    sim = SimSlurm(1, 4, runtime=ElasticRuntime(startup_s=0))
    jid = sim.submit_job(job("A", 1, 100, None))
    sim.call_at(40, lambda: sim.requeue(jid))
    sim.run_until(10_000)
    assert sim.job(jid).end_s == pytest.approx(161 + 100)


def test_requeue_delay_is_configurable() -> None:
    sim = SimSlurm(1, 4, requeue_delay_s=5, runtime=ElasticRuntime(startup_s=0))
    jid = sim.submit_job(job("A", 1, 100, None))
    sim.call_at(40, lambda: sim.requeue(jid))
    sim.run_until(10_000)
    assert sim.job(jid).runs[-1].start_s == 45


def test_array_throttle_limits_running_tasks_and_can_be_raised() -> None:
    sim = SimSlurm(1, 4)
    array_id = sim.submit_job(job("arr", 1, 100, 200, array_tasks=4, array_throttle=2))
    sim.run_until(1)
    listed = sim.jobs()
    running = [j for j in listed if j.state is JobState.RUNNING]
    meta = [j for j in listed if j.state is JobState.PENDING]
    assert len(running) == 2
    assert [m.display_id for m in meta] == [f"{array_id}_[2-3%2]"]
    sim.set_array_throttle(array_id, 0)
    sim.run_until(2)
    assert sum(1 for j in sim.jobs() if j.state is JobState.RUNNING) == 4


def test_update_of_one_array_task_by_its_a_i_id() -> None:
    sim = SimSlurm(1, 1)
    array_id = sim.submit_job(job("arr", 1, 100, 200, array_tasks=3))
    sim.run_until(1)
    sim.update_job(f"{array_id}_2", (SetTimeLimit(600),))
    limits = {j.array_task_id: j.time_limit_s for j in sim.all_jobs.values()}
    assert limits == {0: 200, 1: 200, 2: 600}


def test_hold_release_and_update_of_a_pending_job() -> None:
    sim = SimSlurm(1, 4)
    sim.submit_job(job("A", 4, 100, 100))
    b = sim.submit_job(job("B", 4, 100, 500))
    sim.hold(b)
    sim.update_job(b, (SetTimeLimit(300), SetGpus(2, per_node=False)))
    sim.run_until(150)
    assert sim.job(b).state is JobState.PENDING  # held: A's end did not start it
    sim.release(b)
    sim.run_until(10_000)
    bj = sim.job(b)
    assert bj.first_start_s == 150 and bj.time_limit_s == 300 and bj.allocated_gpus == 2


def test_a_gpu_change_to_a_running_job_is_refused_like_slurmctld() -> None:
    sim = SimSlurm(1, 4)
    a = sim.submit_job(job("A", 2, 100, 100))
    sim.run_until(1)
    with pytest.raises(SlurmCommandError, match="pending"):
        sim.update_job(a, (SetGpus(1, per_node=False),))
    with pytest.raises(SlurmCommandError, match="Invalid job id"):
        sim.update_job(999, (SetTimeLimit(60),))


def test_shard_jobs_share_one_gpu_and_slow_each_other() -> None:
    def half_speed(ua: float, ma: float, ub: float, mb: float) -> tuple[float, float]:
        return 2.0, 2.0

    sim = SimSlurm(1, 2, shards_per_gpu=2, interference=half_speed)
    sim.submit_job(job("A", 0, 100, None, shards=1))
    sim.submit_job(job("B", 0, 100, None, shards=1))
    sim.run_until(10_000)
    a, b = sim.all_jobs.values()
    assert a.shard_alloc is not None and b.shard_alloc is not None
    assert a.shard_alloc[:2] == b.shard_alloc[:2]  # the same GPU
    assert a.end_s == pytest.approx(200) and b.end_s == pytest.approx(200)


def test_placement_is_compact_when_it_can_be() -> None:
    sim = SimSlurm(4, 4)
    sim.submit_job(job("A", 6, 100, None))
    sim.run_until(1)
    (a,) = sim.all_jobs.values()
    assert sorted(a.placement) == [2, 4]


class _ShrinkWhenOthersWait:
    """Test-only policy: shrink a running multi-node job in place when a job waits."""

    name = "test_shrink"

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        jobs = snapshot.cluster.jobs
        if not any(j.state is JobState.PENDING for j in jobs):
            return []
        return [
            Action(
                policy=self.name,
                kind="update",
                job_id=j.job_id,
                user=j.user,
                reason="a job waits",
                intents=(SetNodes(j.node_count - 1),),
            )
            for j in jobs
            if j.state is JobState.RUNNING and j.node_count > 1
        ]


def test_a_shrink_lets_a_waiting_job_start_through_the_real_engine() -> None:
    # Two nodes of 4 GPUs. A holds all 8 (two nodes) for 1000 s of work; B wants 4.
    # Without a policy B waits for A. The test policy, run by the real PolicyEngine at
    # the first cycle (t=60), shrinks A to one node: B starts then.
    trace = [job("A", 8, 1000, None), job("B", 4, 100, 200, at=1)]
    shape = ClusterShape(2, 4)
    plain = simulate(trace, shape, "slurm")
    start = {j.name: j.first_start_s for j in plain.jobs}
    assert start["B"] == pytest.approx(1000)
    engine = PolicyEngine([(_ShrinkWhenOthersWait(), Mode.ENFORCE)], EngineSettings())
    run = simulate(trace, shape, "slurm", SimOptions(record_decisions=True), engine=engine)
    start = {j.name: j.first_start_s for j in run.jobs}
    assert start["B"] == pytest.approx(60)
    assert [(d.kind, d.fields, d.outcome) for d in run.decisions] == [
        ("update", (("NumNodes", "1"),), "done")
    ]
    a = next(j for j in run.jobs if j.name == "A")
    assert a.allocated_gpus == 4 and a.restarts == 0


def _resize_at(sim: SimSlurm, resizes: SimResizes, at_s: float, action: Action) -> None:
    """The daemon's dispatcher starts ``action`` at ``at_s`` (the job malleable 1:4)."""

    def go() -> None:
        listing = ClusterSnapshot(
            sim.at(sim.now), tuple(sim.jobs()), tuple(sim.nodes()), sim.version()
        )
        spec = {action.job_id: MalleableSpec(action.job_id, 1, 4)}
        done = resizes.carry_out(Decision(action, Mode.ENFORCE, True, True), listing, spec)
        assert done.outcome == "done", done

    sim.call_at(at_s, go)


def test_resize_is_checkpoint_requeue_delay_restart_at_the_new_size() -> None:
    # Slurm's plain requeue path (the executor without fast_start). A (4 GPUs, 1000 s of
    # work at 4 GPUs) is resized to 2 at t=60: checkpoint signal (20 s pause; 60 s of
    # work saved), the ack seen at 80 and the job requeued held; seen pending at 81,
    # updated and released; eligible at 80 + 121 = 201; 30 s start-up; the 940 s left
    # run at 2 GPUs, where Amdahl (p = 0.95) makes it 1.9 / 1.0256 ... slower:
    # rate(2) / rate(4) = 1.9048 / 3.4783.
    sim = SimSlurm(1, 4, runtime=ElasticRuntime(checkpoint_s=20, startup_s=30))
    jid = sim.submit_job(job("A", 4, 1000, None))
    resizes = SimResizes(sim, ResizeSettings(fast_start=False))
    _resize_at(
        sim, resizes, 60, Action("test", "resize", jid, "alice", "t", intents=(Resize(4, 2),))
    )
    sim.run_until(100)
    assert sim.job(jid).state is JobState.PENDING and sim.job(jid).restarts == 1
    sim.run_until(100_000)
    a = sim.job(jid)
    assert a.state is JobState.COMPLETED
    assert a.allocated_gpus == 2 and a.runs[-1].start_s == pytest.approx(201)
    slower = (1 / (0.05 + 0.95 / 4)) / (1 / (0.05 + 0.95 / 2))
    assert a.end_s == pytest.approx(201 + 30 + 940 * slower)
    (row,) = resizes.transactions.recent(["resize"])
    assert row.state == "running" and not resizes.in_flight


def test_a_resize_of_a_job_that_ends_before_its_checkpoint_is_aborted() -> None:
    sim = SimSlurm(1, 4, runtime=ElasticRuntime(checkpoint_s=20, startup_s=30))
    jid = sim.submit_job(job("A", 4, 500, None))
    resizes = SimResizes(sim)
    _resize_at(
        sim, resizes, 40, Action("test", "resize", jid, "alice", "t", intents=(Resize(4, 2),))
    )
    sim.call_at(50, lambda: sim.cancel(jid))  # before the checkpoint is acknowledged
    sim.run_until(100_000)
    a = sim.job(jid)
    assert a.state is JobState.CANCELLED and a.restarts == 0 and a.end_s == 50
    (row,) = resizes.transactions.recent(["resize"])
    assert row.state == "aborted" and not resizes.in_flight


def _shrink_scenario(scale_time_limit: bool) -> SimRun:
    # One node of 4 GPUs. A (malleable 2:4) has 3000 s of work at 4 GPUs and a 3600 s
    # limit, right for 4 GPUs; its history says such runs take ~4000 s. B (rigid, 2 GPUs,
    # 1000 s, 1200 s limit) arrives at t=100: the malleable policy shrinks A to 2 GPUs
    # for it. At 2 GPUs A's ~2900 s of work left take ~5300 s, past its 3600 s limit.
    a = job("A", 4, 3000, 3600, malleable=MalleableRange(2, 4))
    b = replace(job("B", 2, 1000, 1200, at=100), user="bob")
    past = tuple(
        HistoryRecord(
            user="alice",
            name="A",
            partition="gpu",
            script_hash=None,
            state="COMPLETED",
            run_time=timedelta(seconds=4000),
            time_limit=timedelta(seconds=4200),
            gpus_requested=4,
            gpus_used=4,
            cpus=0,
            memory_requested_mib=None,
            peak_memory_mib=None,
            mean_cpu_pct=None,
            mean_gpu_util_pct=100.0,
            peak_gpu_memory_mib=None,
            ended_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for _ in range(5)
    )
    malleable = MalleableSettings(scale_time_limit=scale_time_limit, expand=False)
    options = SimOptions(
        record_decisions=True,
        history=past,
        max_resubmits=0,
        policies=SimPolicies(malleable=malleable),
    )
    return simulate([a, b], ClusterShape(1, 4), "malleable", options)


def test_a_shrunk_job_gets_a_time_limit_for_its_new_size_and_no_longer_times_out() -> None:
    before = _shrink_scenario(scale_time_limit=False)
    assert [d.fields for d in before.decisions if d.kind == "resize"] == [
        (("from_gpus", "4"), ("to_gpus", "2"))
    ]
    assert {j.name: j.state for j in before.jobs}["A"] is JobState.TIMEOUT
    after = _shrink_scenario(scale_time_limit=True)
    (resize,) = [dict(d.fields) for d in after.decisions if d.kind == "resize"]
    assert resize["to_gpus"] == "2" and "TimeLimit" in resize
    a = next(j for j in after.jobs if j.name == "A")
    assert a.state is JobState.COMPLETED and a.allocated_gpus == 2
    assert a.time_limit_s == parse_time_limit(resize["TimeLimit"]).total_seconds()  # type: ignore[union-attr]


def test_resize_on_the_daemons_fast_path_skips_the_requeue_delay() -> None:
    # As test_resize_is_checkpoint_requeue_delay_restart_at_the_new_size, on the daemon's
    # fast path (the executor's default ResizeSettings, one observation a second): the
    # ack written at 80 is seen at 80 and the job requeued held; pending seen at 81:
    # updated with StartTime=now+1 (eligible 82); released on the first observation
    # 1.5 s after the update, at 83, when it starts: 118 s sooner than after Slurm's
    # 121 s requeue delay.
    sim = SimSlurm(1, 4, runtime=ElasticRuntime(checkpoint_s=20, startup_s=30))
    jid = sim.submit_job(job("A", 4, 1000, None))
    resizes = SimResizes(sim)
    _resize_at(
        sim, resizes, 60, Action("test", "resize", jid, "alice", "t", intents=(Resize(4, 2),))
    )
    sim.run_until(82.5)
    a = sim.job(jid)
    assert a.state is JobState.PENDING and a.held and a.gpus == 2
    assert a.eligible_s == pytest.approx(82.0)
    sim.run_until(100_000)
    a = sim.job(jid)
    assert a.state is JobState.COMPLETED and a.allocated_gpus == 2
    assert a.runs[-1].start_s == pytest.approx(83.0)
    slower = (1 / (0.05 + 0.95 / 4)) / (1 / (0.05 + 0.95 / 2))
    assert a.end_s == pytest.approx(83.0 + 30 + 940 * slower)
    (row,) = resizes.transactions.recent(["resize"])
    t0 = sim.at(0)
    t = {k: (datetime.fromisoformat(v) - t0).total_seconds() for k, v in row.payload["t"].items()}
    phases = ("signaled", "acked", "requeued", "pending", "updated", "released", "running")
    assert [t[k] for k in phases] == [60, 80, 80, 81, 81, 83, 84]


def test_simslurm_takes_a_start_time_for_a_pending_job() -> None:
    sim = SimSlurm(1, 4)
    jid = sim.submit_job(job("A", 4, 100, None, at=0))
    sim.hold(jid)
    sim.update_job(jid, (StartSoon(50),))
    sim.release(jid)
    sim.run_until(10)
    assert sim.job(jid).state is JobState.PENDING
    sim.run_until(60)
    assert sim.job(jid).state is JobState.RUNNING and sim.job(jid).start_s == pytest.approx(50)
    with pytest.raises(SlurmCommandError, match="StartTime"):
        sim.update_job(sim.submit_job(job("B", 1, 10, None)), (StartSoon(-1),))

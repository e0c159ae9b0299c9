"""The malleable policy on hand-built snapshots: shrink for waiting jobs, expand into idle GPUs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from slurmgpu.config import ConfigError, load_settings
from slurmgpu.intent import SetGpus, SetTimeLimit
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, MalleableSpec, Node
from slurmgpu.policy.base import Action, JobUsage, Mode, PolicySnapshot, resize_sizes
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.malleable import MalleablePolicy
from slurmgpu.policy.settings import EngineSettings, MalleableSettings, PolicyConfigError
from slurmgpu.policy.speedup import DEFAULT_PRIOR, fit_speedup
from tests.unit.policy_builders import HOUR, MIN, T0, gpu, pending_job, record, running_job, usage


def limit_of(action: Action) -> SetTimeLimit | None:
    """The action's time limit intent, if it has one."""
    return next((i for i in action.intents if isinstance(i, SetTimeLimit)), None)


def nodes(count: int = 2, gpus: int = 4, used: Mapping[str, int] | None = None) -> list[Node]:
    used = used or {}
    return [
        Node(f"gpu{i}", "mixed", gpus=gpus, gpus_used=used.get(f"gpu{i}", 0))
        for i in range(1, count + 1)
    ]


def used_by(jobs: Iterable[Job]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        for a in j.gpu_allocations:
            out[a.node] = out.get(a.node, 0) + len(a.gpu_indices)
    return out


def snap(
    jobs: list[Job],
    *,
    malleable: Mapping[int, tuple[int, int]] | None = None,
    node_count: int = 2,
    throughput: Mapping[int, Mapping[int, float]] | None = None,
    at: datetime = T0,
    resize_cost: timedelta | None = None,
    last_resize_at: Mapping[int, datetime] | None = None,
    resizing: Iterable[int] = (),
    usage_by_job: Iterable[JobUsage] = (),
    history: Iterable[object] = (),
) -> PolicySnapshot:
    running = [j for j in jobs if j.gpu_allocations]
    return PolicySnapshot(
        at=at,
        cluster=ClusterSnapshot(at, tuple(jobs), tuple(nodes(node_count, used=used_by(running)))),
        usage={u.job_id: u for u in usage_by_job},
        history=tuple(history),  # type: ignore[arg-type]
        malleable={j: MalleableSpec(j, lo, hi) for j, (lo, hi) in (malleable or {}).items()},
        resizing=frozenset(resizing),
        throughput={k: dict(v) for k, v in (throughput or {}).items()},
        resize_cost=resize_cost,
        last_resize_at=dict(last_resize_at or {}),
    )


def four(node: str = "gpu1") -> dict[str, tuple[int, ...]]:
    return {node: (0, 1, 2, 3)}


def two(node: str = "gpu1") -> dict[str, tuple[int, ...]]:
    return {node: (0, 1)}


def sizes(actions: list[Action]) -> dict[int, tuple[int, int]]:
    return {a.job_id: resize_sizes(a) for a in actions}


# Poor scaling past 2 GPUs: shrinking 4 -> 2 costs little throughput.
POOR = {2: 100.0, 4: 110.0}
# Near-linear scaling: growing pays.
GOOD = {2: 100.0, 4: 195.0}


def full_cluster_with_waiting_rigid_job(**pending: object) -> list[Job]:
    mall = running_job(1, gpus=four("gpu1"), started=HOUR)
    rigid = running_job(2, gpus=four("gpu2"), started=10 * HOUR, user="bob")
    waiting = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=2, **pending)  # type: ignore[arg-type]
    return [mall, rigid, waiting]


def test_full_cluster_and_a_waiting_rigid_job_shrinks_the_malleable_job() -> None:
    jobs = full_cluster_with_waiting_rigid_job(time_limit=timedelta(hours=1))
    actions = MalleablePolicy().propose(snap(jobs, malleable={1: (2, 4)}, throughput={1: POOR}))
    assert sizes(actions) == {1: (4, 2)}
    a = actions[0]
    assert a.kind == "resize" and a.policy == "malleable"
    assert a.numbers["direction"] == "shrink" and a.numbers["for_job"] == 3
    assert "waiting job 3" in a.reason


def test_shrink_needs_a_gain_over_the_donors_loss() -> None:
    # The waiting job runs 24 h and the donor scales linearly: shrinking it for the
    # whole of its remaining time costs more than the wait it saves.
    jobs = full_cluster_with_waiting_rigid_job(time_limit=timedelta(hours=24))
    linear = {2: 100.0, 4: 200.0}
    assert (
        MalleablePolicy().propose(snap(jobs, malleable={1: (2, 4)}, throughput={1: linear})) == []
    )


def test_shrink_never_goes_below_min() -> None:
    jobs = full_cluster_with_waiting_rigid_job(time_limit=timedelta(hours=1))
    # MIN 3: the job may give only one GPU, and the waiting job needs two.
    assert MalleablePolicy().propose(snap(jobs, malleable={1: (3, 4)}, throughput={1: POOR})) == []


def test_a_waiting_job_that_fits_is_not_shrunk_for_and_its_gpus_are_not_expanded_into() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=HOUR)
    rigid = running_job(2, gpus=four("gpu2"), started=HOUR, user="bob")
    waiting = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=2)
    actions = MalleablePolicy().propose(
        snap([mall, rigid, waiting], malleable={1: (1, 4)}, throughput={1: GOOD})
    )
    assert actions == []  # the two free GPUs are the waiting job's


def test_idle_gpus_and_no_pending_job_expand_the_malleable_job() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    actions = MalleablePolicy().propose(
        snap([mall], malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1)
    )
    assert sizes(actions) == {1: (2, 4)}
    assert actions[0].numbers["direction"] == "expand"
    assert int(actions[0].numbers["saving_s"] or 0) > 0


def test_two_jobs_on_one_node_do_not_both_grow_into_its_idle_gpus() -> None:
    # Two single-node jobs at 1 GPU on a 4-GPU node: 2 idle GPUs between them. Seen on
    # the lab (fidelity replay, `all`): both were grown (1 -> 3 and 1 -> 2) into the
    # same 2 GPUs; 5 GPUs on a 4-GPU node, so one waited 2 min to start again.
    # A rigid job leaves gpu2 one idle GPU: 3 idle in all, so the first growth (1 -> 3
    # on gpu1) leaves the pool one, which gpu1 no longer has.
    a = running_job(1, gpus={"gpu1": (0,)}, started=2 * HOUR)
    b = running_job(2, gpus={"gpu1": (1,)}, started=2 * HOUR, user="bob")
    rigid = running_job(3, gpus={"gpu2": (0, 1, 2)}, started=2 * HOUR, user="carol")
    linear = {1: 100.0, 2: 200.0, 3: 300.0, 4: 400.0}
    actions = MalleablePolicy().propose(
        snap(
            [a, b, rigid],
            malleable={1: (1, 4), 2: (1, 4)},
            throughput={1: linear, 2: linear},
            node_count=2,
        )
    )
    grown = {j: to - was for j, (was, to) in sizes(actions).items()}
    assert grown == {1: 2}  # job 2 would only fit on gpu1, whose idle GPUs job 1 takes


def test_expand_without_measurements_follows_the_prior() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    actions = MalleablePolicy().propose(snap([mall], malleable={1: (1, 4)}, node_count=1))
    assert sizes(actions) == {1: (2, 4)}


def test_expand_never_goes_above_max() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    actions = MalleablePolicy().propose(
        snap([mall], malleable={1: (1, 3)}, throughput={1: GOOD}, node_count=2)
    )
    assert sizes(actions) == {1: (2, 3)}
    at_max = running_job(1, gpus=four("gpu1"), started=2 * HOUR)
    assert MalleablePolicy().propose(snap([at_max], malleable={1: (1, 4)}, node_count=2)) == []


def test_jobs_that_are_not_malleable_are_never_touched() -> None:
    rigid = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    other = running_job(5, gpus=two("gpu2"), started=2 * HOUR, user="bob")
    waiting = pending_job(3, gpus_per_node=None, gpus_per_job=6, time_limit=HOUR)
    actions = MalleablePolicy().propose(
        snap([rigid, other, waiting], malleable={5: (2, 2)}, throughput={1: GOOD})
    )
    assert actions == []
    # Even with idle GPUs, a job without a malleable spec is not expanded.
    assert MalleablePolicy().propose(snap([rigid], throughput={1: GOOD}, node_count=2)) == []


def test_poor_scaling_is_not_expanded_dead_band_both_ways() -> None:
    # 4 GPUs are only 8 % faster than 2: expanding is not worth a restart, and at 4 GPUs
    # with nobody waiting it is not shrunk back either.
    flat = {2: 100.0, 4: 108.0}
    small = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    assert (
        MalleablePolicy().propose(snap([small], malleable={1: (1, 4)}, throughput={1: flat})) == []
    )
    big = running_job(1, gpus=four("gpu1"), started=2 * HOUR)
    assert MalleablePolicy().propose(snap([big], malleable={1: (1, 4)}, throughput={1: flat})) == []


def test_min_gain_is_the_hysteresis_threshold() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    s = snap([mall], malleable={1: (1, 4)}, throughput={1: {2: 100.0, 4: 130.0}}, node_count=1)
    assert sizes(MalleablePolicy(MalleableSettings(min_gain=0.15)).propose(s)) == {1: (2, 4)}
    assert MalleablePolicy(MalleableSettings(min_gain=0.3)).propose(s) == []


def test_minimum_interval_between_resizes_of_one_job() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    base = dict(malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1)
    recent = snap([mall], last_resize_at={1: T0 - 5 * MIN}, **base)  # type: ignore[arg-type]
    assert MalleablePolicy().propose(recent) == []
    older = snap([mall], last_resize_at={1: T0 - 11 * MIN}, **base)  # type: ignore[arg-type]
    assert sizes(MalleablePolicy().propose(older)) == {1: (2, 4)}


def test_a_job_with_a_resize_in_flight_is_left_alone() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    s = snap([mall], malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1, resizing=[1])
    assert MalleablePolicy().propose(s) == []


def test_reconfiguration_cost_too_high_means_no_action() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=HOUR)
    base = dict(malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1)
    costly = snap([mall], resize_cost=timedelta(hours=1), **base)  # type: ignore[arg-type]
    assert MalleablePolicy().propose(costly) == []
    # The same snapshot with the measured cost ignored uses the 181 s default and acts.
    assert sizes(MalleablePolicy(MalleableSettings(use_measured_cost=False)).propose(costly)) == {
        1: (2, 4)
    }
    expensive_default = MalleableSettings(requeue_delay=timedelta(hours=1))
    assert MalleablePolicy(expensive_default).propose(snap([mall], **base)) == []  # type: ignore[arg-type]


def test_a_job_near_its_time_limit_is_not_expanded() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR, time_limit=2 * HOUR + 3 * MIN)
    assert MalleablePolicy().propose(snap([mall], malleable={1: (1, 4)}, node_count=1)) == []


def test_a_job_with_idle_gpus_is_not_expanded() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    idle = usage(1, gpu("gpu1", 0, util=2.0), gpu("gpu1", 1, util=1.0))
    busy = usage(1, gpu("gpu1", 0, util=90.0), gpu("gpu1", 1, util=80.0))
    base = dict(malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1)
    assert MalleablePolicy().propose(snap([mall], usage_by_job=[idle], **base)) == []  # type: ignore[arg-type]
    assert sizes(MalleablePolicy().propose(snap([mall], usage_by_job=[busy], **base))) == {  # type: ignore[arg-type]
        1: (2, 4)
    }


def test_idle_gpus_go_to_the_job_that_gains_most_per_gpu() -> None:
    # --gpus=2 requests: Slurm may place them across nodes when they grow.
    req = GpuRequest(gpus=2, per_job=2)
    good = replace(running_job(1, gpus={"gpu1": (0, 1)}, started=2 * HOUR), gpus=req)
    poor = replace(running_job(2, gpus={"gpu1": (2, 3)}, started=2 * HOUR, user="bob"), gpus=req)
    rigid = running_job(9, gpus={"gpu2": (0, 1)}, started=2 * HOUR, user="dan")
    s = snap(
        [good, poor, rigid],
        malleable={1: (1, 8), 2: (1, 8)},
        throughput={1: GOOD, 2: {2: 100.0, 4: 150.0}},
        node_count=2,  # two idle GPUs on gpu2
    )
    assert sizes(MalleablePolicy().propose(s)) == {1: (2, 4)}  # to the better scaler
    # With more idle GPUs than the better scaler may take (its MAX is 4), both grow,
    # never past what is free.
    more = tuple(nodes(3, used={"gpu1": 4, "gpu2": 2}))
    s3 = replace(
        s,
        cluster=replace(s.cluster, nodes=more),
        malleable={1: MalleableSpec(1, 1, 4), 2: MalleableSpec(2, 1, 8)},
    )
    got = sizes(MalleablePolicy().propose(s3))
    assert got[1] == (2, 4)
    assert got[2][1] > 2
    assert sum(to - frm for frm, to in got.values()) <= 6


def test_blocked_big_job_keeps_its_reservation_from_expansion() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    rigid = running_job(2, gpus=four("gpu2"), started=HOUR, user="bob")
    big = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=8, time_limit=24 * HOUR)
    base = dict(malleable={1: (2, 4)}, throughput={1: GOOD})
    assert MalleablePolicy().propose(snap([mall, rigid, big], **base)) == []  # type: ignore[arg-type]
    greedy = MalleablePolicy(MalleableSettings(reserve_for_blocked=False))
    assert sizes(greedy.propose(snap([mall, rigid, big], **base))) == {1: (2, 4)}  # type: ignore[arg-type]


def test_multiple_donors_together_free_a_waiting_job() -> None:
    a = running_job(1, gpus={"gpu1": (0, 1, 2, 3)}, started=HOUR)
    b = running_job(2, gpus={"gpu2": (0, 1, 2, 3)}, started=HOUR, user="bob")
    waiting = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=4, time_limit=HOUR)
    s = snap([a, b, waiting], malleable={1: (2, 4), 2: (2, 4)}, throughput={1: POOR, 2: POOR})
    assert sizes(MalleablePolicy().propose(s)) == {1: (4, 2), 2: (4, 2)}


def test_per_node_waiting_job_is_freed_on_one_node() -> None:
    a = running_job(1, gpus={"gpu1": (0, 1, 2, 3)}, started=HOUR)
    b = running_job(2, gpus={"gpu2": (0, 1, 2)}, started=HOUR, user="bob")
    waiting = pending_job(3, user="carol", gpus_per_node=2, time_limit=HOUR)  # one node
    s = snap([a, b, waiting], malleable={1: (1, 4)}, throughput={1: {1: 60.0, 2: 100.0, 4: 110.0}})
    # gpu2 has one free GPU; shrinking job 1 on gpu1 by 2 gives a node with 2 free.
    assert sizes(MalleablePolicy().propose(s)) == {1: (4, 2)}


def test_waiting_job_history_shortens_the_donors_loss() -> None:
    # A waiting job that runs 20 min (history) next to a donor with hours left: the donor
    # loses only those 20 minutes at the smaller size, then grows back.
    jobs = full_cluster_with_waiting_rigid_job(time_limit=24 * HOUR)
    linear = {2: 100.0, 4: 180.0}
    hist = [record(user="carol", name="train", run_time=20 * MIN) for _ in range(3)]
    s = snap(jobs, malleable={1: (2, 4)}, throughput={1: linear}, history=hist)
    assert sizes(MalleablePolicy().propose(s)) == {1: (4, 2)}
    assert MalleablePolicy().propose(replace(s, history=())) == []


def test_engine_modes_advise_notifies_enforce_executes() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    s = snap([mall], malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1)
    policy = MalleablePolicy()
    cooldown = EngineSettings(job_cooldown=timedelta(0))
    advise = PolicyEngine([(policy, Mode.ADVISE)], cooldown).decide(s)
    assert [(d.action.kind, d.execute, d.notify) for d in advise] == [("resize", False, True)]
    enforce = PolicyEngine([(policy, Mode.ENFORCE)], cooldown).decide(s)
    assert [(d.action.kind, d.execute, d.notify) for d in enforce] == [("resize", True, True)]
    observe = PolicyEngine([(policy, Mode.OBSERVE)], cooldown).decide(s)
    assert [(d.execute, d.notify) for d in observe] == [(False, False)]
    # The engine's guardrails apply as to any change: an exempt user is never resized.
    exempt = PolicyEngine(
        [(policy, Mode.ENFORCE)], EngineSettings(exempt_users=frozenset({"alice"}))
    ).decide(s)
    assert exempt[0].suppressed.startswith("exempt user")


def test_settings_from_config_table() -> None:
    s = MalleableSettings.from_mapping(
        {"mode": "enforce", "min_gain": 0.25, "min_interval": "15m", "requeue_delay": "61s"}
    )
    assert s.mode is Mode.ENFORCE and s.min_gain == 0.25
    assert s.min_interval == 15 * MIN
    assert s.default_cost == timedelta(seconds=30 + 61 + 30)
    with pytest.raises(PolicyConfigError, match=r"policy\.malleable\.min_gain"):
        MalleableSettings.from_mapping({"min_gain": 2})
    with pytest.raises(PolicyConfigError, match="max_growth"):
        MalleableSettings.from_mapping({"max_growth": 1.0})
    with pytest.raises(PolicyConfigError, match="not a known setting"):
        MalleableSettings.from_mapping({"min_gian": 0.2})


def test_nothing_malleable_is_cheap_and_empty() -> None:
    jobs = [running_job(i, gpus={"gpu1": (0,)}, started=HOUR) for i in range(1, 50)]
    assert MalleablePolicy().propose(snap(jobs)) == []


def test_config_file_policy_malleable_table(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[daemon]\nmode = "enforce"\n\n[policy.malleable]\nmin_gain = 0.2\n')
    s = load_settings(path).policy.malleable
    assert s.mode is Mode.ENFORCE  # daemon.mode, as every policy table without its own
    assert s.min_gain == 0.2
    path.write_text('[policy.malleable]\nmin_interval = "soon"\n')
    with pytest.raises(ConfigError, match=r"line 2: policy\.malleable\.min_interval"):
        load_settings(path)


# ---- start smaller


def two_free_and_a_waiting_malleable_job(**pending: object) -> list[Job]:
    """gpu1 has 2 of 4 GPUs free, gpu2 is full; job 3 waits for 4 GPUs on one node."""
    rigid_a = running_job(1, gpus=two("gpu1"), started=HOUR, user="bob")
    rigid_b = running_job(2, gpus=four("gpu2"), started=HOUR, user="bob")
    waiting = pending_job(3, user="carol", gpus_per_node=4, **pending)  # type: ignore[arg-type]
    return [rigid_a, rigid_b, waiting]


def test_a_waiting_malleable_job_starts_now_at_the_gpus_free() -> None:
    jobs = two_free_and_a_waiting_malleable_job(time_limit=timedelta(hours=1))
    actions = MalleablePolicy().propose(snap(jobs, malleable={3: (2, 4)}))
    (a,) = actions
    assert (a.kind, a.job_id, a.policy) == ("update", 3, "malleable")
    assert a.intents == (SetGpus(2), limit_of(a))
    assert a.numbers["direction"] == "start_smaller" and a.numbers["to_gpus"] == 2
    # Its 1 h limit was for 4 GPUs: scaled by the prior curve's speed ratio, +10 %, +1 min.
    curve = fit_speedup({4: 1.0}, DEFAULT_PRIOR)
    assert curve is not None
    ratio = curve.throughput(4) / curve.throughput(2)
    want = timedelta(minutes=math.ceil(60 * ratio * 1.1 + 1))
    assert limit_of(a) == SetTimeLimit.of(want)
    assert a.numbers["time_limit_s"] == want.total_seconds()
    assert a.numbers["time_limit_was_s"] == 3600
    assert not a.requires_opt_in  # the malleable spec is the opt-in


def test_start_smaller_keeps_per_job_requests_per_job() -> None:
    rigid = running_job(1, gpus=four("gpu1"), started=HOUR, user="bob")
    half = running_job(2, gpus=two("gpu2"), started=HOUR, user="bob")
    waiting = pending_job(3, gpus_per_node=None, gpus_per_job=4, time_limit=timedelta(hours=1))
    s = snap([rigid, half, waiting], malleable={3: (1, 4)})
    (a,) = MalleablePolicy().propose(s)
    assert a.intents == (SetGpus(2, per_node=False), SetTimeLimit(2 * 3600 + 3 * 60))


def test_start_smaller_never_below_min_nor_for_jobs_that_are_not_malleable() -> None:
    jobs = two_free_and_a_waiting_malleable_job(time_limit=timedelta(hours=1))
    assert MalleablePolicy().propose(snap(jobs, malleable={3: (3, 4)})) == []
    assert MalleablePolicy().propose(snap(jobs, malleable={1: (2, 4)})) == []


def test_start_smaller_only_when_it_beats_waiting() -> None:
    # The running jobs end within minutes (their history says so) but the waiting one
    # would run for days at half speed: waiting is better.
    jobs = two_free_and_a_waiting_malleable_job(time_limit=timedelta(days=7))
    jobs = [
        replace(j, time_limit=timedelta(hours=1, minutes=5)) if j.job_id != 3 else j for j in jobs
    ]
    assert MalleablePolicy().propose(snap(jobs, malleable={3: (2, 4)})) == []
    off = MalleablePolicy(MalleableSettings(start_smaller=False))
    short = two_free_and_a_waiting_malleable_job(time_limit=timedelta(hours=1))
    assert off.propose(snap(short, malleable={3: (2, 4)})) == []


def test_the_free_gpus_go_first_to_the_job_slurm_starts_first() -> None:
    """gpu1 has one GPU free; job 3 (malleable 1:4, asks for 4) waits since before job
    4 (rigid, asks for 1). In submit order job 3 is started on the free GPU; where Slurm
    lists priorities and job 4's is higher (fair share), Slurm gives that GPU to job 4,
    so job 3 is not changed. Without priorities (priority/basic) submit order stands."""
    rigid_a = running_job(1, gpus={"gpu1": (0, 1, 2)}, started=HOUR, user="bob")
    rigid_b = running_job(2, gpus=four("gpu2"), started=HOUR, user="bob")
    early = pending_job(3, user="carol", time_limit=10 * MIN, submit_time=T0 - HOUR)
    late = pending_job(4, user="dave", gpus_per_node=1, submit_time=T0 - MIN)

    def propose(priorities: tuple[int, int] | None) -> list[Action]:
        jobs = [early, late]
        if priorities is not None:
            jobs = [replace(j, priority=p) for j, p in zip(jobs, priorities, strict=True)]
        return MalleablePolicy().propose(snap([rigid_a, rigid_b, *jobs], malleable={3: (1, 4)}))

    (a,) = propose(None)
    assert (a.job_id, a.numbers["direction"], a.numbers["to_gpus"]) == (3, "start_smaller", 1)
    assert propose((100, 200)) == []
    (b,) = propose((200, 100))  # Slurm's order is submit order again
    assert (b.job_id, b.numbers["to_gpus"]) == (3, 1)


def test_a_requeued_job_is_priced_on_its_own_runs_not_its_limit() -> None:
    """Job 3 (malleable 2:4, 7-day limit) ran 1 h, was requeued, and waits while gpu1
    has 2 GPUs free and the rest runs about 4 h more: started smaller, priced on the
    hour it ran (as a running job's remaining time), not on its 7-day limit."""
    week = timedelta(days=7)
    later = T0 + 2 * MIN

    def cycle_two() -> PolicySnapshot:
        # 20 h into 24-hour limits: about 4 h left each
        rigid_a = running_job(1, gpus=two("gpu1"), started=20 * HOUR, user="bob", at=later)
        rigid_b = running_job(2, gpus=four("gpu2"), started=20 * HOUR, user="bob", at=later)
        waiting = pending_job(3, user="carol", gpus_per_node=4, time_limit=week)
        return snap([rigid_a, rigid_b, waiting], malleable={3: (2, 4)}, at=later)

    # Never seen running: its limit prices the start smaller, and waiting wins.
    assert MalleablePolicy().propose(cycle_two()) == []
    policy = MalleablePolicy()
    ran = running_job(3, gpus=four("gpu1"), started=HOUR, user="carol", time_limit=week)
    other = running_job(2, gpus=four("gpu2"), started=HOUR, user="bob")
    assert policy.propose(snap([ran, other], malleable={3: (2, 4)})) == []  # nothing free
    (a,) = policy.propose(cycle_two())
    assert (a.job_id, a.numbers["direction"], a.numbers["to_gpus"]) == (3, "start_smaller", 2)
    assert a.intents[0] == SetGpus(2)


def test_a_malleable_job_held_mid_resize_is_not_started_smaller() -> None:
    jobs = two_free_and_a_waiting_malleable_job(time_limit=timedelta(hours=1))
    assert MalleablePolicy().propose(snap(jobs, malleable={3: (2, 4)}, resizing=[3])) == []


# ---- time limits at the new size


def test_a_shrunk_job_gets_its_time_limit_raised_in_the_same_update() -> None:
    # Job 1 ran 1 h of its 24 h limit on 4 GPUs; at 2 GPUs it runs at 100/110 of its speed.
    jobs = full_cluster_with_waiting_rigid_job(time_limit=timedelta(hours=1))
    (a,) = MalleablePolicy().propose(snap(jobs, malleable={1: (2, 4)}, throughput={1: POOR}))
    assert sizes([a]) == {1: (4, 2)}
    want = timedelta(minutes=math.ceil(23 * 60 * 110 / 100 * 1.1 + 1))
    assert limit_of(a) == SetTimeLimit.of(want)
    assert a.numbers["time_limit_s"] == want.total_seconds()
    assert a.numbers["time_limit_was_s"] == 24 * 3600


def test_a_shrunk_job_s_raised_limit_stops_at_its_partition_s_max_time() -> None:
    jobs = full_cluster_with_waiting_rigid_job(time_limit=timedelta(hours=1))
    s = replace(
        snap(jobs, malleable={1: (2, 4)}, throughput={1: POOR}),
        partition_max_time={"gpu": timedelta(hours=25)},
    )
    (a,) = MalleablePolicy().propose(s)
    assert limit_of(a) == SetTimeLimit(25 * 3600)  # 1-01:00:00


def test_an_expanded_job_s_limit_is_lowered_to_what_it_had_left() -> None:
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    (a,) = MalleablePolicy().propose(
        snap([mall], malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1)
    )
    assert sizes([a]) == {1: (2, 4)}
    # 2 h used of its 24 h limit: the run at 4 GPUs gets the 22 h left (+1 min restart),
    # not a fresh 24 h, and no less whatever the speed-up.
    assert limit_of(a) == SetTimeLimit.of(timedelta(hours=22, minutes=1))
    assert a.numbers["time_limit_s"] == 22 * 3600 + 60


def test_time_limits_stay_when_scaling_is_off() -> None:
    jobs = full_cluster_with_waiting_rigid_job(time_limit=timedelta(hours=1))
    off = MalleablePolicy(MalleableSettings(scale_time_limit=False))
    (a,) = off.propose(snap(jobs, malleable={1: (2, 4)}, throughput={1: POOR}))
    assert limit_of(a) is None


# -- GPU types: a job is planned only onto the type it asked for ---------------------------


def typed(job: Job, gpu_type: str | None) -> Job:
    return replace(job, gpus=replace(job.gpus, gpu_type=gpu_type))


def hetero_snap(jobs: list[Job], malleable: Mapping[int, tuple[int, int]]) -> PolicySnapshot:
    """gpu1: 4 A100, gpu2: 4 V100 (as sinfo's gres gpu:a100:4 / gpu:v100:4 give them)."""
    running = used_by(j for j in jobs if j.gpu_allocations)
    cluster_nodes = (
        Node("gpu1", "mixed", gpus=4, gpu_type="a100", gpus_used=running.get("gpu1", 0)),
        Node("gpu2", "mixed", gpus=4, gpu_type="v100", gpus_used=running.get("gpu2", 0)),
    )
    return PolicySnapshot(
        at=T0,
        cluster=ClusterSnapshot(T0, tuple(jobs), cluster_nodes),
        malleable={j: MalleableSpec(j, lo, hi) for j, (lo, hi) in malleable.items()},
        throughput={1: {4: 100.0, 8: 199.0}},
    )


def test_a_typed_job_is_not_grown_into_free_gpus_of_another_type() -> None:
    job = running_job(1, gpus=four("gpu1"), started=2 * HOUR)  # all 4 A100 of gpu1
    job = replace(job, gpus=GpuRequest(gpus=4, per_job=4))  # --gpus=4: may span nodes
    untyped = MalleablePolicy().propose(hetero_snap([job], {1: (1, 8)}))
    assert sizes(untyped) == {1: (4, 8)}  # any GPU will do: it grows into the V100s
    a100 = MalleablePolicy().propose(hetero_snap([typed(job, "a100")], {1: (1, 8)}))
    assert a100 == []  # the free GPUs are V100s; it asked for A100s


def test_a_typed_waiting_job_gets_gpus_of_its_type_not_the_free_ones_of_another() -> None:
    donor = running_job(1, gpus=four("gpu1"), started=HOUR)  # the 4 A100
    waiting = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=2,
                          time_limit=timedelta(hours=1))  # fmt: skip

    def snap_of(w: Job) -> PolicySnapshot:
        return replace(hetero_snap([donor, w], {1: (2, 4)}), throughput={1: POOR})

    # Untyped, it fits the free V100s: nobody is shrunk for it.
    assert MalleablePolicy().propose(snap_of(waiting)) == []
    # Asking for A100s, only the donor's A100s can free up: the donor shrinks 4 -> 2.
    actions = MalleablePolicy().propose(snap_of(typed(waiting, "A100")))
    assert sizes(actions) == {1: (4, 2)}
    assert actions[0].numbers["for_job"] == 3


def test_a_size_measured_not_to_pay_overrules_the_prior_curve() -> None:
    # On 2 GPUs with 6 idle: the prior alone grows it (Pollux's curve: ~1.7x on 4).
    mall = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    base = dict(malleable={1: (1, 8)}, node_count=2)
    assert sizes(MalleablePolicy().propose(snap([mall], **base)))[1][1] > 2  # type: ignore[arg-type]
    # It ran at 8 and was measured 5 % faster there: the step 2 -> 8 wastes GPUs, so it
    # grows to no size up to 8, whatever the curve fitted through 2 says about 3..7.
    wasted = {2: 100.0, 8: 105.0}
    s = snap([mall], throughput={1: wasted}, **base)  # type: ignore[arg-type]
    assert MalleablePolicy().propose(s) == []
    # Efficient to 4 (1.9x), wasteful from 4 to 8: it grows to 4, not past it.
    steps = {2: 100.0, 4: 190.0, 8: 200.0}
    s = snap([mall], throughput={1: steps}, **base)  # type: ignore[arg-type]
    assert sizes(MalleablePolicy().propose(s)) == {1: (2, 4)}


def test_a_large_donor_is_not_restarted_for_a_small_waiting_job() -> None:
    # A waiting 1-GPU job; the donor's restart idles all its GPUs, so its cost is
    # counted once per waiting-job GPU it holds: an 8-GPU donor is left alone where a
    # 2-GPU donor with the same scaling gives its GPU.
    flat = {1: 100.0, 2: 105.0, 7: 140.0, 8: 141.0}
    rigid = running_job(2, gpus=four("gpu3"), started=30 * MIN, user="bob")  # frees in ~30 min
    waiting = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=1, time_limit=HOUR)
    big = running_job(1, gpus={"gpu1": (0, 1, 2, 3), "gpu2": (0, 1, 2, 3)}, started=HOUR)
    s = snap(
        [big, rigid, waiting],
        malleable={1: (1, 8)},
        throughput={1: flat},
        node_count=3,
        resize_cost=timedelta(minutes=5),
    )
    assert MalleablePolicy().propose(s) == []
    small = running_job(1, gpus={"gpu1": (0, 1)}, started=HOUR)
    filler = running_job(4, gpus={"gpu1": (2, 3), "gpu2": (0, 1, 2, 3)}, started=HOUR, user="dan")
    s2 = snap(
        [small, filler, rigid, waiting],
        malleable={1: (1, 8)},
        throughput={1: flat},
        node_count=3,
        resize_cost=timedelta(minutes=5),
    )
    assert sizes(MalleablePolicy().propose(s2)) == {1: (2, 1)}


def test_one_donor_shrinks_once_for_several_waiting_jobs() -> None:
    # Two waiting 1-GPU jobs and one donor: one resize 4 -> 2 (its restart paid once),
    # not 4 -> 3 now and 3 -> 2 at a second restart later.
    mall = running_job(1, gpus=four("gpu1"), started=HOUR)
    rigid = running_job(2, gpus=four("gpu2"), started=10 * HOUR, user="bob")
    first = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=1, time_limit=HOUR)
    second = pending_job(4, user="dan", gpus_per_node=None, gpus_per_job=1, time_limit=HOUR)
    s = snap([mall, rigid, first, second], malleable={1: (1, 4)}, throughput={1: POOR})
    actions = MalleablePolicy().propose(s)
    assert sizes(actions) == {1: (4, 2)}
    assert actions[0].numbers["for_job"] == 3 and actions[0].numbers["also_for"] == "4"
    assert "waiting job 3 (and 4)" in actions[0].reason


def test_a_job_restarted_often_for_its_age_is_not_resized_again() -> None:
    # Pollux's re-allocation factor (T - S * delay) / (T + delay): a job 3 h old that
    # has restarted 30 times (181 s each) counts its speed at a new size at ~0.5x.
    fresh = running_job(1, gpus=two("gpu1"), started=2 * HOUR)
    base = dict(malleable={1: (1, 4)}, throughput={1: GOOD}, node_count=1)
    assert sizes(MalleablePolicy().propose(snap([fresh], **base))) == {1: (2, 4)}  # type: ignore[arg-type]
    churned = replace(fresh, restart_count=30)
    assert MalleablePolicy().propose(snap([churned], **base)) == []  # type: ignore[arg-type]


def test_a_small_donor_s_restart_weighs_little_for_a_large_waiting_job() -> None:
    # An 8-GPU job waits ~30 min for one more GPU; a 2-GPU donor's 20-min restart idles
    # 2 GPUs, a quarter of the 8 the waiting job holds back: 300 s of its loss, which
    # the wait pays for (a full 1,200 s would not).
    donor = running_job(1, gpus={"gpu1": (0, 1)}, started=HOUR)
    rigid = running_job(2, gpus={"gpu2": (0, 1, 2)}, started=30 * MIN, user="bob")
    big = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=8, time_limit=HOUR)
    s = snap(
        [donor, rigid, big],
        malleable={1: (1, 2)},
        throughput={1: {1: 100.0, 2: 110.0}},
        node_count=3,
        resize_cost=timedelta(minutes=20),
    )
    actions = MalleablePolicy().propose(s)
    assert sizes(actions) == {1: (2, 1)}
    assert actions[0].numbers["for_job"] == 3


# ---- rebalance: GPUs from a job that gains little from them to one that gains more


def anywhere(job: Job) -> Job:
    """``job`` as a ``--gpus=N`` request: Slurm may place it on any nodes."""
    n = job.allocated_gpus
    return replace(job, gpus=GpuRequest(gpus=n, per_job=n, sources=("tres_per_job",)))


FLAT = {2: 100.0, 4: 102.0}  # two more GPUs add 2 %
LINEAR = {2: 100.0, 4: 200.0}


def two_full_nodes() -> list[Job]:
    return [
        anywhere(running_job(1, gpus=four("gpu1"))),
        anywhere(running_job(2, gpus=four("gpu2"), user="bob")),
    ]


def test_rebalance_moves_gpus_from_a_flat_job_to_a_linear_one_while_nobody_waits() -> None:
    s = snap(two_full_nodes(), malleable={1: (1, 8), 2: (1, 8)}, throughput={1: FLAT, 2: LINEAR})
    actions = MalleablePolicy().propose(s)
    got = sizes(actions)
    assert set(got) == {1, 2}
    given = got[1][0] - got[1][1]
    assert got[1][0] == 4 and given > 0  # the flat job gives GPUs ...
    assert got[2] == (4, 4 + given)  # ... and the linear one grows by exactly those
    by_job = {a.job_id: a for a in actions}
    assert by_job[1].numbers["direction"] == "rebalance_shrink"
    assert by_job[1].numbers["for_job"] == 2
    assert by_job[2].numbers["direction"] == "rebalance_expand"
    assert by_job[2].numbers["from_job"] == 1
    assert by_job[2].needs == 1 and by_job[1].needs is None  # it grows only if 1 shrinks
    assert all(a.kind == "resize" and limit_of(a) is not None for a in actions)


def test_rebalance_leaves_two_jobs_that_scale_alike() -> None:
    s = snap(two_full_nodes(), malleable={1: (1, 8), 2: (1, 8)}, throughput={1: LINEAR, 2: LINEAR})
    assert MalleablePolicy().propose(s) == []


def test_rebalance_waits_while_a_job_is_blocked() -> None:
    # A waiting rigid job that no shrink can serve (it needs more than the donors could
    # give): the GPUs a rebalance moves would be the queue's, so nothing moves.
    waiting = pending_job(3, user="carol", gpus_per_node=None, gpus_per_job=16, time_limit=HOUR)
    s = snap(
        [*two_full_nodes(), waiting],
        malleable={1: (1, 8), 2: (1, 8)},
        throughput={1: FLAT, 2: LINEAR},
    )
    assert MalleablePolicy().propose(s) == []


def test_rebalance_is_off_without_shrink_or_expand() -> None:
    s = snap(two_full_nodes(), malleable={1: (1, 8), 2: (1, 8)}, throughput={1: FLAT, 2: LINEAR})
    for off in ({"shrink": False}, {"expand": False}):
        settings = replace(MalleableSettings(), **off)  # type: ignore[arg-type]
        assert MalleablePolicy(settings).propose(s) == []

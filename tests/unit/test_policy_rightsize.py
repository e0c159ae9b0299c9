"""Rightsizing pending jobs from their history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.intent import (
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetTimeLimit,
)
from slurmgpu.model import GpuRequest, Job
from slurmgpu.policy.base import Action, HistoryRecord
from slurmgpu.policy.priors import Priors
from slurmgpu.policy.rightsize import RightsizePolicy, _same_request
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.units import parse_time_limit
from tests.hypothesis_profiles import examples
from tests.unit.policy_builders import (
    HOUR,
    MIN,
    T0,
    pending_job,
    record,
    running_job,
    snapshot,
)

ONLY_TIME = RightsizeSettings(memory=False, cpus=False, gpus=False)


def propose(
    jobs: Sequence[Job],
    history: Sequence[HistoryRecord],
    rs: RightsizeSettings | None = None,
    *,
    slurm_version: str = "24.05.4",
    opted_in: Sequence[int] = (),
) -> list[Action]:
    policy = RightsizePolicy(rs or RightsizeSettings())
    snap = snapshot(jobs, history=history, slurm_version=slurm_version, opted_in=opted_in)
    return policy.propose(snap)


def limit(text: str) -> SetTimeLimit:
    """The intent of a time limit as Slurm prints it."""
    return SetTimeLimit.of(parse_time_limit(text))


def limit_of(action: Action) -> SetTimeLimit | None:
    """The action's time limit intent, if it has one."""
    return next((i for i in action.intents if isinstance(i, SetTimeLimit)), None)


def only(actions: list[Action]) -> Action:
    assert len(actions) == 1, actions
    return actions[0]


def test_no_history_proposes_nothing() -> None:
    assert propose([pending_job()], []) == []


def test_time_limit_is_quantile_times_headroom_rounded_up() -> None:
    history = [record(run_time=MIN * m) for m in (50, 55, 60)]
    a = only(propose([pending_job(time_limit=8 * HOUR)], history, ONLY_TIME))
    # 60 min * 1.3 = 78 min -> 80 min
    assert a.kind == "update" and a.intents == (limit("01:20:00"),)
    assert a.numbers["time_limit_current_s"] == 8 * 3600
    assert a.numbers["time_limit_proposed_s"] == 80 * 60
    assert a.numbers["history_samples"] == 3
    assert a.numbers["history_level"] == "user+name+partition"
    assert a.numbers["time_quantile"] == 0.95
    assert a.slurm_id == "100" and a.requires_opt_in and a.alert == "rightsize"


def test_the_keys_margin_grows_with_each_run_that_hit_its_limit() -> None:
    # 60 min runs; one of them was killed at a (rightsized) 78 min limit
    history = [record(run_time=MIN * m) for m in (50, 55, 60)]
    timed_out = [*history, record(run_time=MIN * 78, state="TIMEOUT")]
    a = only(propose([pending_job(time_limit=8 * HOUR)], timed_out, ONLY_TIME))
    # 78 min (the killed run, the longest) * 1.3 * 1.5 = 152.1 min -> 155 min
    assert limit_of(a) == limit("02:35:00")
    twice = [*timed_out, record(run_time=MIN * 78, state="TIMEOUT")]
    b = only(propose([pending_job(time_limit=8 * HOUR)], twice, ONLY_TIME))
    # * 1.5 again: 78 * 1.3 * 2.25 = 228.15 min -> 230 min
    assert limit_of(b) == limit("03:50:00")
    # growth 1 keeps the plain rule
    flat = replace(ONLY_TIME, timeout_margin_growth=1.0)
    c = only(propose([pending_job(time_limit=8 * HOUR)], timed_out, flat))
    assert limit_of(c) == limit("01:45:00")  # 78 * 1.3 = 101.4 -> 105 min


def test_a_job_slurm_may_split_over_nodes_gets_a_limit_it_cannot_hit() -> None:
    # 4-GPU runs of 1 h, all on one node (--gpus-per-node=4 or packed --gpus=4)
    history = [record(run_time=HOUR)] * 3
    per_node = only(propose([pending_job(time_limit=24 * HOUR)], history, ONLY_TIME))
    assert limit_of(per_node) == limit("01:20:00")  # the shape the history ran in
    assert per_node.numbers["time_bound_gpus"] == 1
    # --gpus=4: Slurm may split it 3 + 1 over two nodes, where it can run far slower
    # than its packed runs (1.76x for yolov3): bound by its 4 GPUs' one-GPU time
    split = pending_job(time_limit=24 * HOUR, gpus_per_node=None, gpus_per_job=4)
    a = only(propose([split], history, ONLY_TIME))
    assert limit_of(a) == limit("05:15:00")  # 4 * 1 h * 1.3 = 5.2 h -> 5 h 15 min
    assert a.numbers["time_bound_gpus"] == 4
    assert a.numbers["run_time_quantile_s"] == 3600  # the history's figure, unscaled
    # which a limit near the history's cannot shrink by 20 %: kept
    assert propose([replace(split, time_limit=6 * HOUR)], history, ONLY_TIME) == []
    # one GPU cannot be split: the plain rule
    one = pending_job(time_limit=24 * HOUR, gpus_per_node=None, gpus_per_job=1)
    one_gpu = [record(run_time=HOUR, gpus_requested=1, gpus_used=1)] * 3
    assert limit_of(only(propose([one], one_gpu, ONLY_TIME))) == limit("01:20:00")


def test_time_limit_never_goes_below_the_minimum() -> None:
    history = [record(run_time=MIN)] * 3
    a = only(propose([pending_job(time_limit=2 * HOUR)], history, ONLY_TIME))
    assert limit_of(a) == limit("00:15:00")


def test_time_limit_never_goes_below_what_a_running_sibling_used() -> None:
    history = [record(run_time=HOUR)] * 3
    sibling = running_job(300, started=2 * HOUR)  # same user and name, running 2 h
    a = only(propose([pending_job(time_limit=24 * HOUR), sibling], history, ONLY_TIME))
    # 2 h * 1.3 = 2 h 36 min -> 2 h 40 min, not the 1 h 20 min the history alone gives
    assert limit_of(a) == limit("02:40:00")
    assert a.numbers["sibling_elapsed_s"] == 2 * 3600


def test_a_sibling_beyond_the_limit_blocks_the_change() -> None:
    history = [record(run_time=HOUR)] * 3
    sibling = running_job(300, started=7 * HOUR)
    assert propose([pending_job(time_limit=8 * HOUR), sibling], history, ONLY_TIME) == []


def test_other_users_jobs_are_not_siblings() -> None:
    history = [record(run_time=HOUR)] * 3
    stranger = running_job(300, user="bob", started=6 * HOUR)
    a = only(propose([pending_job(time_limit=8 * HOUR), stranger], history, ONLY_TIME))
    assert limit_of(a) == limit("01:20:00")


def test_changes_smaller_than_the_min_fraction_are_not_proposed() -> None:
    history = [record(run_time=MIN * 70)] * 3  # 91 min -> 95 min
    assert propose([pending_job(time_limit=MIN * 110)], history, ONLY_TIME) == []  # 13.6 %
    a = only(propose([pending_job(time_limit=MIN * 120)], history, ONLY_TIME))  # 20.8 %
    assert limit_of(a) == limit("01:35:00")


def test_time_limit_is_never_raised() -> None:
    history = [record(run_time=5 * HOUR)] * 3
    assert propose([pending_job(time_limit=HOUR)], history, ONLY_TIME) == []


def test_an_unlimited_job_gets_a_limit() -> None:
    history = [record(run_time=HOUR)] * 3
    a = only(propose([pending_job(time_limit=None)], history, ONLY_TIME))
    assert limit_of(a) == limit("01:20:00") and a.numbers["time_limit_current_s"] is None


def test_memory_is_ceil_headroom_times_peak_rounded_to_256_mib() -> None:
    history = [record(peak_memory_mib=10_000.0)] * 3
    rs = RightsizeSettings(time_limit=False, cpus=False, gpus=False)
    a = only(propose([pending_job(memory_mib=64 * 1024)], history, rs))
    # 1.2 * 10000 = 12000 -> 12032 (47 * 256)
    assert a.intents == (SetMemoryPerNode(12032),)
    assert a.numbers["memory_per_node_current_mib"] == 65536
    assert a.numbers["memory_per_node_proposed_mib"] == 12032


def test_memory_is_not_touched_after_an_out_of_memory_run() -> None:
    history = [record(peak_memory_mib=1000.0)] * 3 + [record(state="OUT_OF_MEMORY")]
    rs = RightsizeSettings(time_limit=False, cpus=False, gpus=False)
    assert propose([pending_job()], history, rs) == []


def test_memory_of_a_multi_node_job_uses_the_busiest_node() -> None:
    rs = RightsizeSettings(time_limit=False, cpus=False, gpus=False)
    job = pending_job(node_count=2, memory_mib=2 * 64 * 1024)
    per_node = [record(peak_memory_mib=30_000.0, peak_node_memory_mib=20_000.0)] * 3
    a = only(propose([job], per_node, rs))
    assert a.intents == (SetMemoryPerNode(24064),)  # 1.2 * 20000 -> 24064, not total / 2
    total_only = [record(peak_memory_mib=60_000.0)] * 3  # the total stands in: too high
    assert propose([job], total_only, rs) == []


def test_memory_zero_or_unknown_is_left_alone() -> None:
    rs = RightsizeSettings(time_limit=False, cpus=False, gpus=False)
    history = [record(peak_memory_mib=100.0)] * 3
    assert propose([pending_job(memory_mib=0)], history, rs) == []
    assert propose([pending_job(memory_mib=None)], history, rs) == []


def test_cpus_go_toward_the_target_per_gpu_when_history_shows_low_use() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, gpus=False)
    history = [record(mean_cpu_pct=400.0, cpus=96)] * 3
    a = only(propose([pending_job(cpus=96, gpus_per_node=4)], history, rs))
    assert a.intents == (SetCpus(48), SetCpusPerNode(48))  # 12 per GPU floor
    busy = [record(mean_cpu_pct=6000.0, cpus=96)] * 3  # 60 cores * 1.2 = 72
    a = only(propose([pending_job(cpus=96, gpus_per_node=4)], busy, rs))
    assert SetCpus(72) in a.intents


def test_cpus_are_kept_when_a_run_saturated_its_cores_or_for_cpu_only_jobs() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, gpus=False)
    saturated = [record(cpus=8, mean_cpu_pct=780.0)] + [record(mean_cpu_pct=100.0)] * 2
    assert propose([pending_job(cpus=96)], saturated, rs) == []
    low = [record(mean_cpu_pct=100.0, gpus_requested=0, gpus_used=None)] * 3
    assert propose([pending_job(cpus=32, gpus_per_node=None)], low, rs) == []


def test_multi_node_cpus_set_the_per_node_minimum() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, gpus=False)
    history = [record(mean_cpu_pct=100.0, gpus_requested=8)] * 3
    job = pending_job(cpus=192, gpus_per_node=4, node_count=2)
    a = only(propose([job], history, rs))
    assert a.intents == (SetCpus(96), SetCpusPerNode(48))


def test_gpus_shrink_to_the_most_any_run_used() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, cpus=False)
    history = [record(gpus_requested=4, gpus_used=u) for u in (1, 2, 1)]
    a = only(propose([pending_job(gpus_per_node=4)], history, rs))
    assert a.intents == (SetGpus(2),)
    assert a.numbers["gpus_current"] == 4 and a.numbers["gpus_proposed"] == 2


def test_gpus_come_only_from_runs_of_the_jobs_own_name_or_script() -> None:
    # the user's other program kept one of 4 GPUs busy three times: that says nothing
    # of this one (the trace replay: a 4-GPU yolov3 cut to 1 GPU from its user's ncf
    # runs ran 4x longer); the same runs under its own name do
    rs = RightsizeSettings(time_limit=False, memory=False, cpus=False)
    others = [record(name="ncf", gpus_requested=4, gpus_used=1)] * 3
    assert propose([pending_job(name="yolov3", gpus_per_node=4)], others, rs) == []
    own = [record(name="yolov3", gpus_requested=4, gpus_used=1)] * 3
    a = only(propose([pending_job(name="yolov3", gpus_per_node=4)], own, rs))
    assert a.intents == (SetGpus(1),)


def test_multi_node_gpus_shrink_per_node() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, cpus=False)
    history = [record(gpus_requested=8, gpus_used=3)] * 3
    a = only(propose([pending_job(gpus_per_node=4, node_count=2)], history, rs))
    assert a.intents == (SetGpus(2),)  # ceil(3 / 2) on each of 2 nodes
    assert a.numbers["gpus_proposed"] == 4 and a.numbers["gpus_per_node_proposed"] == 2


def test_gpus_keep_the_requested_type() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, cpus=False)
    history = [record(gpus_requested=4, gpus_used=1)] * 3
    typed = pending_job(gpus=GpuRequest(gpus=4, per_node=4, gpu_type="a100"))
    a = only(propose([typed], history, rs, slurm_version="22.05.9"))
    assert a.intents == (SetGpus(1, "a100"),)


def test_gpus_per_job_requests_use_tres_per_job() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, cpus=False)
    history = [record(gpus_requested=8, gpus_used=2)] * 3
    job = pending_job(gpus_per_node=None, gpus_per_job=8)
    a = only(propose([job], history, rs))
    assert a.intents == (SetGpus(2, per_node=False),)


def test_gpus_are_kept_without_enough_gpu_samples_or_for_a_bigger_shape() -> None:
    rs = RightsizeSettings(time_limit=False, memory=False, cpus=False)
    unsampled = [record(gpus_used=None)] * 2 + [record(gpus_used=1)]
    assert propose([pending_job(gpus_per_node=4)], unsampled, rs) == []
    smaller_runs = [record(gpus_requested=2, gpus_used=1)] * 3
    assert propose([pending_job(gpus_per_node=4)], smaller_runs, rs) == []
    shards = pending_job(gpus=GpuRequest(gpus=0, shards=4, shards_per_node=4))
    assert propose([shards], [record(gpus_used=1)] * 3, rs) == []
    per_task = pending_job(gpus=GpuRequest(gpus=4, per_task=1, per_job=4))
    assert propose([per_task], [record(gpus_used=1)] * 3, rs) == []


def test_one_action_combines_every_field_and_cpus_follow_the_new_gpu_count() -> None:
    history = [record(run_time=HOUR, peak_memory_mib=8000.0, mean_cpu_pct=200.0, gpus_used=1)] * 3
    a = only(propose([pending_job(cpus=48, gpus_per_node=4)], history))
    assert a.intents == (
        limit("01:20:00"),
        SetMemoryPerNode(9728),
        SetGpus(1),
        SetCpus(12),
        SetCpusPerNode(12),
    )
    assert "TimeLimit 01:20:00 (was 08:00:00)" in a.reason


def test_held_and_requeued_pending_jobs_are_candidates_running_ones_are_not() -> None:
    history = [record(run_time=HOUR)] * 3
    held = pending_job(101, reason="JobHeldUser")
    requeued = pending_job(102, restart_count=2, state_flags=frozenset({"REQUEUED"}))
    running = running_job(103)
    actions = propose([held, requeued, running], history, ONLY_TIME)
    assert sorted(a.job_id for a in actions) == [101, 102]


def test_an_array_meta_record_is_addressed_as_its_pending_range() -> None:
    history = [record(run_time=HOUR)] * 3
    meta = pending_job(120, array_job_id=120, array_task_spec="3-9%2")
    task = pending_job(125, array_job_id=120, array_task_id=2)
    actions = propose([meta, task], history, ONLY_TIME)
    assert {a.job_id: a.slurm_id for a in actions} == {120: "120_[3-9]", 125: "120_2"}


def test_opted_in_and_apply_to_all_are_carried_for_the_engine() -> None:
    history = [record(run_time=HOUR)] * 3
    a = only(propose([pending_job()], history, ONLY_TIME, opted_in=[100]))
    assert a.numbers["opted_in"] == 1 and a.requires_opt_in
    meta = pending_job(120, array_job_id=120, array_task_spec="3-9")
    a = only(propose([meta], history, replace(ONLY_TIME, apply_to_all=True), opted_in=[5]))
    assert a.numbers["opted_in"] == 0 and not a.requires_opt_in


def test_priors_are_built_once_per_history_tuple() -> None:
    calls: list[int] = []

    def factory(records: Sequence[HistoryRecord]) -> Priors:
        calls.append(1)
        return Priors.from_history(records)

    policy = RightsizePolicy(ONLY_TIME, priors_factory=factory)
    snap = snapshot([pending_job()], history=[record()] * 3)
    policy.propose(snap)
    policy.propose(snap)
    assert len(calls) == 1
    policy.propose(snapshot([pending_job()], history=[record()] * 3))
    assert len(calls) == 2


@st.composite
def _history_and_job(draw: st.DrawFn) -> tuple[list[HistoryRecord], Job]:
    n = draw(st.integers(min_value=3, max_value=8))
    gpus_req = draw(st.sampled_from([1, 2, 4, 8]))
    history = [
        record(
            run_time=timedelta(seconds=draw(st.integers(0, 5 * 86400))),
            peak_memory_mib=draw(st.none() | st.floats(0, 2e6)),
            peak_node_memory_mib=draw(st.none() | st.floats(0, 1e6)),
            mean_cpu_pct=draw(st.none() | st.floats(0, 20000)),
            cpus=draw(st.integers(0, 256)),
            gpus_requested=draw(st.integers(0, 16)),
            gpus_used=draw(st.none() | st.integers(0, 16)),
            state=draw(st.sampled_from(["COMPLETED", "TIMEOUT", "FAILED", "OUT_OF_MEMORY"])),
        )
        for _ in range(n)
    ]
    nodes = draw(st.integers(1, 4))
    per_job = draw(st.booleans())
    limit_s = draw(st.none() | st.integers(1, 10 * 86400))
    job = pending_job(
        time_limit=timedelta(seconds=limit_s) if limit_s is not None else None,
        cpus=draw(st.integers(0, 512)),
        memory_mib=draw(st.none() | st.integers(0, 4 * 1024 * 1024)),
        node_count=nodes,
        tasks=draw(st.integers(1, 64)),
        gpus_per_node=None if per_job else gpus_req,
        gpus_per_job=gpus_req * nodes if per_job else None,
    )
    return history, job


@given(_history_and_job(), st.sampled_from(["22.05.3", "24.11.1"]))
@settings(max_examples=examples(300), deadline=None)
def test_rightsizing_never_raises_a_request(case: tuple[list[HistoryRecord], Job], v: str) -> None:
    history, job = case
    for a in RightsizePolicy().propose(snapshot([job], history=history, slurm_version=v)):
        assert a.job_id == job.job_id and a.kind == "update" and a.intents
        for i in a.intents:
            if isinstance(i, SetTimeLimit):
                new = i.limit
                assert new is not None and new >= timedelta(minutes=15)
                assert job.time_limit is None or new < job.time_limit
            elif isinstance(i, SetMemoryPerNode):
                nodes = max(1, job.node_count)
                assert job.memory_mib
                assert i.mib < job.memory_mib / nodes
            elif isinstance(i, SetCpus):
                assert 1 <= i.count < job.cpus
                per_node = [p.count for p in a.intents if isinstance(p, SetCpusPerNode)]
                assert per_node and per_node[0] * max(1, job.node_count) >= i.count
            elif isinstance(i, SetGpus):
                have = job.gpus.per_node if i.per_node else job.gpus.per_job
                assert have is not None and 1 <= i.count < have


def test_time_limits_follow_the_gpu_count_of_the_pending_job() -> None:
    # One name, two shapes: 8-GPU runs take 40 min, 1-GPU runs 5 h. Each pending job's
    # limit comes from runs of its own shape. (Mixed, both got one quantile: 6.5 h here,
    # and with mostly 8-GPU runs in the history a 1-GPU job got less than it runs.)
    history = [record(gpus_requested=8, run_time=40 * MIN)] * 3 + [
        record(gpus_requested=1, run_time=5 * HOUR)
    ] * 3
    small = pending_job(100, gpus_per_node=1, time_limit=24 * HOUR)
    big = pending_job(101, gpus_per_node=8, time_limit=24 * HOUR)
    by_job = {a.job_id: a for a in propose([small, big], history, ONLY_TIME)}
    assert by_job[100].intents == (limit("06:30:00"),)  # 5 h * 1.3
    assert by_job[101].intents == (limit("00:55:00"),)  # 40 min * 1.3 = 52 -> 55
    assert by_job[101].numbers["history_gpus"] == 8
    assert by_job[101].numbers["history_gpu_samples"] == 3
    # A 2-GPU job has no runs of its own shape: the 8-GPU runs count 4x, never shorter.
    two = only(propose([pending_job(102, gpus_per_node=2, time_limit=24 * HOUR)], history[:3]))
    assert limit_of(two) == limit("03:30:00")  # 40 min * 4 = 160 min * 1.3 = 208 -> 210
    assert two.numbers["history_gpu_scaled"] == 1


def test_the_users_other_jobs_never_set_a_time_limit_unless_allowed() -> None:
    # Three short runs of other jobs: the user+partition level answers for "train".
    history = [record(name=f"other{i}", run_time=10 * MIN) for i in range(3)]
    job = pending_job(time_limit=8 * HOUR)
    assert propose([job], history, ONLY_TIME) == []
    allowed = replace(ONLY_TIME, time_from_other_jobs=True)
    a = only(propose([job], history, allowed))
    assert a.numbers["history_level"] == "user+partition"
    assert a.intents == (limit("00:15:00"),)
    # Memory still comes from the user's jobs when nothing finer is known.
    memory = only(propose([job], history, RightsizeSettings(time_limit=True, cpus=False)))
    assert limit_of(memory) is None
    assert any(isinstance(i, SetMemoryPerNode) for i in memory.intents)
    parsed = RightsizeSettings.from_mapping({"time_from_other_jobs": True}, "policy.rightsize")
    assert parsed.time_from_other_jobs


def test_a_policy_kept_across_cycles_answers_as_a_fresh_one() -> None:
    """Estimates are kept per key while the history is the same; siblings are per cycle."""
    history = tuple(record(run_time=HOUR) for _ in range(3))
    kept = RightsizePolicy(ONLY_TIME)
    waiting = [pending_job(100, time_limit=24 * HOUR), pending_job(101, time_limit=24 * HOUR)]
    cycles = [
        waiting,
        [*waiting, running_job(300, started=2 * HOUR)],  # a sibling raises the floor
        [*waiting, running_job(300, started=7 * HOUR)],
        waiting[:1],  # the sibling ended, one job started
    ]
    seen = []
    for jobs in cycles:
        snap = snapshot(jobs, history=history)
        got = kept.propose(snap)
        assert got == RightsizePolicy(ONLY_TIME).propose(snap)
        seen.append([limit_of(a) for a in got])
    assert seen == [
        [limit("01:20:00")] * 2,
        [limit("02:40:00")] * 2,
        [limit("09:10:00")] * 2,
        [limit("01:20:00")],
    ]


# --- verdicts kept across cycles -----------------------------------------------------

_CYCLE_HISTORY = tuple(
    [record(run_time=m * MIN, mean_cpu_pct=900.0) for m in (50, 55, 60)]
    + [record(name="eval", run_time=3 * HOUR, gpus_requested=2, gpus_used=1)] * 3
    + [record(user="bob", run_time=20 * MIN)] * 3
)


def _comparable(actions: Sequence[Action]) -> list[tuple[object, ...]]:
    """An action but its sibling figure: a kept verdict shows the elapsed time of the
    cycle it was made in, and the audit records an unchanged verdict once anyway."""
    return [
        (
            a.job_id,
            a.kind,
            a.reason,
            a.intents,
            {k: v for k, v in a.numbers.items() if k != "sibling_elapsed_s"},
            a.slurm_id,
            a.requires_opt_in,
        )
        for a in sorted(actions, key=lambda a: a.job_id)
    ]


_CHANGES = st.sampled_from(
    ["limit", "memory", "cpus", "gpus", "name", "opt", "spec", "gone", "sibling", "none"]
)


@given(
    st.lists(st.tuples(st.integers(0, 5), _CHANGES, st.integers(0, 20)), max_size=40),
    st.integers(1, 12),
)
@settings(max_examples=examples(150), deadline=None)
def test_kept_verdicts_match_a_fresh_policy_every_cycle(
    changes: list[tuple[int, str, int]], cycles: int
) -> None:
    """The policy keeps last cycle's verdict for a job whose request, sibling floor and
    opt-in did not change: whatever changes between cycles, what it proposes is what a
    policy seeing the snapshot for the first time proposes."""
    jobs: dict[int, Job] = {
        100 + i: pending_job(
            100 + i,
            user="bob" if i == 5 else "alice",
            name="eval" if i == 4 else "train",
            time_limit=24 * HOUR,
        )
        for i in range(6)
    }
    jobs[103] = replace(jobs[103], array_job_id=103, array_task_spec="1-9")
    opted: set[int] = {100}
    sibling_started = 50 * MIN  # the running sibling of alice's "train" jobs
    kept = RightsizePolicy()
    per_cycle = max(1, len(changes) // cycles)
    for cycle in range(cycles + 1):
        at = T0 + cycle * 10 * MIN
        todo = changes[(cycle - 1) * per_cycle : cycle * per_cycle] if cycle else []
        for index, change, amount in todo:
            job_id = 100 + index
            job = jobs.get(job_id)
            if change == "sibling":
                sibling_started += amount * 7 * MIN
            elif job is None:
                jobs[job_id] = pending_job(job_id, time_limit=(amount + 1) * HOUR)
            elif change == "limit":
                jobs[job_id] = replace(job, time_limit=(amount + 1) * HOUR if amount else None)
            elif change == "memory":
                jobs[job_id] = replace(job, memory_mib=(amount + 1) * 4096)
            elif change == "cpus":
                jobs[job_id] = replace(job, cpus=(amount + 1) * 4)
            elif change == "gpus":
                per_node = 1 + amount % 8
                jobs[job_id] = replace(job, gpus=GpuRequest(per_node, per_node=per_node))
            elif change == "name":
                jobs[job_id] = replace(job, name=("train", "eval", "other")[amount % 3])
            elif change == "opt":
                opted ^= {job_id}
            elif change == "spec" and job.array_job_id is not None:
                jobs[job_id] = replace(job, array_task_spec=f"{1 + amount % 9}-9")
            elif change == "gone":
                del jobs[job_id]
        sibling = running_job(300, started=sibling_started + cycle * 10 * MIN, at=at)
        snap = snapshot([*jobs.values(), sibling], at=at, history=_CYCLE_HISTORY, opted_in=opted)
        assert snap.history is _CYCLE_HISTORY  # the same tuple: priors and verdicts kept
        fresh = RightsizePolicy().propose(snap)
        assert _comparable(kept.propose(snap)) == _comparable(fresh), f"cycle {cycle}"


def test_a_kept_verdict_is_the_same_action_object() -> None:
    """An unchanged pending job costs a comparison next cycle, not a new action."""
    history = _CYCLE_HISTORY
    policy = RightsizePolicy()
    first = only(policy.propose(snapshot([pending_job(time_limit=24 * HOUR)], history=history)))
    # next cycle: a new Job object, equal request
    again = only(
        policy.propose(snapshot([pending_job(time_limit=24 * HOUR)], at=T0 + MIN, history=history))
    )
    assert again is first
    changed = only(
        policy.propose(
            snapshot([pending_job(time_limit=12 * HOUR)], at=T0 + 2 * MIN, history=history)
        )
    )
    assert changed is not first and changed.numbers["time_limit_current_s"] == 12 * 3600


def test_a_job_parsed_anew_keeps_its_verdict_only_while_its_request_is_the_same() -> None:
    """What a kept verdict is compared on: every field of the job the verdict reads
    (GpuRequest's field by field), nothing else (a new projected start changes none)."""
    job = pending_job(time_limit=24 * HOUR, array_job_id=100, array_task_spec="1-9")
    same = replace(job, start_time=T0 + HOUR, gpus=replace(job.gpus))
    assert job.gpus is not same.gpus and _same_request(job, same)
    changed = {
        "user": replace(job, user="bob"),
        "name": replace(job, name="eval"),
        "partition": replace(job, partition="a100"),
        "time_limit": replace(job, time_limit=12 * HOUR),
        "memory_mib": replace(job, memory_mib=1024),
        "node_count": replace(job, node_count=2),
        "cpus": replace(job, cpus=8),
        "tasks": replace(job, tasks=4),
        "array_task_spec": replace(job, array_task_spec="2-9"),
    }
    request = job.gpus
    for field, other_request in {
        "gpus": replace(request, gpus=3),
        "per_node": replace(request, per_node=3),
        "per_job": replace(request, per_job=3),
        "per_task": replace(request, per_task=3),
        "gpu_type": replace(request, gpu_type="a100"),
        "shards": replace(request, shards=3),
    }.items():
        changed[f"gpus.{field}"] = replace(job, gpus=other_request)
    for field, other in changed.items():
        assert not _same_request(job, other), field
        assert not _same_request(other, job), field


_RELOADS = st.lists(
    st.tuples(
        st.sampled_from(["same", "reload", "add", "drop"]),
        st.sampled_from(["alice", "bob", "carol"]),
        st.integers(1, 30),
        st.sampled_from(["train", "eval", "sweep"]),
    ),
    min_size=1,
    max_size=12,
)


@given(_RELOADS)
@settings(max_examples=examples(100), deadline=None)
def test_kept_verdicts_match_a_fresh_policy_across_history_reloads(
    reloads: list[tuple[str, str, int, str]],
) -> None:
    """A new history tuple keeps the statistics and verdicts resting on keys whose runs
    are the same (a daemon reload): whatever each reload changes, the kept policy
    proposes what a policy seeing the snapshot for the first time proposes. Jobs answer
    at every level: their name's, their user's (``sweep`` until it has runs, a job on
    two partitions), or none."""
    history = list(_CYCLE_HISTORY) + [record(user="carol", run_time=40 * MIN)] * 3
    jobs = [
        pending_job(100, time_limit=24 * HOUR),
        pending_job(101, name="eval", time_limit=24 * HOUR),
        pending_job(102, user="bob", time_limit=24 * HOUR),
        pending_job(103, user="carol", time_limit=24 * HOUR, gpus_per_node=2),
        pending_job(104, user="dave", time_limit=24 * HOUR),  # no history at all
        pending_job(105, name="sweep", time_limit=24 * HOUR),
        pending_job(106, partition="gpu,a100", time_limit=24 * HOUR),
    ]
    kept = RightsizePolicy()
    current = tuple(history)
    for cycle, (change, user, amount, name) in enumerate(reloads):
        if change == "reload":  # equal records, new objects, as loaded from the store
            current = tuple(msgspec.structs.replace(r) for r in current)
        elif change == "add":
            current = (*current, record(user=user, name=name, run_time=amount * 10 * MIN))
        elif change == "drop":
            first = next(
                (i for i, r in enumerate(current) if r.user == user and r.name == name), None
            )
            if first is not None:
                current = current[:first] + current[first + 1 :]
        snap = snapshot(jobs, at=T0 + cycle * MIN, history=current)
        fresh = RightsizePolicy().propose(snap)
        assert _comparable(kept.propose(snap)) == _comparable(fresh), f"cycle {cycle}"


def test_a_reload_keeps_the_verdicts_of_users_whose_runs_are_the_same() -> None:
    history = _CYCLE_HISTORY
    policy = RightsizePolicy(ONLY_TIME)
    jobs = [pending_job(100, time_limit=24 * HOUR), pending_job(101, user="bob")]
    alice, bob = policy.propose(snapshot(jobs, history=history))
    reloaded = (
        *(msgspec.structs.replace(r) for r in history),
        record(user="bob", run_time=3 * HOUR),
    )
    alice_again, bob_again = policy.propose(snapshot(jobs, at=T0 + MIN, history=reloaded))
    assert alice_again is alice  # bob's new run changes nothing of alice's
    assert bob_again is not bob and limit_of(bob_again) != limit_of(bob)


def test_a_reload_keeps_a_changed_users_verdicts_whose_keys_are_the_same() -> None:
    """alice's new "eval" runs change her eval key and her user-level keys: her "train"
    job, answered by its own unchanged key, keeps its verdict (the same action); her
    "eval" job, and a "sweep" job answered at her user level, are judged again."""
    policy = RightsizePolicy()
    jobs = [
        pending_job(100, time_limit=24 * HOUR),
        pending_job(101, name="eval", time_limit=24 * HOUR),
        pending_job(102, name="sweep", time_limit=24 * HOUR),
    ]
    train, eval_, sweep = policy.propose(snapshot(jobs, history=_CYCLE_HISTORY))
    assert "(user+partition)" in sweep.reason
    bigger = record(name="eval", run_time=9 * HOUR, peak_memory_mib=30_000.0)
    longer = (*_CYCLE_HISTORY, *[bigger] * 3)
    snap = snapshot(jobs, at=T0 + MIN, history=longer)
    got = {a.job_id: a for a in policy.propose(snap)}
    assert got[100] is train
    assert got[101].intents != eval_.intents and got[102].intents != sweep.intents
    assert _comparable(list(got.values())) == _comparable(RightsizePolicy().propose(snap))


def test_verdicts_of_users_changed_by_reloads_no_cycle_saw_are_judged_again() -> None:
    """The daemon's export builds the priors at each history load: two reloads may come
    before the next propose. Each one's changed users stay marked until a cycle judges
    their jobs again, so alice's verdict (changed by the first reload) is not reused
    after the second (which changed only bob)."""
    policy = RightsizePolicy(ONLY_TIME)
    jobs = [pending_job(100, time_limit=24 * HOUR), pending_job(101, user="bob")]
    alice, _ = policy.propose(snapshot(jobs, history=_CYCLE_HISTORY))
    longer = (*_CYCLE_HISTORY, *[record(run_time=9 * HOUR)] * 3)  # alice's runs grow
    policy.priors(longer)  # the export's look at the reload; no cycle in between
    both = (*(msgspec.structs.replace(r) for r in longer), record(user="bob", run_time=HOUR))
    policy.priors(both)
    snap = snapshot(jobs, at=T0 + MIN, history=both)
    got = policy.propose(snap)
    assert _comparable(got) == _comparable(RightsizePolicy(ONLY_TIME).propose(snap))
    alice_now = next(a for a in got if a.job_id == 100)
    assert limit_of(alice_now) != limit_of(alice)


# --- judging a deep queue over cycles (max_judged_per_cycle) --------------------------


def _queue(n: int) -> list[Job]:
    """``n`` pending jobs of alice's, 3 of them (ids 100, 101, 102 mixed among the
    rest) the oldest by submit time, in a queue listed in no useful order."""
    jobs = [
        pending_job(100 + i, time_limit=24 * HOUR, submit_time=T0 - (i % 7 + 1) * MIN)
        for i in range(n)
    ]
    oldest = {100: T0 - 3 * HOUR, 101: T0 - 2 * HOUR, 102: T0 - 90 * MIN}
    jobs = [replace(j, submit_time=oldest.get(j.job_id, j.submit_time)) for j in jobs]
    return jobs[::-1]


def test_a_deep_queue_is_judged_over_cycles_oldest_first() -> None:
    """A cycle judges at most max_judged_per_cycle jobs anew, oldest submit time first;
    the others wait for the next cycles, and once every job is judged the policy
    proposes exactly what one judging them all at once does."""
    history = _CYCLE_HISTORY
    jobs = _queue(10)
    snap = snapshot(jobs, history=history)
    policy = RightsizePolicy(RightsizeSettings(max_judged_per_cycle=3))
    first = policy.propose(snap)
    assert sorted(a.job_id for a in first) == [100, 101, 102]
    assert policy.backlog == 7
    cycles = 1
    while policy.backlog:
        got = policy.propose(snapshot(jobs, at=T0 + cycles * MIN, history=history))
        cycles += 1
    assert cycles == 4  # 3 + 3 + 3 + 1
    whole = RightsizePolicy(RightsizeSettings(max_judged_per_cycle=0)).propose(snap)
    assert _comparable(got) == _comparable(whole) and len(whole) == 10
    # the verdicts made over cycles are kept as they are once all are judged
    again = policy.propose(snapshot(jobs, at=T0 + 9 * MIN, history=history))
    assert policy.backlog == 0 and sorted(map(id, again)) == sorted(map(id, got))
    # a queue that empties while jobs wait their turn leaves none waiting
    fresh = RightsizePolicy(RightsizeSettings(max_judged_per_cycle=3))
    fresh.propose(snap)
    assert fresh.backlog == 7
    assert fresh.propose(snapshot([], at=T0 + MIN, history=history)) == []
    assert fresh.backlog == 0


def test_jobs_without_a_verdict_are_judged_before_reloaded_users_jobs() -> None:
    """After a reload that changed a user's history, their jobs keep their last verdict
    until a cycle has room to judge them again; jobs never judged go first."""
    history = _CYCLE_HISTORY
    policy = RightsizePolicy(replace(ONLY_TIME, max_judged_per_cycle=2))
    old = [pending_job(100, time_limit=24 * HOUR), pending_job(101, time_limit=24 * HOUR)]
    before = policy.propose(snapshot(old, history=history))
    assert policy.backlog == 0 and len(before) == 2
    # alice's runs grow (a reload), and two jobs of bob's are submitted
    longer = (*_CYCLE_HISTORY, *[record(run_time=9 * HOUR)] * 3)
    new = [
        pending_job(102, user="bob", time_limit=24 * HOUR, submit_time=T0),
        pending_job(103, user="bob", time_limit=24 * HOUR, submit_time=T0),
    ]
    snap = snapshot([*old, *new], at=T0 + MIN, history=longer)
    got = {a.job_id: a for a in policy.propose(snap)}
    assert policy.backlog == 2
    # bob's new jobs were judged; alice's kept the verdicts of the old history meanwhile
    assert sorted(got) == [100, 101, 102, 103]
    assert got[100] is before[0] and got[101] is before[1]
    later = {
        a.job_id: a for a in policy.propose(snapshot([*old, *new], at=T0 + 2 * MIN, history=longer))
    }
    assert policy.backlog == 0
    assert limit_of(later[100]) != limit_of(before[0])  # judged on alice's longer runs now
    fresh = RightsizePolicy(ONLY_TIME).propose(snap)
    assert _comparable(list(later.values())) == _comparable(fresh)


def test_a_changed_request_beyond_the_budget_loses_its_old_verdict() -> None:
    """An old verdict is kept for a job waiting its turn only when just its user's
    history changed: a job whose request changed gets none until judged (its old
    action would set values for a request it no longer has)."""
    history = _CYCLE_HISTORY
    policy = RightsizePolicy(replace(ONLY_TIME, max_judged_per_cycle=1))
    first = pending_job(100, time_limit=24 * HOUR, submit_time=T0 - HOUR)
    second = pending_job(101, time_limit=24 * HOUR, submit_time=T0 - 2 * HOUR)
    policy.propose(snapshot([first, second], history=history))
    policy.propose(snapshot([first, second], at=T0 + MIN, history=history))
    assert policy.backlog == 0
    # both change their request; only the older (101) is judged this cycle
    shorter = [replace(first, time_limit=12 * HOUR), replace(second, time_limit=12 * HOUR)]
    got = policy.propose(snapshot(shorter, at=T0 + 2 * MIN, history=history))
    assert [a.job_id for a in got] == [101] and policy.backlog == 1
    assert got[0].numbers["time_limit_current_s"] == 12 * 3600


def test_a_time_limit_never_goes_below_the_jobs_time_min() -> None:
    """Slurm refuses it (22.05: "Invalid time-min specification ..." for a coordinator's
    TimeLimit below the job's --time-min), and the action would fail every cycle."""
    history = [record(run_time=MIN * m) for m in (50, 55, 60)]  # -> 80 min
    job = pending_job(time_limit=8 * HOUR, time_min=2 * HOUR)
    assert limit_of(only(propose([job], history, ONLY_TIME))) == limit("02:00:00")
    assert propose([replace(job, time_min=7 * HOUR)], history, ONLY_TIME) == []

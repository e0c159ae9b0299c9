"""Least attained service (policy/las.py) on hand-built snapshots, and its engine guardrails."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from slurmgpu.cycle.guardrails import GuardrailRecords, GuardrailView
from slurmgpu.intent import Preempt, SetGpus, SetNice, SetTimeLimit
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, MalleableSpec, Node
from slurmgpu.policy.base import (
    ORDERING_ALERT,
    Action,
    Decision,
    Mode,
    PolicySnapshot,
    is_ordering,
    is_preempt,
    resize_action,
    resize_sizes,
)
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.las import AttainedServicePolicy
from slurmgpu.policy.settings import (
    AttainedServiceSettings,
    EngineSettings,
    PolicyConfigError,
)
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from tests.unit.policy_builders import HOUR, MIN, T0, pending_job, running_job


def snap(
    jobs: Iterable[Job],
    *,
    at: datetime = T0,
    opted: Iterable[int] | None = None,
    node_count: int = 2,
    resizing: Iterable[int] = (),
    last_action_at: Mapping[int, datetime] | None = None,
    user_actions_last_hour: Mapping[str, int] | None = None,
) -> PolicySnapshot:
    jobs = tuple(jobs)
    used: dict[str, int] = {}
    for j in jobs:
        if j.state is JobState.RUNNING:
            for a in j.gpu_allocations:
                used[a.node] = used.get(a.node, 0) + len(a.gpu_indices)
    nodes = tuple(
        Node(f"gpu{i}", "mixed", gpus=4, gpus_used=used.get(f"gpu{i}", 0))
        for i in range(1, node_count + 1)
    )
    ids = [j.job_id for j in jobs] if opted is None else list(opted)
    return PolicySnapshot(
        at=at,
        cluster=ClusterSnapshot(at, jobs, nodes),
        malleable={j: MalleableSpec(j, 1, 8) for j in ids},
        resizing=frozenset(resizing),
        last_action_at=dict(last_action_at or {}),
        user_actions_last_hour=dict(user_actions_last_hour or {}),
    )


SETTINGS = AttainedServiceSettings(enabled=True, mode=Mode.ENFORCE, queue_limits=(1.0, 16.0))


def test_attained_service_counts_every_run_and_sets_the_queue_through_nice() -> None:
    las = AttainedServicePolicy(SETTINGS)
    # 4 GPUs for 20 min: 1.33 GPU-h, queue 1 while it runs
    run = running_job(1, gpus={"gpu1": (0, 1, 2, 3)}, started=20 * MIN)
    assert las.propose(snap([run])) == []  # a running job is not reordered
    assert las.queue(run, T0) == 1
    # requeued: pending again, its earlier run is remembered (to when it was last seen)
    later = T0 + 5 * MIN
    again = pending_job(1, gpus_per_node=4, restart_count=1)
    acts = las.propose(snap([again], at=later))
    assert las.attained_gpu_s(again, later) == pytest.approx(4 * 20 * 60)
    assert [a.intents for a in acts] == [(SetNice(SETTINGS.nice_step),)]
    assert is_ordering(acts[0]) and acts[0].alert == ORDERING_ALERT
    # once the nice is in place nothing more is proposed
    assert las.propose(snap([replace(again, nice=SETTINGS.nice_step)], at=later)) == []


def test_new_jobs_stay_in_queue_zero_without_an_update() -> None:
    las = AttainedServicePolicy(SETTINGS)
    assert las.propose(snap([pending_job(5, gpus_per_node=2)])) == []


def test_jobs_not_opted_in_are_never_touched() -> None:
    las = AttainedServicePolicy(SETTINGS)
    hog = running_job(1, gpus={"gpu1": (0, 1, 2, 3), "gpu2": (0, 1, 2, 3)}, started=5 * HOUR)
    waiting = pending_job(2, gpus_per_node=4, submit_time=T0 - HOUR)
    assert las.propose(snap([hog, waiting], opted=[2])) == []


def _cluster_full_of_long_job(started: timedelta = 5 * HOUR) -> Job:
    # 8 GPUs for hours: 40 GPU-h, queue 2 of (1, 16)
    return running_job(1, gpus={"gpu1": (0, 1, 2, 3), "gpu2": (0, 1, 2, 3)}, started=started)


def test_a_waiting_job_of_a_better_queue_preempts_a_long_running_one() -> None:
    las = AttainedServicePolicy(SETTINGS)
    hog = _cluster_full_of_long_job()
    waiting = pending_job(2, gpus_per_node=4, submit_time=T0 - 10 * MIN)
    acts = las.propose(snap([hog, waiting]))
    assert len(acts) == 1
    a = acts[0]
    assert a.kind == "resize" and a.job_id == 1 and is_preempt(a)
    assert resize_sizes(a) == (8, 8)
    # back in line in its queue
    assert a.intents == (SetNice(2 * SETTINGS.nice_step), Preempt(8))


def test_churn_guardrails_hold_preemption_back() -> None:
    las = AttainedServicePolicy(SETTINGS)
    waiting = pending_job(2, gpus_per_node=4, submit_time=T0 - 10 * MIN)
    # started 10 min ago (under min_runtime 15 min), though 8 GPUs x 10 min is queue 1
    fresh = _cluster_full_of_long_job(started=10 * MIN)
    assert las.propose(snap([fresh, waiting])) == []
    # a resize in flight
    hog = _cluster_full_of_long_job()
    assert las.propose(snap([hog, waiting], resizing=[1])) == []
    # a job that just arrived waits min_wait first (a GPU may free up on its own)
    new = pending_job(3, gpus_per_node=4, submit_time=T0 - timedelta(seconds=30))
    assert las.propose(snap([hog, new])) == []
    # never a job of the same (or a better) queue: 8 GPUs x 20 min = 2.7 GPU-h, queue 1
    las2 = AttainedServicePolicy(SETTINGS)
    queued = replace(pending_job(4, gpus_per_node=4), nice=SETTINGS.nice_step)
    las2._ended[4] = 2 * 3600.0
    peer = _cluster_full_of_long_job(started=20 * MIN)
    assert las2.propose(snap([peer, queued])) == []


def test_at_most_max_preemptions_per_cycle() -> None:
    s = replace(SETTINGS, max_preemptions_per_cycle=1)
    las = AttainedServicePolicy(s)
    a = running_job(1, gpus={"gpu1": (0, 1, 2, 3)}, started=6 * HOUR)
    b = running_job(2, gpus={"gpu2": (0, 1, 2, 3)}, started=6 * HOUR)
    big = pending_job(3, gpus_per_node=4, node_count=2, submit_time=T0 - 10 * MIN)
    assert las.propose(snap([a, b, big])) == []  # needs two: over the limit
    small = pending_job(4, gpus_per_node=4, submit_time=T0 - 10 * MIN)
    acts = las.propose(snap([a, b, small]))
    assert len(acts) == 1 and acts[0].job_id == 2  # the later submitted of the two


def _spread_job(job_id: int, *, used_on_gpu2: int = 4) -> Job:
    # --gpus=N (per job), placed over two nodes; 5 h on them: queue 2 of (1, 16)
    layout = {"gpu1": (0, 1, 2, 3), "gpu2": tuple(range(used_on_gpu2))}
    n = 4 + used_on_gpu2
    job = running_job(job_id, gpus=layout, started=5 * HOUR)
    return replace(job, gpus=GpuRequest(gpus=n, per_job=n, sources=("tres_per_job",)))


def test_a_malleable_victim_is_shrunk_by_what_is_lacking_and_keeps_its_place() -> None:
    las = AttainedServicePolicy(SETTINGS)
    hog = _spread_job(1)
    waiting = pending_job(2, gpus_per_node=4, submit_time=T0 - 10 * MIN)
    [a] = las.propose(snap([hog, waiting]))
    assert a.kind == "resize" and a.job_id == 1 and not is_preempt(a)
    assert resize_sizes(a) == (8, 4) and a.numbers["for_job"] == 2
    # no Nice: it restarts at once on the GPUs it kept, not behind the better queues
    assert not any(isinstance(i, SetNice) for i in a.intents)
    # its limit raised for half the speed (linear, the most it slows): 19 h left -> 2 x 1.1
    [limit] = [i for i in a.intents if isinstance(i, SetTimeLimit)]
    assert limit.seconds == 60 * math.ceil((19 * 3600 * 2 * 1.1 + 30) / 60)
    # one GPU free already: three are lacking, three are given
    las2 = AttainedServicePolicy(SETTINGS)
    [b] = las2.propose(snap([_spread_job(1, used_on_gpu2=3), waiting]))
    assert resize_sizes(b) == (7, 4)


def test_a_victim_that_cannot_give_enough_is_preempted_whole() -> None:
    las = AttainedServicePolicy(SETTINGS)
    hog = _spread_job(1)
    waiting = pending_job(2, gpus_per_node=4, submit_time=T0 - 10 * MIN)
    s = snap([hog, waiting])
    floor = replace(s, malleable={1: MalleableSpec(1, 6, 8), 2: MalleableSpec(2, 1, 8)})
    [a] = las.propose(floor)  # 2 GPUs above its minimum, 4 lacking
    assert is_preempt(a) and resize_sizes(a) == (8, 8)
    off = AttainedServicePolicy(replace(SETTINGS, shrink=False))
    [b] = off.propose(s)
    assert is_preempt(b) and b.intents == (SetNice(2 * SETTINGS.nice_step), Preempt(8))


def test_settings_from_config_table() -> None:
    s = AttainedServiceSettings.from_mapping({"enabled": True, "queue_limits": [2, 8]})
    assert s.enabled and s.queue_limits == (2.0, 8.0)
    assert AttainedServiceSettings().enabled is False  # off unless the site opts in
    assert s.shrink is True and s.restart_time == timedelta(seconds=30)
    off = AttainedServiceSettings.from_mapping({"shrink": False, "restart_time": "2m"})
    assert off.shrink is False and off.restart_time == timedelta(minutes=2)
    assert s.grow_back is None  # automatic: whether the malleable policy expands
    assert AttainedServiceSettings.from_mapping({"grow_back": False}).grow_back is False
    with pytest.raises(PolicyConfigError, match="queue_limits"):
        AttainedServiceSettings.from_mapping({"queue_limits": [8, 2]})
    with pytest.raises(PolicyConfigError, match="bogus"):
        AttainedServiceSettings.from_mapping({"bogus": 1})


# ---- the engine: ordering updates and other policies' actions on the same job


class _Fixed:
    def __init__(self, name: str, actions: list[Action]) -> None:
        self.name = name
        self.actions = actions

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        return self.actions


def _order(job: Job) -> Action:
    return Action(
        "las",
        "update",
        job.job_id,
        job.user,
        "queue 1",
        intents=(SetNice(100),),
        alert=ORDERING_ALERT,
    )


def test_engine_ordering_update_passes_cooldown_and_rate_limits_and_notifies_nobody() -> None:
    job = pending_job(7, gpus_per_node=2)
    engine = PolicyEngine(
        [(_Fixed("las", [_order(job)]), Mode.ENFORCE)],
        EngineSettings(max_actions_per_user_per_hour=1, max_actions_per_cycle=1),
    )
    s = snap(
        [job],
        last_action_at={7: T0 - MIN},
        user_actions_last_hour={job.user: 5},
    )
    [d] = engine.decide(s)
    assert d.execute and not d.suppressed and not d.notify


def test_engine_ordering_update_goes_with_another_policys_update_of_the_job() -> None:
    job = pending_job(7, gpus_per_node=2)
    limit = Action("rightsize", "update", 7, job.user, "limit", intents=(SetTimeLimit(3600),))
    engine = PolicyEngine(
        [(_Fixed("rightsize", [limit]), Mode.ENFORCE), (_Fixed("las", [_order(job)]), Mode.ENFORCE)]
    )
    decisions = engine.decide(snap([job]))
    assert sorted(d.action.policy for d in decisions if d.execute) == ["las", "rightsize"]


def test_engine_a_resize_of_the_job_supersedes_its_ordering_update() -> None:
    job = running_job(7, gpus={"gpu1": (0, 1)})
    shrink = resize_action("malleable", job, 2, 1, "shrink")
    engine = PolicyEngine(
        [
            (_Fixed("malleable", [shrink]), Mode.ENFORCE),
            (_Fixed("las", [_order(job)]), Mode.ENFORCE),
        ]
    )
    by_policy = {d.action.policy: d for d in engine.decide(snap([job]))}
    assert by_policy["malleable"].execute
    assert by_policy["las"].suppressed.startswith("superseded by malleable resize")


def test_engine_cooldown_lets_a_later_stages_follow_up_on_a_pending_job_through() -> None:
    job = pending_job(7, gpus_per_node=4)
    smaller = Action("malleable", "update", 7, job.user, "start smaller", intents=(SetGpus(2),))
    limit = Action("rightsize", "update", 7, job.user, "limit", intents=(SetTimeLimit(7200),))

    def decide(last_by: str, proposals: list[Action]) -> dict[str, str]:
        s = replace(snap([job], last_action_at={7: T0 - 5 * MIN}), last_action_by={7: last_by})
        engine = PolicyEngine(
            [
                (
                    _Fixed("rightsize", [a for a in proposals if a.policy == "rightsize"]),
                    Mode.ENFORCE,
                ),
                (
                    _Fixed("malleable", [a for a in proposals if a.policy == "malleable"]),
                    Mode.ENFORCE,
                ),
            ]
        )
        return {d.action.policy: d.suppressed for d in engine.decide(s)}

    # rightsize set the limit, then malleable starts it smaller: the pipeline's next step
    assert decide("rightsize", [smaller]) == {"malleable": ""}
    # rightsize may not redo the limit malleable set for the smaller size
    assert decide("malleable", [limit])["rightsize"].startswith("cooldown")
    # the same policy again: a flap
    assert decide("rightsize", [limit])["rightsize"].startswith("cooldown")
    # unknown author (an old audit row): the cooldown holds, as before
    s = snap([job], last_action_at={7: T0 - 5 * MIN})
    [d] = PolicyEngine([(_Fixed("malleable", [smaller]), Mode.ENFORCE)]).decide(s)
    assert d.suppressed.startswith("cooldown")


def test_engine_cooldown_still_guards_a_running_job_against_another_policy() -> None:
    job = running_job(7, gpus={"gpu1": (0, 1)})
    limit = Action("rightsize", "update", 7, job.user, "limit", intents=(SetTimeLimit(32400),))
    s = replace(snap([job], last_action_at={7: T0 - 5 * MIN}), last_action_by={7: "idle_gpu"})
    [d] = PolicyEngine([(_Fixed("rightsize", [limit]), Mode.ENFORCE)]).decide(s)
    assert d.suppressed.startswith("cooldown")


def test_audit_does_not_count_ordering_updates_as_changes(store: JobStore) -> None:
    audit = AuditStore(store.engine)
    job = pending_job(7, gpus_per_node=2)
    limit = Action("rightsize", "update", 7, job.user, "limit", intents=(SetTimeLimit(3600),))
    for i, action in enumerate([limit, _order(job)]):
        at = T0 + i * MIN
        [row_id] = audit.record([Decision(action, Mode.ENFORCE, execute=True, notify=False)], at)
        audit.set_outcome(row_id, "done")
    # the limit, not the reorder after it, seeds the daemon's guardrails
    view = GuardrailRecords(audit.taken_since(T0 - HOUR)).view(T0 + 2 * MIN, cooldown=HOUR)
    assert view == GuardrailView({7: T0}, {7: "rightsize"}, {job.user: 1})


def test_engine_holds_other_changes_while_the_jobs_resize_is_in_flight() -> None:
    # requeued for its resize: pending, but its request and limit are the resize's
    job = pending_job(7, gpus_per_node=4, restart_count=1)
    limit = Action("rightsize", "update", 7, job.user, "limit", intents=(SetTimeLimit(900),))
    s = replace(snap([job], resizing=[7]), last_action_by={7: "malleable"})
    decisions = PolicyEngine(
        [(_Fixed("rightsize", [limit]), Mode.ENFORCE), (_Fixed("las", [_order(job)]), Mode.ENFORCE)]
    ).decide(s)
    by_policy = {d.action.policy: d for d in decisions}
    assert by_policy["rightsize"].suppressed == "resize in flight"
    assert by_policy["las"].execute  # its place in line is no part of the resize

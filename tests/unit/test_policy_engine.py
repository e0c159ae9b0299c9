"""The engine: one decision per proposal, modes, one action per job, guardrails."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.cycle.guardrails import GuardrailRecords, Taken
from slurmgpu.model import ClusterSnapshot, Job
from slurmgpu.policy.base import Action, Decision, Mode, PolicySnapshot
from slurmgpu.policy.engine import ACTION_PRIORITY, PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import EngineSettings
from tests.hypothesis_profiles import examples
from tests.unit.policy_builders import (
    HOUR,
    MIN,
    T0,
    gpu,
    pending_job,
    record,
    running_job,
    snapshot,
    usage,
)


class Fixed:
    """A policy that proposes the actions it was given."""

    def __init__(self, name: str, actions: Iterable[Action]) -> None:
        self.name = name
        self.actions = list(actions)

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        return list(self.actions)


def act(
    job_id: int,
    kind: str = "cancel",
    policy: str = "p",
    user: str = "alice",
    *,
    alert: str = "",
    priority: int = 0,
    requires_opt_in: bool = False,
) -> Action:
    return Action(
        policy=policy,
        kind=kind,
        job_id=job_id,
        user=user,
        reason="test",
        alert=alert,
        priority=priority,
        requires_opt_in=requires_opt_in,
    )


def jobs(n: int, user: str = "alice") -> list[Job]:
    return [running_job(100 + i, user=user, submit_time=T0 - HOUR * (n - i)) for i in range(n)]


def decide(
    policies: Sequence[tuple[Fixed, Mode]],
    snap: PolicySnapshot,
    engine_settings: EngineSettings | None = None,
) -> list[Decision]:
    return PolicyEngine(policies, engine_settings).decide(snap)


def by_job(decisions: list[Decision]) -> dict[int, Decision]:
    return {d.action.job_id: d for d in decisions if not d.suppressed}


def test_modes_set_execute_and_notify() -> None:
    snap = snapshot(jobs(2))
    for mode, execute, notify in [
        (Mode.OBSERVE, False, False),
        (Mode.ADVISE, False, True),
        (Mode.ENFORCE, True, True),
    ]:
        out = decide([(Fixed("p", [act(100, "cancel"), act(101, "warn")]), mode)], snap)
        d = {x.action.kind: x for x in out}
        assert (d["cancel"].execute, d["cancel"].notify, d["cancel"].mode) == (
            execute,
            notify,
            mode,
        )
        assert not d["warn"].execute and d["warn"].notify is (mode is not Mode.OBSERVE)
        assert not any(x.suppressed for x in out)


def test_one_action_per_job_by_kind_priority_then_policy_order() -> None:
    assert ACTION_PRIORITY["cancel"] > ACTION_PRIORITY["requeue"] > ACTION_PRIORITY["warn"]
    assert ACTION_PRIORITY["warn"] > ACTION_PRIORITY["update"]
    snap = snapshot(jobs(2))
    first = Fixed("first", [act(100, "update", "first"), act(101, "warn", "first")])
    second = Fixed("second", [act(100, "requeue", "second"), act(101, "warn", "second")])
    out = decide([(first, Mode.ENFORCE), (second, Mode.ENFORCE)], snap)
    assert len(out) == 4
    kept = by_job(out)
    assert kept[100].action.kind == "requeue" and kept[101].action.policy == "first"
    lost = [d for d in out if d.suppressed]
    assert {d.suppressed for d in lost} == {
        "superseded by second requeue for this job",
        "superseded by first warn for this job",
    }
    assert all(not d.execute and not d.notify for d in lost)


def test_action_priority_breaks_ties_within_a_kind() -> None:
    snap = snapshot(jobs(1))
    p = Fixed("p", [act(100, "warn", alert="a"), act(100, "warn", alert="b", priority=5)])
    kept = by_job(decide([(p, Mode.ADVISE)], snap))
    assert kept[100].action.alert == "b"


def test_exempt_users_partitions_qos_and_interactive_jobs_are_suppressed() -> None:
    js = [
        running_job(100, user="root"),
        running_job(101, partition="debug"),
        pending_job(102, partition="gpu,debug"),
        running_job(103, qos="urgent"),
        running_job(104, batch=False),
        running_job(105),
    ]
    rules = EngineSettings(
        exempt_users=frozenset({"root"}),
        exempt_partitions=frozenset({"debug"}),
        exempt_qos=frozenset({"urgent"}),
    )
    p = Fixed("p", [act(j.job_id, "warn") for j in js])
    out = {d.action.job_id: d.suppressed for d in decide([(p, Mode.ENFORCE)], snapshot(js), rules)}
    assert out == {
        100: "exempt user root",
        101: "exempt partition debug",
        102: "exempt partition debug",
        103: "exempt QOS urgent",
        104: "interactive job (exempt)",
        105: "",
    }
    allowed = replace(rules, exempt_interactive=False)
    assert by_job(decide([(p, Mode.ENFORCE)], snapshot(js), allowed)).get(104) is not None


def test_an_action_for_a_job_not_in_the_snapshot_is_suppressed() -> None:
    out = decide([(Fixed("p", [act(999)]), Mode.ENFORCE)], snapshot(jobs(1)))
    assert out[0].suppressed == "job not in snapshot" and not out[0].execute


def test_cooldown_holds_changes_but_not_warnings() -> None:
    snap = snapshot(jobs(2), last_action_at={100: T0 - MIN * 10, 101: T0 - MIN * 10})
    p = Fixed("p", [act(100, "cancel"), act(101, "warn")])
    out = {d.action.job_id: d for d in decide([(p, Mode.ENFORCE)], snap)}
    assert out[100].suppressed == "cooldown: last change 10 min ago (wait 30 min)"
    assert not out[101].suppressed
    later = snapshot(jobs(1), last_action_at={100: T0 - MIN * 31})
    assert decide([(Fixed("p", [act(100)]), Mode.ENFORCE)], later)[0].execute


def test_resizes_are_spaced_by_their_policy_not_the_job_cooldown() -> None:
    # A shrink for a waiting job and the expansion back after it ended come minutes
    # apart; the malleable policy's min_interval spaces them, the 30-min cooldown must not.
    snap = snapshot(jobs(2), last_action_at={100: T0 - MIN * 2, 101: T0 - MIN * 2})
    p = Fixed("p", [act(100, "resize"), act(101, "requeue")])
    out = {d.action.job_id: d for d in decide([(p, Mode.ENFORCE)], snap)}
    assert out[100].execute and not out[100].suppressed
    assert out[101].suppressed == "cooldown: last change 2 min ago (wait 30 min)"


def test_a_change_slurm_refused_is_not_retried_by_that_policy_within_the_cooldown() -> None:
    # Seen on the lab: 22.05 refused a shard conversion, and the daemon sent it again
    # every cycle (146 times in ten minutes).
    failed = {(100, "p"): T0 - MIN * 5, (101, "p"): T0 - MIN * 31}
    snap = replace(snapshot(jobs(3)), failed_at=failed)
    p = Fixed("p", [act(100, "update"), act(101, "update"), act(102, "resize")])
    out = {d.action.job_id: d for d in decide([(p, Mode.ENFORCE)], snap)}
    assert out[100].suppressed == "failed in Slurm 5 min ago: not retried for 30 min"
    assert not out[100].execute
    assert out[101].execute  # refused longer ago than the cooldown
    assert out[102].execute  # nothing failed on it
    other = Fixed("q", [act(100, "update", policy="q")])
    assert decide([(other, Mode.ENFORCE)], snap)[0].execute  # another policy's change
    warn = Fixed("p", [act(100, "warn")])
    assert not decide([(warn, Mode.ENFORCE)], snap)[0].suppressed  # no change in Slurm


def test_guardrail_records_keep_refusals_until_a_change_is_made_or_the_cooldown_ends() -> None:
    records = GuardrailRecords()
    update = act(100, "update")
    assert records.record_action(update, "failed", T0) is False
    view = records.view(T0 + MIN, cooldown=30 * MIN)
    assert view.failed_at == {(100, "p"): T0} and view.last_action_at == {}
    assert records.view(T0 + 31 * MIN, cooldown=30 * MIN).failed_at == {}
    records.record_action(update, "failed", T0 + 32 * MIN)
    assert records.record_action(update, "done", T0 + 33 * MIN) is True
    assert records.view(T0 + 34 * MIN, cooldown=30 * MIN).failed_at == {}
    seeded = GuardrailRecords((), [Taken(100, "alice", "p", T0)])
    assert seeded.view(T0 + MIN, cooldown=30 * MIN).failed_at == {(100, "p"): T0}


def test_per_user_hourly_rate_counts_this_cycle() -> None:
    snap = snapshot(jobs(5), user_actions_last_hour={"alice": 8})
    p = Fixed("p", [act(100 + i) for i in range(5)])
    out = decide([(p, Mode.ENFORCE)], snap)
    taken = [d.action.job_id for d in out if d.execute]
    assert taken == [100, 101]  # oldest first, 8 + 2 = 10
    reasons = {d.suppressed for d in out if d.suppressed}
    assert reasons == {"rate limit: 10 changes to alice's jobs in the last hour (max 10)"}
    other = snapshot(jobs(1, user="bob"), user_actions_last_hour={"alice": 99})
    assert decide([(Fixed("p", [act(100, user="bob")]), Mode.ENFORCE)], other)[0].execute


def test_max_actions_per_cycle_keeps_highest_priority_then_oldest() -> None:
    js = jobs(6)
    p = Fixed(
        "p",
        [
            act(100, "update"),
            act(101, "update"),
            act(102, "requeue"),
            act(103, "cancel"),
            act(104, "update"),
            act(105, "warn"),
        ],
    )
    out = decide([(p, Mode.ENFORCE)], snapshot(js), EngineSettings(max_actions_per_cycle=3))
    executed = sorted(d.action.job_id for d in out if d.execute)
    assert executed == [100, 102, 103]  # cancel, requeue, then the oldest update
    held = {d.action.job_id: d.suppressed for d in out if d.suppressed}
    assert held == {
        101: "cycle limit: 3 changes this cycle",
        104: "cycle limit: 3 changes this cycle",
    }
    assert not by_job(out)[105].execute and by_job(out)[105].notify  # warnings are not counted


def test_rate_limits_bind_enforce_mode_changes_only() -> None:
    p = Fixed("p", [act(100 + i) for i in range(5)])
    advise = decide([(p, Mode.ADVISE)], snapshot(jobs(5)), EngineSettings(max_actions_per_cycle=1))
    assert all(not d.suppressed and d.notify and not d.execute for d in advise)
    observe_first = Fixed("o", [act(100 + i, policy="o") for i in range(5)])
    enforce = Fixed("e", [act(105, policy="e")])
    out = decide(
        [(observe_first, Mode.OBSERVE), (enforce, Mode.ENFORCE)],
        snapshot(jobs(6)),
        EngineSettings(max_actions_per_cycle=1),
    )
    assert [d.action.job_id for d in out if d.execute] == [105]


def test_rightsize_updates_of_jobs_that_did_not_opt_in_are_suppressed() -> None:
    history = [record(run_time=HOUR)] * 3
    js = [
        pending_job(100),
        pending_job(101),
        pending_job(120, array_job_id=120, array_task_spec="1-3"),
    ]
    snap = snapshot(js, history=history, opted_in=[101, 120])
    engine = PolicyEngine([(RightsizePolicy(), Mode.ENFORCE)])
    out = {d.action.job_id: d for d in engine.decide(snap)}
    assert out[100].suppressed.startswith("not opted in") and not out[100].execute
    assert out[101].execute and out[120].execute


def test_decisions_are_sorted_and_repeatable() -> None:
    js = jobs(4)
    p = Fixed("p", [act(103, "update"), act(101, "warn"), act(102, "cancel"), act(100, "update")])
    a = decide([(p, Mode.ENFORCE)], snapshot(js))
    b = decide([(p, Mode.ENFORCE)], snapshot(js))
    assert a == b
    assert [(d.action.kind, d.action.job_id) for d in a] == [
        ("cancel", 102),
        ("warn", 101),
        ("update", 100),
        ("update", 103),
    ]


def test_real_policies_together_warn_idle_and_rightsize_pending() -> None:
    running = running_job(200, started=timedelta(hours=3))
    pend = pending_job(100)
    snap = snapshot(
        [running, pend],
        usage_by_job=[usage(200, gpu(idle=MIN * 70, never_busy=True))],
        history=[record(run_time=HOUR)] * 3,
        opted_in=[100],
    )
    engine = PolicyEngine([(IdleGpuPolicy(), Mode.ENFORCE), (RightsizePolicy(), Mode.ADVISE)])
    out = engine.decide(snap)
    assert [(d.action.policy, d.action.kind, d.execute, d.notify) for d in out] == [
        ("idle_gpu", "warn", False, True),
        ("rightsize", "update", False, True),
    ]


KINDS = ["cancel", "requeue", "warn", "update", "other"]


@st.composite
def _scenario(draw: st.DrawFn) -> tuple[list[tuple[Fixed, Mode]], PolicySnapshot, EngineSettings]:
    n_jobs = draw(st.integers(1, 8))
    users = ["alice", "bob", "carol"]
    js = [
        running_job(
            100 + i,
            user=draw(st.sampled_from(users)),
            partition=draw(st.sampled_from(["gpu", "debug"])),
            batch=draw(st.booleans()),
            submit_time=T0 - MIN * draw(st.integers(0, 1000)),
        )
        for i in range(n_jobs)
    ]
    policies: list[tuple[Fixed, Mode]] = []
    for p in range(draw(st.integers(1, 3))):
        actions = [
            act(
                draw(st.integers(98, 100 + n_jobs)),
                draw(st.sampled_from(KINDS)),
                policy=f"p{p}",
                priority=draw(st.integers(0, 2)),
                requires_opt_in=draw(st.booleans()),
            )
            for _ in range(draw(st.integers(0, 10)))
        ]
        policies.append((Fixed(f"p{p}", actions), draw(st.sampled_from(list(Mode)))))
    snap = snapshot(
        js,
        last_action_at={100: T0 - MIN * draw(st.integers(0, 60))},
        user_actions_last_hour={"alice": draw(st.integers(0, 12))},
        opted_in=draw(st.sets(st.integers(100, 108))),
    )
    rules = EngineSettings(
        max_actions_per_cycle=draw(st.integers(0, 5)),
        max_actions_per_user_per_hour=draw(st.integers(0, 5)),
        exempt_partitions=frozenset(draw(st.sets(st.sampled_from(["gpu", "debug"])))),
    )
    return policies, snap, rules


@given(_scenario())
@settings(max_examples=examples(300), deadline=None)
def test_every_proposal_gets_exactly_one_decision(
    case: tuple[list[tuple[Fixed, Mode]], PolicySnapshot, EngineSettings],
) -> None:
    policies, snap, rules = case
    out = decide(policies, snap, rules)
    proposed = Counter(id(a) for p, _ in policies for a in p.propose(snap))
    assert Counter(id(d.action) for d in out) == proposed
    taken_per_job = Counter(d.action.job_id for d in out if not d.suppressed)
    assert all(n == 1 for n in taken_per_job.values())
    for d in out:
        if d.mode is not Mode.ENFORCE or d.suppressed or d.action.kind == "warn":
            assert not d.execute
        if d.mode is Mode.OBSERVE or d.suppressed:
            assert not d.notify
    executed = [d for d in out if d.execute]
    assert len(executed) <= rules.max_actions_per_cycle
    assert decide(policies, snap, rules) == out


def test_the_job_index_is_built_once_per_snapshot_and_is_not_part_of_its_value() -> None:
    jobs = (pending_job(100), pending_job(101))
    a = ClusterSnapshot(taken_at=T0, jobs=jobs, nodes=())
    b = ClusterSnapshot(taken_at=T0, jobs=jobs, nodes=())
    index = a.jobs_by_id()
    assert dict(index) == {100: jobs[0], 101: jobs[1]}
    assert a.jobs_by_id() is index  # shared by the engine and every actuator
    assert a == b and hash(a) == hash(b) and "by_id" not in repr(a)


def test_an_action_that_needs_another_jobs_change_goes_only_with_it() -> None:
    # A rebalance: job 101 grows into the GPUs job 100 gives up. When the donor's
    # change is held back (exempt user, or another policy's action wins its slot), the
    # expansion is held back too; it would wait pending for GPUs nobody frees.
    js = [running_job(100, user="root"), running_job(101), running_job(102), running_job(103)]
    donor = act(100, "warn")
    needing = Action(policy="p", kind="warn", job_id=101, user="alice", reason="t", needs=100)
    fine = Action(policy="p", kind="warn", job_id=103, user="alice", reason="t", needs=102)
    p = Fixed("p", [donor, needing, act(102, "warn"), fine])
    rules = EngineSettings(exempt_users=frozenset({"root"}))
    out = {d.action.job_id: d.suppressed for d in decide([(p, Mode.ENFORCE)], snapshot(js), rules)}
    assert out == {100: "exempt user root", 101: "needs the p change of job 100", 102: "", 103: ""}
    # the donor's slot taken by another policy's stronger action: the same
    q = Fixed("q", [act(102, "cancel", policy="q")])
    both = {
        (d.action.policy, d.action.job_id): d.suppressed
        for d in decide([(p, Mode.ENFORCE), (q, Mode.ENFORCE)], snapshot(js), rules)
    }
    assert both[("p", 103)] == "needs the p change of job 102"
    assert both[("q", 102)] == ""

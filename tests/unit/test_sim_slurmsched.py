"""SimSlurm with Slurm's own passes (sim.slurmsched): cases worked out by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from slurmgpu.intent import SetTimeLimit
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.slurmsched import NodePlans, SlurmScheduling
from slurmgpu.sim.workload import RigidJob, TraceJob

# backfill every 100 s, plans in 10 s steps; the periodic full main pass far away; limits
# to the second
SCHED = SlurmScheduling(
    bf_interval_s=100.0, bf_resolution_s=10.0, sched_interval_s=10_000.0, limit_unit_s=1.0
)


def job(name: str, gpus: int, run_s: float, limit_s: float) -> TraceJob:
    return TraceJob(
        submit_s=0.0,
        name=name,
        user="u",
        model=RigidJob(run_s, gpus),
        gpus=gpus,
        time_limit_s=limit_s,
    )


def starts(sim: SimSlurm) -> dict[str, float]:
    return {j.name: j.first_start_s for j in sim.all_jobs.values()}


def one_node(scheduling: SlurmScheduling | None) -> SimSlurm:
    """4 GPUs; R holds 3 from 0 to 500 (limit 1000); at 10 B (2 GPUs) and C (1 GPU,
    100 s) queue, B first."""
    sim = SimSlurm(1, 4, scheduling=scheduling)
    sim.submit_job(job("R", 3, 500, 1000))
    sim.run_until(10)
    sim.submit_job(job("B", 2, 100, 100))
    sim.submit_job(job("C", 1, 100, 100))
    return sim


def test_the_main_pass_starts_nothing_below_a_blocked_job() -> None:
    # At 10 the main pass finds B blocked (1 GPU free) and stops: C, which fits, waits
    # behind it (squeue's reason Priority), where EASY starts it at once.
    sim = one_node(SCHED)
    sim.run_until(50)
    assert [j.name for j in sim.running()] == ["R"]
    easy = one_node(None)
    easy.run_until(50)
    assert starts(easy)["C"] == 10


def test_a_job_below_a_blocked_one_starts_at_the_next_backfill_pass() -> None:
    # The backfill thread's first pass is 100 s after its start (0): B plans the node
    # from R's limit (1000); C's run [100, 200] ends before, so it starts then. R ends at
    # 500: the main pass starts B.
    sim = one_node(SCHED)
    sim.run_until(5000)
    assert starts(sim) == {"R": 0, "B": 500, "C": 100}


def test_bf_max_job_test_stops_the_pass_before_the_job_that_fits() -> None:
    # One job tested per pass: B, which cannot start; C waits for R's end with it.
    sim = one_node(replace(SCHED, bf_max_job_test=1))
    sim.run_until(5000)
    assert starts(sim) == {"R": 0, "B": 500, "C": 500}


def test_simulate_takes_slurms_passes_from_its_options() -> None:
    # the one-node case through the runner: C starts at the backfill pass (100) with the
    # option, at once (10) without it
    trace = [
        replace(job("R", 3, 500, 1000), submit_s=0.0),
        replace(job("B", 2, 100, 100), submit_s=10.0),
        replace(job("C", 1, 100, 100), submit_s=10.0),
    ]
    shape = ClusterShape(1, 4)
    slurm = simulate(trace, shape, "slurm", SimOptions(scheduling=SCHED))
    easy = simulate(trace, shape, "slurm", SimOptions())
    assert {j.name: j.first_start_s for j in slurm.jobs}["C"] == 100
    assert {j.name: j.first_start_s for j in easy.jobs}["C"] == 10


def two_nodes(scheduling: SlurmScheduling | None) -> SimSlurm:
    """2 nodes of 2 GPUs. R1 holds node 0 until 1000, R2 one GPU of node 1 until 200
    (its limit). At 10 A (4 GPUs), B (2 GPUs, 100 s) and C (1 GPU, 500 s) queue."""
    sim = SimSlurm(2, 2, scheduling=scheduling)
    sim.submit_job(job("R1", 2, 1000, 1000))
    sim.submit_job(job("R2", 1, 200, 200))
    sim.run_until(10)
    for spec in (job("A", 4, 100, 100), job("B", 2, 100, 100), job("C", 1, 500, 500)):
        sim.submit_job(spec)
    return sim


def test_conservative_backfill_starts_no_job_that_delays_a_later_plan() -> None:
    # EASY reserves for A alone (from 1000): C's run [10, 510] ends before, so it starts
    # at 10 on node 1's free GPU -- and B, which needed node 1 whole from 200 (R2's
    # limit), waits until C ends. Conservative backfill plans B too: at the pass at 100,
    # B holds node 1 for [200, 300], so C (window [100, 600]) may not start; it plans
    # node 1 from 300. The pass at 200 (R2 gone) starts B, the one at 300 C; A starts
    # when R1 ends.
    sim = two_nodes(SCHED)
    sim.run_until(5000)
    assert starts(sim) == {"R1": 0, "R2": 0, "A": 1000, "B": 200, "C": 300}
    easy = two_nodes(None)
    easy.run_until(5000)
    assert starts(easy)["C"] == 10
    assert starts(easy)["B"] == 510


def test_a_plan_holds_its_whole_node() -> None:
    # 1 node of 4 GPUs: R holds 2 until 1000. A (4 GPUs) plans the node from 1000. B
    # (1 GPU) fits beside R now but its run [100, 1100] overlaps A's plan: Slurm's plans
    # are node bitmaps, so B may not start even though 2 GPUs are free; with a run
    # ending by 1000 it may.
    sim = SimSlurm(1, 4, scheduling=SCHED)
    sim.submit_job(job("R", 2, 1000, 1000))
    sim.run_until(10)
    sim.submit_job(job("A", 4, 100, 100))
    sim.submit_job(job("B", 1, 1000, 1000))
    sim.submit_job(job("D", 1, 800, 800))
    sim.run_until(5000)
    assert starts(sim) == {"R": 0, "A": 1000, "B": 1100, "D": 100}


def test_time_limits_are_whole_minutes_as_slurm_keeps_them() -> None:
    # time_str2mins rounds seconds up, at submission and in an update
    sim = SimSlurm(1, 4, scheduling=SlurmScheduling())
    jid = sim.submit_job(job("R", 4, 500, 61))
    assert sim.job(jid).time_limit_s == 120
    sim.update_job(jid, (SetTimeLimit(seconds=90),))
    assert sim.job(jid).time_limit_s == 120
    sim.update_job(jid, (SetTimeLimit(seconds=None),))
    assert sim.job(jid).time_limit_s is None
    assert SlurmScheduling().scaled(60).limit(61.0) == 3600
    easy = SimSlurm(1, 4)
    assert easy.job(easy.submit_job(job("R", 4, 500, 61))).time_limit_s == 61


def test_plans_round_down_to_the_resolution() -> None:
    plans = NodePlans(60.0)
    assert plans.add(125.0, 250.0, frozenset({1})) == (120.0, 240.0)
    assert plans.add(125.0, 130.0, frozenset({2})) == (120.0, 180.0)  # one step at least
    assert plans.blocked(200.0, 300.0) == {1}  # the second ended at 180
    assert plans.blocked(240.0, 300.0) == set()  # the first at 240
    assert plans.blocked(0.0, 120.0) == {1, 2}  # a window's end counts
    assert plans.add(0.0, math.inf, frozenset({3}))[1] == math.inf


def test_the_backfill_thread_polls_once_its_interval_passed() -> None:
    s = SlurmScheduling()
    assert s.next_backfill(100.0, 110.0) == 130.0
    assert s.next_backfill(100.0, 140.4) == 141.0
    assert s.next_backfill(100.0, 141.0) == 141.0
    scaled = s.scaled(60)
    assert (scaled.bf_interval_s, scaled.bf_resolution_s, scaled.bf_poll_s) == (1800, 3600, 60)
    assert scaled.bf_max_job_test == 500


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bf_interval_s": 0.0}, "bf_interval_s must be a number > 0"),
        ({"bf_resolution_s": math.nan}, "bf_resolution_s must be a number > 0"),
        ({"bf_max_job_test": 0}, "bf_max_job_test must be >= 1"),
        ({"bf_poll_s": -1.0}, "bf_poll_s must be > 0"),
        ({"limit_unit_s": math.inf}, "limit_unit_s must be a number > 0"),
    ],
)
def test_bad_parameters_are_refused_in_one_line(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlurmScheduling(**kwargs)  # type: ignore[arg-type]

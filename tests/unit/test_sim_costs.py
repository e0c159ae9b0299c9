"""The simulator's cost sets: provenance, the default, TOML files, what SimSlurm charges,
and what ``sgpu simulate`` says it used."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.sim.costs import (
    COST_SETS,
    COSTS,
    DEFAULT,
    CostError,
    cost_set,
    parse_costs,
)
from slurmgpu.sim.metrics import summarise
from slurmgpu.sim.pollux import RestartCosts
from slurmgpu.sim.progress import ElasticRuntime
from slurmgpu.sim.replayplan import replay_options
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.workload import RigidJob, TraceJob

TRACE = "submit_s,duration_s,gpus\n0,600,2\n100,300,1\n"


def _job(duration: float = 600.0, gpus: int = 2) -> TraceJob:
    return TraceJob(submit_s=0.0, user="u", name="j", gpus=gpus, model=RigidJob(duration, gpus))


# ---- the named sets


def test_every_measured_cost_says_which_bench_release_date_and_how_many() -> None:
    for name, costs in COST_SETS.items():
        assert costs.name == name and costs.version >= 1 and costs.about
        for key in COSTS:
            c = costs.cost(key)
            assert c.seconds >= 0 and c.bench, (name, key)
            if name != "legacy":
                assert c.measured and c.release and c.date, (name, key)
                assert c.samples > 0 and c.bench.startswith("bench/"), (name, key)
    legacy = cost_set("legacy")
    assert not any(legacy.cost(k).measured for k in ("checkpoint", "startup", "reform"))


def test_the_default_is_the_measured_22_05_lab_set() -> None:
    costs = cost_set(DEFAULT)
    assert DEFAULT == "slurm-22.05-lab" and costs.checkpoint.release == "22.05"
    assert all(costs.cost(k).measured for k in COSTS)
    # the measured resize is far cheaper than the constants it replaces
    legacy = cost_set("legacy")
    assert costs.checkpoint.seconds < legacy.checkpoint.seconds
    assert costs.startup.seconds < legacy.startup.seconds
    # and a job now pays a fixed cost the legacy set never charged
    assert costs.first_startup.seconds > 0 and costs.submit_delay.seconds > 0


def test_the_legacy_set_is_what_bare_options_charge() -> None:
    legacy = SimOptions.of_costs(cost_set("legacy"))
    bare = SimOptions()
    assert legacy.runtime == bare.runtime == ElasticRuntime()
    assert legacy.requeue_delay_s == bare.requeue_delay_s == 121.0
    assert legacy.submit_delay_s == bare.submit_delay_s == 0.0


def test_an_unknown_set_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(CostError, match=r"unknown cost set 'nope'; known: slurm-22.05-lab"):
        cost_set("nope")


def test_lines_print_each_cost_with_its_source() -> None:
    costs = cost_set(DEFAULT)
    lines = costs.lines()
    assert lines[0].startswith(f"cost set {DEFAULT} v2: ")
    for key in COSTS:
        (line,) = [x for x in lines if x.strip().startswith(key + " ")]
        c = costs.cost(key)
        assert f"{c.seconds:.2f} s" in line and c.source() in line
    assert "Slurm 22.05, 2026-12-06, median of 3" in costs.checkpoint.source()


def test_scaled_multiplies_every_cost_and_refuses_nonsense() -> None:
    costs = cost_set("replay-stand-in")
    big = costs.scaled(60)
    for key in COSTS:
        assert big.cost(key).seconds == pytest.approx(60 * costs.cost(key).seconds)
        assert big.cost(key).bench == costs.cost(key).bench
    assert big.name == "replay-stand-in x60"
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(CostError, match="scales by a number > 0"):
            costs.scaled(bad)


def test_with_cost_replaces_one_and_says_so() -> None:
    costs = cost_set(DEFAULT).with_cost("checkpoint", 7, "the --checkpoint option")
    assert costs.checkpoint.seconds == 7.0
    assert costs.checkpoint.source() == "the --checkpoint option"
    assert costs.startup == cost_set(DEFAULT).startup
    with pytest.raises(CostError, match="no cost 'lunch'"):
        costs.with_cost("lunch", 1, "x")
    with pytest.raises(CostError, match="checkpoint must be a number of seconds >= 0"):
        costs.with_cost("checkpoint", -1, "x")


# ---- TOML files


def test_a_toml_file_gives_costs_with_their_provenance_and_the_rest_from_its_base() -> None:
    text = (
        'name = "our-site"\nversion = 2\nabout = "our cluster"\nbase = "legacy"\n'
        "checkpoint = 12\n"
        '[startup]\nseconds = 45.5\nbench = "restart log"\nrelease = "23.11"\n'
        "date = 2026-11-30\nsamples = 20\n"
    )
    costs = parse_costs(text, "site.toml")
    assert costs.label == "our-site v2" and costs.about == "our cluster"
    assert costs.checkpoint.seconds == 12.0 and costs.checkpoint.source() == "site.toml"
    assert costs.startup.source() == "restart log, Slurm 23.11, 2026-11-30, median of 20"
    assert costs.requeue_delay.seconds == 121.0
    assert costs.requeue_delay.note.endswith("from legacy v1")
    default = parse_costs("", "empty.toml")  # everything from the default set
    assert default.name == "empty.toml"
    assert all(default.cost(k).seconds == cost_set(DEFAULT).cost(k).seconds for k in COSTS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("checkpoint = ", r"f.toml: not TOML"),
        ("lunch = 3", r"f.toml: unknown key lunch; known: about, base, checkpoint"),
        ("checkpoint = -1", r"f.toml: checkpoint must be a number of seconds >= 0, not -1"),
        ("checkpoint = true", r"f.toml: checkpoint must be a number of seconds, not True"),
        ('checkpoint = "20s"', r"f.toml: checkpoint must be a number of seconds, not '20s'"),
        ("checkpoint = nan", r"f.toml: checkpoint must be a number of seconds >= 0, not nan"),
        ('base = "nope"', r"f.toml: base: unknown cost set 'nope'"),
        ("version = 0", r"f.toml: version must be an integer >= 1, not 0"),
        ('name = ""', r"f.toml: name must be a non-empty string"),
        ("[startup]\nbench = 'x'", r"f.toml: \[startup\] needs seconds"),
        ("[startup]\nseconds = 1\nwhen = 2", r"f.toml: \[startup\] has unknown key when"),
        ("[startup]\nseconds = 1\nsamples = -2", r"samples must be an integer >= 0, not -2"),
        ("[startup]\nseconds = 1\nrelease = 23.11", r"release must be a string, not 23.11"),
    ],
)
def test_a_bad_cost_file_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(CostError, match=message) as info:
        parse_costs(text, "f.toml")
    assert "\n" not in str(info.value)


# ---- what SimSlurm charges


def test_a_job_is_scheduled_submit_delay_after_its_submission_and_listed_reason_none() -> None:
    sim = SimSlurm(1, 4, submit_delay_s=3.5)
    job_id = sim.submit_job(_job())
    sim.run_until(1.0)
    (listed,) = sim.jobs()
    assert listed.state.value == "PENDING" and listed.reason == "None"
    sim.run_until(3.5)
    assert sim.job(job_id).state.value == "RUNNING" and sim.job(job_id).start_s == 3.5


def test_a_first_run_pays_first_startup_and_a_restart_pays_startup() -> None:
    runtime = ElasticRuntime(checkpoint_s=1.0, startup_s=5.0, first_startup_s=2.0)
    sim = SimSlurm(1, 4, runtime=runtime, requeue_delay_s=10.0)
    job_id = sim.submit_job(_job(600.0))
    sim.run_until(1e6)
    job = sim.job(job_id)
    assert job.end_s == pytest.approx(602.0)  # 600 s of work after a 2-s start-up

    sim = SimSlurm(1, 4, runtime=runtime, requeue_delay_s=10.0)
    job_id = sim.submit_job(_job(600.0))
    sim.run_until(100.0)
    sim.requeue(job_id)  # at 100 s: no checkpoint, the work since the start is lost
    sim.run_until(1e6)
    assert sim.job(job_id).end_s == pytest.approx(100.0 + 10.0 + 5.0 + 600.0)


def test_an_ended_job_holds_its_gpus_completing_s_before_the_next_starts() -> None:
    # Two 4-GPU jobs on one 4-GPU node: the second starts when the first's GPUs are
    # free, completing_s after its end (Slurm's COMPLETING), not at the end.
    sim = SimSlurm(1, 4, completing_s=0.9)
    first = sim.submit_job(_job(100.0, 4))
    second = sim.submit_job(_job(50.0, 4))
    sim.run_until(100.5)
    assert sim.job(first).state.value == "COMPLETED" and sim.job(first).end_s == 100.0
    assert sim.job(second).state.value == "PENDING"
    (node,) = sim.nodes()
    assert node.gpus_used == 4  # still held
    sim.run_until(1e6)
    assert sim.job(second).first_start_s == pytest.approx(100.9)
    # a job that fits beside the ended one's GPUs does not wait for them
    sim = SimSlurm(1, 4, completing_s=0.9)
    sim.submit_job(_job(100.0, 2))
    sim.run_until(100.0)
    other = sim.submit_job(_job(10.0, 2))
    sim.run_until(1e6)
    assert sim.job(other).first_start_s == pytest.approx(100.0)


def test_completing_gpus_count_for_the_backfill_reservation() -> None:
    # While an ended job's GPUs are held, they count as freed at the hold's end: for
    # EASY backfill's reservation and for Slurm's conservative backfill's releases.
    sim = SimSlurm(1, 4, completing_s=1.0)
    sim.submit_job(_job(100.0, 2))
    sim.submit_job(replace(_job(1000.0, 2), time_limit_s=2000.0))
    sim.run_until(100.0)
    big = sim.submit_job(_job(10.0, 4))
    waiting = sim.job(big)
    sim.run_until(100.5)
    assert waiting.state.value == "PENDING"
    # both jobs' GPUs are needed: the held two (free at 101 s) and the running job's,
    # at its time limit; not counting the held ones, no time would fit it
    reservation = sim._reservation(waiting, sim._free())
    assert reservation is not None and reservation[1] == [4]
    until, freed = sim._releases()[0]  # the hold's end, first
    assert until == pytest.approx(101.0) and freed == [(0, 2)]


def test_the_measured_default_costs_a_trace_its_fixed_costs_per_job() -> None:
    trace = [_job(600.0), _job(300.0, 1)]
    legacy = summarise(simulate(trace, ClusterShape(1, 4), "slurm", SimOptions()))
    costs = cost_set(DEFAULT)
    measured = summarise(simulate(trace, ClusterShape(1, 4), "slurm", SimOptions.of_costs(costs)))
    fixed = costs.submit_delay.seconds + costs.first_startup.seconds
    assert measured.avg_jct_s == pytest.approx(legacy.avg_jct_s + fixed)


def test_pollux_with_slurms_costs_pays_the_cost_set_and_legacy_keeps_its_model() -> None:
    assert RestartCosts.of_costs(cost_set("legacy")) == RestartCosts.slurm()
    costs = cost_set(DEFAULT)
    r = RestartCosts.of_costs(costs)
    assert r.label == "pollux-slurm"
    assert r.first_start_s == pytest.approx(
        costs.submit_delay.seconds + costs.first_startup.seconds
    )
    assert r.restart_s == pytest.approx(
        costs.checkpoint.seconds + costs.fast_path_s + costs.startup.seconds
    )


def test_a_replay_compressed_by_c_pays_costs_and_pacing_c_times_in_trace_time() -> None:
    costs = cost_set("replay-stand-in")
    options = replay_options(costs, 60.0)
    assert options.runtime.checkpoint_s == pytest.approx(60 * costs.checkpoint.seconds)
    assert options.requeue_delay_s == pytest.approx(60 * costs.requeue_delay.seconds)
    assert options.submit_delay_s == pytest.approx(60 * costs.submit_delay.seconds)
    assert options.resize.cycle_interval == timedelta(seconds=60)
    assert options.resize.release_delay == timedelta(seconds=90)


# ---- sgpu simulate


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(TRACE)
    return path


def test_sgpu_simulate_says_which_costs_it_used_and_the_json_carries_them(
    tmp_path: Path,
) -> None:
    out = tmp_path / "cmp.json"
    result = CliRunner().invoke(
        main, ["simulate", str(_trace(tmp_path)), "--policies", "slurm", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"cost set {DEFAULT} v2" in result.output
    assert "bench/resize_path.py --torch" in result.output  # a source, printed
    doc = json.loads(out.read_text())
    assert doc["costs"]["name"] == DEFAULT
    assert set(doc["costs"]["costs"]) == set(COSTS)
    assert doc["costs"]["costs"]["checkpoint"]["samples"] == 3


def test_sgpu_simulate_takes_a_named_set_a_file_and_an_override(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path))
    out = tmp_path / "a.json"
    result = CliRunner().invoke(
        main,
        ["simulate", trace, "--policies", "slurm", "--costs", "legacy", "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "cost set legacy v1" in result.output
    legacy_jct = json.loads(out.read_text())["results"][0]["avg_jct_s"]
    assert legacy_jct == pytest.approx((600 + 300) / 2)  # no fixed cost, both start at once

    costs = tmp_path / "site.toml"
    costs.write_text('name = "our-site"\nbase = "legacy"\nsubmit_delay = 10\n')
    result = CliRunner().invoke(
        main,
        ["simulate", trace, "--policies", "slurm", "--costs", str(costs), "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "cost set our-site v1" in result.output
    assert json.loads(out.read_text())["results"][0]["avg_jct_s"] == pytest.approx(legacy_jct + 10)

    result = CliRunner().invoke(
        main, ["simulate", trace, "--policies", "slurm", "--checkpoint", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "the --checkpoint option" in result.output


def test_sgpu_simulate_refuses_a_bad_cost_set_or_file_in_one_line(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path))
    result = CliRunner().invoke(main, ["simulate", trace, "--costs", "slurm-22.05-lb"])
    assert result.exit_code == 2
    assert "unknown cost set 'slurm-22.05-lb'" in result.output
    bad = tmp_path / "bad.toml"
    bad.write_text("startup = -5\n")
    result = CliRunner().invoke(main, ["simulate", trace, "--costs", str(bad)])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0
    assert "bad.toml: startup must be a number of seconds >= 0, not -5" in result.output
    result = CliRunner().invoke(main, ["simulate", trace, "--costs", str(tmp_path / "no.toml")])
    assert result.exit_code == 1 and "cannot read cost file" in result.output
    result = CliRunner().invoke(main, ["simulate", trace, "--startup", "-1"])
    assert result.exit_code == 2 and "startup must be a number of seconds >= 0" in result.output

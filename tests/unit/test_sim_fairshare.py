"""Slurm's Fair Tree priority in SimSlurm (sim.fairshare), checked against what the 22.05
site lab's ``sshare -l`` printed and on small traces worked out by hand."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.lab.cluster import site
from slurmgpu.model import JobState
from slurmgpu.sim.fairshare import (
    FairShareConfig,
    FairShareError,
    FairTree,
    fair_tree_factors,
    parse_fairshare,
)
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.workload import RigidJob, TraceJob

ACCOUNTS = {"physics": 50, "biology": 30, "chemistry": 20}
MEMBERS = {
    "physics": [("sgpu-u1", 1), ("sgpu-u2", 1), ("sgpu-u3", 1)],
    "biology": [("sgpu-u4", 1), ("sgpu-u5", 1), ("sgpu-u6", 1)],
    "chemistry": [("sgpu-u7", 1), ("sgpu-u8", 1)],
}


def test_fair_tree_factors_match_the_site_labs_sshare() -> None:
    # 22.05 site lab, two minutes into a replay: sshare -l's NormUsage per user and the
    # FairShare column it printed beside them (10 users: root and sgpu-daemon under root)
    usage = {"sgpu-u1": 0.3221, "sgpu-u2": 0.2548, "sgpu-u5": 0.2596, "sgpu-u7": 0.0096}
    usage["sgpu-u8"] = 0.1538
    factors = fair_tree_factors(ACCOUNTS, MEMBERS, ["root", "sgpu-daemon"], usage)
    assert factors == pytest.approx(
        {
            "root": 1.0,
            "sgpu-daemon": 1.0,
            "sgpu-u7": 0.8,
            "sgpu-u8": 0.7,
            "sgpu-u4": 0.6,  # tied with u6 (no usage): one rank, the next one skipped
            "sgpu-u6": 0.6,
            "sgpu-u5": 0.4,
            "sgpu-u3": 0.3,
            "sgpu-u2": 0.2,
            "sgpu-u1": 0.1,
        }
    )


def test_an_account_over_its_share_ranks_all_its_users_below() -> None:
    # physics used little but has 50 shares; chemistry used the same with 20: every
    # physics user outranks every chemistry user, however light, as Fair Tree does
    usage = {"sgpu-u1": 10.0, "sgpu-u7": 10.0}
    factors = fair_tree_factors(ACCOUNTS, MEMBERS, [], usage)
    physics = [factors[u] for u, _ in MEMBERS["physics"]]
    chemistry = [factors[u] for u, _ in MEMBERS["chemistry"]]
    assert min(physics) > max(chemistry)
    assert all(0 < f <= 1 for f in factors.values())


def test_with_no_usage_every_user_ties() -> None:
    # fair_tree.c: root's users and the accounts all have infinite level fair share; the
    # first user under an account tied with its previous sibling keeps the rank, so all
    # share the top one (the 22.05 lab started its first jobs in submit order)
    factors = fair_tree_factors(ACCOUNTS, MEMBERS, ["root", "sgpu-daemon"], {})
    assert set(factors.values()) == {1.0}


def test_a_user_under_a_tied_account_keeps_the_previous_rank() -> None:
    # a and b tie (equal shares, equal usage). Under a: a2 (no usage) ranks 3, a1 2.
    # b is tied with a, so b1, its first user, keeps rank 2; none is merged (Slurm's
    # _count_tied_accounts stops at the first account).
    members = {"a": [("a1", 1), ("a2", 1)], "b": [("b1", 1)]}
    factors = fair_tree_factors({"a": 1, "b": 1}, members, [], {"a1": 1.0, "b1": 1.0})
    assert factors == pytest.approx({"a2": 1.0, "a1": 2 / 3, "b1": 2 / 3})


def test_an_account_without_shares_ranks_last_even_unused() -> None:
    members = {"a": [("a1", 1)], "z": [("z1", 1)]}
    factors = fair_tree_factors({"a": 1, "z": 0}, members, [], {"a1": 5.0})
    assert factors == pytest.approx({"a1": 1.0, "z1": 0.5})


def job(name: str, user: str, run_s: float, at: float, gpus: int = 1) -> TraceJob:
    return TraceJob(
        submit_s=at,
        name=name,
        user=user,
        model=RigidJob(run_s, gpus),
        gpus=gpus,
        time_limit_s=2 * run_s,
    )


CONFIG = FairShareConfig(
    accounts={"a": 1, "b": 1}, users={"heavy": "a", "light": "b"}, calc_period_s=60.0
)


def run_three(sim: SimSlurm) -> dict[str, float]:
    """heavy runs 600 s from t=0; at t=100 heavy and then light queue 100 s each: when
    each started."""
    sim.submit_job(job("h0", "heavy", 600, 0))
    sim.submit_job(job("h1", "heavy", 100, 100))
    sim.submit_job(job("l1", "light", 100, 101))
    sim.run_until(10_000)
    return {j.name: j.first_start_s for j in sim.all_jobs.values()}


def test_the_light_users_job_starts_first_after_a_calculation() -> None:
    # one GPU. heavy runs 600 s from t=0; at t=100 heavy and then light queue a job
    # each. Submit order would start heavy's; fair share has charged heavy's usage by
    # then (calculated each 60 s), so light's goes first.
    sim = SimSlurm(1, 1)
    sim.priority = FairTree(sim, CONFIG)
    starts = run_three(sim)
    assert starts["h0"] == 0
    assert starts["l1"] == 600
    assert starts["h1"] == 700


def test_without_fair_share_submit_order_decides() -> None:
    sim = SimSlurm(1, 1)
    starts = run_three(sim)
    assert (starts["h1"], starts["l1"]) == (600, 700)


def test_pending_jobs_list_their_fair_share_priority_as_squeue_does() -> None:
    """The policies order the queue by the priority Slurm lists (policy.malleable
    queue_order): the simulator lists the one its Fair Tree ranks by, and none under
    submit order (priority/basic gives the policies no number to read either)."""
    sim = SimSlurm(1, 1)
    tree = sim.priority = FairTree(sim, CONFIG)
    sim.submit_job(job("h0", "heavy", 600, 0))
    sim.submit_job(job("h1", "heavy", 100, 100))
    sim.submit_job(job("l1", "light", 100, 101))
    sim.run_until(200)
    pending = {j.name: j for j in sim.jobs() if j.state is JobState.PENDING}
    assert set(pending) == {"h1", "l1"}
    for name, listed in pending.items():
        sim_job = next(j for j in sim.all_jobs.values() if j.name == name)
        assert listed.priority == int(tree.priority(sim_job, sim.now))
    assert pending["l1"].priority > pending["h1"].priority  # type: ignore[operator]
    plain = SimSlurm(1, 1)
    plain.submit_job(job("h0", "heavy", 600, 0))
    plain.submit_job(job("h1", "heavy", 100, 100))
    plain.run_until(200)
    assert [j.priority for j in plain.jobs()] == [None, None]


def test_usage_left_by_earlier_work_counts_from_the_start() -> None:
    # one GPU held until 100 by h0; at 1 h1 then l1 queue; no calculation before then
    # (period 1,000 s). Without earlier usage they tie and h1 goes first; with heavy's
    # earlier usage in the site's database, l1 does.
    def starts(usage: dict[str, float]) -> dict[str, float]:
        sim = SimSlurm(1, 1)
        sim.priority = FairTree(sim, replace(CONFIG, calc_period_s=1000.0, usage=usage))
        sim.submit_job(job("h0", "heavy", 100, 0))
        sim.run_until(1)
        for name, user in (("h1", "heavy"), ("l1", "light")):
            sim.submit_job(job(name, user, 100, 1))
        sim.run_until(10_000)
        return {j.name: j.first_start_s for j in sim.all_jobs.values()}

    assert starts({})["h1"] == 100
    assert starts({"heavy": 500.0})["l1"] == 100


def test_usage_is_charged_only_at_a_calculation() -> None:
    # the same, but the second jobs come before the first calculation (period 1,000 s):
    # no usage yet, both users tie, and submit order breaks the tie
    config = FairShareConfig(
        accounts={"a": 1, "b": 1}, users={"heavy": "a", "light": "b"}, calc_period_s=1000.0
    )
    sim = SimSlurm(1, 1)
    tree = FairTree(sim, config)
    sim.priority = tree
    starts = run_three(sim)
    assert (starts["h1"], starts["l1"]) == (600, 700)
    assert tree.usage == {}  # no pass has needed a priority since t=700
    h1 = next(j for j in sim.all_jobs.values() if j.name == "h1")
    tree.priority(h1, 1500.0)  # one calculation (t=1000): what ran up to then
    assert tree.usage == pytest.approx({"heavy": 700.0, "light": 100.0})
    tree.priority(h1, 2500.0)  # the next one decays it: nothing ran since
    decay = 0.5 ** (1000 / config.half_life_s)
    assert tree.usage == pytest.approx({"heavy": 700 * decay, "light": 100 * decay})


def test_nice_lowers_a_fair_share_priority_and_is_floored_at_one() -> None:
    sim = SimSlurm(1, 1)
    tree = FairTree(sim, FairShareConfig(accounts={"a": 1}, users={"u": "a"}, base=100.0))
    sim.submit_job(job("x", "u", 10, 0))
    x = next(iter(sim.all_jobs.values()))
    assert tree.priority(x, 0.0) == pytest.approx(100.0 + 100000.0)
    x.nice = 10**9
    assert tree.priority(x, 0.0) == 1.0


def test_simulate_takes_the_sites_fair_share_from_its_options() -> None:
    trace = [
        job("h0", "heavy", 600, 0),
        job("h1", "heavy", 100, 100),
        job("l1", "light", 100, 101),
    ]
    shape = ClusterShape(1, 1)
    fifo = simulate(trace, shape, "slurm", SimOptions())
    fair = simulate(trace, shape, "slurm", SimOptions(fairshare=CONFIG))
    start = {j.name: j.first_start_s for j in fair.jobs}
    assert start["l1"] < start["h1"]
    assert {j.name: j.first_start_s for j in fifo.jobs}["h1"] < 700
    assert not math.isnan(start["h1"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"calc_period_s": 0.0}, "calc_period_s"),
        ({"half_life_s": -1.0}, "half_life_s"),
        ({"billing": "tres"}, "billing"),
        ({"accounts": {"a": -1}}, "shares"),
        ({"usage": {"u": -5.0}}, "usage must be numbers >= 0"),
    ],
)
def test_a_bad_config_is_refused_in_one_line(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"accounts": {"a": 1}, "users": {}}
    with pytest.raises(ValueError, match=message):
        FairShareConfig(**{**base, **kwargs})  # type: ignore[arg-type]


# ---- a site's fair share from a file, and sgpu simulate --fairshare

SITE = """
calc_period = 60
half_life = 86400
weight = 1000
base = 10
billing = "gpu"
root_users = ["root"]
[accounts]
a = 2
b = 1
[users]
heavy = "a"
light = "b"
"""


def test_the_site_labs_fair_share_is_what_its_slurm_conf_and_sacctmgr_set() -> None:
    config = parse_fairshare(site.fairshare_toml(), "the site lab")
    assert config.accounts == site.ACCOUNTS
    assert config.users == {u.name: u.account for u in site.USERS}
    assert config.calc_period_s == 60 and config.half_life_s == 86400
    assert f"PriorityWeightFairshare={config.weight_fairshare:g}" in site.policy_lines()
    # every job's partition and QOS terms (PriorityWeightPartition x 1, QOS x 1)
    assert config.base == site.BASE_PRIORITY + site.WEIGHT_QOS


def test_parse_fairshare_reads_every_setting() -> None:
    config = parse_fairshare(SITE, "site.toml")
    assert config.accounts == {"a": 2, "b": 1}
    assert config.users == {"heavy": "a", "light": "b"}
    assert config.root_users == ("root",)
    assert (config.calc_period_s, config.half_life_s) == (60.0, 86400.0)
    assert (config.weight_fairshare, config.base, config.billing) == (1000.0, 10.0, "gpu")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("calc_period = [", "site.toml: not TOML"),
        ("priority = 3", "site.toml: unknown key priority"),
        ("weight = 'x'", "site.toml: weight must be a number"),
        ("[accounts]\na = 'many'", "site.toml: [accounts] must map"),
        ("[users]\nu = 3", "site.toml: [users] must map"),
        ("root_users = 'root'", "site.toml: root_users must be a list"),
        ("calc_period = 0", "site.toml: calc_period_s must be > 0"),
        ("billing = 'tres'", "site.toml: billing must be"),
    ],
)
def test_parse_fairshare_refuses_a_bad_file_in_one_line(text: str, message: str) -> None:
    with pytest.raises(FairShareError, match=message.replace("[", r"\[")) as info:
        parse_fairshare(text, "site.toml")
    assert "\n" not in str(info.value)


def test_sgpu_simulate_orders_its_queue_by_the_sites_fair_share(tmp_path: Path) -> None:
    # one GPU; heavy's 600 s job first, then heavy and light queue one each: with fair
    # share (calculated each 60 s) light's starts first, and the table says why
    trace = tmp_path / "t.csv"
    trace.write_text(
        "submit_s,duration_s,gpus,user\n0,600,1,heavy\n100,100,1,heavy\n101,100,1,light\n"
    )
    site = tmp_path / "site.toml"
    site.write_text(SITE)
    runs = {}
    for extra in ([], ["--fairshare", str(site)]):
        out = tmp_path / "cmp.json"
        result = CliRunner().invoke(
            main,
            [
                "simulate",
                str(trace),
                "--cluster",
                "1x1",
                "--policies",
                "slurm",
                "--costs",
                "legacy",
                "--json",
                str(out),
                *extra,
            ],
        )
        assert result.exit_code == 0, result.output
        runs[bool(extra)] = json.loads(out.read_text())["results"][0]["avg_jct_s"]
        assert ("queue order: fair share from" in result.output) is bool(extra)
    # submit order: 600, 600 - 100 + 100 = 600, 700 - 101 + 100 = 699; fair share swaps
    # the last two: light 600 - 101 + 100 = 599, heavy 800 - 100 = 700
    assert runs[False] == pytest.approx((600 + 600 + 699) / 3)
    assert runs[True] == pytest.approx((600 + 599 + 700) / 3)


def test_sgpu_simulate_refuses_a_bad_fair_share_file_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,duration_s,gpus\n0,60,1\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("weight = 'x'\n")
    result = CliRunner().invoke(main, ["simulate", str(trace), "--fairshare", str(bad)])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "weight must be a number" in result.output
    result = CliRunner().invoke(
        main, ["simulate", str(trace), "--fairshare", str(tmp_path / "no.toml")]
    )
    assert result.exit_code == 1 and "cannot read fair-share file" in result.output


def test_the_first_calculation_can_fall_where_the_sites_did() -> None:
    # heavy's 600 s job from t=0, then heavy and light queue at t=100: with the first
    # calculation at t=50 (slurmctld started before the trace) heavy's 50 s are charged
    # in time for the queue at t=600, so light's goes first; with none before t=600...
    early = FairShareConfig(
        accounts={"a": 1, "b": 1},
        users={"heavy": "a", "light": "b"},
        calc_period_s=1000.0,
        first_calc_s=50.0,
    )
    sim = SimSlurm(1, 1)
    sim.priority = FairTree(sim, early)
    starts = run_three(sim)
    assert (starts["l1"], starts["h1"]) == (600, 700)
    # ... (the first a period after the first priority asked for: t=1,000) submit order
    late = replace(early, first_calc_s=None)
    sim = SimSlurm(1, 1)
    sim.priority = FairTree(sim, late)
    starts = run_three(sim)
    assert (starts["h1"], starts["l1"]) == (600, 700)


def test_sgpu_simulate_runs_slurms_own_passes_when_asked(tmp_path: Path) -> None:
    # one 4-GPU node: a 4-GPU job blocked behind a running 2-GPU one; a short 1-GPU job
    # that fits before it. EASY backfills it at once; Slurm's main pass stops at the
    # blocked job, and only the next backfill pass (every 30 s) starts it
    trace = tmp_path / "t.csv"
    trace.write_text(
        "submit_s,duration_s,gpus,time_limit_s\n0,600,2,600\n10,600,4,600\n20,200,1,300\n"
    )
    waits = {}
    for scheduler in ("easy", "slurm"):
        out = tmp_path / f"{scheduler}.json"
        result = CliRunner().invoke(
            main,
            [
                "simulate",
                str(trace),
                "--cluster",
                "1x4",
                "--policies",
                "slurm",
                "--costs",
                "legacy",
                "--scheduler",
                scheduler,
                "--json",
                str(out),
            ],
        )
        assert result.exit_code == 0, result.output
        assert ("scheduler: Slurm's main pass" in result.output) is (scheduler == "slurm")
        waits[scheduler] = json.loads(out.read_text())["results"][0]["avg_jct_s"]
    assert waits["slurm"] > waits["easy"]

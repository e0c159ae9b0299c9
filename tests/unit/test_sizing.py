"""One sizing rule (policy/sizing.py): rightsizing, the job_submit.lua export and ``sgpu eff``
suggest the same size for the same usage."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.config import parse_settings
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.recommend import recommendations
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.policy.sizing import (
    SizingRules,
    ceil_whole,
    cores_needed,
    gpus_needed,
    memory_mib,
    round_up,
    time_limit_s,
)
from slurmgpu.report.eff import EffThresholds, job_efficiency
from slurmgpu.report.eff_advice import notes
from slurmgpu.slurm.sbatch import mem_size
from slurmgpu.slurm.update import update_fields
from slurmgpu.units import format_time_limit
from tests.hypothesis_profiles import examples
from tests.unit.eff_records import ended, host, make_job
from tests.unit.eff_records import gpu as gpu_usage
from tests.unit.policy_builders import pending_job, record, snapshot

DAY = timedelta(days=1)


def test_time_limit_is_headroom_times_run_time_at_least_the_minimum_in_5_minute_steps() -> None:
    assert time_limit_s(3600) == 4800  # 1.3 * 3600 = 4680 s -> 16 * 300 s
    assert time_limit_s(3300 / 1.3) == 3300  # 1.3 * that is 3300.0000000000005: no step more
    assert time_limit_s(3693) == 5100  # 4800.9 s: one step more
    assert time_limit_s(60) == 900  # never below 15 min
    assert time_limit_s(3600, headroom=1.5, step_s=600, minimum_s=0) == 5400


def test_memory_is_ceil_of_headroom_times_peak_in_256_mib_steps() -> None:
    assert memory_mib(5120) == 6144  # 1.2 * 5120 is 6144 exactly, not a step more
    assert memory_mib(8192) == 9984  # ceil(9830.4) = 9831 -> 39 * 256
    assert memory_mib(0) == 256  # at least one step
    assert memory_mib(1000, headroom=1.0, step_mib=1024) == 1024


def test_cores_and_gpus_are_never_fewer_than_one() -> None:
    assert cores_needed(2.5) == 3 and cores_needed(5.0) == 6 and cores_needed(0.0) == 1
    assert gpus_needed(0) == 1 and gpus_needed(3) == 3
    assert round_up(601, 300) == 900 and round_up(600, 300) == 600


def _ceil_rounded(x: float) -> int:
    """The rule ceil_whole states: ceil of x rounded to 6 decimals."""
    return math.ceil(round(x, 6))


def test_ceil_whole_ignores_noise_below_a_millionth_above_a_whole_number() -> None:
    assert ceil_whole(6.0000004) == 6  # noise above 6: ignored
    assert ceil_whole(6.0000011) == 7  # more than noise: the next whole number
    assert ceil_whole(5.9999996) == 6 and ceil_whole(-2.5) == -2 and ceil_whole(7) == 7
    # on and around the boundary, where ceil_whole leaves the value to round()
    for whole in (-3, 0, 1, 17, 4096, 10**9):
        for offset in (0.0, 1e-7, 4.9e-7, 5e-7, 5.1e-7, 9.99e-7, 1e-6, 1.01e-6, -1e-7, -1e-6):
            x = whole + offset
            assert ceil_whole(x) == _ceil_rounded(x), x


@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
@settings(max_examples=examples(300), deadline=None)
def test_ceil_whole_is_ceil_of_the_value_rounded_to_6_decimals(x: float) -> None:
    assert ceil_whole(x) == _ceil_rounded(x)
    assert isinstance(ceil_whole(x), int)


@given(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(min_value=-2e-6, max_value=2e-6, allow_nan=False),
)
@settings(max_examples=examples(300), deadline=None)
def test_ceil_whole_near_whole_numbers_matches_the_rounded_rule(whole: int, noise: float) -> None:
    x = whole + noise
    assert ceil_whole(x) == _ceil_rounded(x)


def test_rightsize_colocate_and_eff_take_one_sizing_rules_object() -> None:
    """The knobs live in SizingRules alone: the policies and eff hold one, the site's."""
    assert RightsizePolicy().sizing == ColocatePolicy().sizing == EffThresholds().sizing
    assert EffThresholds().sizing == SizingRules()
    site = parse_settings(
        '[policy.rightsize]\ntime_round = "10m"\n[policy.colocate]\nmax_jobs_per_gpu = 4\n'
    ).policy
    th = EffThresholds.for_site(site.sizing, site.colocate, 4)
    assert th.sizing is site.sizing and th.colocate is site.colocate
    assert (th.sizing.time_round, th.sizing.max_jobs_per_gpu, th.shards_per_gpu) == (
        timedelta(minutes=10),
        4,
        4,
    )
    assert EffThresholds.for_site(site.sizing, site.colocate, None).shards_per_gpu == 16


def test_eff_sizes_by_the_sites_sizing_rules() -> None:
    site = SizingRules(time_round=timedelta(minutes=10), memory_round_mib=1024)
    done = make_job(elapsed=timedelta(seconds=7000), time_limit=30 * DAY, memory_mib=1_000_000)
    report = job_efficiency(
        done,
        [gpu_usage(0, 70.0)],
        [host("gpu1", 380.0, 4, memory_mib=8192.0)],
        ended(done),
        thresholds=EffThresholds(sizing=site),
    )
    options = {n.kind: n.option for n in notes(report)}
    # 1.3 * 7000 s = 9100 s -> 16 * 600 s; ceil(1.2 * 8192) = 9831 MiB -> 10 * 1024 MiB
    assert options["time"] == "--time=02:40:00" and options["memory"] == "--mem=10G"
    defaults = {n.kind: n.option for n in notes(replace(report, thresholds=EffThresholds()))}
    assert defaults["time"] == "--time=02:35:00" and defaults["memory"] == "--mem=9984M"


def _three_sizes(run_s: int, peak_mib: int, busy_cores: float) -> dict[str, dict[str, object]]:
    """What rightsizing, the export and ``sgpu eff`` suggest for runs that ran ``run_s``,
    peaked at ``peak_mib`` on their node, kept ``busy_cores`` busy and one of two GPUs."""
    runs = [
        record(
            run_time=timedelta(seconds=run_s),
            gpus_requested=2,
            gpus_used=1,
            cpus=64,
            peak_memory_mib=float(peak_mib),
            peak_node_memory_mib=float(peak_mib),
            mean_cpu_pct=busy_cores * 100.0,
        )
        for _ in range(5)
    ]
    s = RightsizeSettings(apply_to_all=True)
    policy = RightsizePolicy(s)
    job = pending_job(
        time_limit=30 * DAY, cpus=64, memory_mib=1_000_000, gpus_per_node=2, comment=""
    )
    snap = snapshot([job], history=runs)
    (action,) = policy.propose(snap)
    by_key, _ = recommendations(policy.priors(snap.history), s, policy.sizing)
    rec = by_key["alice|train|gpu"]

    done = make_job(
        elapsed=timedelta(seconds=run_s),
        time_limit=30 * DAY,
        cpus=64,
        memory_mib=1_000_000,
        gpus={"gpu1": (0, 1)},
    )
    report = job_efficiency(
        done,
        [gpu_usage(0, 70.0), gpu_usage(1, 0.0)],
        [host("gpu1", busy_cores * 100.0, 64, memory_mib=float(peak_mib))],
        ended(done),
    )
    eff = {n.kind: n.option for n in notes(report)}
    fields = update_fields(action.intents, "")  # as the daemon spells them for Slurm
    return {
        "rightsize": {
            "time": fields["TimeLimit"],
            "mem": mem_size(int(fields["MinMemoryNode"])),
            "cpus": int(fields["NumCPUs"]),
            "gpus": fields["TresPerNode"].rpartition(":")[2],
        },
        "recommend": {
            "time": format_time_limit(timedelta(minutes=int(rec["time_limit_min"] or 0))),
            "mem": mem_size(int(rec["mem_mib"] or 0)),
            "cpus": None,  # no CPU figure in the export (see policy.sizing)
            "gpus": str(rec["gpus"]),
        },
        "eff": {
            "time": (eff["time"] or "").removeprefix("--time="),
            "mem": (eff["memory"] or "").removeprefix("--mem="),
            "cpus": int((eff["cpu"] or "").removeprefix("-c ")),
            "gpus": (eff["gpus"] or "").removeprefix("--gpus="),
        },
    }


def test_rightsize_recommend_and_eff_suggest_the_same_size() -> None:
    got = _three_sizes(run_s=7200, peak_mib=8192, busy_cores=20.0)
    # 1.3 * 2 h = 9360 s -> 9600 s; ceil(1.2 * 8192) = 9831 -> 9984 MiB; 1.2 * 20 cores = 24;
    # one GPU busy of two. Before issue 21 eff said --time=02:45:00 (15 min steps) and
    # --mem=10G (whole GiB) for the same runs.
    expected = {"time": "02:40:00", "mem": "9984M", "cpus": 24, "gpus": "1"}
    assert got["rightsize"] == expected
    assert got["eff"] == expected
    assert got["recommend"] == {**expected, "cpus": None}


@given(
    run_s=st.integers(min_value=901, max_value=10 * 86400),
    peak_mib=st.integers(min_value=1, max_value=400_000),
    busy_cores=st.integers(min_value=11, max_value=40).map(lambda c: c + 0.5),
)
@settings(max_examples=examples(60), deadline=None)
def test_the_three_agree_for_any_usage(run_s: int, peak_mib: int, busy_cores: float) -> None:
    got = _three_sizes(run_s, peak_mib, busy_cores)
    rightsize = got["rightsize"]
    assert got["eff"] == rightsize
    assert got["recommend"] == {**rightsize, "cpus": None}


@pytest.mark.parametrize("round_s", [60, 90, 300, 900])
def test_the_export_never_rounds_a_limit_below_what_rightsizing_sets(round_s: int) -> None:
    # a time_round that is not whole minutes: the export's minutes are rounded up
    s, rules = RightsizeSettings(), SizingRules(time_round=timedelta(seconds=round_s))
    runs = [record(run_time=timedelta(seconds=1000), gpus_used=4) for _ in range(3)]
    policy = RightsizePolicy(s, sizing=rules)
    by_key, _ = recommendations(policy.priors(tuple(runs)), s, rules)
    minutes = by_key["alice|train|gpu"]["time_limit_min"]
    assert minutes is not None
    seconds = time_limit_s(1000, rules.time_headroom, round_s, rules.min_time_limit.total_seconds())
    assert minutes * 60 >= seconds > (minutes - 1) * 60


def test_the_export_widens_the_margin_after_a_timeout_as_rightsizing_does() -> None:
    s = RightsizeSettings(apply_to_all=True, memory=False, cpus=False, gpus=False)
    runs = [record(run_time=timedelta(hours=1)) for _ in range(3)]
    killed = record(run_time=timedelta(minutes=78), state="TIMEOUT")
    job = pending_job(time_limit=30 * DAY)
    for history, limit in (((*runs,), "01:20:00"), ((*runs, killed), "02:35:00")):
        policy = RightsizePolicy(s)
        snap = snapshot([job], history=history)
        (action,) = policy.propose(snap)
        assert update_fields(action.intents, "")["TimeLimit"] == limit
        by_key, _ = recommendations(policy.priors(snap.history), s, policy.sizing)
        # 80 min; 78 min * 1.3 * 1.5 = 152.1 -> 155 min
        hours, minutes, _ = limit.split(":")
        assert by_key["alice|train|gpu"]["time_limit_min"] == int(hours) * 60 + int(minutes)


def test_no_time_limit_anywhere_from_runs_slurm_restarted() -> None:
    """A resized, preempted or requeued job's run time is its last run's only (Slurm's
    start time is the last start): rightsizing, the export and ``sgpu eff`` set no time
    limit from it, and still size memory from it. In the simulator such limits were the
    nine timeouts of the 'all' set at load 2.0."""
    s = RightsizeSettings(apply_to_all=True)
    whole = [record(run_time=timedelta(hours=1), peak_node_memory_mib=8192.0) for _ in range(3)]
    resized = [*whole[:2], msgspec.structs.replace(whole[2], restarts=2)]
    job = pending_job(time_limit=30 * DAY, memory_mib=256 * 1024)
    limits = {}
    for label, runs in {"whole": whole, "resized": resized}.items():
        policy = RightsizePolicy(s)
        snap = snapshot([job], history=runs)
        (action,) = policy.propose(snap)
        fields = update_fields(action.intents, "")
        assert fields["MinMemoryNode"] == "9984"  # memory is still sized from them
        by_key, _ = recommendations(policy.priors(snap.history), s, policy.sizing)
        limits[label] = (fields.get("TimeLimit"), by_key["alice|train|gpu"]["time_limit_min"])
    assert limits == {"whole": ("01:20:00", 80), "resized": (None, None)}

    done = make_job(elapsed=timedelta(hours=1), time_limit=30 * DAY)
    for restarts, expected in ((0, {"time"}), (1, set())):
        ran = replace(done, restart_count=restarts)
        report = job_efficiency(ran, [gpu_usage(0, 70.0)], [host("gpu1", 380.0, 4)], ended(ran))
        assert {n.kind for n in notes(report)} & {"time"} == expected

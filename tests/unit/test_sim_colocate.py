"""Co-location in the simulator: the daemon's colocate policy packs, SimSlurm shares and slows.

The expected times are worked out by hand from the interference model's coefficients
(slurmgpu/policy/interference.py): two 20 % jobs on one GPU each run at

    speed(0.2, 0.2) = 0.701555 - 0.093307 * 0.2 - 0.494136 * 0.2 * 0.2 + 0.326203 * 1
                    = 0.98933116

so a 3,600 s job takes 3600 / 0.98933116 = 3,638.82 s next to its partner.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.sim.loaders import TraceError, detect_format, load_trace
from slurmgpu.sim.lucid import (
    LucidError,
    LucidWorkload,
    config_name,
    load_lucid_pairs,
    lucid_workload,
    measured_interference,
    model_interference,
    parse_lucid_pairs,
    solo_profiles,
)
from slurmgpu.sim.metrics import summarise
from slurmgpu.sim.run import ClusterShape, SimOptions, SimRun, simulate
from slurmgpu.sim.slurm import SimJob
from slurmgpu.sim.workload import RigidJob, TraceJob
from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
LUCID = ROOT.parent / "shared" / "data" / "lucid" / "colocate_info.csv"
SPEED_20_20 = 0.98933116
SHARE_4G = "sgpu:shareable sgpu:gpu-mem=4096"


def job(
    name: str, at: float, run_s: float, util: float, memory_mib: float, comment: str = ""
) -> TraceJob:
    return TraceJob(
        submit_s=at,
        name=name,
        user="bob" if name.startswith("light") else "alice",
        model=RigidJob(run_s, 1, util_pct=util, memory_mib=memory_mib),
        gpus=1,
        gpus_per_node=1,  # --gres=gpu:1: what co-location may turn into shards
        comment=comment,
    )


def run(trace: list[TraceJob], policy_set: str = "colocate") -> tuple[SimRun, dict[str, SimJob]]:
    result = simulate(
        trace,
        ClusterShape(1, 1, 4),
        policy_set,
        SimOptions(interference=model_interference(), record_decisions=True),
    )
    return result, {j.name: j for j in result.all_jobs}


def one_gpu_trace(light_memory_mib: float = 4096) -> list[TraceJob]:
    """One GPU: three heavy runs make history, a heavy blocker, then two light jobs and a
    heavy one that all declare themselves shareable while they wait behind it."""
    return [
        *(job(f"heavy{i}", 0.0, 100.0, 90.0, 4096) for i in (1, 2, 3)),
        job("blocker", 1000.0, 2000.0, 90.0, 4096),
        job("light-a", 1001.0, 3600.0, 20.0, light_memory_mib, SHARE_4G),
        job("light-b", 1001.5, 3600.0, 20.0, light_memory_mib, SHARE_4G),
        job("heavy4", 1002.0, 100.0, 90.0, 4096, SHARE_4G),
    ]


def test_two_light_jobs_share_one_gpu_slowed_by_the_model_and_the_heavy_one_never() -> None:
    trace = one_gpu_trace()
    # History of the heavy job's own name, so its "shareable" is overruled by 90 % util.
    for t in trace[:3]:
        t.name = "heavy4"
    result, jobs = run(trace)
    a, b, heavy = jobs["light-a"], jobs["light-b"], jobs["heavy4"]
    packed = {d.job_id: dict(d.fields) for d in result.decisions}
    assert packed == {
        a.job_id: {"TresPerNode": "gres:shard:2"},
        b.job_id: {"TresPerNode": "gres:shard:2"},
    }
    # Both start when the blocker ends, on the same GPU, 2 of its 4 shards each.
    assert a.first_start_s == b.first_start_s == pytest.approx(3000.0)
    assert a.shard_alloc == (0, 0, 2) and b.shard_alloc == (0, 0, 2)
    assert a.end_s == pytest.approx(3000.0 + 3600.0 / SPEED_20_20, abs=0.01)  # 6,638.82
    assert b.end_s == pytest.approx(a.end_s, abs=0.01)
    # Each held half a GPU and kept it 20 % busy for 3,600 s of its own work.
    (run_a,) = a.runs
    assert run_a.gpus == 0.5
    assert run_a.used_gpu_s == pytest.approx(0.20 * 3600.0)
    # The heavy job ran alone on the whole GPU, after them.
    assert heavy.shard_alloc is None and heavy.placement == (1,)
    assert heavy.first_start_s == pytest.approx(a.end_s, abs=0.01)
    # Without sharing the same trace runs them one after another at full speed.
    _, plain = run(trace, "slurm")
    assert plain["light-a"].end_s == pytest.approx(3000.0 + 3600.0)
    assert plain["light-b"].end_s == pytest.approx(3000.0 + 2 * 3600.0)


def test_a_job_that_uses_more_memory_than_it_declared_is_separated_onto_the_whole_gpu() -> None:
    # Declared 4 GiB, really 15 GiB each: 30 of 32 GiB on the GPU, past 90 %.
    result, jobs = run(one_gpu_trace(light_memory_mib=15 * 1024))
    a, b = jobs["light-a"], jobs["light-b"]
    kinds = Counter((d.kind, d.job_id, d.outcome) for d in result.decisions)
    assert kinds[("update", a.job_id, "done")] == kinds[("update", b.job_id, "done")] == 1
    # The newer sharer (b: same start, higher id) goes back to a whole GPU's 4 shards.
    assert kinds[("requeue", b.job_id, "done")] == 1
    assert ("requeue", a.job_id, "done") not in kinds
    assert b.restarts == 1 and "sgpu:separated" in b.comment
    assert b.runs[0].gpus == 0.5 and b.runs[-1].gpus == 1.0
    # Judged once it has three samples (min_samples, 30 s apart): a co-located job gets
    # the daemon's 60 s cycles until then, so at the first cycle past 3,090 s: 3,120 s
    # (the 3,060 s cycle saw two samples).
    assert b.runs[0].end_s == pytest.approx(3000.0 + 120.0)
    assert b.runs[-1].start_s >= a.end_s  # it waited for the GPU to be free
    assert a.state.value == b.state.value == "COMPLETED"


def _bench_interference() -> ModuleType:
    return load_script("bench_interference", ROOT / "bench" / "interference.py")


@pytest.fixture(scope="module")
def lucid() -> list[object]:
    if not LUCID.is_file():
        pytest.skip(f"Lucid pairs not found at {LUCID} (shared/data, see ATTRIBUTION.md)")
    return list(load_lucid_pairs(LUCID))


def test_solo_profiles_match_numpys_least_squares(lucid: list[object]) -> None:
    pytest.importorskip("numpy", reason="numpy (dev extra) gives the reference solution")
    bench = _bench_interference()
    reference = bench.solo_profiles(bench.load_pairs(LUCID))
    ours = solo_profiles(load_lucid_pairs(LUCID))
    assert set(ours) == set(reference) and len(ours) == 56
    for config, (util, memory) in reference.items():
        assert ours[config].util_pct == pytest.approx(util, abs=1e-6)
        assert ours[config].memory_mib == pytest.approx(memory, abs=1e-6)


def test_lucid_workload_is_seeded_one_gpu_and_hints_only_light_jobs(lucid: list[object]) -> None:
    pairs = load_lucid_pairs(LUCID)
    profiles = solo_profiles(pairs)
    shape = LucidWorkload(jobs=300, load=1.2)
    trace = lucid_workload(profiles, 16, seed=3, shape=shape)
    again = lucid_workload(profiles, 16, seed=3, shape=shape)
    other = lucid_workload(profiles, 16, seed=4, shape=shape)
    assert [(j.submit_s, j.name, j.user, j.comment) for j in trace] == [
        (j.submit_s, j.name, j.user, j.comment) for j in again
    ]
    assert [j.name for j in trace] != [j.name for j in other]
    by_name = {config_name(c): p for c, p in profiles.items()}
    assert all(j.gpus == 1 and j.gpus_per_node == 1 for j in trace)
    for j in trace:
        solo = by_name[j.name]
        assert (j.model.util_pct, j.model.memory_mib) == (solo.util_pct, solo.memory_mib)
        if j.comment:
            assert solo.util_pct <= 40.0 and "sgpu:shareable" in j.comment
    # Each user runs at most 3 configurations, so history repeats per (user, name).
    per_user = Counter(j.user for j in {(j.user, j.name): j for j in trace}.values())
    assert max(per_user.values()) <= 3
    # Offered demand: run time alone per second of arrivals, about 1.2 x 16 GPUs.
    demand = sum(j.model.work for j in trace) / trace[-1].submit_s
    assert 0.8 * 1.2 * 16 < demand < 1.25 * 1.2 * 16


def test_measured_interference_uses_lucids_speeds_and_the_model_elsewhere(
    lucid: list[object],
) -> None:
    pairs = load_lucid_pairs(LUCID)
    profiles = solo_profiles(pairs)
    slow = measured_interference(pairs, profiles)
    p = next(p for p in pairs if p.a != p.b)
    both = [q for q in pairs if {q.a, q.b} == {p.a, p.b}]
    speed_a = sum(q.speed_a if q.a == p.a else q.speed_b for q in both) / len(both)
    pa, pb = profiles[p.a], profiles[p.b]
    got_a, _ = slow(pa.util_pct, pa.memory_mib, pb.util_pct, pb.memory_mib)
    assert got_a == pytest.approx(1.0 / min(1.0, speed_a))
    # A profile Lucid never measured: the interference model's prediction.
    assert slow(20.0, 1.0, 20.0, 1.0) == pytest.approx((1 / SPEED_20_20, 1 / SPEED_20_20))


def test_a_bad_lucid_file_is_one_clear_error() -> None:
    with pytest.raises(LucidError, match=r"line 1: not Lucid's colocate_info\.csv"):
        parse_lucid_pairs("a,b\n1,2\n", "x.csv")
    header = (
        ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,gpu_num2,"
        "batchsize2,amp2,speed2,gpu_util,gmem_util,gmem\n"
    )
    with pytest.raises(LucidError, match=r"x.csv, line 3: speeds, gpu_util and gmem"):
        parse_lucid_pairs(
            header
            + "0,A,D,1,32,0,0.9,B,D,1,32,0,0.8,50,20,4000\n"
            + "1,A,D,1,32,0,fast,B,D,1,32,0,0.8,50,20,4000\n",
            "x.csv",
        )


def test_co_location_raises_used_utilisation_and_lowers_jct_on_a_lucid_trace(
    lucid: list[object],
) -> None:
    pairs = load_lucid_pairs(LUCID)
    profiles = solo_profiles(pairs)
    shape = ClusterShape(2, 4, 4)
    trace = lucid_workload(profiles, shape.gpus, seed=1, shape=LucidWorkload(jobs=200, load=1.3))
    options = SimOptions(interference=measured_interference(pairs, profiles))
    plain = summarise(simulate(trace, shape, "slurm", options))
    shared = summarise(simulate(trace, shape, "colocate", options))
    assert shared.actions > 0
    assert shared.avg_jct_s < plain.avg_jct_s
    assert shared.used_util_pct > plain.used_util_pct
    assert shared.gpu_hours < plain.gpu_hours  # the same work on fewer GPU-hours


def test_sgpu_simulate_draws_the_workload_from_the_lucid_file(
    lucid: list[object], tmp_path: Path
) -> None:
    assert detect_format(LUCID.read_text().splitlines()[0]) == "lucid"
    args = ["simulate", str(LUCID), "--policies", "slurm,colocate", "--cluster", "2x4"]
    out = CliRunner().invoke(main, [*args, "--load", "1.3", "--json", "-"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    runs = {r["policy_set"]: r for r in doc["results"]}
    assert runs["slurm"]["jobs"] == runs["colocate"]["jobs"] == 600
    assert runs["colocate"]["actions"] > 0
    assert runs["colocate"]["avg_jct_s"] < runs["slurm"]["avg_jct_s"]
    assert any("measured pair speeds" in n for n in doc["notes"])
    bad = tmp_path / "pairs.csv"
    bad.write_text(LUCID.read_text().splitlines()[0] + "\n0,A,D,1,32,0,x,B,D,1,32,0,1,5,5,5\n")
    with pytest.raises(TraceError, match=r"pairs\.csv, line 2: speeds, gpu_util and gmem"):
        load_trace(bad, None)
    out = CliRunner().invoke(main, ["simulate", str(bad), "--policies", "slurm"])
    assert out.exit_code == 1 and "line 2: speeds" in out.output

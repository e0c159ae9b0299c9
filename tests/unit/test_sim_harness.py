"""The simulator's harness: same policies as the daemon, loaders, the CLI, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.config import Settings
from slurmgpu.daemon.policy_cycle import build_policy_cycle
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.sim.loaders import TraceError, load_generic_csv, load_philly, load_trace
from slurmgpu.sim.metrics import summarise
from slurmgpu.sim.policysets import POLICY_SETS, SimPolicies, build_engine
from slurmgpu.sim.profiles import load_profiles
from slurmgpu.sim.run import ClusterShape, simulate
from slurmgpu.store import JobStore
from tests.fakes import FakeSlurm
from tests.unit.pollux_data import DATA, needs_data


def test_the_daemon_and_the_simulator_run_the_same_policy_classes(store: JobStore) -> None:
    daemon = build_policy_cycle(Settings(), store, FakeSlurm())
    daemon_classes = {type(p) for p, _ in daemon.engine.policies}
    sim_classes = {type(build(SimPolicies())) for build in POLICY_SETS["all"]}
    assert type(daemon.engine) is PolicyEngine
    assert type(build_engine("rightsize")) is PolicyEngine
    assert daemon_classes <= sim_classes, daemon_classes - sim_classes
    rightsize = build_engine("rightsize").policies[0][0]
    assert type(rightsize) in daemon_classes


def test_a_bad_philly_row_names_its_line() -> None:
    text = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66,1,66,a\n"
    text += "2017-10-09 07:02:00,abc,1,1,a\n"
    with pytest.raises(TraceError, match=r"philly.csv, line 3: duration must be"):
        load_philly(text, "philly.csv")


def test_generic_csv_with_limits_and_a_malleable_range() -> None:
    text = "submit_s,duration_s,gpus,user,time_limit_s,min_gpus,max_gpus\n0,100,2,bob,600,1,4\n"
    (job,) = load_generic_csv(text, "t.csv")
    assert job.user == "bob" and job.time_limit_s == 600 and job.malleable is not None
    bad = "submit_s,duration_s,gpus\n0,100,0\n"
    with pytest.raises(TraceError, match=r"t.csv, line 2: gpus must be a whole number >= 1"):
        load_generic_csv(bad, "t.csv")


def test_sacct_parsable_export_loads_gpu_jobs_and_skips_steps(tmp_path: Path) -> None:
    path = tmp_path / "sacct.txt"
    path.write_text(
        "JobID|User|JobName|Partition|Submit|Start|End|AllocTRES|Timelimit|State\n"
        "10|ann|train|gpu|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T01:01:00|"
        "billing=4,cpu=4,gres/gpu=2,node=1|02:00:00|COMPLETED\n"
        "10.batch|||gpu|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T01:01:00|"
        "cpu=4|02:00:00|COMPLETED\n"
        "11|ann|cpu-only|cpu|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T01:01:00|"
        "cpu=4|02:00:00|COMPLETED\n"
    )
    (job,) = load_trace(path, None)
    assert (job.user, job.name, job.gpus, job.time_limit_s) == ("ann", "train", 2, 7200)
    assert job.model.work == 3600


def test_an_unknown_trace_format_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        load_trace(path, None)


@needs_data
def test_pollux_workload_replays_deterministically_by_seed() -> None:
    profiles = load_profiles(DATA / "profiles")
    path = DATA / "workloads" / "workload-1.csv"
    a = load_trace(path, profiles, seed=3)
    b = load_trace(path, profiles, seed=3)
    c = load_trace(path, profiles, seed=4)
    assert len(a) == 160
    assert [j.time_limit_s for j in a] == [j.time_limit_s for j in b]
    assert [j.time_limit_s for j in a] != [j.time_limit_s for j in c]
    ra = summarise(simulate(a, ClusterShape(16, 4), "slurm"))
    rb = summarise(simulate(b, ClusterShape(16, 4), "slurm"))
    assert ra.avg_jct_s == rb.avg_jct_s and ra.completed == 160


@needs_data
def test_sgpu_simulate_prints_and_writes_the_comparison(tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    html = tmp_path / "cmp.html"
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            str(DATA / "workloads" / "workload-1.csv"),
            "--policies",
            "slurm,qssf,malleable",
            "--json",
            str(out),
            "--html",
            str(html),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "slurm" in result.output and "published avg JCT" in result.output
    doc = json.loads(out.read_text())
    assert [r["policy_set"] for r in doc["results"]][:2] == ["slurm", "qssf"]
    assert doc["published_avg_jct_s"]["tiresias"] == 2474
    page = html.read_text()
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")


def test_sgpu_simulate_refuses_a_bad_cluster_shape(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("submit_s,duration_s,gpus\n0,100,1\n")
    result = CliRunner().invoke(main, ["simulate", str(path), "--cluster", "16by4"])
    assert result.exit_code == 2
    assert "16x4" in result.output


def test_a_sets_settings_reach_its_policy_and_unset_ones_take_the_sets_default() -> None:
    from slurmgpu.policy.base import Mode
    from slurmgpu.policy.settings import ColocateSettings

    mine = ColocateSettings(mode=Mode.ENFORCE, device_memory_mib=16_384)
    ((policy, mode),) = build_engine("colocate", SimPolicies(colocate=mine)).policies
    assert policy.settings is mine and mode is Mode.ENFORCE  # type: ignore[attr-defined]
    ((default, _),) = build_engine("colocate").policies
    assert default.settings.apply_to_all  # type: ignore[attr-defined]
    assert default.settings.convert_gpu_requests == "always"  # type: ignore[attr-defined]

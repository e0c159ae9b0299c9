"""Least attained service in the simulator and the daemon: the same policy, Slurm's Nice."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.config import parse_settings
from slurmgpu.daemon.policy_cycle import build_policy_cycle
from slurmgpu.intent import SetNice
from slurmgpu.model import JobState
from slurmgpu.policy.base import Mode
from slurmgpu.policy.las import AttainedServicePolicy
from slurmgpu.policy.settings import AttainedServiceSettings
from slurmgpu.sim.metrics import summarise
from slurmgpu.sim.policysets import POLICY_SETS, SimPolicies
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.sim.slurm import SimSlurm
from slurmgpu.sim.workload import MalleableRange, RigidJob, TraceJob
from slurmgpu.store import JobStore
from tests.fakes import FakeSlurm
from tests.unit.pollux_data import DATA, needs_data


def _job(submit: float, gpus: int, seconds: float, name: str) -> TraceJob:
    return TraceJob(
        submit_s=submit,
        name=name,
        user=name,
        model=RigidJob(seconds, gpus),
        gpus=gpus,
        time_limit_s=seconds * 3,
        malleable=MalleableRange(1, gpus),
    )


def test_simslurm_starts_a_lower_nice_first() -> None:
    sim = SimSlurm(1, 2)
    hog = sim.submit_job(_job(0, 2, 3600, "hog"))
    sim.run_until(0)
    first = sim.submit_job(_job(0, 2, 60, "first"))
    second = sim.submit_job(_job(0, 2, 60, "second"))
    sim.update_job(first, (SetNice(100),))
    assert sim.job_record(sim.job(first)).nice == 100
    sim.run_until(3601)
    assert sim.job(hog).state is JobState.COMPLETED
    assert sim.job(second).state is JobState.RUNNING  # submitted later, but nice 0
    assert sim.job(first).state is JobState.PENDING


def test_las_preempts_a_long_job_for_a_short_one_through_the_resize_transaction() -> None:
    trace = [_job(0, 4, 4 * 3600, "long"), _job(1800, 2, 600, "short")]
    shape = ClusterShape(1, 4)
    plain = simulate(trace, shape, "slurm")
    # one queue limit at 1 GPU-h: the long job has had 2 GPU-h when the short one comes;
    # shrink off: the long job is preempted whole
    settings = AttainedServiceSettings(
        enabled=True, mode=Mode.ENFORCE, queue_limits=(1.0,), shrink=False
    )
    options = SimOptions(policies=SimPolicies(las=settings))
    las = simulate(trace, shape, "las", options)
    jct = {r.policy_set: {j.name: j.end_s - j.origin_s for j in r.jobs} for r in (plain, las)}
    assert las.preemptions >= 1 and summarise(las).preemptions_per_job > 0
    # the short job waited for the long one under plain Slurm; now it overtakes it
    assert jct["slurm"]["short"] > 4 * 3600 - 1800
    assert jct["las"]["short"] < 1800
    # the long one pays for it (checkpoint, requeue delay, restart), and still finishes
    assert jct["las"]["long"] > jct["slurm"]["long"]
    assert all(j.state is JobState.COMPLETED for j in las.jobs)


def test_las_shrinks_a_malleable_long_job_instead_and_it_keeps_running() -> None:
    trace = [_job(0, 4, 4 * 3600, "long"), _job(1800, 2, 600, "short")]
    shape = ClusterShape(1, 4)
    runs = {}
    for shrink in (False, True):
        settings = AttainedServiceSettings(
            enabled=True, mode=Mode.ENFORCE, queue_limits=(1.0,), shrink=shrink
        )
        runs[shrink] = simulate(trace, shape, "las", SimOptions(policies=SimPolicies(las=settings)))
    run = runs[True]
    jobs = {j.name: j for j in run.jobs}
    long, short = jobs["long"], jobs["short"]
    assert run.preemptions == 0 and run.resizes >= 1
    # the short job overtakes the long one all the same
    assert short.end_s - short.origin_s < 1800
    # the long one never stopped for long: its first run ended where its 2-GPU run
    # began, and once the short job was done (and min_runtime after its restart) the
    # policy gave it its 4 GPUs back: no job waited for them
    gpu_runs = [r for r in long.runs if r.kind == "gpu"]
    assert [r.gpus for r in gpu_runs] == [4, 2, 4]
    assert gpu_runs[1].start_s - gpu_runs[0].end_s < 60
    assert gpu_runs[2].start_s >= max(short.end_s, gpu_runs[1].start_s + 15 * 60)
    assert all(j.state is JobState.COMPLETED for j in run.jobs)
    # preempted whole, it held nothing while the short job ran
    whole = [r for r in {j.name: j for j in runs[False].jobs}["long"].runs if r.kind == "gpu"]
    assert [r.gpus for r in whole] == [4, 4] and whole[1].start_s >= short.end_s


def test_the_daemon_runs_las_only_when_the_site_enables_it(store: JobStore) -> None:
    off = build_policy_cycle(parse_settings(""), store, FakeSlurm())
    assert not any(isinstance(p, AttainedServicePolicy) for p, _ in off.engine.policies)
    on = build_policy_cycle(
        parse_settings('[policy.las]\nenabled = true\nmode = "enforce"\n'), store, FakeSlurm()
    )
    las = [(p, m) for p, m in on.engine.policies if isinstance(p, AttainedServicePolicy)]
    assert len(las) == 1 and las[0][1] == "enforce"
    # the malleable policy only advises here: LAS grows the jobs it shrank back itself
    assert isinstance(las[0][0], AttainedServicePolicy) and las[0][0].grows_back
    beside = build_policy_cycle(
        parse_settings(
            '[policy.las]\nenabled = true\nmode = "enforce"\n[policy.malleable]\nmode = "enforce"\n'
        ),
        store,
        FakeSlurm(),
    )
    [lp] = [p for p, _ in beside.engine.policies if isinstance(p, AttainedServicePolicy)]
    assert not lp.grows_back  # the malleable policy expands, pricing each growth
    forced = build_policy_cycle(
        parse_settings(
            '[policy.las]\nenabled = true\ngrow_back = true\n[policy.malleable]\nmode = "enforce"\n'
        ),
        store,
        FakeSlurm(),
    )
    [fp] = [p for p, _ in forced.engine.policies if isinstance(p, AttainedServicePolicy)]
    assert fp.grows_back  # the site's word wins
    # the simulator's full set runs the same class, built as beside malleable; alone, the
    # las set's grows back
    [sim_las] = [
        p for b in POLICY_SETS["all"] if isinstance(p := b(SimPolicies()), AttainedServicePolicy)
    ]
    assert not sim_las.grows_back
    [alone] = [b(SimPolicies()) for b in POLICY_SETS["las"]]
    assert isinstance(alone, AttainedServicePolicy) and alone.grows_back


@needs_data
def test_sgpu_simulate_over_seeds_reports_means_ci_and_the_new_figures(tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    # a wide terminal: the table has many columns (energy too) and Rich folds narrow ones
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        main,
        [
            "simulate",
            str(DATA / "workloads" / "workload-1.csv"),
            "--policies",
            "slurm,las",
            "--seeds",
            "1-2",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "95% CI" in result.output
    doc = json.loads(out.read_text())
    assert doc["seeds"] == [1, 2]
    assert set(doc["avg_jct_ci95_s"]) == {"slurm", "las"}
    las = next(r for r in doc["results"] if r["policy_set"] == "las")
    # the long jobs LAS moves out of the way: shrunk (malleable) or preempted whole
    moved = las["preemptions_per_job"] + las["resizes_per_job"]
    assert moved > 0 and las["rho_max"] >= 1.0
    assert 0.0 <= las["rho_over_pct"] <= 100.0
    bad = CliRunner().invoke(
        main, ["simulate", str(DATA / "workloads" / "workload-1.csv"), "--seeds", "x"]
    )
    assert bad.exit_code == 2 and "--seeds must look like" in bad.output

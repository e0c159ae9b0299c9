"""The Pollux baseline (slurmgpu.sim.pollux): goodput, batch co-adaptation, the search."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from slurmgpu.sim.loaders import load_trace
from slurmgpu.sim.pollux import (
    FIXED_BATCH,
    PolluxJob,
    PolluxSearch,
    RestartCosts,
    _goodputs,
    _Search,
    _steps,
    simulate_pollux,
)
from slurmgpu.sim.profiles import APPLICATIONS, ThroughputProfile, load_profiles
from slurmgpu.sim.progress import ElasticRuntime
from slurmgpu.sim.workload import ProfiledJob, RigidJob, TraceJob

DATA = Path("/work/shared/data/pollux")
PROFILES: dict[str, ThroughputProfile] | None = (
    load_profiles(DATA / "profiles") if (DATA / "profiles").is_dir() else None
)
needs_profiles = pytest.mark.skipif(
    PROFILES is None, reason=f"Pollux throughput profiles not found under {DATA / 'profiles'}"
)
SMALL = PolluxSearch(population=8, generations=4)


def _job(app: str, submit: float, batch: int, gpus: int = 1) -> TraceJob:
    assert PROFILES is not None
    return TraceJob(submit, app, "u1", ProfiledJob(APPLICATIONS[app], PROFILES[app], batch), gpus)


def test_restart_costs_are_the_artifacts_flat_30s_and_what_slurm_sets_pay() -> None:
    flat = RestartCosts.pollux()
    assert (flat.label, flat.first_start_s, flat.restart_s) == ("pollux-30s", 30.0, 30.0)
    rt = ElasticRuntime(checkpoint_s=20.0, startup_s=30.0)
    slurm = RestartCosts.slurm(rt, executor_s=3.0)
    # a first start pays the start-up; a change the checkpoint, the executor and start-up
    assert (slurm.label, slurm.first_start_s, slurm.restart_s) == ("pollux-slurm", 30.0, 53.0)


@needs_profiles
def test_the_batch_grows_with_the_gpus_and_the_noise_scale() -> None:
    assert PROFILES is not None
    gp = _goodputs(APPLICATIONS["cifar10"], PROFILES["cifar10"], 4)
    last = len(APPLICATIONS["cifar10"].noise_scale) - 1
    rate1, batch1 = gp.on((1,), 0)
    rate4, batch4 = gp.on((4,), 0)
    assert rate4 > rate1 > 0
    assert batch4 >= batch1 >= APPLICATIONS["cifar10"].init_batch_size
    # later in training the noise scale is larger: big batches lose less, so it grows
    _, batch4_late = gp.on((4,), last)
    assert batch4_late >= batch4
    assert batch4_late > batch1
    ncf = _goodputs(APPLICATIONS["ncf"], PROFILES["ncf"], 4)
    assert ncf.on((1,), 0)[1] == FIXED_BATCH["ncf"]


@needs_profiles
def test_the_search_keeps_node_capacity_replica_caps_and_one_spread_job_per_node() -> None:
    trace = [
        _job(app, 10.0 * i, batch)
        for i, (app, batch) in enumerate(
            [("cifar10", 2048), ("imagenet", 3200), ("deepspeech2", 320), ("bert", 384)] * 5
        )
    ]
    jobs = []
    for i, t in enumerate(trace):
        model = t.model
        assert isinstance(model, ProfiledJob)
        gp = _goodputs(model.app, model.profile, 4)
        jobs.append(PolluxJob(i, t.submit_s, model.app, gp, 1, model))
    for j in jobs[:10]:
        j.max_seen = 8  # has run: may grow to 16 (capped by its batch limit)
    search = _Search(PolluxSearch(population=16, generations=6, seed=3), 4, 4)
    for j in jobs:
        search.add(j.goodputs)
    best = search.optimize(jobs, now=600.0, delay=30.0)
    assert best.shape == (20, 4)
    assert (best >= 0).all()
    assert (best.sum(axis=0) <= 4).all()  # node capacity
    for j, row in zip(jobs, best, strict=True):
        assert row.sum() <= j.max_replicas()
    spread = np.count_nonzero(best, axis=1) > 1
    assert ((best[spread] > 0).sum(axis=0) <= 1).all()  # one distributed job per node
    assert best.sum() > 0  # it allocated something


@needs_profiles
def test_a_run_finishes_every_job_and_counts_what_it_did() -> None:
    trace = [_job("cifar10", 0.0, 2048, 4), _job("deepspeech2", 30.0, 320, 2)]
    flat = simulate_pollux(
        trace, nodes=2, costs=RestartCosts.pollux(), search=SMALL, max_virtual_s=86400.0
    )
    f = flat.figures()
    assert f["unfinished"] == 0 and f["timeouts"] == 0
    assert all(not math.isnan(j.end_s) for j in flat.jobs)
    # nothing finishes faster than alone at its best goodput on all 8 GPUs
    for j in flat.jobs:
        fastest = max(j.goodputs.on(p, k)[0] for p in ((4, 4),) for k in range(8))
        assert j.end_s - j.submit_s > j.app.progress / fastest
    assert f["resizes_per_job"] == sum(j.resizes for j in flat.jobs) / 2
    assert f["gpu_hours"] > 0
    # its history holds every allocation change: a first start, then each resize and
    # preemption, in time order, never past its end
    for j in flat.jobs:
        assert j.history and j.history[0][1]
        assert len(j.history) == 1 + j.resizes + j.preemptions + sum(
            1 for (_, a), (_, b) in zip(j.history, j.history[1:], strict=False) if not a and b
        )
        times = [t for t, _ in j.history]
        assert times == sorted(times) and times[-1] < j.end_s
    # the job co-adapted its batch as it was given more GPUs
    assert len(flat.jobs[0].batches) > 1
    again = simulate_pollux(
        trace, nodes=2, costs=RestartCosts.pollux(), search=SMALL, max_virtual_s=86400.0
    )
    assert again.figures() == f  # seeded: the same run


@needs_profiles
def test_slurm_costs_make_every_restart_dearer() -> None:
    trace = [_job("cifar10", 0.0, 2048, 4)]
    flat = simulate_pollux(
        trace, nodes=1, costs=RestartCosts.pollux(), search=SMALL, max_virtual_s=86400.0
    )
    dear = simulate_pollux(
        trace, nodes=1, costs=RestartCosts("dear", 30.0, 600.0), search=SMALL, max_virtual_s=86400.0
    )
    assert flat.jobs[0].restarts >= 1  # it grew from its first GPU
    assert dear.figures()["avg_jct_s"] > flat.figures()["avg_jct_s"]


def test_a_trace_without_profiled_jobs_is_refused_by_job() -> None:
    trace = [TraceJob(0.0, "rigid", "u1", RigidJob(3600.0, 1), 1)]
    with pytest.raises(ValueError, match=r"job 1 \(rigid\): Pollux runs only"):
        simulate_pollux(trace)


@needs_profiles
@pytest.mark.slow
def test_pollux_30s_is_within_15pct_of_the_published_workload_1() -> None:
    assert PROFILES is not None
    trace = load_trace(DATA / "workloads" / "workload-1.csv", PROFILES, seed=1)
    r = simulate_pollux(trace, search=PolluxSearch(population=20, generations=10))
    assert r.figures()["avg_jct_s"] == pytest.approx(2089, rel=0.15)


@given(hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=3), elements=st.integers(0, 64)))
def test_steps_are_the_increments_of_running_totals(cells: np.ndarray) -> None:
    totals = np.cumsum(cells, axis=-1)
    assert np.array_equal(_steps(totals), np.diff(totals, axis=-1, prepend=0))
    assert np.array_equal(_steps(totals), cells)

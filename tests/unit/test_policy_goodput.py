"""The goodput batch choice (Pollux's throughput x statistical efficiency)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from slurmgpu.policy.goodput import batch_candidates, best_batch, efficiency, goodput
from slurmgpu.sim.profiles import APPLICATIONS, load_profiles
from slurmgpu.sim.workload import ProfiledJob, packed
from tests.unit.pollux_data import DATA, needs_data


def _step(gpus: int, fixed: float = 0.05, per_sample: float = 0.001) -> Callable[[int], float]:
    """A data-parallel step: a fixed part (sync, launch) plus compute split over GPUs."""
    return lambda b: fixed + per_sample * b / gpus


def test_efficiency_is_one_at_the_initial_batch_and_falls_with_the_batch() -> None:
    assert efficiency(32, 32, 100.0) == 1.0
    effs = [efficiency(b, 32, 100.0) for b in (32, 64, 128, 256)]
    assert effs == sorted(effs, reverse=True) and effs[-1] < 1.0
    assert efficiency(256, 32, 0.0) == pytest.approx(32 / 256)  # clean gradient: no gain
    assert efficiency(256, 32, 1e12) == pytest.approx(1.0)  # pure noise: all samples count
    with pytest.raises(ValueError, match="positive"):
        efficiency(0, 32, 1.0)


def test_goodput_counts_initial_batch_steps_per_second() -> None:
    # 64 samples at efficiency 0.5 are worth one step of B0 = 32; 0.5 s a step
    assert goodput(64, 32, 0.5, 0.5) == pytest.approx(2.0)
    assert goodput(64, 32, math.inf, 1.0) == 0.0


def test_candidates_are_multiples_of_the_gpus_within_the_limits() -> None:
    c = batch_candidates(4, 10, 1000, current=250)
    assert c[0] == 10 and c[-1] == 1000 and 250 in c
    assert all(10 <= b <= 1000 for b in c)
    assert all(b % 4 == 0 for b in c if b not in (10, 1000, 250))
    assert batch_candidates(2, 64, 64) == [64]
    with pytest.raises(ValueError, match="lo <= hi"):
        batch_candidates(1, 100, 10)


def test_best_batch_finds_the_interior_optimum() -> None:
    # goodput(B) ~ B (phi+B0)/(phi+B) / (f + c B / g): maximal at B* = sqrt(phi f g / c)
    b0, phi, gpus = 16, 4000.0, 4
    choice = best_batch(
        gpus, _step(gpus), lambda b: efficiency(b, b0, phi), init_batch=b0, lo=b0, hi=16384
    )
    optimum = math.sqrt(phi * 0.05 * gpus / 0.001)  # about 894
    assert 0.8 * optimum <= choice.batch <= 1.25 * optimum
    # and it beats both limits
    for b in (b0, 16384):
        assert choice.goodput > goodput(b, b0, _step(gpus)(b), efficiency(b, b0, phi))


def test_best_batch_stays_within_the_declared_limits() -> None:
    b0, phi = 16, 4000.0
    eff = lambda b: efficiency(b, b0, phi)  # noqa: E731
    capped = best_batch(4, _step(4), eff, init_batch=b0, lo=b0, hi=256)
    assert capped.batch == 256  # the optimum (~894) is above the limit: the limit
    floored = best_batch(4, _step(4), eff, init_batch=b0, lo=2048, hi=4096)
    assert floored.batch == 2048


def test_more_gpus_or_a_noisier_gradient_move_the_best_batch_up() -> None:
    b0 = 16
    eff = lambda b: efficiency(b, b0, 4000.0)  # noqa: E731
    by_gpus = [
        best_batch(g, _step(g), eff, init_batch=b0, lo=b0, hi=65536).batch for g in (1, 4, 16)
    ]
    assert by_gpus == sorted(by_gpus) and by_gpus[0] < by_gpus[-1]
    quiet = best_batch(
        4, _step(4), lambda b: efficiency(b, b0, 200.0), init_batch=b0, lo=b0, hi=65536
    )
    noisy = best_batch(
        4, _step(4), lambda b: efficiency(b, b0, 50_000.0), init_batch=b0, lo=b0, hi=65536
    )
    assert quiet.batch < noisy.batch


@needs_data
def test_a_batch_adaptive_pollux_job_is_the_fixed_one_at_its_batch_and_never_slower() -> None:
    profiles = load_profiles(DATA / "profiles")
    for app, batch in (("imagenet", 3200), ("yolov3", 64), ("cifar10", 2048)):
        fixed = ProfiledJob(APPLICATIONS[app], profiles[app], batch)
        pinned = fixed.adaptive(lo=batch, hi=batch)
        free = fixed.adaptive()
        for gpus in (1, 2, 4, 8, 16):
            place = packed(gpus, 4)
            # same batch: the same run time, counted in progress instead of steps
            assert pinned.run_time(gpus, 4) == pytest.approx(fixed.run_time(gpus, 4), rel=0.01)
            assert free.run_time(gpus, 4) <= pinned.run_time(gpus, 4) * (1 + 1e-9)
            assert APPLICATIONS[app].init_batch_size <= free.best(place).batch <= batch
    # on one GPU a large batch only accumulates gradients: the runtime picks a smaller one
    img = ProfiledJob(APPLICATIONS["imagenet"], profiles["imagenet"], 3200).adaptive()
    assert img.best(packed(1, 4)).batch < img.best(packed(16, 4)).batch


@needs_data
def test_only_the_sets_with_the_goodput_allocator_retune_batches() -> None:
    from slurmgpu.sim.loaders import load_trace
    from slurmgpu.sim.policysets import BATCH_ADAPTIVE
    from slurmgpu.sim.run import ClusterShape, simulate

    profiles = load_profiles(DATA / "profiles")
    trace = load_trace(DATA / "workloads" / "workload-1.csv", profiles, seed=1)[:20]
    for name in ("slurm", "tiresias", "las", "malleable", "all"):
        run = simulate(trace, ClusterShape(16, 4), name)
        limits = {
            j.model.batch_limits is not None for j in run.jobs if isinstance(j.model, ProfiledJob)
        }
        assert limits == {name in BATCH_ADAPTIVE}, name
    assert all(j.model.batch_limits is None for j in trace if isinstance(j.model, ProfiledJob))


@needs_data
def test_a_batch_ceiling_raises_the_declared_limit_of_its_application_only() -> None:
    from slurmgpu.sim.pollux import POLLUX_BATCH_CEILINGS
    from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
    from slurmgpu.sim.workload import TraceJob, elastic_batch

    profiles = load_profiles(DATA / "profiles")

    def job(app: str, batch: int, at: float) -> TraceJob:
        return TraceJob(at, app, "u1", ProfiledJob(APPLICATIONS[app], profiles[app], batch), 4)

    trace = [job("yolov3", 64, 0.0), job("cifar10", 8192, 1.0), job("bert", 96, 2.0)]
    # cifar10 submitted above its ceiling keeps its own batch; bert has no ceiling here
    out = elastic_batch(trace, {"yolov3": 512, "cifar10": 4096})
    limits = [j.model.batch_limits for j in out if isinstance(j.model, ProfiledJob)]
    assert limits == [(8, 512), (128, 8192), (APPLICATIONS["bert"].init_batch_size, 96)]
    assert elastic_batch(trace) == elastic_batch(trace, {})  # no ceiling: the submitted batch
    # the what-if reaches the simulator through its options, for the batch-adaptive sets
    opts = SimOptions(batch_ceilings=POLLUX_BATCH_CEILINGS)
    yolo = simulate(trace[:1], ClusterShape(4, 4), "malleable", opts).jobs[0].model
    assert isinstance(yolo, ProfiledJob) and yolo.batch_limits == (8, 512)
    plain = simulate(trace[:1], ClusterShape(4, 4), "slurm", opts).jobs[0].model
    assert isinstance(plain, ProfiledJob) and plain.batch_limits is None


@needs_data
def test_a_phased_job_runs_each_slice_at_the_batch_its_run_started_with() -> None:
    from slurmgpu.sim.slurm import SimSlurm
    from slurmgpu.sim.workload import TraceJob

    profiles = load_profiles(DATA / "profiles")
    app = APPLICATIONS["yolov3"]
    job = ProfiledJob(app, profiles["yolov3"], 512).adaptive()
    job.phased = True
    k = job.phases
    assert k == len(app.noise_scale) > 1
    assert job.phase(0.0) == 0 and job.phase(job.work) == k - 1
    assert job.phase_end(0.0) == pytest.approx(job.work / k)
    # yolov3's noise scale grows 70-fold: late in training a bigger batch pays
    place = packed(8, 4)
    assert job.phase_batch(place, 0.0) < job.phase_batch(place, job.work * 0.99)
    # alone on 8 GPUs, never restarted: each slice at the first slice's batch
    sim = SimSlurm(2, 4)
    job_id = sim.submit_job(TraceJob(0.0, "yolov3", "u1", job, 8))
    sim.run_until(1e9)
    batch = job.phase_batch(place, 0.0)
    expected = sum(
        (job.work / k) / job.rate_in(place, batch, job.work * (i + 0.5) / k) for i in range(k)
    )
    assert sim.job(job_id).end_s == pytest.approx(expected, rel=1e-6)
    # not phased: the run's average, a different run time
    flat = ProfiledJob(app, profiles["yolov3"], 512).adaptive()
    assert flat.phases == 1 and flat.run_time(8, 4) != pytest.approx(expected, rel=1e-3)
    # the what-if reaches the batch-adaptive sets through the simulator's options
    from slurmgpu.sim.run import ClusterShape, SimOptions, simulate

    fixed = TraceJob(0.0, "yolov3", "u1", ProfiledJob(app, profiles["yolov3"], 512), 8)
    for name, phased in (("malleable", True), ("slurm", False)):
        run = simulate([fixed], ClusterShape(2, 4), name, SimOptions(batch_phases=True))
        model = run.jobs[0].model
        assert isinstance(model, ProfiledJob) and model.phased is phased, name

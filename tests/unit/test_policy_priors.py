"""Priors: estimates per (user, name, partition) with coarser fallbacks."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from slurmgpu.policy.priors import Priors, quantile_nearest_rank
from tests.unit.policy_builders import HOUR, MIN, pending_job, record


def test_no_history_gives_no_estimate() -> None:
    assert Priors.from_history([]).estimate(pending_job()) is None


def test_the_finest_key_with_enough_samples_answers() -> None:
    history = [record(run_time=HOUR)] * 3 + [record(partition="a100", run_time=5 * HOUR)] * 3
    est = Priors.from_history(history).estimate(pending_job(partition="gpu"))
    assert est is not None
    assert est.level == "user+name+partition" and est.key == ("alice", "train", "gpu")
    assert est.samples == 3 and est.run_time == HOUR


def test_too_few_samples_fall_back_to_coarser_keys() -> None:
    two_here = [record(run_time=HOUR)] * 2
    elsewhere = [record(partition="a100", run_time=2 * HOUR)] * 2
    est = Priors.from_history(two_here + elsewhere).estimate(pending_job())
    assert est is not None and est.level == "user+name" and est.samples == 4
    other_names = [record(name=f"job{i}", run_time=MIN * 10) for i in range(3)]
    est = Priors.from_history(other_names).estimate(pending_job(name="new"))
    assert est is not None and est.level == "user+partition" and est.samples == 3
    other_partition = [record(name=f"job{i}", partition="cpu") for i in range(3)]
    est = Priors.from_history(other_partition).estimate(pending_job(name="new"))
    assert est is not None and est.level == "user"
    assert Priors.from_history([record(user="bob")] * 5).estimate(pending_job()) is None


def test_min_samples_is_configurable() -> None:
    history = [record()] * 2
    assert Priors.from_history(history).estimate(pending_job()) is None
    est = Priors.from_history(history, min_samples=2).estimate(pending_job())
    assert est is not None and est.samples == 2


def test_run_time_is_the_nearest_rank_quantile() -> None:
    history = [record(run_time=MIN * m) for m in range(1, 21)]  # 1..20 min
    est = Priors.from_history(history, quantile=0.95).estimate(pending_job())
    assert est is not None and est.run_time == MIN * 19 and est.max_run_time == MIN * 20
    est = Priors.from_history(history, quantile=0.5).estimate(pending_job())
    assert est is not None and est.run_time == MIN * 10
    assert quantile_nearest_rank([5.0], 0.95) == 5.0
    with pytest.raises(ValueError, match="no values"):
        quantile_nearest_rank([], 0.5)


def test_only_completed_and_timed_out_runs_are_samples() -> None:
    history = [
        record(run_time=HOUR),
        record(run_time=HOUR, state="TIMEOUT"),
        record(run_time=HOUR),
        record(run_time=MIN, state="CANCELLED by 1000"),
        record(run_time=MIN, state="FAILED"),
    ]
    est = Priors.from_history(history).estimate(pending_job())
    assert est is not None and est.samples == 3 and est.timeouts == 1
    assert est.run_time == HOUR


def test_out_of_memory_runs_are_counted_not_sampled() -> None:
    history = [record()] * 3 + [record(state="OUT_OF_MEMORY", run_time=MIN)]
    est = Priors.from_history(history).estimate(pending_job())
    assert est is not None and est.oom_runs == 1 and est.samples == 3


def test_figures_are_maxima_and_means_over_samples() -> None:
    history = [
        record(peak_memory_mib=1000.0, mean_cpu_pct=100.0, gpus_used=1),
        record(peak_memory_mib=3000.0, mean_cpu_pct=300.0, gpus_used=2),
        record(peak_memory_mib=None, mean_cpu_pct=None, gpus_used=None),
    ]
    est = Priors.from_history(history).estimate(pending_job())
    assert est is not None
    assert est.peak_memory_mib == 3000.0 and est.peak_node_memory_mib == 3000.0
    assert est.mean_cpu_pct == 200.0 and est.max_cpu_pct == 300.0
    assert est.gpus_used == 2 and est.gpus_used_samples == 2 and est.gpus_requested == 4
    assert not est.cpu_saturated


def test_a_run_that_kept_its_cores_busy_marks_cpu_saturated() -> None:
    history = [record(cpus=4, mean_cpu_pct=390.0)] + [record()] * 2
    est = Priors.from_history(history).estimate(pending_job())
    assert est is not None and est.cpu_saturated


def test_per_node_peaks_are_used_when_recorded() -> None:
    history = [record(peak_memory_mib=8000.0, peak_node_memory_mib=5000.0)] * 3
    est = Priors.from_history(history).estimate(pending_job())
    assert est is not None and est.peak_node_memory_mib == 5000.0


def test_script_hash_keys_come_first_when_given() -> None:
    history = [record(script_hash="abc", run_time=3 * HOUR)] * 3 + [record(name="x")] * 3
    priors = Priors.from_history(history)
    job = pending_job(name="renamed")
    est = priors.estimate(job, script_hash="abc")
    assert est is not None and est.level == "user+script+partition"
    assert est.run_time == 3 * HOUR
    plain = priors.estimate(job)
    assert plain is not None and plain.level == "user+partition" and plain.samples == 6


def test_a_job_listing_several_partitions_skips_partition_keys() -> None:
    history = [record(partition="gpu")] * 3
    est = Priors.from_history(history).estimate(pending_job(partition="gpu,gpu-long"))
    assert est is not None and est.level == "user+name"


@pytest.mark.slow
def test_a_million_records_group_into_every_key() -> None:
    # How long this takes is bench/policy.py's business, not a test's.
    users = [f"u{i}" for i in range(2000)]
    history = [
        record(user=users[i % 2000], name=f"n{i % 7}", run_time=timedelta(seconds=60 + i % 977))
        for i in range(200_000)
    ]
    priors = Priors.from_history(history * 5)
    answering = priors.prepare()
    assert answering == len(priors) == 2000 * 7 * 2 + 2000 * 2  # upn, un + up, u levels


def test_statistics_are_computed_on_first_use_and_prepare_computes_them_all() -> None:
    history = [record(run_time=HOUR)] * 3 + [record(name="rare")]
    lazy = Priors.from_history(history)
    eager = Priors.from_history(history)
    # train/gpu, train, rare/gpu, rare, alice/gpu and alice: all but the two "rare" keys
    assert eager.prepare() == 4
    assert lazy.estimate(pending_job()) == eager.estimate(pending_job())
    assert lazy.estimate(pending_job(name="rare")) == eager.estimate(pending_job(name="rare"))


def test_run_time_is_for_the_jobs_gpu_count_when_enough_runs_had_it() -> None:
    # The same job name on 8 GPUs runs 1 h, on 1 GPU 6 h: neither answers for the other.
    history = [record(gpus_requested=8, run_time=HOUR)] * 3 + [
        record(gpus_requested=1, run_time=6 * HOUR)
    ] * 3
    priors = Priors.from_history(history)
    one = priors.estimate(pending_job(gpus_per_node=1))
    eight = priors.estimate(pending_job(gpus_per_node=8))
    assert one is not None and eight is not None
    assert one.level == eight.level == "user+name+partition"
    assert (one.run_time, one.gpus, one.gpu_samples, one.gpu_scaled) == (6 * HOUR, 1, 3, False)
    assert (eight.run_time, eight.gpus, eight.samples) == (HOUR, 8, 3)


def test_too_few_runs_at_the_gpu_count_scale_the_others_never_shorter() -> None:
    history = [record(gpus_requested=8, run_time=HOUR)] * 3
    priors = Priors.from_history(history)
    # On 2 GPUs a run of 8 takes at most 8/2 = 4 times as long...
    two = priors.estimate(pending_job(gpus_per_node=2))
    assert two is not None and two.gpu_scaled and two.gpu_samples == 0
    assert two.run_time == 4 * HOUR and two.samples == 3
    # ...and on 16 at most as long: more GPUs never shorten the estimate.
    many = priors.estimate(pending_job(gpus_per_node=16))
    assert many is not None and many.gpu_scaled and many.run_time == HOUR
    # One run at the job's own count is mixed with the scaled others.
    mixed = Priors.from_history([*history, record(gpus_requested=2, run_time=30 * MIN)])
    est = mixed.estimate(pending_job(gpus_per_node=2))
    assert est is not None and est.gpu_samples == 1 and est.samples == 4
    assert est.run_time == 4 * HOUR


def test_jobs_and_runs_without_gpus_are_not_scaled() -> None:
    history = [record(gpus_requested=0, gpus_used=None, run_time=HOUR)] * 3
    cpu_job = pending_job(gpus_per_node=None)
    est = Priors.from_history(history).estimate(cpu_job)
    assert est is not None and est.run_time == HOUR and est.gpus is None
    est = Priors.from_history(history).estimate(pending_job(gpus_per_node=4))
    assert est is not None and est.run_time == HOUR and est.gpu_scaled


def test_gpu_counts_can_be_pooled_for_a_median() -> None:
    history = [record(gpus_requested=8, run_time=HOUR)] * 3
    pooled = Priors.from_history(history, by_gpus=False).estimate(pending_job(gpus_per_node=2))
    assert pooled is not None and pooled.run_time == HOUR and pooled.gpus is None


# --- carrying statistics over a history reload ---------------------------------------


def test_a_reload_keeps_the_statistics_of_users_whose_runs_are_the_same() -> None:
    old_history = [record(run_time=HOUR)] * 3 + [record(user="bob", run_time=2 * HOUR)] * 3
    old = Priors.from_history(old_history)
    alice, bob = old.estimate(pending_job()), old.estimate(pending_job(user="bob"))
    assert alice is not None and bob is not None
    # Reloaded from the database: equal records, new objects; bob ran once more.
    new_history = [msgspec.structs.replace(r) for r in old_history] + [
        record(user="bob", run_time=9 * HOUR)
    ]
    new = Priors.from_history(new_history)
    assert new.carry_over(old) == frozenset({"bob"})
    assert new.estimate(pending_job()) is alice  # not computed again
    again = new.estimate(pending_job(user="bob"))
    assert again is not None and again.samples == 4 and again.run_time == 9 * HOUR
    assert again == Priors.from_history(new_history).estimate(pending_job(user="bob"))
    # The old priors gave their statistics up, and still answer as before.
    assert old.estimate(pending_job(user="bob")) == bob
    assert old.estimate(pending_job(user="bob")) is not bob


def test_a_reload_recomputes_only_the_keys_whose_runs_changed() -> None:
    """bob's new "eval" run changes his eval key and every coarser key over it, not his
    "train" key: its statistics are carried over (the same Estimate), and a job whose
    name has no runs of its own answers from bob's changed user-level keys."""
    old_history = [record(user="bob", run_time=HOUR)] * 3 + [
        record(user="bob", name="eval", run_time=2 * HOUR)
    ] * 3
    old = Priors.from_history(old_history)
    train = old.estimate(pending_job(user="bob"))
    sweep = old.estimate(pending_job(user="bob", name="sweep"))
    assert train is not None and sweep is not None and sweep.level == "user+partition"
    new_history = [msgspec.structs.replace(r) for r in old_history] + [
        record(user="bob", name="eval", run_time=9 * HOUR, script_hash="s1")
    ]
    new = Priors.from_history(new_history)
    assert new.carry_over(old) == frozenset({"bob"})
    assert new.changed_keys == {
        (0, "bob", "s1", "gpu"),
        (1, "bob", "s1"),
        (2, "bob", "eval", "gpu"),
        (3, "bob", "eval"),
        (4, "bob", "gpu"),
        (5, "bob"),
    }
    assert new.estimate(pending_job(user="bob")) is train
    fresh = Priors.from_history(new_history)
    for name in ("eval", "sweep"):
        job = pending_job(user="bob", name=name)
        assert new.estimate(job) == fresh.estimate(job)
    assert new.estimate(pending_job(user="bob", name="sweep")) != sweep
    # what answer() tries for a name, finest first: one partition, or several
    assert Priors.chain("bob", "eval", "gpu") == (
        (2, "bob", "eval", "gpu"),
        (3, "bob", "eval"),
        (4, "bob", "gpu"),
        (5, "bob"),
    )
    assert Priors.chain("bob", "eval", "gpu,a100") == ((3, "bob", "eval"), (5, "bob"))


def test_a_user_gone_from_history_or_new_to_it_counts_as_changed() -> None:
    old = Priors.from_history([record(user="ann")] * 3)
    assert old.estimate(pending_job(user="ann")) is not None
    assert old.estimate(pending_job(user="zed")) is None  # remembered: no history
    new = Priors.from_history([record(user="bob")] * 3)
    assert new.carry_over(old) == frozenset({"ann", "bob"})
    assert new.estimate(pending_job(user="ann")) is None
    assert new.estimate(pending_job(user="bob")) is not None
    assert new.estimate(pending_job(user="zed")) is None


def test_priors_with_other_settings_take_nothing_over() -> None:
    history = [record()] * 3
    old = Priors.from_history(history, quantile=0.5)
    assert old.estimate(pending_job()) is not None
    new = Priors.from_history(history, quantile=0.95)
    assert new.carry_over(old) is None
    est = new.estimate(pending_job())
    assert est is not None and est.quantile == 0.95


def test_answer_key_estimate_and_run_time_are_estimate_in_parts() -> None:
    """What rightsizing builds from the parts equals the Estimate for every job shape."""
    import random

    rng = random.Random(7)
    history = [
        record(
            user=rng.choice(["ann", "bob"]),
            name=rng.choice(["a", "b", "c"]),
            partition=rng.choice(["gpu", "a100"]),
            run_time=timedelta(seconds=rng.randrange(60, 90_000)),
            state=rng.choice(["COMPLETED", "COMPLETED", "TIMEOUT", "FAILED"]),
            gpus_requested=rng.choice([1, 2, 3, 4, 8]),
        )
        for _ in range(60)
    ]
    priors = Priors.from_history(history)
    answered = 0
    for user in ("ann", "bob", "eve"):
        for name in ("a", "b", "c", "d"):
            for partition in ("gpu", "a100", "gpu,a100", ""):
                for gpus in (0, 1, 2, 3, 4, 8, 16):
                    job = pending_job(user=user, name=name, partition=partition, gpus_per_node=gpus)
                    est = priors.estimate(job)
                    key = priors.answer(user, name, partition)
                    if est is None:
                        assert key is None
                        continue
                    answered += 1
                    assert key is not None
                    whole = priors.key_estimate(key)
                    assert whole is not None
                    assert (whole.level, whole.key) == (est.level, est.key)
                    assert (
                        msgspec.structs.replace(
                            whole,
                            samples=est.samples,
                            run_time=est.run_time,
                            max_run_time=est.max_run_time,
                            gpus=est.gpus,
                            gpu_samples=est.gpu_samples,
                            gpu_scaled=est.gpu_scaled,
                        )
                        == est
                    )
                    run_s, samples, gpu_samples, scaled = priors.run_time(key, gpus or None)
                    assert run_s == est.run_time.total_seconds()
                    assert (samples, gpu_samples, scaled) == (
                        est.samples,
                        est.gpu_samples,
                        est.gpu_scaled,
                    )
    assert answered > 100


@pytest.mark.parametrize("quantile", [0.5, 0.8, 0.95, 1.0])
def test_run_time_figures_equal_sorting_the_runs_that_apply(quantile: float) -> None:
    """The estimate's run times (read without a sort where the quantile is the longest
    run) equal the module docstring's definition, sorted and read, for groups small and
    large, every GPU count and quantile: the runs that asked as many GPUs when there are
    ``min_samples`` of them, else every run scaled by ``g / gpus`` where it had more."""
    import random

    rng = random.Random(11)
    for size in (1, 2, 3, 5, 8, 19, 20, 21, 40, 120):
        for min_samples in (1, 3, 5):
            runs = [
                (float(rng.randrange(60, 90_000)), rng.choice([0, 1, 1, 2, 3, 4, 8]))
                for _ in range(size)
            ]
            history = [record(run_time=timedelta(seconds=t), gpus_requested=g) for t, g in runs]
            priors = Priors.from_history(history, quantile=quantile, min_samples=min_samples)
            for gpus in (0, 1, 2, 3, 4, 5, 8, 16):
                est = priors.estimate(pending_job(gpus_per_node=gpus))
                if size < min_samples:
                    assert est is None
                    continue
                assert est is not None
                same = sorted(t for t, g in runs if g == gpus)
                if gpus and (len(same) >= min_samples or len(same) == size):
                    times, scaled = same, False
                elif gpus:
                    times = sorted(t * g / gpus if g > gpus else t for t, g in runs)
                    scaled = True
                else:
                    times, scaled = sorted(t for t, _ in runs), False
                assert est.samples == len(times) and est.gpu_scaled is scaled
                assert est.gpu_samples == (len(same) if gpus else 0)
                want = quantile_nearest_rank(times, quantile)
                assert est.run_time == timedelta(seconds=want)
                assert est.max_run_time == timedelta(seconds=times[-1])

"""Idle GPUs: warned at 60 and 105 min, acted on at 120 (fixed window); 240 / 300 sliding."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import Action, GpuStat, PriorAlert
from slurmgpu.policy.idle import (
    ALERT_CANCEL,
    ALERT_NOTICE,
    ALERT_REQUEUE,
    ALERT_SLIDING_WARNING,
    ALERT_WARNING_1,
    ALERT_WARNING_2,
    IdleGpuPolicy,
)
from slurmgpu.policy.settings import IdleGpuSettings
from tests.unit.policy_builders import MIN, T0, alert, gpu, running_job, snapshot, usage


def propose(
    job: Job,
    gpus: Sequence[GpuStat],
    alerts: Sequence[PriorAlert] = (),
    settings: IdleGpuSettings | None = None,
    at: datetime = T0,
) -> list[Action]:
    snap = snapshot([job], at=at, usage_by_job=[usage(job.job_id, *gpus)], alerts=alerts)
    return IdleGpuPolicy(settings).propose(snap)


def never_busy(minutes: float, node: str = "gpu1", index: int = 0) -> GpuStat:
    return gpu(node, index, idle=MIN * minutes, never_busy=True)


def only(actions: list[Action]) -> Action:
    assert len(actions) == 1, actions
    return actions[0]


JOB = running_job(200, started=timedelta(hours=6))


def test_a_job_that_just_started_is_left_alone() -> None:
    job = running_job(200, started=MIN * 5)
    assert propose(job, [never_busy(5)]) == []
    assert propose(JOB, [gpu(idle=timedelta(0))]) == []


def test_first_warning_at_60_minutes_of_zero_since_start() -> None:
    assert propose(JOB, [never_busy(59)]) == []
    a = only(propose(JOB, [never_busy(61)]))
    assert a.kind == "warn" and a.alert == ALERT_WARNING_1 and a.policy == "idle_gpu"
    assert a.numbers["window"] == "fixed" and a.numbers["idle_gpus"] == 1
    assert a.numbers["threshold_minutes"] == 60
    assert "requeued after 120 min" in a.reason and a.slurm_id == "200"


def test_second_warning_at_105_minutes_after_the_first() -> None:
    w1 = alert(200, ALERT_WARNING_1, T0 - MIN * 45)
    a = only(propose(JOB, [never_busy(106)], [w1]))
    assert a.kind == "warn" and a.alert == ALERT_WARNING_2
    # no repeat of a warning already given
    assert propose(JOB, [never_busy(80)], [w1]) == []


def test_idle_gpu_job_is_warned_before_it_is_requeued() -> None:
    warnings = [
        alert(200, ALERT_WARNING_1, T0 - MIN * 60),
        alert(200, ALERT_WARNING_2, T0 - MIN * 15),
    ]
    a = only(propose(JOB, [never_busy(121)], warnings))
    assert a.kind == "requeue" and a.alert == ALERT_REQUEUE
    assert a.numbers["warned_at"] == (T0 - MIN * 15).isoformat()
    assert a.numbers["idle_minutes"] == 121.0


def test_no_action_without_an_earlier_warning() -> None:
    a = only(propose(JOB, [never_busy(200)]))
    assert a.kind == "warn" and a.alert == ALERT_WARNING_1


def test_each_step_waits_for_the_warning_lead() -> None:
    # found already idle for hours: warn, then 15 min later warn again, 15 min later act
    w1_fresh = [alert(200, ALERT_WARNING_1, T0 - MIN * 5)]
    assert propose(JOB, [never_busy(200)], w1_fresh) == []
    w1 = [alert(200, ALERT_WARNING_1, T0 - MIN * 15)]
    assert only(propose(JOB, [never_busy(200)], w1)).alert == ALERT_WARNING_2
    w2_fresh = [*w1, alert(200, ALERT_WARNING_2, T0 - MIN * 10)]
    assert propose(JOB, [never_busy(200)], w2_fresh) == []
    w2 = [*w1, alert(200, ALERT_WARNING_2, T0 - MIN * 15)]
    assert only(propose(JOB, [never_busy(200)], w2)).kind == "requeue"


def test_a_job_busy_again_after_the_warning_is_spared() -> None:
    warnings = [
        alert(200, ALERT_WARNING_1, T0 - MIN * 60),
        alert(200, ALERT_WARNING_2, T0 - MIN * 15),
    ]
    # busy 10 minutes ago, idle since: the warnings predate this idle window
    busy_again = gpu(idle=MIN * 10, never_busy=False)
    assert propose(JOB, [busy_again], warnings) == []


def test_a_warning_from_an_earlier_idle_window_does_not_count() -> None:
    old = [alert(200, ALERT_WARNING_1, T0 - MIN * 300), alert(200, ALERT_WARNING_2, T0 - MIN * 260)]
    # sliding window: idle 250 min since being busy; the old warnings came before that
    a = only(propose(JOB, [gpu(idle=MIN * 250)], old))
    assert a.kind == "warn" and a.alert == ALERT_SLIDING_WARNING


def test_sliding_window_warns_at_240_and_acts_at_300() -> None:
    assert propose(JOB, [gpu(idle=MIN * 239)]) == []
    a = only(propose(JOB, [gpu(idle=MIN * 241)]))
    assert a.alert == ALERT_SLIDING_WARNING and a.numbers["window"] == "sliding"
    assert "after being busy" in a.reason
    sw = [alert(200, ALERT_SLIDING_WARNING, T0 - MIN * 60)]
    assert propose(JOB, [gpu(idle=MIN * 299)], sw) == []
    act = only(propose(JOB, [gpu(idle=MIN * 301)], sw))
    assert act.kind == "requeue" and act.numbers["threshold_minutes"] == 300


def test_requeue_false_falls_back_to_cancel_or_notify() -> None:
    job = running_job(200, started=timedelta(hours=6), requeue=False)
    warned = [
        alert(200, ALERT_WARNING_1, T0 - MIN * 60),
        alert(200, ALERT_WARNING_2, T0 - MIN * 15),
    ]
    a = only(propose(job, [never_busy(130)], warned))
    assert a.kind == "cancel" and a.alert == ALERT_CANCEL and "cannot be requeued" in a.reason
    notify = IdleGpuSettings(requeue_fallback="notify")
    a = only(propose(job, [never_busy(130)], warned, notify))
    assert a.kind == "warn" and a.alert == ALERT_NOTICE
    w1 = only(propose(job, [never_busy(61)], settings=notify))
    assert "named in a final notice" in w1.reason


def test_configured_cancel_and_notify_actions() -> None:
    warned = [
        alert(200, ALERT_WARNING_1, T0 - MIN * 60),
        alert(200, ALERT_WARNING_2, T0 - MIN * 15),
    ]
    cancel = only(propose(JOB, [never_busy(130)], warned, IdleGpuSettings(action="cancel")))
    assert cancel.kind == "cancel"
    notice = only(propose(JOB, [never_busy(130)], warned, IdleGpuSettings(action="notify")))
    assert notice.kind == "warn" and notice.alert == ALERT_NOTICE


def test_the_action_is_proposed_once_per_idle_window() -> None:
    warned = [
        alert(200, ALERT_WARNING_1, T0 - MIN * 60),
        alert(200, ALERT_WARNING_2, T0 - MIN * 20),
    ]
    done = [*warned, alert(200, ALERT_REQUEUE, T0 - MIN * 5)]
    assert propose(JOB, [never_busy(140)], done) == []
    by_kind = [*warned, alert(200, "requeue", T0 - MIN * 5)]
    assert propose(JOB, [never_busy(140)], by_kind) == []


def test_alerts_of_other_policies_or_jobs_do_not_count() -> None:
    foreign = [
        alert(200, ALERT_WARNING_1, T0 - MIN * 60, policy="other"),
        alert(201, ALERT_WARNING_1, T0 - MIN * 60),
    ]
    assert only(propose(JOB, [never_busy(130)], foreign)).alert == ALERT_WARNING_1


def test_gpu_fraction_threshold() -> None:
    job = running_job(200, started=timedelta(hours=6), gpus={"gpu1": (0, 1, 2, 3)})
    half = [never_busy(90, index=0), never_busy(70, index=1), gpu(index=2), gpu(index=3)]
    assert propose(job, half) == []  # default: every GPU must be idle
    a = only(propose(job, half, settings=IdleGpuSettings(idle_fraction=0.5)))
    assert a.alert == ALERT_WARNING_1 and a.numbers["idle_gpus"] == 2
    assert a.numbers["idle_minutes"] == 70.0  # the 2nd longest idle GPU sets the window
    assert a.numbers["allocated_gpus"] == 4
    assert propose(job, half, settings=IdleGpuSettings(idle_fraction=0.75)) == []


def test_multi_node_jobs_count_gpus_across_nodes() -> None:
    job = running_job(200, started=timedelta(hours=6), gpus={"gpu1": (0, 1), "gpu2": (0, 1)})
    stats = [never_busy(70, n, i) for n in ("gpu1", "gpu2") for i in (0, 1)]
    a = only(propose(job, stats))
    assert a.numbers["idle_gpus"] == 4 and a.numbers["allocated_gpus"] == 4
    # a GPU of another job on the same node does not stand in for a missing one
    stats[3] = never_busy(70, "gpu2", 5)
    assert propose(job, stats) == []


def test_gpus_without_samples_are_unknown_never_idle() -> None:
    job = running_job(200, started=timedelta(hours=6), gpus={"gpu1": (0, 1)})
    no_agent = [never_busy(130, index=0), gpu(index=1, samples=0, util=None, idle=MIN * 130)]
    assert propose(job, no_agent) == []
    assert propose(job, [never_busy(130, index=0)]) == []  # second GPU missing entirely
    stale = gpu(idle=MIN * 130, never_busy=True, last_sample_at=T0 - MIN * 30)
    assert propose(JOB, [stale]) == []
    too_few = gpu(idle=MIN * 130, never_busy=True, samples=1)
    assert propose(JOB, [too_few]) == []


def test_interactive_and_exempt_partition_jobs_are_not_considered() -> None:
    interactive = running_job(200, started=timedelta(hours=6), batch=False)
    assert propose(interactive, [never_busy(130)]) == []
    allowed = IdleGpuSettings(exempt_interactive=False)
    assert only(propose(interactive, [never_busy(130)], settings=allowed)).kind == "warn"
    debug = running_job(200, started=timedelta(hours=6), partition="debug")
    assert (
        propose(
            debug,
            [never_busy(130)],
            settings=IdleGpuSettings(exempt_partitions=frozenset({"debug"})),
        )
        == []
    )


def test_non_running_and_shard_only_jobs_and_jobs_without_usage_are_skipped() -> None:
    suspended = running_job(200, state=JobState.SUSPENDED)
    assert propose(suspended, [never_busy(130)]) == []
    shards = running_job(200, gpus={}, gpu_allocations=())
    assert propose(shards, [never_busy(130)]) == []
    snap = snapshot([JOB])
    assert IdleGpuPolicy().propose(snap) == []


def test_an_array_task_is_addressed_as_a_task() -> None:
    task = running_job(205, started=timedelta(hours=6), array_job_id=200, array_task_id=0)
    assert only(propose(task, [never_busy(61)])).slurm_id == "200_0"


def test_a_single_warning_ladder_when_the_second_is_off() -> None:
    one = IdleGpuSettings(second_warn_after=None)
    w1 = [alert(200, ALERT_WARNING_1, T0 - MIN * 60)]
    assert only(propose(JOB, [never_busy(121)], w1, one)).kind == "requeue"

"""The replay's plan (sim/replayplan.py), its stand-in's rate table (lab/replayload.py) and
its watcher's bookkeeping (lab/replay.py's Replayer over a scripted Slurm listing)."""

from __future__ import annotations

import math
import time
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from slurmgpu.config import parse_settings
from slurmgpu.lab.replay import (
    Observed,
    Replayer,
    Submission,
    TxSeen,
    ctld_timeline,
    first_calculation_s,
    toml_text,
)
from slurmgpu.lab.replayload import parse_rates, rate_at
from slurmgpu.model import GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.policy.settings import AttainedServiceSettings, MalleableSettings
from slurmgpu.sim.replayplan import (
    ReplayError,
    ReplayJob,
    outcomes,
    plan_replay,
    policy_sections,
    render,
    summarise,
)
from slurmgpu.sim.workload import MalleableRange, RigidJob, TraceJob

USERS = [f"sgpu-u{i}" for i in range(1, 9)]


def rigid(submit_s: float, duration_s: float, gpus: int, user: str = "user1") -> TraceJob:
    return TraceJob(
        submit_s=submit_s,
        name=f"j{submit_s:g}",
        user=user,
        model=RigidJob(duration_s, gpus),
        gpus=gpus,
        malleable=MalleableRange(1, 8),
        time_limit_s=3 * duration_s,
    )


def test_plan_compresses_arrivals_and_speeds_and_keeps_the_work() -> None:
    trace = [rigid(100, 600, 2, "user3"), rigid(400, 1200, 4, "user9"), rigid(700, 60, 1)]
    jobs = plan_replay(trace, compression=10, users=USERS)
    assert [j.at_s for j in jobs] == [0.0, 30.0, 60.0]
    assert [j.user for j in jobs] == ["sgpu-u3", "sgpu-u1", "sgpu-u1"]  # user9 wraps
    first = jobs[0]
    assert first.work == 600 and first.gpus == 2
    assert (first.min_gpus, first.max_gpus) == (1, 4)  # capped to one 4-GPU node
    assert first.run_s == pytest.approx(60.0)  # 600 s of the trace, 10x faster
    assert first.rates[1] == pytest.approx(10.0)  # at its own size: C units per second
    assert first.rates[3] > first.rates[1] > first.rates[0]  # Amdahl: faster, sublinear
    assert first.time_limit_s == pytest.approx(180.0)  # 3x the run, compressed
    assert first.rates_text().startswith("1:")


def test_plan_slices_by_count_and_window_and_leaves_out_long_jobs() -> None:
    trace = [rigid(t, 100, 1) for t in (0, 10, 20, 30)] + [rigid(40, 100_000, 1)]
    assert len(plan_replay(trace, compression=1, users=USERS, first=2)) == 2
    assert len(plan_replay(trace, compression=1, users=USERS, window_s=15)) == 2
    kept = plan_replay(trace, compression=1, users=USERS, max_run_s=1000)
    assert len(kept) == 4 and [j.index for j in kept] == [0, 1, 2, 3]
    # a job the one-node cap makes slower than its trace limit still gets twice its run
    capped = plan_replay([rigid(0, 100, 16)], compression=1, users=USERS)[0]
    assert capped.time_limit_s >= 2 * capped.run_s > 300


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compression": 0}, "compression factor"),
        ({"compression": math.inf}, "compression factor"),
        ({"compression": 2, "users": []}, "no users"),
        ({"compression": 2, "first": 0}, "at least 1"),
        ({"compression": 2, "window_s": -1}, "no job"),
        ({"compression": 2, "max_run_s": 1}, "longer than"),
    ],
)
def test_plan_refuses_a_bad_slice_in_one_line(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"users": USERS, **kwargs}
    with pytest.raises(ReplayError, match=message):
        plan_replay([rigid(0, 100, 1)], **args)  # type: ignore[arg-type]


def test_policy_sections_enforce_the_set_and_compress_its_pacing() -> None:
    sections = policy_sections("malleable", 60)
    text = toml_text(sections)
    parsed = tomllib.loads(text)
    assert parsed["policy"]["malleable"]["mode"] == "enforce"
    assert {parsed["policy"][p]["mode"] for p in ("idle_gpu", "rightsize", "colocate", "las")} == {
        "observe"
    }
    # the daemon's own settings reader takes them; 10 min of trace time is 10 s here
    m = MalleableSettings.from_mapping(parsed["policy"]["malleable"])
    assert m.min_interval.total_seconds() == 10
    las = AttainedServiceSettings.from_mapping(parsed["policy"]["las"])
    assert not las.enabled and las.queue_limits == pytest.approx((16 / 60,))
    every = tomllib.loads(toml_text(policy_sections("all", 60)))["policy"]
    assert {every[p]["mode"] for p in ("idle_gpu", "rightsize", "colocate", "las")} == {"enforce"}
    assert every["las"]["enabled"] is True
    assert tomllib.loads(toml_text(policy_sections("slurm", 2)))["policy"]["malleable"]["mode"] == (
        "observe"
    )
    with pytest.raises(ReplayError, match="unknown policy set"):
        policy_sections("tiresias", 60)


@pytest.mark.parametrize(
    "policy_set", ["slurm", "rightsize", "colocate", "malleable", "las", "all"]
)
def test_every_sets_sections_are_a_config_the_daemon_reads(policy_set: str) -> None:
    settings = parse_settings(toml_text(policy_sections(policy_set, 60)))
    modes = {
        "idle_gpu": settings.policy.idle_gpu.mode,
        "rightsize": settings.policy.rightsize.mode,
        "colocate": settings.policy.colocate.mode,
        "las": settings.policy.las.mode,
        "malleable": settings.policy.malleable.mode,
    }
    enforced = {name for name, mode in modes.items() if mode == "enforce"}
    expected = {
        "slurm": set(),
        "all": set(modes),
    }.get(policy_set, {policy_set})
    assert enforced == expected
    assert settings.policy.las.enabled is ("las" in expected)


def test_rates_table_of_the_stand_in() -> None:
    rates = parse_rates("1:0.5,2:0.9,4:1.5")
    assert rates == {1: 0.5, 2: 0.9, 4: 1.5}
    assert rate_at(rates, 3) == 0.9 and rate_at(rates, 8) == 1.5 and rate_at(rates, 0) == 0.5
    for bad in ("", "1", "0:1", "1:-1", "x:1"):
        with pytest.raises(ValueError, match="--rates"):
            parse_rates(bad)


def _observed(index: int, **kw: object) -> Observed:
    return replace(Observed(index, "cifar10", "sgpu-u1"), **kw)  # type: ignore[arg-type]


def test_outcomes_count_resizes_and_preemptions_and_summarise() -> None:
    resize = TxSeen("malleable", "running", 4, 2, {"checkpoint": 1.0, "total": 6.0})
    las = TxSeen("las", "ended", 4, 4, {})
    aborted = TxSeen("malleable", "aborted", 4, 2, {})
    rows = outcomes(
        [
            _observed(
                0,
                job_id=1,
                submitted_s=0.0,
                started_s=1.0,
                ended_s=11.0,
                state="COMPLETED",
                gpu_seconds=3600.0,
                restarts=3,
                transactions=(resize, las, aborted),
            ),
            _observed(
                1,
                job_id=2,
                submitted_s=5.0,
                started_s=6.0,
                ended_s=35.0,
                state="COMPLETED",
                gpu_seconds=36.0,
            ),
            _observed(2, job_id=3, submitted_s=6.0, state="unfinished"),
        ]
    )
    assert [(r.resizes, r.preemptions) for r in rows] == [(1, 2), (0, 0), (0, 0)]
    # restarts 3: the resize's, LAS's and one no transaction explains (Slurm's QOS)
    assert rows[0].gpu_hours == 1.0 and rows[0].phases == ({"checkpoint": 1.0, "total": 6.0},)
    s = summarise(rows)
    assert (s.jobs, s.finished) == (3, 2)
    assert s.avg_jct_s == pytest.approx(20.5)  # (11 + 30) / 2: the finished only
    assert s.makespan_s == pytest.approx(35.0)
    assert s.phase_medians_s == {"checkpoint": 1.0, "total": 6.0}
    table = render(rows, s)
    assert "2/3 finished" in table and "unfinished" in table
    assert math.isnan(summarise([rows[2]]).avg_jct_s)


class _Slurm:
    """A scripted squeue: ``frames[i]`` is what the i-th listing shows."""

    def __init__(self, frames: Sequence[Sequence[Job]]) -> None:
        self.frames = list(frames)
        self.calls = 0

    def jobs(self) -> list[Job]:
        frame = self.frames[min(self.calls, len(self.frames) - 1)]
        self.calls += 1
        return list(frame)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _job(state: JobState, gpus: int, start: float | None, end: float | None = None) -> Job:
    def ts(v: float | None) -> datetime | None:
        return datetime.fromtimestamp(v, UTC) if v is not None else None

    return Job(
        job_id=7,
        name="cifar10",
        user="sgpu-u1",
        state=state,
        start_time=ts(start),
        end_time=ts(end),
        gpu_allocations=(NodeGpuAllocation("gpu1", tuple(range(gpus))),)
        if state is JobState.RUNNING
        else (),
    )


def test_replayer_integrates_gpu_time_from_slurms_start_and_end() -> None:
    clock = _Clock()
    job = ReplayJob(0, "cifar10", "sgpu-u1", 0.0, 4, 1, 4, 10.0, (1.0,) * 4, 60.0, 10.0)
    frames = [
        [_job(JobState.PENDING, 4, None)],
        [_job(JobState.RUNNING, 4, 1000.5)],  # started half a second after submission
        [_job(JobState.RUNNING, 2, 1001.5)],  # resized between polls: 2 GPUs now
        [_job(JobState.COMPLETED, 2, 1001.5, 1002.5)],
        [_job(JobState.COMPLETED, 2, 1001.5, 1002.5)],
    ]
    submitted: list[Submission] = []

    def submit(s: Submission) -> int:
        submitted.append(s)
        return 7

    replayer = Replayer(
        submit,
        _Slurm(frames),  # type: ignore[arg-type]
        clock=clock,
        sleep=clock.sleep,
    )
    (o,) = replayer.run([job], timeout_s=60)
    assert submitted == [job]
    assert o.state == "COMPLETED" and o.job_id == 7
    assert (o.submitted_s, o.started_s, o.ended_s) == (0.0, 0.5, 2.5)
    # 4 GPUs from 1000.5 to the poll at 1001, 4 to 1002 (held at the last poll), 2 to 1002.5
    assert o.gpu_seconds == pytest.approx(4 * 0.5 + 4 * 1.0 + 2 * 0.5)


def test_a_job_that_ran_between_two_polls_is_counted_from_slurms_times() -> None:
    clock = _Clock()
    job = ReplayJob(0, "ncf", "sgpu-u1", 0.0, 1, 1, 1, 1.0, (1.0,), 60.0, 1.0)
    done = replace(_job(JobState.COMPLETED, 0, 1000.2, 1000.6), gpus=GpuRequest(gpus=1))
    replayer = Replayer(
        lambda s: 7,
        _Slurm([[_job(JobState.PENDING, 1, None)], [done]]),  # type: ignore[arg-type]
        clock=clock,
        sleep=clock.sleep,
    )
    (o,) = replayer.run([job], timeout_s=60)
    assert o.state == "COMPLETED"
    assert o.started_s == pytest.approx(0.2) and o.ended_s == pytest.approx(0.6)
    assert o.gpu_seconds == pytest.approx(0.4)


def test_replayer_stops_at_its_deadline_and_reports_what_was_left() -> None:
    clock = _Clock()
    job = ReplayJob(0, "x", "sgpu-u1", 0.0, 1, 1, 1, 1.0, (1.0,), 60.0, 1.0)
    late = replace(job, index=1, at_s=1e9)
    cancelled: list[list[Observed]] = []

    class Replay(Replayer):
        def _cancel(self, left: Sequence[Observed]) -> None:
            cancelled.append(list(left))
            super()._cancel([])  # nothing real to scancel
            for o in left:
                o.state = "unfinished"

    replayer = Replay(
        lambda s: 7,
        _Slurm([[_job(JobState.RUNNING, 1, 1000.0)]]),  # type: ignore[arg-type]
        clock=clock,
        sleep=clock.sleep,
    )
    first, second = replayer.run([job, late], timeout_s=5)
    assert first.state == "unfinished" and [o.job_id for o in cancelled[0]] == [7]
    assert second.state == "not submitted" and second.job_id is None


def test_first_calculation_is_read_off_the_labs_slurmctld_log() -> None:
    # 22.05 site lab: the decay thread started at :57.169, the first job came at :02.072
    # of the next minute; calculations every 60 s from the thread's start
    log = "\n".join(
        [
            "[2026-12-07T05:23:56.164] slurmctld version 22.05.8 started on cluster lab",
            "[2026-12-07T05:23:57.169] priority/multifactor: _read_last_decay_ran: No last "
            "decay (/tmp/x/state/priority_last_decay_ran) to recover",
            "a line without a time",
            "[2026-12-07T05:24:02.072] _slurm_rpc_submit_batch_job: JobId=1 InitPrio=210000",
        ]
    )
    assert first_calculation_s(log, 60.0) == pytest.approx(55.097)
    # no decay line (another release's wording): slurmctld's start stands in
    no_decay = "\n".join(line for line in log.splitlines() if "decay" not in line)
    assert first_calculation_s(no_decay, 60.0) == pytest.approx(54.092)
    assert first_calculation_s("[2026-12-07T05:23:56.164] started on cluster lab", 60) is None
    assert first_calculation_s("", 60.0) is None


def test_ctld_timeline_reads_submissions_priorities_and_runs() -> None:
    log = "\n".join(
        [
            "[2026-12-07T05:23:47.508] slurmctld version 26.05.5 started on cluster lab(0)",
            "[2026-12-07T05:23:53.757] _slurm_rpc_submit_batch_job: JobId=1 "
            "SLUID=s541M97FAR8W00 InitPrio=210000 usec=1078",
            "[2026-12-07T05:23:54.000] sched: Allocate JobId=1 NodeList=gpu1 #CPUs=1",
            "[2026-12-07T05:24:10.000] _job_complete: JobId=1 WTERMSIG 15",
            "[2026-12-07T05:24:10.001] _job_complete: JobId=1 done",
            "[2026-12-07T05:24:26.901] sched/backfill: _start_job: Started JobId=1 in gpu on gpu2",
            "[2026-12-07T05:24:30.000] _job_complete: JobId=1 done",
            "[2026-12-07T05:24:31.000] sched: Allocate JobId=2 NodeList=gpu1 #CPUs=1",
        ]
    )
    timeline = ctld_timeline(log)
    assert timeline.decay_start == datetime(2026, 12, 7, 5, 23, 47, 508000)  # no decay line
    assert timeline.submitted == {1: (datetime(2026, 12, 7, 5, 23, 53, 757000), 210000)}
    (first, second) = timeline.runs[1]
    assert first == (datetime(2026, 12, 7, 5, 23, 54), datetime(2026, 12, 7, 5, 24, 10, 1000))
    assert second[1] == datetime(2026, 12, 7, 5, 24, 30)
    assert timeline.runs[2] == [(datetime(2026, 12, 7, 5, 24, 31), None)]  # still running


def test_replayer_submits_each_job_at_its_time_not_at_its_next_poll() -> None:
    """Arrivals between two polls are submitted when due (on a fixed 1 s tick they were
    0-1.2 s late, 60 trace s each at C = 60); Slurm is still listed once a poll."""

    class Clock(_Clock):  # lets the submitting threads run between fake sleeps
        def sleep(self, s: float) -> None:
            time.sleep(0.01)
            super().sleep(s)

    clock = Clock()
    first = ReplayJob(0, "ncf", "sgpu-u1", 0.0, 1, 1, 1, 1.0, (1.0,), 60.0, 1.0)
    second = replace(first, index=1, at_s=0.3)
    done = replace(_job(JobState.COMPLETED, 0, 1000.5, 1000.9), job_id=8)
    slurm = _Slurm([[], [_job(JobState.COMPLETED, 0, 1000.2, 1000.6), done]])
    replayer = Replayer(
        lambda s: 7 if s.index == 0 else 8,
        slurm,  # type: ignore[arg-type]
        clock=clock,
        sleep=clock.sleep,
    )
    a, b = replayer.run([first, second], timeout_s=60)
    assert a.submitted_s == 0.0 and b.submitted_s == pytest.approx(0.3)
    assert a.state == b.state == "COMPLETED"
    assert slurm.calls == 3  # at 0, 1 and 2 s (an end holds one poll): none at 0.3 s

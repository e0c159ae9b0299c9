"""A replay's per-job costs read off a slurmctld log (lab.jobcosts): start-up, the
submission delay of jobs that had room, and the COMPLETING hold before a waiting job."""

from __future__ import annotations

import pytest

from slurmgpu.lab.jobcosts import JobCostSamples, PlannedJob, job_cost_samples
from slurmgpu.lab.replay import ctld_timeline

# One 4-GPU node. Job 1 (4 GPUs, 10 s planned) is submitted to an empty node and starts
# 1.5 s later; job 2 (2 GPUs) arrives while job 1 holds the node and starts 0.8 s after
# job 1's end; job 3 (2 GPUs) arrives with job 2 running and 2 GPUs free, but job 4
# (1 GPU) waits before it: no submission-delay sample for job 3 then.
LOG = "\n".join(
    [
        "[2026-12-07T10:00:00.000] slurmctld version 22.05.8 started on cluster lab",
        "[2026-12-07T10:00:01.000] _slurm_rpc_submit_batch_job: JobId=1 InitPrio=1 usec=1",
        "[2026-12-07T10:00:02.500] sched: Allocate JobId=1 NodeList=gpu1 #CPUs=1 Partition=gpu",
        "[2026-12-07T10:00:05.000] _slurm_rpc_submit_batch_job: JobId=2 InitPrio=1 usec=1",
        "[2026-12-07T10:00:13.100] _job_complete: JobId=1 done",
        "[2026-12-07T10:00:13.900] sched: Allocate JobId=2 NodeList=gpu1 #CPUs=1 Partition=gpu",
        "[2026-12-07T10:00:14.000] _slurm_rpc_submit_batch_job: JobId=4 InitPrio=1 usec=1",
        "[2026-12-07T10:00:15.000] _slurm_rpc_submit_batch_job: JobId=3 InitPrio=1 usec=1",
        "[2026-12-07T10:00:16.000] sched/backfill: _start_job: Started JobId=4 in gpu on gpu1",
        "[2026-12-07T10:00:16.000] sched/backfill: _start_job: Started JobId=3 in gpu on gpu1",
        "[2026-12-07T10:00:30.000] _job_complete: JobId=2 done",
    ]
)
PLANNED = {
    1: PlannedJob(4, 10.0),
    2: PlannedJob(2, 15.0),
    3: PlannedJob(2, None),
    4: PlannedJob(1, None),
}


def test_the_three_costs_come_from_the_jobs_that_show_them() -> None:
    samples = job_cost_samples(ctld_timeline(LOG), PLANNED, gpus_per_node=4)
    assert samples.startup == pytest.approx((0.6, 1.1))  # 10.6 - 10, 16.1 - 15
    # job 1 had the node; job 4 had room and nobody before it; job 3 had room but job 4
    # (1 GPU, which fits) waited before it; job 2 had no room
    assert sorted(samples.submit_delay) == pytest.approx([1.5, 2.0])
    assert samples.completing == pytest.approx((0.8,))  # job 1's end -> job 2's start


def test_the_timeline_keeps_each_runs_nodes_and_jobs_not_planned_are_left_out() -> None:
    timeline = ctld_timeline(LOG)
    assert timeline.nodes[1] == ["gpu1"] and timeline.nodes[4] == ["gpu1"]
    samples = job_cost_samples(timeline, {1: PLANNED[1]}, gpus_per_node=4)
    assert samples.completing == () and samples.startup == pytest.approx((0.6,))


def test_samples_pool_and_print_one_line_per_cost() -> None:
    a = JobCostSamples((0.5,), (1.5,), ())
    pooled = a + JobCostSamples((0.7,), (), (0.9,))
    assert pooled.medians() == {
        "first_startup": pytest.approx(0.6),
        "submit_delay": 1.5,
        "completing": 0.9,
    }
    lines = pooled.lines()
    assert len(lines) == 3 and "median of 2" in lines[0] and "0.90 s" in lines[2]
    assert "no job shows it" in a.lines()[2]

"""Does an agent's sample fit where and when its job ran? One rule for every sample.

A node's agent is authenticated as its node, but which job and GPU it names, and when, is
only its word. A sample of a job is kept when the job ran on the posting node, on that GPU
(one of the job's GPU or shard indices on the node, where Slurm said which), within the
job's run: from its start to its end (now, while it runs), give or take ``RUN_SKEW_S``
of clock difference between the node and slurmctld. The same rule is applied to samples
of jobs the daemon knows at ingest and to held samples once their job is listed
(store/sample_hold.py), so a sample is not kept or dropped by when it happened to arrive.

A job requeued since its samples were taken has a new start (and maybe other nodes): the
start is not checked for a job restarted at least once, or its first run's late samples
(a spool emptied) would be dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurmgpu.model import Job

__all__ = ["NOT_ON_NODE", "RUN_SKEW_S", "JobRun", "job_run", "misfit"]

# Seconds a sample may lie before the job's start or after its end: node clocks and
# slurmctld's differ a little (NTP keeps them within milliseconds; this is for a node
# without it), and Slurm's times are whole seconds.
RUN_SKEW_S = 60.0

NOT_ON_NODE = "job not on node"
GPU_NOT_ALLOCATED = "GPU not allocated to job"
OUTSIDE_RUN = "outside the job's run"


@dataclass(frozen=True, slots=True)
class JobRun:
    """Where and when one job (one incarnation of its id) ran, as Slurm listed it.

    ``gpus``: the GPU indices (shards' devices included) the job held, by node; a node
    missing from it means Slurm did not say, and any GPU of the node passes. ``start``
    None: not checked (unknown, or the job was requeued); ``end`` None: still running.
    """

    nodes: frozenset[str]
    gpus: Mapping[str, frozenset[int]] = field(default_factory=dict)
    start: float | None = None
    end: float | None = None


def job_run(job: Job) -> JobRun | None:
    """The run of a listed or stored job; None when it has not run anywhere (yet).

    A pending job's start and a running job's end are Slurm's projections, not facts:
    only a job with nodes has run, and only a finished one has an end.
    """
    if not job.nodes:
        return None
    gpus: dict[str, frozenset[int]] = {}
    for alloc in job.gpu_allocations:
        indices = (
            frozenset(alloc.gpu_indices)
            | frozenset(alloc.shard_indices)
            | frozenset(alloc.mps_indices)
        )
        if indices:
            gpus[alloc.node] = gpus.get(alloc.node, frozenset()) | indices
    start = job.start_time.timestamp() if job.start_time and not job.restart_count else None
    end = job.end_time.timestamp() if job.end_time and job.state.is_terminal else None
    return JobRun(nodes=frozenset(job.nodes), gpus=gpus, start=start, end=end)


def _misfit_one(run: JobRun, node: str, gpu_index: int | None, at: float) -> str:
    if node not in run.nodes:
        return NOT_ON_NODE
    held = run.gpus.get(node)
    if gpu_index is not None and held is not None and gpu_index not in held:
        return GPU_NOT_ALLOCATED
    if run.start is not None and at < run.start - RUN_SKEW_S:
        return OUTSIDE_RUN
    if run.end is not None and at > run.end + RUN_SKEW_S:
        return OUTSIDE_RUN
    return ""


def misfit(runs: Sequence[JobRun], node: str, gpu_index: int | None, at: float) -> str:
    """Why a sample of a job with these runs does not fit ('' when it fits one of them).

    ``gpu_index`` None for a host sample. With several runs (a reused job id) the sample
    fits when it fits any; else the reason is the first run's.
    """
    first = ""
    for run in runs:
        reason = _misfit_one(run, node, gpu_index, at)
        if not reason:
            return ""
        first = first or reason
    return first or NOT_ON_NODE

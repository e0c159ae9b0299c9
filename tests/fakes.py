"""A faithful in-memory SlurmClient for unit tests (same protocol as the real backends)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta

from slurmgpu.intent import (
    Intent,
    NarrowToShards,
    Preempt,
    Resize,
    SetAdminComment,
    SetComment,
    SetCpus,
    SetGpus,
    SetMemoryPerNode,
    SetNice,
    SetNodes,
    SetTimeLimit,
)
from slurmgpu.model import GpuRequest, Job, JobState, Node
from slurmgpu.slurm.client import SlurmCommandError, SlurmError


def apply_intents(job: Job, intents: Sequence[Intent]) -> Job:
    """``job`` as squeue lists it after an update that carried ``intents`` (the changes a
    listing shows; a start time or CPUs per node leave it as it was)."""
    for i in intents:
        if isinstance(i, Resize | Preempt):
            raise SlurmCommandError(f"{type(i).__name__} is no scontrol update")
        if isinstance(i, SetTimeLimit):
            job = replace(job, time_limit=i.limit)
        elif isinstance(i, SetComment):
            job = replace(job, comment=i.text)
        elif isinstance(i, SetAdminComment):
            job = replace(job, admin_comment=i.text)
        elif isinstance(i, SetNice):
            job = replace(job, nice=i.nice)
        elif isinstance(i, SetCpus):
            job = replace(job, cpus=i.count)
        elif isinstance(i, SetMemoryPerNode):
            job = replace(job, memory_mib=i.mib * max(job.node_count, 1))
        elif isinstance(i, SetNodes):
            job = replace(job, node_count=i.count)
        elif isinstance(i, SetGpus) and i.per_node:
            n = i.count * max(job.node_count, 1)
            gpus = GpuRequest(gpus=n, per_node=i.count, gpu_type=i.gpu_type)
            job = replace(job, gpus=replace(gpus, sources=("tres_per_node",)))
        elif isinstance(i, SetGpus):
            gpus = GpuRequest(gpus=i.count, per_job=i.count, gpu_type=i.gpu_type)
            job = replace(job, gpus=replace(gpus, sources=("tres_per_job",)))
        elif isinstance(i, NarrowToShards):
            shards = GpuRequest(shards=i.shards, shards_per_node=i.shards)
            job = replace(job, gpus=replace(shards, sources=("tres_per_node",)))
    return job


class FakeSlurm:
    """Holds jobs and nodes in memory and applies what is done to them as Slurm would show it
    in the next listing; ``fail_with`` makes the next listings raise, ``update_fails_with``
    the next updates (after they are recorded, as a refused ``scontrol update``), and
    ``before_next_listing`` runs once as the next job listing starts (what happens
    meanwhile elsewhere: a disk filling up; or, raising, a bug on a record).

    ``calls`` names every call, listings and actions alike, in order; ``actions`` holds each
    action as ``(call, "<job id>[ <detail>]")``; ``updates`` the intents of each update that
    Slurm took.

    Also an ``AccountingClient``: ``accounting`` (job id → Job, as ``sacct`` would report
    it) answers :meth:`finished_jobs`; ``None`` (the default) behaves like a cluster with
    accounting storage disabled (``[]``), and ``accounting_fail_with`` makes it raise.
    """

    def __init__(
        self,
        jobs: Sequence[Job] = (),
        nodes: Sequence[Node] = (),
        accounting: Mapping[int, Job] | None = None,
    ) -> None:
        self._jobs: dict[int, Job] = {j.job_id: j for j in jobs}
        self._nodes = list(nodes)
        self.fail_with: SlurmError | None = None
        self.accounting: dict[int, Job] | None = None if accounting is None else dict(accounting)
        self.accounting_fail_with: BaseException | None = None
        self.sacct_queries: list[list[int]] = []
        self.calls: list[str] = []
        self.actions: list[tuple[str, str]] = []
        self.updates: list[tuple[int, tuple[Intent, ...]]] = []
        self.update_fails_with: SlurmError | None = None
        self.before_next_listing: Callable[[], None] | None = None
        self._next_id = max(self._jobs, default=0) + 1

    def _act(self, call: str, job_id: str | int, detail: str = "") -> None:
        self.calls.append(call)
        self.actions.append((call, f"{job_id} {detail}" if detail else str(job_id)))

    def set_jobs(self, jobs: Sequence[Job]) -> None:
        self._jobs = {j.job_id: j for j in jobs}

    def version(self) -> str:
        return "22.05.8"

    def jobs(self) -> list[Job]:
        self.calls.append("jobs")
        if (meanwhile := self.before_next_listing) is not None:
            self.before_next_listing = None
            meanwhile()
        if self.fail_with is not None:
            raise self.fail_with
        return list(self._jobs.values())

    def nodes(self) -> list[Node]:
        self.calls.append("nodes")
        if self.fail_with is not None:
            raise self.fail_with
        return list(self._nodes)

    def finished_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        self.calls.append("finished_jobs")
        self.sacct_queries.append(list(job_ids))
        if self.accounting_fail_with is not None:
            raise self.accounting_fail_with
        if self.accounting is None:
            return []
        found = (self.accounting.get(i) for i in dict.fromkeys(job_ids))
        return [j for j in found if j is not None and j.state.is_terminal]

    def submit(
        self,
        sbatch_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> int:
        self.calls.append("submit")
        job_id = self._next_id
        self._next_id += 1
        self._jobs[job_id] = Job(job_id=job_id, name="job", user="u", state=JobState.PENDING)
        return job_id

    def _get(self, job_id: str | int) -> Job:
        try:
            return self._jobs[int(job_id)]
        except (KeyError, ValueError):
            raise SlurmCommandError(f"Invalid job id specified: {job_id}") from None

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        """Applies the intents to the listed job (:func:`apply_intents`) and records them."""
        self._act("update", job_id, repr(intents))
        if self.update_fails_with is not None:
            raise self.update_fails_with
        job = self._get(job_id)
        if not intents:
            raise SlurmCommandError("scontrol update: no fields to update")
        self._jobs[job.job_id] = apply_intents(job, intents)
        self.updates.append((job.job_id, tuple(intents)))

    def hold(self, job_id: str | int) -> None:
        self._act("hold", job_id)
        self._get(job_id)

    def release(self, job_id: str | int) -> None:
        self._act("release", job_id)
        self._get(job_id)

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        self._act("requeuehold" if hold else "requeue", job_id)
        job = self._get(job_id)
        self._jobs[job.job_id] = replace(
            job, state=JobState.PENDING, restart_count=job.restart_count + 1, start_time=None
        )

    def signal(self, job_id: str | int, signal: str, *, batch_only: bool = False) -> None:
        self._act("signal", job_id, signal)
        self._get(job_id)

    def cancel(self, job_id: str | int) -> None:
        self._act("cancel", job_id)
        job = self._get(job_id)
        self._jobs[job.job_id] = replace(job, state=JobState.CANCELLED)

    def set_array_throttle(self, array_job_id: int, max_running: int) -> None:
        self._act("throttle", array_job_id, str(max_running))
        self._get(array_job_id)

    def set_time_limit(self, job_id: str | int, limit: timedelta) -> None:
        self._act("set_time_limit", job_id, str(limit))
        job = self._get(job_id)
        self._jobs[job.job_id] = replace(job, time_limit=limit)

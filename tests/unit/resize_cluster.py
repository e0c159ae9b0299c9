"""An in-memory Slurm that behaves like 22.05 for what a resize touches (same protocol).

``requeue`` leaves the job COMPLETING (RUNNING + flag) with its restart count raised, as
slurmctld does until the epilog ends; :meth:`settle` makes it PENDING (held when it was
``requeuehold``). ``update_job`` refuses jobs that are not pending; ``release`` refuses
jobs that are not held; :meth:`schedule` starts released pending jobs with the GPUs
they now ask for. Every Slurm call is recorded in ``calls``; ``kill_after`` makes one
named call raise :class:`Killed` *after* it took effect, like a daemon SIGKILLed between
its Slurm call and its database write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from slurmgpu.intent import Intent, SetNodes, SetTimeLimit, StartSoon
from slurmgpu.model import GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.slurm.client import SlurmCommandError
from tests.fakes import FakeSlurm, apply_intents

HELD = "job_requeued_in_held_state"
USER_HELD = "JobHeldUser"  # what `scontrol hold` by the job's user leaves
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


class Killed(BaseException):
    """The daemon died right after a Slurm call (BaseException: nothing catches it)."""


def gpu_job(
    job_id: int, gpus: int = 4, *, comment: str = "sgpu:malleable=2:4", **kw: object
) -> Job:
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=JobState.RUNNING,
        requeue=True,
        submit_time=T0 - timedelta(hours=1),
        start_time=T0 - timedelta(minutes=30),
        node_count=1,
        nodes=("gpu1",),
        comment=comment,
        work_dir="/tmp",
        gpus=GpuRequest(gpus=gpus, per_node=gpus, sources=("tres_per_node",)),
        gpu_allocations=(NodeGpuAllocation("gpu1", tuple(range(gpus))),),
        **kw,  # type: ignore[arg-type]
    )


class ResizeSlurm(FakeSlurm):
    def __init__(self, jobs: Sequence[Job] = ()) -> None:
        super().__init__(jobs)
        self.log: list[tuple[str, str, str]] = []  # (call, ref, detail)
        self.kill_after: str | None = None
        self.refuse_update = False
        # Like EnforcePartLimits refusing a TimeLimit past the partition's MaxTime.
        self.max_time: timedelta | None = None
        self.on_signal: dict[str, object] = {}
        self.throttles: dict[int, int] = {}

    def _ref(self, ref: str | int) -> Job:
        text = str(ref)
        if "_" in text:
            array, task = text.split("_", 1)
            for job in self._jobs.values():
                if job.array_job_id == int(array) and job.array_task_id == int(task):
                    return job
            raise SlurmCommandError(f"Invalid job id specified: {text}")
        return self._get(text)

    def _done(self, call: str, ref: str | int, detail: str = "") -> None:
        self.log.append((call, str(ref), detail))
        if self.kill_after == call:
            self.kill_after = None
            raise Killed(call)

    def job(self, job_id: int) -> Job:
        return self._jobs[job_id]

    def put(self, job: Job) -> None:
        self._jobs[job.job_id] = job

    # ---------------------------------------------------------------- protocol

    def signal_all(self, job_id: str | int, signal: str) -> None:
        job = self._ref(job_id)
        if job.state is not JobState.RUNNING:
            raise SlurmCommandError("Job is not running")
        callback = self.on_signal.get(str(job_id))
        if callable(callback):
            callback()
        self._done("signal", job_id, signal)

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        job = self._ref(job_id)
        if job.state is not JobState.RUNNING or "COMPLETING" in job.state_flags:
            raise SlurmCommandError(
                "Job is pending execution"
                if job.state is JobState.PENDING
                else "Job is not running"
            )
        self.put(
            replace(
                job,
                state_flags=frozenset({"COMPLETING"}),
                restart_count=job.restart_count + 1,
                reason=HELD if hold else "",
            )
        )
        self._done("requeuehold" if hold else "requeue", job_id)

    def settle(self) -> None:
        """Epilogs done: completing jobs become pending, keeping their held reason."""
        for job in list(self._jobs.values()):
            if "COMPLETING" in job.state_flags:
                self.put(
                    replace(
                        job,
                        state=JobState.PENDING,
                        state_flags=frozenset(),
                        gpu_allocations=(),
                        start_time=None,
                    )
                )

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        job = self._ref(job_id)
        if job.state is JobState.RUNNING and "COMPLETING" not in job.state_flags:
            self._update_running(job, intents)
            return
        if job.state is not JobState.PENDING:
            raise SlurmCommandError("Job is no longer pending execution")
        if self.refuse_update and any(not isinstance(i, StartSoon) for i in intents):
            raise SlurmCommandError("Requested node configuration is not available")
        limits = [i.limit for i in intents if isinstance(i, SetTimeLimit)]
        if limits and self.max_time is not None:
            limit = limits[-1]
            if limit is None or limit > self.max_time:
                raise SlurmCommandError(
                    "Requested time limit is invalid (missing or exceeds some limit)"
                )
        job = apply_intents(job, intents)
        self.put(job)
        self.updates.append((job.job_id, tuple(intents)))
        self._done("update", job_id, ",".join(sorted(repr(i) for i in intents)))

    def _update_running(self, job: Job, intents: Sequence[Intent]) -> None:
        """As slurmctld: a running job takes a time limit and fewer nodes (the nodes at
        the end of its list are released, with their GPUs); nothing else."""
        if self.refuse_update or any(not isinstance(i, SetNodes | SetTimeLimit) for i in intents):
            raise SlurmCommandError("Job is no longer pending execution")
        for intent in intents:
            if isinstance(intent, SetNodes):
                if not 1 <= intent.count < job.node_count:
                    raise SlurmCommandError("Requested node configuration is not available")
                job = replace(
                    job,
                    node_count=intent.count,
                    nodes=job.nodes[: intent.count],
                    gpu_allocations=job.gpu_allocations[: intent.count],
                )
            elif isinstance(intent, SetTimeLimit):
                job = replace(job, time_limit=intent.limit)
        self.put(job)
        self.updates.append((job.job_id, tuple(intents)))
        self._done("update", job.job_id, ",".join(sorted(repr(i) for i in intents)))

    def signal(self, job_id: str | int, signal: str, *, batch_only: bool = False) -> None:
        job = self._ref(job_id)
        if job.state is not JobState.RUNNING:
            raise SlurmCommandError("Job is not running")
        self._done("signal_steps", job_id, signal)

    def release(self, job_id: str | int) -> None:
        job = self._ref(job_id)
        if job.reason not in (HELD, USER_HELD):  # release lifts any hold, as scontrol does
            raise SlurmCommandError("Job is not held")
        self.put(replace(job, reason=""))
        self._done("release", job_id)

    def schedule(self, at: datetime = T0) -> None:
        for job in list(self._jobs.values()):
            if job.state is JobState.PENDING and job.reason != HELD and job.array_task_spec is None:
                n = job.gpus.gpus
                self.put(
                    replace(
                        job,
                        state=JobState.RUNNING,
                        start_time=at,
                        eligible_time=at,
                        gpu_allocations=(NodeGpuAllocation("gpu2", tuple(range(n))),),
                    )
                )

    def set_array_throttle(self, array_job_id: int, max_running: int) -> None:
        self.throttles[array_job_id] = max_running
        self._done("throttle", str(array_job_id), str(max_running))

    def held(self) -> list[int]:
        return [j.job_id for j in self._jobs.values() if j.reason == HELD]

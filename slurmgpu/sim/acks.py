"""SimSlurm's checkpoint record read as the resize executor's acknowledgement, so that
``cycle.resize.ResizeExecutor`` (the daemon's) can carry a resize out in virtual time.

A real job's runtime counts its answered requests in ``ack.json``; SimSlurm records when
a job last checkpointed (``SimSlurm.checkpointed_at``), so the count here grows by one
each time that moment is seen to change.
"""

from __future__ import annotations

from slurmgpu.elastic.spec import Ack
from slurmgpu.sim.slurm import SimSlurm

__all__ = ["SimAcks"]


class SimAcks:
    """An ``AckReader`` (``cycle.transactions``) over one SimSlurm; the state dir is unused."""

    def __init__(self, sim: SimSlurm) -> None:
        self.sim = sim
        self._seen: dict[int, tuple[float, int]] = {}

    def __call__(self, state_dir: str, job_id: int) -> Ack | None:
        at = self.sim.checkpointed_at(job_id)
        job = self.sim.all_jobs.get(job_id)
        if at is None or job is None:
            return None
        last, acks = self._seen.get(job_id, (-1.0, 0))
        if at != last:
            acks += 1
            self._seen[job_id] = (at, acks)
        return Ack(job_id, acks, job.restarts, None, None, at)

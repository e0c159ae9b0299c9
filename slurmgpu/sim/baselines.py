"""Baseline schedulers in the same harness: Tiresias' 2D-LAS and Helios' QSSF.

Both replace SimSlurm's priority order (submit order by default); neither runs a policy.

- **Tiresias** (NSDI'19), discretised two-dimensional least-attained-service, as the
  Pollux artifact configures it: two queues split at 16 GPU-hours of attained service
  (GPUs x time held); a new job enters the first queue; within a queue, arrival order.
  Preemptive: every scheduling period the jobs are taken in that order and given GPUs
  while they fit; running jobs left out are preempted the way Slurm can (checkpoint
  signal, then requeue, paying the requeue delay and the restart), see
  :func:`tiresias_preemptions`.
- **QSSF** (Helios, SC'21): shortest expected GPU time first, where the expected run
  time is the history estimate of :class:`~slurmgpu.policy.priors.Priors` (the same
  priors rightsizing uses) and, with no history, the job's time limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from slurmgpu.model import Job, JobState
from slurmgpu.policy.priors import Priors
from slurmgpu.sim.slurm import SimJob, SimSlurm

__all__ = ["TIRESIAS_THRESHOLD_GPU_S", "QssfPriority", "tiresias_key", "tiresias_preemptions"]

TIRESIAS_THRESHOLD_GPU_S = 16 * 3600.0


def tiresias_key(sim: SimSlurm) -> Callable[[SimJob, float], tuple[float, ...]]:
    """Priority key: (queue, arrival) by attained GPU service."""

    def key(job: SimJob, now: float) -> tuple[float, ...]:
        queue = 0.0 if sim.attained_gpu_s(job) < TIRESIAS_THRESHOLD_GPU_S else 1.0
        return (queue, job.submit_s)

    return key


def tiresias_preemptions(sim: SimSlurm) -> list[SimJob]:
    """Running jobs Tiresias would take GPUs from now, lowest priority first."""
    key = tiresias_key(sim)
    now = sim.now
    active = [j for j in sim.running()] + [
        j for j in sim.pending() if not j.held and j.eligible_s <= now
    ]
    active.sort(key=lambda j: (*key(j, now), j.job_id))
    free = sim.total_gpus
    keep: set[int] = set()
    for job in active:
        need = job.gpus if not job.shards else 1
        if need <= free:
            free -= need
            keep.add(job.job_id)
    waiting = any(j.job_id in keep for j in active if j.state is JobState.PENDING)
    if not waiting:
        return []
    out = [j for j in active if j.state is JobState.RUNNING and j.job_id not in keep]
    out.reverse()
    return out


class QssfPriority:
    """Shortest expected GPU time first; ``priors`` is replaced as history grows."""

    def __init__(self, sim: SimSlurm) -> None:
        self.sim = sim
        self.priors: Priors | None = None
        self._cache: dict[tuple[str, str, str], float | None] = {}

    def update(self, priors: Priors) -> None:
        self.priors = priors
        self._cache = {}

    def expected_s(self, job: Job, limit_s: float | None) -> float:
        est = None
        if self.priors is not None:
            k = (job.user, job.name, job.partition)
            if k in self._cache:
                est = self._cache[k]
            else:
                found = self.priors.estimate(job)
                est = None if found is None else found.run_time.total_seconds()
                self._cache[k] = est
        if est is not None:
            return est
        return limit_s if limit_s is not None else math.inf

    def __call__(self, job: SimJob, now: float) -> tuple[float, ...]:
        gpus = job.gpus if not job.shards else job.shards / max(1, self.sim.shards_per_gpu)
        return (self.expected_s(self.sim.job_record(job), job.time_limit_s) * max(gpus, 0.01),)

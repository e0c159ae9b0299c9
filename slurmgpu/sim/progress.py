"""SimSlurm's speed and progress model: how fast each running job works, and when it ends.

A job's rate is its workload model's rate at its placement, times its co-location speed
(``interference``: jobs sharing a GPU's shards slow each other; an MPS share or a MIG
slice as :mod:`slurmgpu.sim.sharing` models them) and its GPU type's speed
(``type_speed``); its work is folded up to ``now`` whenever the rate or a pause changes,
and its END and LIMIT events follow from the work left and its time limit. The
runtime's checkpoint and start-up costs are :class:`ElasticRuntime`'s.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from slurmgpu.model import JobState
from slurmgpu.sim.clock import EventQueue
from slurmgpu.sim.sharing import mig_speed, mps_speed
from slurmgpu.sim.state import SimJob, SimNode
from slurmgpu.sim.workload import ProfiledJob

__all__ = ["ElasticRuntime", "InterferenceModel", "ProgressModel", "TypeSpeed"]

InterferenceModel = Callable[[float, float, float, float], tuple[float, float]]
TypeSpeed = Callable[["SimJob", str], float]


@dataclass(frozen=True, slots=True)
class ElasticRuntime:
    """The user-side runtime's costs: checkpoint on a signal, start-up on every restart,
    start-up on a job's first run (``first_startup_s``: no checkpoint to load, but the
    process, its imports and its rendezvous). The defaults are the ``legacy`` cost set's
    (sim.costs: the tools start from the measured ``sim.costs.DEFAULT``)."""

    checkpoint_s: float = 20.0
    startup_s: float = 30.0
    reform_s: float = 10.0  # a shrink in place: the steps restarted on the kept nodes
    first_startup_s: float = 0.0


class ProgressModel(EventQueue):
    """Work done, rates and END/LIMIT events of running jobs."""

    interference: InterferenceModel | None
    type_speed: TypeSpeed | None
    _nodes: list[SimNode]
    _by_limit: list[tuple[float, int]]  # (start + limit, job id), running

    def _fold(self, job: SimJob) -> None:
        """Bring ``base_work`` up to now so the rate or pause can change from here."""
        if self.now > job.busy_from:
            if job.runs:
                run = job.runs[-1]
                run.used_gpu_s += (
                    (self.now - job.busy_from)
                    * run.compute_gpus
                    * job.speed
                    * job.model.util_pct
                    / 100.0
                )
            job.base_work = job.work_at(self.now)
            job.busy_from = self.now

    def attained_gpu_s(self, job: SimJob) -> float:
        """GPU-seconds the job has held so far, this run included (Tiresias' service)."""
        total = job.attained_gpu_s
        if job.state is JobState.RUNNING and job.runs:
            total += (self.now - job.runs[-1].start_s) * job.runs[-1].gpus
        return total

    def _reschedule_end(self, job: SimJob) -> None:
        job.version += 1
        self._changed(job)
        self._push_progress(job)
        self._set_limit_event(job, bump=False)

    def _push_progress(self, job: SimJob) -> None:
        """The job's END at its rate, and (a phased model) the end of its slice of
        training first, where its rate changes (:class:`~slurmgpu.sim.workload.ProfiledJob`)."""
        if job.rate <= 0:
            return
        model = job.model
        work = model.work
        left = max(0.0, work - job.base_work)
        start = max(job.busy_from, self.now)
        self._push(start + left / job.rate, self._END, job)
        if isinstance(model, ProfiledJob) and model.phases > 1:
            boundary = model.phase_end(job.base_work)
            if boundary < work:
                self._push(start + (boundary - job.base_work) / job.rate, self._PHASE, job)

    def _set_limit_event(self, job: SimJob, *, bump: bool = True) -> None:
        if bump:
            job.version += 1
            self._push_progress(job)
        self._by_limit_remove(job)
        end = job.start_s + job.time_limit_s if job.time_limit_s is not None else math.inf
        bisect.insort(self._by_limit, (end, job.job_id))
        if math.isfinite(end):
            self._push(end, self._LIMIT, job)

    def _by_limit_remove(self, job: SimJob) -> None:
        for i, (_, jid) in enumerate(self._by_limit):
            if jid == job.job_id:
                del self._by_limit[i]
                return

    def _speed(self, job: SimJob) -> float:
        """Relative speed from co-location on a shared GPU (1 = alone): a MIG slice's or
        an MPS share's cap (and, under MPS, its neighbours' contention unless there is no
        ``interference``), or the shard sharers' slowdowns."""
        if job.mig_alloc is not None:
            n, k = job.mig_alloc
            return mig_speed(job.model.util_pct, self._nodes[n].slices[k][0])
        if job.mps and job.shard_alloc is not None:
            n, g, units = job.shard_alloc
            node = self._nodes[n]
            partners = (
                [self.all_jobs[j].model.util_pct for j in node.gpu_shards[g] if j != job.job_id]
                if self.interference is not None
                else []
            )
            share = 100.0 * units / max(1, node.mps_per_gpu)
            return mps_speed(job.model.util_pct, share, partners)
        if self.interference is None or job.shard_alloc is None:
            return 1.0
        n, g, _ = job.shard_alloc
        speed = 1.0
        for other_id in self._nodes[n].gpu_shards[g]:
            if other_id == job.job_id:
                continue
            other = self.all_jobs[other_id]
            slow, _ = self.interference(
                job.model.util_pct,
                job.model.memory_mib,
                other.model.util_pct,
                other.model.memory_mib,
            )
            speed *= _as_speed(slow)
        return speed

    def _rates_for(self, jobs: Iterable[SimJob]) -> None:
        for job in jobs:
            if job.state is not JobState.RUNNING:
                continue
            self._fold(job)
            placement = job.placement if job.alloc else (1,)
            job.speed = self._speed(job)
            model = job.model
            if isinstance(model, ProfiledJob) and model.phases > 1:
                # the runtime picks its batch when it (re)starts on these GPUs, from the
                # noise scale of the slice of training it is in, and keeps it
                if job.batch_for != placement:
                    job.batch = model.phase_batch(placement, job.base_work)
                    job.batch_for = tuple(placement)
                base = model.rate_in(placement, job.batch, job.base_work)
            else:
                base = model.rate(placement)
            job.rate = base * job.speed * self.type_factor(job)
            self._reschedule_end(job)

    def _job_nodes(self, job: SimJob) -> list[int]:
        if job.shard_alloc is not None:
            return [job.shard_alloc[0]]
        if job.mig_alloc is not None:
            return [job.mig_alloc[0]]
        return [n for n, _ in job.alloc]

    def type_factor(self, job: SimJob) -> float:
        """Speed on the GPU types it holds: its slowest type's (1 without a speed model)."""
        if self.type_speed is None:
            return 1.0
        types = {self._nodes[n].gpu_type for n in self._job_nodes(job)}
        speeds = [self.type_speed(job, t) for t in types if t is not None]
        return min(speeds) if speeds else 1.0

    def _by_type(self, job: SimJob, share: float) -> dict[str, float]:
        out: dict[str, float] = {}
        if job.shard_alloc is not None or job.mig_alloc is not None:
            t = self._nodes[self._job_nodes(job)[0]].gpu_type
            if t is not None:
                out[t] = share
            return out
        for n, gpus in job.alloc:
            t = self._nodes[n].gpu_type
            if t is not None:
                out[t] = out.get(t, 0.0) + len(gpus)
        return out

    def _sharers(self, job: SimJob) -> list[SimJob]:
        if job.shard_alloc is None:
            return []
        n, g, _ = job.shard_alloc
        return [self.all_jobs[j] for j in self._nodes[n].gpu_shards[g] if j != job.job_id]


def _as_speed(slow: float) -> float:
    if not math.isfinite(slow) or slow <= 0:
        return 1.0
    return 1.0 / slow if slow >= 1.0 else slow

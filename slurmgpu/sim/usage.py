"""Per-GPU usage of the simulator's running jobs, as the agents' samples would show it.

Each running job's GPUs (node name, GPU index) are worked out once per run of the job
and kept while its placement is unchanged; each cycle only the figures that move with
time (sample count, trailing idle, last sample time) are taken. The
:class:`~slurmgpu.policy.base.JobUsage` records themselves are built when a policy
first reads them (:class:`LazyUsage`): sets without a usage-driven policy read none,
and building a ``GpuStat`` for every GPU of every running job each cycle was a large
share of a simulation's CPU time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmgpu.policy.base import GpuStat, JobUsage
from slurmgpu.sim.slurm import SimJob, SimSlurm

DEVICE_MEMORY_MIB = 32_768.0  # the simulated GPUs: V100-32GB-like, as in Pollux's testbed

_Key = tuple[
    int,
    float,
    tuple[tuple[int, tuple[int, ...]], ...],
    tuple[int, int, int] | None,
    tuple[int, int] | None,
]


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What one running job's usage is built from at one cycle."""

    where: tuple[tuple[str, int], ...]
    samples: int
    util: float
    memory_mib: float
    idle: bool
    idle_for: timedelta


class LazyUsage(Mapping[int, JobUsage]):
    """Running jobs' usage by job id, each record built on its first read."""

    __slots__ = ("_at", "_built", "_device_mib", "_inputs")

    def __init__(
        self, inputs: dict[int, _Inputs], at: datetime, device_mib: float = DEVICE_MEMORY_MIB
    ) -> None:
        self._inputs = inputs
        self._at = at
        self._device_mib = device_mib
        self._built: dict[int, JobUsage] = {}

    def __getitem__(self, job_id: int) -> JobUsage:
        built = self._built.get(job_id)
        if built is not None:
            return built
        i = self._inputs[job_id]
        stats = tuple(
            GpuStat(
                node=name,
                gpu_index=g,
                samples=i.samples,
                mean_util_pct=i.util,
                max_util_pct=i.util,
                max_memory_mib=i.memory_mib,
                memory_total_mib=self._device_mib,
                trailing_idle=i.idle_for,
                never_busy=i.idle,
                last_sample_at=self._at,
            )
            for name, g in i.where
        )
        built = self._built[job_id] = JobUsage(job_id, stats)
        return built

    def __iter__(self) -> Iterator[int]:
        return iter(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._inputs


class UsageModel:
    """Usage of ``sim``'s running jobs, sampled every ``sample_interval_s``."""

    def __init__(
        self, sim: SimSlurm, sample_interval_s: float, device_mib: float = DEVICE_MEMORY_MIB
    ) -> None:
        self.sim = sim
        self.sample_interval_s = sample_interval_s
        self.device_mib = device_mib
        # job id -> (the placement it was worked out for, its GPUs by node name)
        self._where: dict[int, tuple[_Key, tuple[tuple[str, int], ...]]] = {}

    def _gpus(self, job: SimJob) -> tuple[tuple[str, int], ...]:
        key: _Key = (
            job.job_id,
            job.start_s,
            tuple(job.alloc),
            job.shard_alloc,
            job.mig_alloc,
        )
        cached = self._where.get(job.job_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        if job.alloc:
            names = self.sim.job_record(job).nodes
            where = tuple(
                (name, g) for name, (_, gpus) in zip(names, job.alloc, strict=True) for g in gpus
            )
        elif job.shard_alloc is not None:
            # A shard job's per-process samples are on the one GPU its shards are on.
            where = ((self.sim.job_record(job).nodes[0], job.shard_alloc[1]),)
        elif job.mig_alloc is not None:
            # a MIG slice is a GPU of its own to Slurm (its index after the whole GPUs)
            gpu = self.sim.job_record(job).gpu_allocations[0].gpu_indices[0]
            where = ((self.sim.job_record(job).nodes[0], gpu),)
        else:
            where = ()
        self._where[job.job_id] = (key, where)
        return where

    def usage(self) -> LazyUsage:
        """Usage of every running job with GPUs (shard jobs included), now."""
        sim = self.sim
        now = sim.now
        running = list(sim.running())
        # Util the jobs sharing one GPU would keep it busy at alone, summed: per-process
        # samples show each its own util while the sum fits the GPU, and its time slice
        # (its util / the sum) once it does not.
        demand: dict[tuple[int, int], float] = {}
        for job in running:
            if job.shard_alloc is not None:
                key = (job.shard_alloc[0], job.shard_alloc[1])
                demand[key] = demand.get(key, 0.0) + max(job.model.util_pct, 0.0)
        inputs: dict[int, _Inputs] = {}
        live: set[int] = set()
        for job in running:
            live.add(job.job_id)
            if not job.alloc and job.shard_alloc is None and job.mig_alloc is None:
                continue
            util = job.model.util_pct
            if not job.alloc and job.shard_alloc is not None:
                summed = demand[(job.shard_alloc[0], job.shard_alloc[1])]
                util *= min(1.0, 100.0 / max(summed, 1e-9))
            elif job.mig_alloc is not None:
                util *= job.speed  # its slice caps it: at most the slice's SM share
            samples = max(1, int((now - job.start_s) // self.sample_interval_s))
            # A job whose GPUs compute nothing has been idle since it started.
            idle = job.model.util_pct <= 0
            idle_for = timedelta(seconds=now - job.start_s) if idle else timedelta(0)
            inputs[job.job_id] = _Inputs(
                self._gpus(job), samples, util, job.model.memory_mib, idle, idle_for
            )
        if len(self._where) > 2 * len(live) + 64:  # forget jobs that stopped running
            self._where = {j: v for j, v in self._where.items() if j in live}
        return LazyUsage(inputs, sim.at(now), self.device_mib)

"""One job's efficiency: what it used of what it asked for.

Pure functions, no I/O. :func:`job_efficiency` turns a :class:`~slurmgpu.model.Job` and the
store's per-GPU / per-node aggregates into a :class:`JobEfficiency` (the figures);
:mod:`slurmgpu.report.eff_advice` turns that into advice with concrete ``sbatch`` options,
:mod:`slurmgpu.report.eff_json` into the stable JSON. The thresholds are jobstats' and Job
Defense Shield's defaults (:class:`EffThresholds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from slurmgpu.gpushare import Sharing, job_equivalents
from slurmgpu.model import Job, JobState
from slurmgpu.policy.settings import ColocateSettings
from slurmgpu.policy.sizing import SizingRules
from slurmgpu.policy.slices import PartitionOffer
from slurmgpu.report.energy import JobEnergy
from slurmgpu.store.usage_query import GpuUsage, HostUsage

# "util-unknown": processes ran, but no sample could say how busy the GPU was (a MIG slice
# on a board without GPM): neither idle nor busy, and left out of the job's util.
GpuStatus = Literal["ok", "low", "idle", "no-process", "no-data", "error", "util-unknown"]
GpuRole = Literal["gpu", "shard", "unallocated"]
UsageSourceKind = Literal["samples", "summary", "none"]

# A GPU's shards where the cluster's count is not known (no node with shards recorded).
DEFAULT_SHARDS_PER_GPU = 16


@dataclass(frozen=True, slots=True)
class EffThresholds:
    """When a figure deserves a colour or a note (jobstats' and JDS' defaults).

    >>> EffThresholds().gpu_util_red_pct
    15.0
    >>> EffThresholds(idle_alert=timedelta(minutes=90)).idle_alert.total_seconds()
    5400.0

    ``sizing`` and ``colocate`` are the site's (the sizing knobs, and when a job is light
    enough to share a GPU); ``shards_per_gpu`` the cluster's, 16 where it is not known;
    ``offer`` what the job's nodes offer to share GPUs by (MIG profiles, MPS, shards), None
    where the nodes offer no MIG slice and no MPS (shards of ``shards_per_gpu`` then).
    """

    min_runtime: timedelta = timedelta(seconds=300)
    gpu_util_red_pct: float = 15.0  # at or below: red
    gpu_util_warn_pct: float = 25.0  # below: warning
    cpu_util_red_pct: float = 65.0  # below: red
    cpu_many_cores: int = 4  # the -c note needs at least this many cores on a node
    memory_note_pct: float = 70.0  # below: the --mem note
    time_note_min_elapsed: timedelta = timedelta(seconds=900)
    time_note_pct: float = 60.0  # below: the --time note
    time_red_pct: float = 10.0
    idle_alert: timedelta = timedelta(minutes=60)  # the idle policy's default
    sizing: SizingRules = field(default_factory=SizingRules)  # -c, --mem, --time, shards
    colocate: ColocateSettings = field(default_factory=ColocateSettings)  # shard note's jobs
    shards_per_gpu: int = DEFAULT_SHARDS_PER_GPU  # the cluster's, where known
    offer: PartitionOffer | None = None  # MIG slices / MPS the job's nodes offer
    energy_idle_warn_pct: float = 50.0  # at or above: the energy note is a warning
    input_cpu_busy_pct: float = 80.0  # GPUs under-used while the cores are this busy
    input_iowait_pct: float = 30.0  # ... or while the processes wait this much on I/O

    @classmethod
    def for_site(
        cls,
        sizing: SizingRules,
        colocate: ColocateSettings,
        shards_per_gpu: int | None = None,
        offer: PartitionOffer | None = None,
    ) -> EffThresholds:
        """The defaults, advising by the site's sizing rules and ``[policy.colocate]`` (the
        daemon's ``PolicySettings.sizing`` and ``.colocate``) on GPUs of
        ``shards_per_gpu`` shards (None: not known, 16): ``sgpu eff`` then suggests what
        rightsizing and co-location would set on that site."""
        return cls(
            sizing=sizing,
            colocate=colocate,
            shards_per_gpu=shards_per_gpu or DEFAULT_SHARDS_PER_GPU,
            offer=offer
            if offer is not None and (offer.mig_profiles or offer.mps_per_gpu)
            else None,
        )


DEFAULT_THRESHOLDS = EffThresholds()


@dataclass(frozen=True, slots=True)
class NodeEfficiency:
    """CPU and memory use of one of the job's nodes."""

    node: str
    samples: int
    cores: int | None  # allocated on this node
    mean_cpu_pct: float | None  # 100 = one core busy
    cpu_util_pct: float | None  # of the allocated cores
    max_memory_mib: float | None
    reported: bool  # any sample (host or GPU) from this node
    mean_iowait_pct: float | None = None  # block I/O wait, 100 = one process; None: unknown


@dataclass(frozen=True, slots=True)
class GpuEfficiency:
    """What the job did with one GPU."""

    node: str
    index: int  # Slurm's device index on the node
    role: GpuRole  # a whole GPU, a GPU the job's shards are on, or seen but not allocated
    status: GpuStatus
    samples: int
    mean_util_pct: float | None
    max_util_pct: float | None
    max_memory_mib: float | None
    memory_total_mib: float | None
    trailing_idle: timedelta | None  # idle up to the last sample; None when unknown
    ever_busy: bool
    shared: bool
    error_samples: int
    counted_as_zero: bool  # no samples or no process: counted as 0 % in the job's GPU util

    @property
    def label(self) -> str:
        return f"{self.node}:{self.index}"

    @property
    def memory_use_pct(self) -> float | None:
        if self.max_memory_mib is None or not self.memory_total_mib:
            return None
        return 100.0 * self.max_memory_mib / self.memory_total_mib


@dataclass(frozen=True, slots=True)
class JobEfficiency:
    """A job's use of its allocation, as of ``now`` (for running jobs: so far)."""

    job: Job
    now: datetime
    source: UsageSourceKind  # where the usage figures came from
    started: bool
    running: bool
    elapsed: timedelta | None
    time_use_pct: float | None
    cores: int
    cpu_util_pct: float | None  # over the cores of the nodes that reported
    cpu_memory_max_mib: float | None  # sum of the nodes' peaks
    cpu_memory_node_max_mib: float | None  # peak of the busiest node
    cpu_memory_requested_mib: int | None
    cpu_memory_use_pct: float | None
    nodes: tuple[NodeEfficiency, ...]
    gpus: tuple[GpuEfficiency, ...]
    gpus_allocated: int  # GPUs the job's GPU util is averaged over (whole, else shard GPUs)
    gpus_busy: int
    gpu_util_pct: float | None
    gpu_memory_max_mib: float | None
    gpu_memory_use_pct: float | None  # the largest share of one GPU's memory
    silent_nodes: tuple[str, ...]  # nodes of the job that sent no sample at all
    has_samples: bool
    thresholds: EffThresholds = DEFAULT_THRESHOLDS
    energy: JobEnergy | None = None  # the GPUs' energy; None when not measured
    # How the job shares GPUs and its request in GPU-equivalents (slurmgpu/gpushare.py:
    # a 1g.10gb slice 1/7, mps:50 half a GPU)
    sharing: Sharing = "gpu"
    gpu_equivalents: float = 0.0

    @property
    def counted_gpus(self) -> tuple[GpuEfficiency, ...]:
        """The GPUs ``gpu_util_pct`` averages over."""
        primary = primary_role(self.gpus)
        return tuple(g for g in self.gpus if g.role == primary and gpu_counted(g))


# -- computing --------------------------------------------------------------------------


def elapsed_of(job: Job, now: datetime) -> timedelta | None:
    """Return the job's run time: to its end when it ended, else to ``now``."""
    if job.start_time is None or job.state is JobState.PENDING:
        return None
    end = job.end_time if job.state.is_terminal and job.end_time is not None else now
    return max(end - job.start_time, timedelta(0))


def job_nodes(job: Job) -> list[str]:
    names = list(job.nodes)
    for a in job.gpu_allocations:
        if a.node not in names:
            names.append(a.node)
    return names


def _no_process(u: GpuUsage) -> bool:
    if u.max_processes is not None:
        return u.max_processes == 0
    # From a summary: an "idle" row (no process) carries no memory; a process always does.
    return u.never_busy and not u.max_memory_mib


def gpu_counted(g: GpuEfficiency) -> bool:
    return g.status not in {"no-data", "error", "util-unknown"} or g.counted_as_zero


def primary_role(gpus: Sequence[GpuEfficiency]) -> GpuRole:
    return "gpu" if any(g.role == "gpu" for g in gpus) else "shard"


def _gpu_status(u: GpuUsage, th: EffThresholds) -> GpuStatus:
    if u.samples == 0:
        return "no-data"
    if u.error_samples >= u.samples:
        return "error"
    if _no_process(u):
        return "no-process"
    if u.mean_util_pct is None:
        return "util-unknown"  # no known util sample: never_busy would read unknown as 0
    if u.never_busy or u.trailing_idle >= th.idle_alert:
        return "idle"
    if (u.mean_util_pct or 0.0) < th.gpu_util_warn_pct:
        return "low"
    return "ok"


def _gpu_roles(job: Job, usage: Sequence[GpuUsage]) -> dict[tuple[str, int], GpuRole]:
    roles: dict[tuple[str, int], GpuRole] = {}
    for a in job.gpu_allocations:
        for i in a.gpu_indices:
            roles[(a.node, i)] = "gpu"
        for i in (*a.shard_indices, *a.mps_indices):  # a share of the GPU (MPS too)
            roles.setdefault((a.node, i), "shard")
    # Without a recorded placement the GPUs the agent attributed to the job are its GPUs.
    fallback: GpuRole = "shard" if job.gpus.gpus == 0 and job.gpus.shards else "gpu"
    known = bool(roles)
    for u in sorted(usage, key=lambda u: (u.node, u.gpu_index)):
        roles.setdefault((u.node, u.gpu_index), "unallocated" if known else fallback)
    return roles


def job_efficiency(
    job: Job,
    gpu_usage: Sequence[GpuUsage],
    host_usage: Sequence[HostUsage],
    now: datetime,
    *,
    thresholds: EffThresholds = DEFAULT_THRESHOLDS,
    source: UsageSourceKind | None = None,
    energy: JobEnergy | None = None,
) -> JobEfficiency:
    """Return what ``job`` used of its allocation, from the store's aggregates."""
    th = thresholds
    elapsed = elapsed_of(job, now)
    started = elapsed is not None
    limit_s = job.time_limit.total_seconds() if job.time_limit else 0.0
    time_use = None
    if elapsed is not None and limit_s:
        time_use = 100.0 * elapsed.total_seconds() / limit_s

    hosts = {h.node: h for h in host_usage if h.samples > 0}
    gpu_by_key = {(g.node, g.gpu_index): g for g in gpu_usage}
    sampled_nodes = set(hosts) | {g.node for g in gpu_usage if g.samples > 0}
    names = job_nodes(job)
    names += sorted(n for n in (set(hosts) | {g.node for g in gpu_usage}) if n not in names)
    node_count = job.node_count or len(job_nodes(job)) or 1
    fallback_cores = job.cpus // node_count if job.cpus else None

    nodes: list[NodeEfficiency] = []
    for name in names:
        h = hosts.get(name)
        cores = (h.cpus_allocated if h else None) or fallback_cores
        mean = h.mean_cpu_pct if h else None
        nodes.append(
            NodeEfficiency(
                node=name,
                samples=h.samples if h else 0,
                cores=cores,
                mean_cpu_pct=mean,
                cpu_util_pct=mean / cores if mean is not None and cores else None,
                max_memory_mib=h.max_memory_mib if h else None,
                reported=name in sampled_nodes,
                mean_iowait_pct=h.mean_iowait_pct if h else None,
            )
        )
    cpu_nodes = [n for n in nodes if n.mean_cpu_pct is not None and n.cores]
    cpu_util = (
        sum(n.mean_cpu_pct or 0.0 for n in cpu_nodes) / sum(n.cores or 0 for n in cpu_nodes)
        if cpu_nodes
        else None
    )
    mems = [n.max_memory_mib for n in nodes if n.max_memory_mib is not None]
    mem_max = sum(mems) if mems else None
    mem_use = 100.0 * mem_max / job.memory_mib if mem_max is not None and job.memory_mib else None
    silent = tuple(n for n in job_nodes(job) if n not in sampled_nodes) if started else ()

    gpus: list[GpuEfficiency] = []
    for (node, index), role in _gpu_roles(job, gpu_usage).items():
        u = gpu_by_key.get((node, index))
        if u is None or u.samples == 0:
            gpus.append(
                GpuEfficiency(
                    node=node,
                    index=index,
                    role=role,
                    status="no-data",
                    samples=0,
                    mean_util_pct=None,
                    max_util_pct=None,
                    max_memory_mib=None,
                    memory_total_mib=None,
                    trailing_idle=None,
                    ever_busy=False,
                    shared=False,
                    error_samples=0,
                    # The agent reported from this node but not this GPU: nothing ran on it
                    # that it could see. A silent node tells us nothing, so it is left out.
                    counted_as_zero=role != "unallocated" and node in sampled_nodes,
                )
            )
            continue
        status = _gpu_status(u, th)
        gpus.append(
            GpuEfficiency(
                node=node,
                index=index,
                role=role,
                status=status,
                samples=u.samples,
                mean_util_pct=u.mean_util_pct,
                max_util_pct=u.max_util_pct,
                max_memory_mib=u.max_memory_mib,
                memory_total_mib=u.memory_total_mib,
                trailing_idle=None if status in {"error", "util-unknown"} else u.trailing_idle,
                ever_busy=status not in {"error", "no-process"} and not u.never_busy,
                shared=u.shared,
                error_samples=u.error_samples,
                counted_as_zero=status == "no-process",
            )
        )
    sharing, equivalents = job_equivalents(job.gpus, shards_per_gpu=th.shards_per_gpu)
    primary = primary_role(gpus)
    allocated = [g for g in gpus if g.role == primary]
    counted = [g for g in allocated if gpu_counted(g)]
    gpu_util = (
        sum(0.0 if g.counted_as_zero else (g.mean_util_pct or 0.0) for g in counted) / len(counted)
        if counted
        else None
    )
    gpu_mems = [g.max_memory_mib for g in allocated if g.max_memory_mib is not None]
    gpu_mem_pcts = [p for g in allocated if (p := g.memory_use_pct) is not None]
    return JobEfficiency(
        job=job,
        now=now,
        source=source or ("samples" if sampled_nodes else "none"),
        started=started,
        running=started and not job.state.is_terminal,
        elapsed=elapsed,
        time_use_pct=time_use,
        cores=job.cpus,
        cpu_util_pct=cpu_util,
        cpu_memory_max_mib=mem_max,
        cpu_memory_node_max_mib=max(mems) if mems else None,
        cpu_memory_requested_mib=job.memory_mib,
        cpu_memory_use_pct=mem_use,
        nodes=tuple(nodes),
        gpus=tuple(gpus),
        gpus_allocated=len(allocated),
        gpus_busy=sum(1 for g in allocated if g.ever_busy),
        gpu_util_pct=gpu_util,
        gpu_memory_max_mib=max(gpu_mems) if gpu_mems else None,
        gpu_memory_use_pct=max(gpu_mem_pcts) if gpu_mem_pcts else None,
        silent_nodes=silent,
        has_samples=bool(sampled_nodes),
        thresholds=th,
        energy=energy,
        sharing=sharing,
        gpu_equivalents=equivalents,
    )


def usage_from_summary(
    job: Job, summary: Mapping[str, Any]
) -> tuple[list[GpuUsage], list[HostUsage]]:
    """Rebuild usage aggregates from an end-of-job summary (``daemon.summary`` version 1)."""
    first = job.start_time or job.end_time
    last = job.end_time or job.start_time
    gpus: list[GpuUsage] = []
    hosts: list[HostUsage] = []
    raw_nodes = summary.get("nodes")
    if not isinstance(raw_nodes, Mapping) or first is None or last is None:
        return gpus, hosts
    for node in sorted(raw_nodes):
        entry = raw_nodes[node]
        if not isinstance(entry, Mapping):
            continue
        host = entry.get("host")
        if isinstance(host, Mapping):
            hosts.append(
                HostUsage(
                    node=str(node),
                    samples=int(host.get("samples") or 0),
                    mean_cpu_pct=_num(host.get("cpu_pct_mean")),
                    max_cpu_pct=None,
                    cpus_allocated=_int(host.get("cpus")),
                    max_memory_mib=_num(host.get("memory_max_mib")),
                    mean_iowait_pct=_num(host.get("iowait_pct_mean")),
                )
            )
        gpu_entries = entry.get("gpus")
        if not isinstance(gpu_entries, Mapping):
            continue
        for index in sorted(gpu_entries, key=int):
            g = gpu_entries[index]
            if not isinstance(g, Mapping):
                continue
            gpus.append(
                GpuUsage(
                    node=str(node),
                    gpu_index=int(index),
                    samples=int(g.get("samples") or 0),
                    mean_util_pct=_num(g.get("util_pct_mean")),
                    max_util_pct=_num(g.get("util_pct_max")),
                    max_memory_mib=_num(g.get("memory_max_mib")),
                    memory_total_mib=_num(g.get("memory_total_mib")),
                    first_at=first,
                    last_at=last,
                    trailing_idle=timedelta(seconds=int(g.get("idle_trailing_s") or 0)),
                    never_busy=bool(g.get("never_busy")),
                    shared=bool(g.get("shared")),
                    error_samples=0,
                    max_processes=None,
                )
            )
    return gpus, hosts


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None

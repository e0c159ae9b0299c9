"""One job's efficiency: what it used of what it asked for, and what to ask for next time.

Pure functions, no I/O. :func:`job_efficiency` turns a :class:`~slurmgpu.model.Job` and the
store's per-GPU / per-node aggregates into a :class:`JobEfficiency`; :func:`notes` turns
that into advice with concrete ``sbatch`` options; :func:`to_json` gives the stable JSON.

The thresholds are jobstats' and Job Defense Shield's defaults (:class:`EffThresholds`).
The rules, in the order :func:`notes` applies them (then sorted alert → warn → info):

- not started: one info note, nothing else. Run time < ``min_runtime`` (300 s): one info
  note saying notes are skipped, nothing else.
- no samples at all: warn ``no usage samples: is `sgpu agent` running on NODE?``; some nodes
  silent: the same warning for those nodes.
- ``idle-gpu`` (alert): an allocated GPU with samples idle for the last ≥ ``idle_alert``
  (60 min, the idle policy's default) up to its last sample, a GPU with no process counted
  as idle; after the job ended only GPUs that were busy at some point (a never-used GPU is
  the ``gpus`` / ``no-gpu-use`` / ``no-process`` note instead).
- ``gpus`` (warn): only k of N ≥ 2 whole GPUs ever busy (1 ≤ k < N), every GPU's data known:
  ``--gpus=k`` (``--nodes=1 --gpus=k`` when a multi-node job's busy GPUs are all on one node).
- ``no-gpu-use``: none of the job's GPUs ever busy, when no idle alert said so (alert; warn
  while a running job is younger than ``idle_alert``).
- ``no-process`` (warn): a GPU with no process of the job, when no note above named it.
- ``shard`` (warn): one whole GPU, busy, not named by an idle note, its memory known:
  ``--gres=shard:N`` when the
  daemon's co-location would pack a job of this run's mean util and GPU memory (the larger
  of its peak and its ``--gpu-mem``): :func:`slurmgpu.policy.colocate.shard_fit` under the
  site's ``[policy.colocate]`` and sizing rules, N of the cluster's shards per GPU
  (``EffThresholds.shards_per_gpu``; 16 where unknown) on a GPU of ``device_memory``, else
  the GPU's own memory. Until issue 37 this was ceil(16 * 1.2 * peak / GPU memory) under
  its own util (15 %) and memory (10 GiB) bounds, so that for 4 GiB of a 40 GiB GPU eff
  advised ``shard:2`` where the daemon narrows to 8 (``max_jobs_per_gpu`` 2 of 16).
- ``input-bound`` (warn): overall util < 25 %, some GPU busy, no GPU note above (the
  ``shard`` note does not count: sharing and a starved GPU are told apart), and the
  CPUs ≥ 80 % busy or the processes waiting on block I/O ≥ 30 % of the time (kernel
  delay accounting): the GPUs are starved of data; advice on loader workers, cores,
  node-local copies of the data. Replaces ``gpu-util``.
- ``gpu-util``: overall util ≤ 15 % warn, < 25 % info, when no GPU note above fired
  (``shard`` aside).
- ``cpu`` (warn): CPU util < 65 % with ≥ 4 cores on a node; ``-c K`` with
  K = ceil(1.2 * busy cores of the busiest node / tasks per node) when K is smaller.
- ``memory`` (info): < 70 % of the requested memory used, every node reported:
  ``--mem=`` ceil(1.2 * peak MiB of the busiest node) rounded up to 256 MiB (per node, as
  Slurm reads ``--mem``; written ``NG`` when whole GiB, else ``NM``) when smaller than
  the request.
- ``time`` (warn below 10 %, else info): COMPLETED, run time > 900 s, < 60 % of the limit:
  ``--time=`` 1.3 * run time rounded up to 5 min (at least 15 min), when shorter than the
  limit.

The ``-c``, ``--mem``, ``--time`` and shard figures are the site's
:class:`~slurmgpu.policy.sizing.SizingRules` (``EffThresholds.sizing``, from the same
configuration the daemon reads: :meth:`EffThresholds.for_site`): what rightsizing,
co-location and the job_submit.lua export would set for runs like this one. Until issue 21
the time was rounded to 15 min and the memory to whole GiB here, whatever the site set.
- ``energy`` (info; warn when ≥ 50 % of ≥ 0.1 kWh went to idle GPUs): the job's GPU
  energy and its idle share, and whether a counter measured it or power samples estimate it.

Running jobs get "so far" wording and never a time note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from slurmgpu.model import Job, JobState
from slurmgpu.policy.colocate import hints_from_comment, shard_fit
from slurmgpu.policy.settings import ColocateSettings
from slurmgpu.policy.sizing import SizingRules
from slurmgpu.report.energy import JobEnergy, energy_sentence, energy_to_json
from slurmgpu.slurm import sbatch
from slurmgpu.store.usage_query import GpuUsage, HostUsage
from slurmgpu.units import format_time_limit

GpuStatus = Literal["ok", "low", "idle", "no-process", "no-data", "error"]
GpuRole = Literal["gpu", "shard", "unallocated"]
Severity = Literal["info", "warn", "alert"]
UsageSourceKind = Literal["samples", "summary", "none"]

JSON_VERSION = 1
# A GPU's shards where the cluster's count is not known (no node with shards recorded).
DEFAULT_SHARDS_PER_GPU = 16
_SEVERITY_ORDER: Mapping[str, int] = {"alert": 0, "warn": 1, "info": 2}


@dataclass(frozen=True, slots=True)
class EffThresholds:
    """When a figure deserves a colour or a note (jobstats' and JDS' defaults).

    >>> EffThresholds().gpu_util_red_pct
    15.0
    >>> EffThresholds(idle_alert=timedelta(minutes=90)).idle_alert.total_seconds()
    5400.0

    ``sizing`` and ``colocate`` are the site's (the sizing knobs, and when a job is light
    enough to share a GPU); ``shards_per_gpu`` the cluster's, 16 where it is not known.
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
    energy_idle_warn_pct: float = 50.0  # at or above: the energy note is a warning
    input_cpu_busy_pct: float = 80.0  # GPUs under-used while the cores are this busy
    input_iowait_pct: float = 30.0  # ... or while the processes wait this much on I/O

    @classmethod
    def for_site(
        cls, sizing: SizingRules, colocate: ColocateSettings, shards_per_gpu: int | None = None
    ) -> EffThresholds:
        """The defaults, advising by the site's sizing rules and ``[policy.colocate]`` (the
        daemon's ``PolicySettings.sizing`` and ``.colocate``) on GPUs of
        ``shards_per_gpu`` shards (None: not known, 16): ``sgpu eff`` then suggests what
        rightsizing and co-location would set on that site."""
        return cls(
            sizing=sizing,
            colocate=colocate,
            shards_per_gpu=shards_per_gpu or DEFAULT_SHARDS_PER_GPU,
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

    @property
    def counted_gpus(self) -> tuple[GpuEfficiency, ...]:
        """The GPUs ``gpu_util_pct`` averages over."""
        primary = _primary_role(self.gpus)
        return tuple(g for g in self.gpus if g.role == primary and _gpu_counted(g))


@dataclass(frozen=True, slots=True)
class Note:
    """One piece of advice; ``option`` is what to pass to sbatch next time, if anything."""

    kind: str  # short-run | not-started | no-samples | idle-gpu | gpus | no-gpu-use | …
    severity: Severity
    text: str
    option: str | None = None


# -- computing --------------------------------------------------------------------------


def elapsed_of(job: Job, now: datetime) -> timedelta | None:
    """Return the job's run time: to its end when it ended, else to ``now``."""
    if job.start_time is None or job.state is JobState.PENDING:
        return None
    end = job.end_time if job.state.is_terminal and job.end_time is not None else now
    return max(end - job.start_time, timedelta(0))


def _job_nodes(job: Job) -> list[str]:
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


def _gpu_counted(g: GpuEfficiency) -> bool:
    return g.status not in {"no-data", "error"} or g.counted_as_zero


def _primary_role(gpus: Sequence[GpuEfficiency]) -> GpuRole:
    return "gpu" if any(g.role == "gpu" for g in gpus) else "shard"


def _gpu_status(u: GpuUsage, th: EffThresholds) -> GpuStatus:
    if u.samples == 0:
        return "no-data"
    if u.error_samples >= u.samples:
        return "error"
    if _no_process(u):
        return "no-process"
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
        for i in a.shard_indices:
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
    names = _job_nodes(job)
    names += sorted(n for n in (set(hosts) | {g.node for g in gpu_usage}) if n not in names)
    node_count = job.node_count or len(_job_nodes(job)) or 1
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
    silent = tuple(n for n in _job_nodes(job) if n not in sampled_nodes) if started else ()

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
                trailing_idle=None if status == "error" else u.trailing_idle,
                ever_busy=status not in {"error", "no-process"} and not u.never_busy,
                shared=u.shared,
                error_samples=u.error_samples,
                counted_as_zero=status == "no-process",
            )
        )
    primary = _primary_role(gpus)
    allocated = [g for g in gpus if g.role == primary]
    counted = [g for g in allocated if _gpu_counted(g)]
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


# -- advice -----------------------------------------------------------------------------


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def _minutes(td: timedelta) -> str:
    return f"{int(td.total_seconds() // 60)} min"


def _pct(x: float) -> str:
    return f"{x:.0f}%"


def suggested_time(elapsed: timedelta, th: EffThresholds = DEFAULT_THRESHOLDS) -> timedelta:
    """Return the time limit for a run this long (:func:`slurmgpu.policy.sizing.time_limit_s`)."""
    return timedelta(seconds=th.sizing.time_limit_s(elapsed.total_seconds()))


def suggested_mem_mib(used_mib: float, th: EffThresholds = DEFAULT_THRESHOLDS) -> int:
    """Return the memory per node for a node that peaked at ``used_mib``
    (:func:`slurmgpu.policy.sizing.memory_mib`)."""
    return th.sizing.memory_mib(used_mib)


def suggested_shards(
    util_pct: float, used_mib: float, total_mib: float, th: EffThresholds = DEFAULT_THRESHOLDS
) -> int | None:
    """Return the shards of one of the cluster's GPUs the daemon's co-location would give
    a job of ``util_pct`` mean util using ``used_mib`` of GPU memory, on a GPU of
    ``total_mib`` (the site's ``device_memory`` wins where it is set); None: a whole GPU
    (:func:`slurmgpu.policy.colocate.shard_fit`)."""
    device = th.colocate.device_memory_mib or total_mib
    fit = shard_fit(util_pct, used_mib, th.shards_per_gpu, device, th.colocate, th.sizing)
    return None if fit is None else fit.shards


def _names(gpus: Sequence[GpuEfficiency], *, idle: bool = False) -> str:
    parts = []
    for g in gpus:
        extra = []
        if g.status == "no-process":
            extra.append("no process")
        elif g.status == "no-data":
            extra.append("no samples")
        if idle and g.trailing_idle is not None:
            extra.append(f"last {_minutes(g.trailing_idle)}")
        parts.append(f"{g.label} ({', '.join(extra)})" if extra else g.label)
    return ", ".join(parts)


def _busy_verb(count: int, running: bool) -> str:
    if running:
        return f"{'has' if count == 1 else 'have'} been busy so far"
    return f"{'was' if count == 1 else 'were'} ever busy"


def _agent_note(nodes: Sequence[str], *, some: bool) -> Note:
    where = ", ".join(nodes) if nodes else "the job's nodes"
    head = f"no usage samples from {where}" if some else "no usage samples"
    return Note("no-samples", "warn", f"{head}: is `sgpu agent` running on {where}?")


def notes(eff: JobEfficiency) -> list[Note]:
    """Return advice on ``eff``, most urgent first (the rules are in the module docstring)."""
    th = eff.thresholds
    job = eff.job
    if not eff.started or eff.elapsed is None:
        return [Note("not-started", "info", "the job has not started: nothing to measure yet")]
    if eff.elapsed < th.min_runtime:
        return [
            Note(
                "short-run",
                "info",
                f"run time {format_time_limit(eff.elapsed)} is under "
                f"{_minutes(th.min_runtime)}: no efficiency notes for runs this short",
            )
        ]
    out: list[Note] = []
    so_far = " so far" if eff.running else ""
    was = "has been" if eff.running else "was"
    if not eff.has_samples:
        out.append(_agent_note(_job_nodes(job), some=False))
    elif eff.silent_nodes:
        out.append(_agent_note(eff.silent_nodes, some=True))

    primary = _primary_role(eff.gpus)
    allocated = [g for g in eff.gpus if g.role != "unallocated"]
    counted = list(eff.counted_gpus)
    named: set[str] = set()
    gpu_note = False

    idle = [
        g
        for g in allocated
        if g.trailing_idle is not None
        and g.status not in {"error", "no-data"}
        and g.trailing_idle >= th.idle_alert
        # After the end a never-used GPU is a request to fix (the notes below), not an alert.
        and (eff.running or g.ever_busy)
    ]
    if idle:
        them = "them" if len(idle) > 1 else "it"
        what = (
            f"release {them} (scancel {job.display_id}) or put {them} to work"
            if eff.running
            else "end the job when its GPU work is done"
        )
        limit = f"the idle-GPU limit is {_minutes(th.idle_alert)}"
        if len(idle) == 1:
            g = idle[0]
            tag = " (no process)" if g.status == "no-process" else ""
            minutes = _minutes(g.trailing_idle or timedelta(0))
            text = (
                f"GPU {g.label}{tag} {'has been' if eff.running else 'was'} idle for the "
                f"last {minutes} ({limit}): {what}"
            )
        else:
            verb = "have been" if eff.running else "were"
            text = (
                f"{len(idle)} of {len(allocated)} GPUs {verb} idle for "
                f"{_minutes(th.idle_alert)} or more ({limit}): {_names(idle, idle=True)}; {what}"
            )
        out.append(Note("idle-gpu", "alert", text))
        named.update(g.label for g in idle)
        gpu_note = True

    whole = [g for g in eff.gpus if g.role == "gpu"]
    unknown = [g for g in whole if not _gpu_counted(g)]
    busy = [g for g in whole if g.ever_busy]
    if len(whole) >= 2 and not unknown and 1 <= len(busy) < len(whole):
        k = len(busy)
        # a multi-node job whose busy GPUs are all on one node: ask for that one node
        one_node = len({g.node for g in whole}) > 1 and len({g.node for g in busy}) == 1
        option = str(sbatch.gpus(k, nodes=1 if one_node else None))
        unused = [g for g in whole if not g.ever_busy]
        out.append(
            Note(
                "gpus",
                "warn",
                f"only {k} of {len(whole)} allocated GPUs {_busy_verb(k, eff.running)} "
                f"({_names(busy)}); never busy: {_names(unused)}; "
                f"next time ask for {option}",
                option,
            )
        )
        named.update(g.label for g in unused)
        gpu_note = True
    elif counted and not any(g.ever_busy for g in counted) and not unknown:
        if not idle:
            # Minutes into a running job the program may still be loading its data.
            early = eff.running and eff.elapsed < th.idle_alert
            out.append(
                Note(
                    "no-gpu-use",
                    "warn" if early else "alert",
                    f"none of the {len(counted)} allocated GPU(s) {_busy_verb(1, eff.running)} "
                    f"({_names(counted)}): check that the program uses the GPU "
                    "(CUDA_VISIBLE_DEVICES, torch.cuda.is_available())",
                )
            )
        named.update(g.label for g in counted)
        gpu_note = True

    no_process = [g for g in allocated if g.status == "no-process" and g.label not in named]
    if no_process:
        out.append(
            Note(
                "no-process",
                "warn",
                f"no process of this job {was} seen on GPU {_names(no_process)}{so_far}: "
                "allocated but unused",
            )
        )
        gpu_note = True

    if len(whole) == 1 and not job.gpus.shards:
        g = whole[0]
        if (
            g.ever_busy
            and g.label not in named  # idle: to release, not to share
            and g.mean_util_pct is not None
            and g.max_memory_mib is not None
            and g.memory_total_mib
        ):
            # what co-location packs by: the larger of the peak and the declared --gpu-mem
            declared = hints_from_comment(job.comment).gpu_memory_mib or 0
            needed = max(g.max_memory_mib, float(declared))
            n = suggested_shards(g.mean_util_pct, needed, g.memory_total_mib, th)
            if n is not None:
                option = str(sbatch.shards(n))
                out.append(
                    Note(
                        "shard",
                        "warn",
                        f"GPU util {was} {_pct(g.mean_util_pct)}{so_far} and GPU memory "
                        f"peaked at {_gib(g.max_memory_mib)} of {_gib(g.memory_total_mib)}: "
                        f"a share of one GPU is enough; next time ask for {option} "
                        f"({n} of {th.shards_per_gpu} shards) instead of a whole GPU, or a "
                        "MIG slice / smaller GPU where the site has one",
                        option,
                    )
                )
                # not a GPU note for what follows: sharing is one remedy, and a starved or
                # under-used GPU is still told why (before issue 37 shards were advised
                # only under 15 % util, where the gpu-util note said the same)

    if not gpu_note and primary == "gpu" and eff.gpu_util_pct is not None:
        u = eff.gpu_util_pct
        bound = _input_bound(eff, u, so_far, was) if u < th.gpu_util_warn_pct else None
        if bound is not None:
            out.append(bound)
        elif u <= th.gpu_util_red_pct or u < th.gpu_util_warn_pct:
            severity: Severity = "warn" if u <= th.gpu_util_red_pct else "info"
            out.append(
                Note(
                    "gpu-util",
                    severity,
                    f"GPU utilisation {was} {_pct(u)}{so_far} (target ≥ "
                    f"{_pct(th.gpu_util_warn_pct)}): look for an input or CPU bottleneck, "
                    "or use a larger batch",
                )
            )

    out.extend(_cpu_notes(eff, so_far, was))
    out.extend(_memory_notes(eff, so_far))
    out.extend(_time_notes(eff))
    out.extend(_energy_notes(eff))
    return sorted(out, key=lambda n: _SEVERITY_ORDER[n.severity])


def iowait_pct(eff: JobEfficiency) -> float | None:
    """The highest mean I/O wait of the job's nodes; None when no node's kernel counts it."""
    known = [n.mean_iowait_pct for n in eff.nodes if n.mean_iowait_pct is not None]
    return max(known) if known else None


def _input_bound(eff: JobEfficiency, util: float, so_far: str, was: str) -> Note | None:
    """``input-bound``: GPUs that work, but little, while the CPUs are saturated or the
    processes wait on storage: the GPUs are starved of data (not idle, not mis-sized)."""
    th = eff.thresholds
    if eff.gpus_busy == 0:
        return None
    cpu, io = eff.cpu_util_pct, iowait_pct(eff)
    cpu_bound = cpu is not None and cpu >= th.input_cpu_busy_pct
    io_bound = io is not None and io >= th.input_iowait_pct
    if not (cpu_bound or io_bound):
        return None
    why, advice = [], []
    if cpu_bound:
        were = "have been" if eff.running else "were"
        why.append(f"its {eff.cores} CPU cores {were} {_pct(cpu or 0.0)} busy")
        advice.append(
            "give data loading more cores and workers (more -c, DataLoader num_workers "
            "= cores - 1, pin_memory=True), or move decoding and augmentation to the GPU"
        )
    if io_bound:
        were = "have been" if eff.running else "were"
        why.append(f"its processes {were} waiting on storage {_pct(io or 0.0)} of the time")
        advice.append(
            "copy the data set to node-local disk at the start of the job ($TMPDIR), read "
            "fewer, larger files, and overlap reading with compute (more loader workers)"
        )
    return Note(
        "input-bound",
        "warn",
        f"input-bound: GPU utilisation {was} {_pct(util)}{so_far} while "
        + " and ".join(why)
        + ": the GPUs wait for data; "
        + "; ".join(advice),
    )


def _energy_notes(eff: JobEfficiency) -> list[Note]:
    """``energy``: what the GPUs used and how much of it went to idle GPUs; a warning when
    at least ``energy_idle_warn_pct`` of it did (and it was at least 0.1 kWh)."""
    e = eff.energy
    if e is None or e.energy_j <= 0:
        return []
    th = eff.thresholds
    wasted = e.idle_pct >= th.energy_idle_warn_pct and e.kwh >= 0.1
    text = energy_sentence(e, running=eff.running)
    if wasted:
        text += ": release GPUs you do not use (end the job when the work is done)"
    return [Note("energy", "warn" if wasted else "info", text)]


def _cpu_notes(eff: JobEfficiency, so_far: str, was: str) -> list[Note]:
    th = eff.thresholds
    reported = [n for n in eff.nodes if n.mean_cpu_pct is not None and n.cores]
    if eff.cpu_util_pct is None or eff.cpu_util_pct >= th.cpu_util_red_pct or not reported:
        return []
    cores_per_node = max(n.cores or 0 for n in reported)
    if cores_per_node < th.cpu_many_cores:
        return []
    node_count = len(reported)
    tasks_per_node = max(1, round(eff.job.tasks / node_count)) if eff.job.tasks else 1
    cores_per_task = cores_per_node // tasks_per_node
    busiest = max((n.mean_cpu_pct or 0.0) / 100.0 for n in reported)
    k = th.sizing.cores(busiest / tasks_per_node)
    total = sum(n.cores or 0 for n in reported)
    busy_cores = sum((n.mean_cpu_pct or 0.0) / 100.0 for n in reported)
    text = (
        f"CPU utilisation {was} {_pct(eff.cpu_util_pct)} of {total} cores{so_far} "
        f"({busy_cores:.1f} busy on average)"
    )
    if k < cores_per_task:
        option = str(sbatch.cpus_per_task(k))
        per = " per task" if tasks_per_node > 1 else ""
        return [Note("cpu", "warn", f"{text}; next time ask for {option}{per}", option)]
    return [Note("cpu", "warn", f"{text}: check that the program uses its cores")]


def _memory_notes(eff: JobEfficiency, so_far: str) -> list[Note]:
    th = eff.thresholds
    requested = eff.cpu_memory_requested_mib
    used_pct, node_peak = eff.cpu_memory_use_pct, eff.cpu_memory_node_max_mib
    if requested is None or used_pct is None or node_peak is None or eff.silent_nodes:
        return []
    if used_pct >= th.memory_note_pct or eff.job.state is JobState.OUT_OF_MEMORY:
        return []
    node_count = sum(1 for n in eff.nodes if n.max_memory_mib is not None)
    per_node_request = requested / max(node_count, 1)
    mib = suggested_mem_mib(node_peak, th)
    if mib >= per_node_request:
        return []
    option = str(sbatch.mem(mib))
    per = " (per node)" if node_count > 1 else ""
    verb = "has used" if so_far else "used"
    return [
        Note(
            "memory",
            "info",
            f"this job {verb} {_pct(used_pct)} of its {_gib(requested)} of memory{so_far} "
            f"(peak {_gib(node_peak)}{' on one node' if node_count > 1 else ''}); "
            f"next time ask for {option}{per}",
            option,
        )
    ]


def _time_notes(eff: JobEfficiency) -> list[Note]:
    th = eff.thresholds
    job = eff.job
    if (
        job.state is not JobState.COMPLETED
        or job.restart_count  # elapsed is the last run's only: no measure of the need
        or eff.elapsed is None
        or job.time_limit is None
        or eff.time_use_pct is None
        or eff.elapsed <= th.time_note_min_elapsed
        or eff.time_use_pct >= th.time_note_pct
    ):
        return []
    suggestion = suggested_time(eff.elapsed, th)
    if suggestion >= job.time_limit:
        return []
    option = str(sbatch.time_limit(suggestion))
    severity: Severity = "warn" if eff.time_use_pct < th.time_red_pct else "info"
    return [
        Note(
            "time",
            severity,
            f"this job ran {format_time_limit(eff.elapsed)}, {_pct(eff.time_use_pct)} of its "
            f"{format_time_limit(job.time_limit)} limit; next time ask for {option} "
            "(shorter limits start sooner through backfill)",
            option,
        )
    ]


# -- JSON -------------------------------------------------------------------------------


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


_DIAGNOSIS = (
    ("idle", frozenset({"idle-gpu", "no-gpu-use", "no-process"})),
    ("input-bound", frozenset({"input-bound"})),
    ("low-util", frozenset({"gpu-util", "gpus", "shard"})),
)


def gpu_diagnosis(job_notes: Sequence[Note]) -> str | None:
    """One word for the GPUs from the notes: ``idle`` (held, not working), ``input-bound``
    (working, starved of data), ``low-util`` (working little, or more GPUs than used),
    ``ok``; None when the job is too short or not started to judge.

    >>> gpu_diagnosis([Note("input-bound", "warn", "...")]), gpu_diagnosis([])
    ('input-bound', 'ok')
    """
    kinds = {n.kind for n in job_notes}
    if kinds & {"short-run", "not-started"}:
        return None
    for word, wanted in _DIAGNOSIS:
        if kinds & wanted:
            return word
    return "ok"


def to_json(eff: JobEfficiency, job_notes: Sequence[Note]) -> dict[str, Any]:
    """Return the report as JSON-ready data; keys are stable (``version`` 1).

    Top level: ``version``, ``job`` (job_id, display_id, name, user, account, partition,
    state, nodes, node_count, cores, memory_requested_mib, gpus_requested,
    shards_requested, gpu_type, gpu_allocations [{node, gpus, shard_gpus, shards}],
    start_time, end_time, time_limit_s), ``source`` (samples | summary | none), ``running``,
    ``elapsed_s``, ``time_use_pct``, ``cpu`` (util_pct, cores, memory_max_mib,
    memory_node_max_mib, memory_requested_mib, memory_use_pct), ``nodes`` [{node, samples,
    cores, cpu_pct_mean, cpu_util_pct, memory_max_mib, reported, iowait_pct_mean}], ``gpu``
    (allocated, busy, util_pct, memory_max_mib, memory_use_pct, diagnosis), ``gpus``
    [{node, index, role, status, samples, util_pct_mean, util_pct_max, memory_max_mib,
    memory_total_mib, idle_trailing_min, ever_busy, shared, error_samples,
    counted_as_zero}], ``silent_nodes``, ``energy`` (energy_j, idle_energy_j, kwh,
    idle_pct, method, extrapolated_j, gpus; null when not measured), ``notes`` [{kind,
    severity, text, option}]. Percentages and MiB are rounded to 0.1; absent figures are
    ``null``.
    """
    job = eff.job
    return {
        "version": JSON_VERSION,
        "job": {
            "job_id": job.job_id,
            "display_id": job.display_id,
            "name": job.name,
            "user": job.user,
            "account": job.account,
            "partition": job.partition,
            "state": job.state.value,
            "nodes": _job_nodes(job),
            "node_count": job.node_count,
            "cores": job.cpus,
            "memory_requested_mib": job.memory_mib,
            "gpus_requested": job.gpus.gpus,
            "shards_requested": job.gpus.shards,
            "gpu_type": job.gpus.gpu_type,
            "gpu_allocations": [
                {
                    "node": a.node,
                    "gpus": list(a.gpu_indices),
                    "shard_gpus": list(a.shard_indices),
                    "shards": a.shards,
                }
                for a in job.gpu_allocations
            ],
            "start_time": _iso(job.start_time),
            "end_time": _iso(job.end_time) if job.state.is_terminal else None,
            "time_limit_s": int(job.time_limit.total_seconds()) if job.time_limit else None,
        },
        "source": eff.source,
        "running": eff.running,
        "elapsed_s": int(eff.elapsed.total_seconds()) if eff.elapsed is not None else None,
        "time_use_pct": _r(eff.time_use_pct),
        "cpu": {
            "util_pct": _r(eff.cpu_util_pct),
            "cores": eff.cores,
            "memory_max_mib": _r(eff.cpu_memory_max_mib),
            "memory_node_max_mib": _r(eff.cpu_memory_node_max_mib),
            "memory_requested_mib": eff.cpu_memory_requested_mib,
            "memory_use_pct": _r(eff.cpu_memory_use_pct),
        },
        "nodes": [
            {
                "node": n.node,
                "samples": n.samples,
                "cores": n.cores,
                "cpu_pct_mean": _r(n.mean_cpu_pct),
                "cpu_util_pct": _r(n.cpu_util_pct),
                "memory_max_mib": _r(n.max_memory_mib),
                "reported": n.reported,
                "iowait_pct_mean": _r(n.mean_iowait_pct),
            }
            for n in eff.nodes
        ],
        "gpu": {
            "allocated": eff.gpus_allocated,
            "busy": eff.gpus_busy,
            "util_pct": _r(eff.gpu_util_pct),
            "memory_max_mib": _r(eff.gpu_memory_max_mib),
            "memory_use_pct": _r(eff.gpu_memory_use_pct),
            "diagnosis": gpu_diagnosis(job_notes),
        },
        "gpus": [
            {
                "node": g.node,
                "index": g.index,
                "role": g.role,
                "status": g.status,
                "samples": g.samples,
                "util_pct_mean": _r(g.mean_util_pct),
                "util_pct_max": _r(g.max_util_pct),
                "memory_max_mib": _r(g.max_memory_mib),
                "memory_total_mib": _r(g.memory_total_mib),
                "idle_trailing_min": (
                    None if g.trailing_idle is None else _r(g.trailing_idle.total_seconds() / 60)
                ),
                "ever_busy": g.ever_busy,
                "shared": g.shared,
                "error_samples": g.error_samples,
                "counted_as_zero": g.counted_as_zero,
            }
            for g in eff.gpus
        ],
        "silent_nodes": list(eff.silent_nodes),
        "energy": energy_to_json(eff.energy),
        "notes": [
            {"kind": n.kind, "severity": n.severity, "text": n.text, "option": n.option}
            for n in job_notes
        ],
    }

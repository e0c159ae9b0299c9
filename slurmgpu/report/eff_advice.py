"""Advice on one job's efficiency: notes with concrete ``sbatch`` options for next time.

Pure functions, no I/O: :func:`notes` turns a :class:`~slurmgpu.report.eff.JobEfficiency`
into :class:`Note` s, :func:`gpu_diagnosis` those into one word for the GPUs.

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
- ``slice`` (warn), instead of ``shard`` where the job's nodes offer MIG slices or MPS
  (``EffThresholds.offer``): the share co-location would narrow such a run to
  (:func:`slurmgpu.policy.slices.choose_slice`: the smallest MIG profile, MPS share or
  shards that holds it), e.g. ``--gres=gpu:1g.10gb:1``; a ``shard`` note when shards win.
  Never for a job that already ran on a MIG slice or MPS.
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
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from slurmgpu.model import Job, JobState
from slurmgpu.policy.colocate import hints_from_comment, shard_fit
from slurmgpu.policy.slices import MigProfile, choose_slice
from slurmgpu.report.eff import (
    DEFAULT_THRESHOLDS,
    EffThresholds,
    GpuEfficiency,
    JobEfficiency,
    gpu_counted,
    job_nodes,
    primary_role,
)
from slurmgpu.report.energy import energy_sentence
from slurmgpu.slurm import sbatch
from slurmgpu.units import format_time_limit

Severity = Literal["info", "warn", "alert"]

_SEVERITY_ORDER: Mapping[str, int] = {"alert": 0, "warn": 1, "info": 2}


@dataclass(frozen=True, slots=True)
class Note:
    """One piece of advice; ``option`` is what to pass to sbatch next time, if anything."""

    kind: str  # short-run | not-started | no-samples | idle-gpu | gpus | no-gpu-use | …
    severity: Severity
    text: str
    option: str | None = None


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


def _on_a_share(job: Job) -> bool:
    """Whether the job already ran on a share of a GPU (a MIG slice or MPS)."""
    return (
        job.gpus.mps > 0
        or any(a.mps for a in job.gpu_allocations)
        or MigProfile.parse(job.gpus.gpu_type) is not None
    )


def _slice_note(
    util_pct: float,
    needed_mib: float,
    peak_mib: float,
    device_mib: float,
    was: str,
    so_far: str,
    th: EffThresholds,
) -> Note | None:
    """The ``slice`` note: the share co-location would narrow such a run to where the
    nodes offer MIG slices or MPS (:func:`slurmgpu.policy.slices.choose_slice`)."""
    assert th.offer is not None
    choice = choose_slice(util_pct, needed_mib, th.offer, device_mib, th.colocate, th.sizing)
    if choice is None:
        return None
    option = str(sbatch.gres(choice.gres))
    if choice.kind == "mig":
        what = (
            f"a MIG slice, {choice.gpu_fraction * 7:.0f} of 7 compute slices and "
            f"{_gib(choice.memory_mib)}, isolated"
        )
    elif choice.kind == "mps":
        what = f"an MPS share of {choice.gpu_fraction:.0%} of a GPU's SMs, partly isolated"
    else:
        what = f"{choice.count} shards, {choice.gpu_fraction:.0%} of a GPU, not isolated"
    return Note(
        "shard" if choice.kind == "shard" else "slice",
        "warn",
        f"GPU util {was} {_pct(util_pct)}{so_far} and GPU memory peaked at "
        f"{_gib(peak_mib)} of {_gib(device_mib)}: a share of one GPU is enough; next time "
        f"ask for {option} ({what}) instead of a whole GPU",
        option,
    )


def _names(gpus: Sequence[GpuEfficiency], *, idle: bool = False) -> str:
    parts = []
    for g in gpus:
        extra = []
        if g.status == "no-process":
            extra.append("no process")
        elif g.status == "no-data":
            extra.append("no samples")
        elif g.status == "util-unknown":
            extra.append("utilization unknown")
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
        out.append(_agent_note(job_nodes(job), some=False))
    elif eff.silent_nodes:
        out.append(_agent_note(eff.silent_nodes, some=True))

    primary = primary_role(eff.gpus)
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
    unknown = [g for g in whole if not gpu_counted(g)]
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
            slice_note = (
                _slice_note(
                    g.mean_util_pct, needed, g.max_memory_mib, g.memory_total_mib, was, so_far, th
                )
                if th.offer is not None and not _on_a_share(job)
                else None
            )
            n = (
                suggested_shards(g.mean_util_pct, needed, g.memory_total_mib, th)
                if th.offer is None
                else None
            )
            if slice_note is not None:
                out.append(slice_note)
            elif n is not None:
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


_DIAGNOSIS = (
    ("idle", frozenset({"idle-gpu", "no-gpu-use", "no-process"})),
    ("input-bound", frozenset({"input-bound"})),
    ("low-util", frozenset({"gpu-util", "gpus", "shard", "slice"})),
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

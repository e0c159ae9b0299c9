"""A trace replayed through a real Slurm lab, planned: what to submit when, and as whom.

Pure: a slice of a loaded trace (:mod:`slurmgpu.sim.loaders`) becomes :class:`ReplayJob`
values, time-compressed by a factor ``C``: a job submitted ``t`` seconds into the trace is
submitted ``t / C`` seconds into the replay, and every job's speed is ``C`` times its
profile's, so a job that would run ``r`` seconds at its size runs ``r / C`` seconds in the
lab. Its work stays the profile's (optimiser steps, or progress for a batch-adaptive job),
so its completion time depends on its size and on every resize, as in the simulator.

What does not compress: a resize's real cost (checkpoint, requeue, Slurm's scheduling,
start-up) is the lab's, in seconds of wall time. The policies' own pacing, set in trace
time (a job's ``min_interval`` between resizes, the engine's cooldown, LAS's queue limits
in GPU-hours and its minimum run time), is divided by ``C`` (:func:`policy_sections`), so
the daemon paces the compressed jobs as it would the real ones.

The simulator's side of the comparison runs in trace time, so what does not compress
is charged to it C times over (:func:`replay_options`): a cost set measured in wall
seconds (sim.costs; ``replay-stand-in`` is the replay's own) times C, and the resize
executor's pacing (its one-second observations, its release delay) times C.

The outcome side (:class:`JobOutcome`, :func:`summarise`, :func:`render`) turns what the
replay observed per job into the figures the simulator reports: average and p99 JCT,
makespan, GPU-hours, resizes and preemptions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from slurmgpu.cycle.resize import ResizeSettings
from slurmgpu.sim.costs import CostSet
from slurmgpu.sim.fairshare import FairShareConfig
from slurmgpu.sim.metrics import percentile
from slurmgpu.sim.run import SimOptions
from slurmgpu.sim.workload import MalleableRange, TraceJob, packed

__all__ = [
    "JobOutcome",
    "ReplayError",
    "ReplayJob",
    "ReplaySummary",
    "outcomes",
    "plan_replay",
    "policy_sections",
    "render",
    "replay_options",
    "replayed_trace",
    "summarise",
]


class ReplayError(ValueError):
    """A replay that cannot be planned (a bad factor or slice); one line."""


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One job of the replay: submitted ``at_s`` seconds after the replay starts by
    ``user``, asking for ``gpus`` (one node: ``gpus <= gpus_per_node``), malleable between
    ``min_gpus`` and ``max_gpus``; it must do ``work`` units at ``rates[g - 1]`` units per
    wall-clock second on ``g`` GPUs."""

    index: int
    name: str
    user: str
    at_s: float
    gpus: int
    min_gpus: int
    max_gpus: int
    work: float
    rates: tuple[float, ...]
    time_limit_s: float
    run_s: float  # wall seconds at ``gpus`` with no resize: the profile's, compressed
    source: int = -1  # its position in the trace it was planned from

    def slurm_limit_s(self) -> float:
        """The time limit Slurm gets: ``time_limit_s`` up to whole minutes (``--time``)."""
        return 60.0 * max(1, math.ceil(self.time_limit_s / 60))

    def rates_text(self) -> str:
        """``1:0.5,2:0.93,...``: the stand-in job's ``--rates``."""
        return ",".join(f"{g}:{r:.6g}" for g, r in enumerate(self.rates, start=1))


def plan_replay(
    trace: Sequence[TraceJob],
    *,
    compression: float,
    users: Sequence[str],
    first: int | None = None,
    window_s: float | None = None,
    gpus_per_node: int = 4,
    min_limit_s: float = 120.0,
    max_run_s: float | None = None,
) -> list[ReplayJob]:
    """The jobs of ``trace`` to replay: the first ``first`` jobs and/or those submitted in
    the first ``window_s`` trace seconds, compressed by ``compression``. A trace user
    ``userK`` (the Pollux loader's seeded users) becomes ``users[(K - 1) % len(users)]``;
    any other name is mapped by its order of appearance. Each job is capped to one node
    (``gpus_per_node``): the stand-in is one process, as the lab's GPUs are fake.

    ``max_run_s``: jobs that would run longer than this (wall seconds, at their size with
    no resize) are left out -- a capped 32-GPU ImageNet job would outlast a short replay
    by far; the caller says how many (``len(trace slice) - len(result)``). A job's time
    limit is its trace limit compressed, at least twice its run time here (the cap to one
    node makes some jobs slower than the trace's limit allowed for) and ``min_limit_s``."""
    if not compression > 0 or not math.isfinite(compression):
        raise ReplayError(f"the compression factor must be a number > 0, not {compression!r}")
    if not users:
        raise ReplayError("no users to submit the replay's jobs as")
    if first is not None and first < 1:
        raise ReplayError(f"--first must be at least 1, not {first}")
    chosen = [(i, j) for i, j in enumerate(trace) if window_s is None or j.submit_s <= window_s]
    if first is not None:
        chosen = chosen[:first]
    if not chosen:
        raise ReplayError("the slice holds no job")
    t0 = chosen[0][1].submit_s
    seen: dict[str, str] = {}
    out: list[ReplayJob] = []
    for source, job in chosen:
        lo = hi = min(job.gpus, gpus_per_node)
        if job.malleable is not None:
            lo = max(1, min(job.malleable.min_gpus, gpus_per_node))
            hi = max(lo, min(job.malleable.max_gpus, gpus_per_node))
        gpus = max(lo, min(max(job.gpus, 1), hi))
        rates = tuple(
            job.model.rate(packed(g, gpus_per_node)) * compression for g in range(1, hi + 1)
        )
        run_s = job.model.work / rates[gpus - 1]
        if max_run_s is not None and run_s > max_run_s:
            continue
        limit = max((job.time_limit_s or 0.0) / compression, 2 * run_s)
        out.append(
            ReplayJob(
                index=len(out),
                name=job.name,
                user=_user(job.user, users, seen),
                at_s=(job.submit_s - t0) / compression,
                gpus=gpus,
                min_gpus=lo,
                max_gpus=hi,
                work=job.model.work,
                rates=rates,
                time_limit_s=max(min_limit_s, limit),
                run_s=run_s,
                source=source,
            )
        )
    if not out:
        raise ReplayError(f"every job of the slice runs longer than {max_run_s:g} s")
    return out


def replayed_trace(
    trace: Sequence[TraceJob], jobs: Sequence[ReplayJob], compression: float
) -> list[TraceJob]:
    """The jobs the replay ran, as the simulator takes them, in trace time: each planned
    job's trace row (``trace`` the one :func:`plan_replay` was given) with the replay's
    one-node size, malleable range and time limit (times ``compression``). Simulated
    figures divided by ``compression`` compare with the replay's wall seconds."""
    return [
        replace(
            trace[j.source],
            user=j.user,  # the site user it ran as (fair share, history keys)
            gpus=j.gpus,
            gpus_per_node=j.gpus,
            malleable=MalleableRange(j.min_gpus, j.max_gpus) if j.max_gpus > j.min_gpus else None,
            time_limit_s=j.slurm_limit_s() * compression,  # what Slurm's backfill sees
        )
        for j in jobs
    ]


def replay_options(
    costs: CostSet, compression: float, fairshare: FairShareConfig | None = None
) -> SimOptions:
    """The simulator's options for holding it to a replay compressed by ``compression``:
    ``costs`` (wall seconds, as measured) and the resize executor's pacing (wall seconds
    in the replay's daemon) both times C, in the simulator's trace time; ``fairshare``:
    the lab's priority (its periods in wall seconds: they are scaled by C here)."""
    if not compression > 0 or not math.isfinite(compression):
        raise ReplayError(f"the compression factor must be a number > 0, not {compression!r}")
    pace = ResizeSettings()
    resize = replace(
        pace,
        cycle_interval=pace.cycle_interval * compression,
        release_delay=pace.release_delay * compression,
        release_after=pace.release_after * compression,
        overtaken_after=pace.overtaken_after * compression,
    )
    if fairshare is not None:
        fairshare = replace(
            fairshare,
            calc_period_s=fairshare.calc_period_s * compression,
            half_life_s=fairshare.half_life_s * compression,
        )
    return SimOptions.of_costs(costs.scaled(compression), resize=resize, fairshare=fairshare)


def _user(name: str, users: Sequence[str], seen: dict[str, str]) -> str:
    if name.startswith("user") and name[4:].isdigit():
        return users[(int(name[4:]) - 1) % len(users)]
    if name not in seen:
        seen[name] = users[len(seen) % len(users)]
    return seen[name]


Section = Mapping[str, str | int | float | bool | Sequence[float]]

# The policies each set enforces (the daemon's config sections), as sim.policysets builds
# them; every other policy observes. ``las`` needs its opt-in, ``enabled``.
_ENFORCED: dict[str, tuple[str, ...]] = {
    "slurm": (),
    "rightsize": ("rightsize",),
    "colocate": ("colocate",),
    "malleable": ("malleable",),
    "las": ("las",),
    "all": ("idle_gpu", "rightsize", "colocate", "las", "malleable"),
}
_POLICIES = ("idle_gpu", "rightsize", "colocate", "las", "malleable")


def _seconds(trace_s: float, compression: float) -> str:
    return f"{max(1, round(trace_s / compression))}s"


def policy_sections(
    policy_set: str, compression: float, *, resize_cost_s: float = 2.0
) -> dict[str, dict[str, str | int | float | bool | Sequence[float]]]:
    """The daemon's config sections for ``policy_set`` at ``compression``: the set's
    policies in enforce mode with the simulator's settings (sim.policysets), every other
    policy observing; the pacing set in trace time divided by ``compression``.
    ``resize_cost_s`` is the malleable policy's assumed checkpoint, requeue and start-up
    cost each until it has measured one (real seconds: the lab's fast path)."""
    if policy_set not in _ENFORCED:
        raise ReplayError(f"unknown policy set {policy_set!r} (replayable: {', '.join(_ENFORCED)})")
    if not compression > 0:
        raise ReplayError(f"the compression factor must be > 0, not {compression!r}")
    enforced = _ENFORCED[policy_set]
    c = compression
    out: dict[str, dict[str, str | int | float | bool | Sequence[float]]] = {
        "policy": {"history_refresh": "1s"},
        "policy.engine": {"job_cooldown": _seconds(30 * 60, c)},
    }
    for name in _POLICIES:
        out[f"policy.{name}"] = {"mode": "enforce" if name in enforced else "observe"}
    if "rightsize" in enforced:
        out["policy.rightsize"]["apply_to_all"] = True
    if "colocate" in enforced:
        out["policy.colocate"].update(
            apply_to_all=True, convert_gpu_requests="always", device_memory="32GiB"
        )
    cost = f"{max(1, round(resize_cost_s))}s"
    out["policy.malleable"].update(
        min_interval=_seconds(10 * 60, c),
        min_remaining=_seconds(10 * 60, c),
        checkpoint_time=cost,
        requeue_delay=cost,
        startup_time=cost,
    )
    out["policy.las"].update(
        enabled="las" in enforced,
        queue_limits=[16.0 / c],
        min_runtime=_seconds(15 * 60, c),
        min_wait=_seconds(2 * 60, c),
    )
    return out


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What the replay saw of one job; times in seconds from the replay's start."""

    index: int
    job_id: int | None
    name: str
    user: str
    submitted_s: float | None
    started_s: float | None
    ended_s: float | None
    state: str  # Slurm's final state, or "unfinished" / "not submitted"
    gpu_hours: float
    restarts: int
    resizes: int
    preemptions: int
    phases: tuple[Mapping[str, float], ...] = field(default_factory=tuple)

    @property
    def jct_s(self) -> float | None:
        if self.submitted_s is None or self.ended_s is None:
            return None
        return self.ended_s - self.submitted_s

    @property
    def finished(self) -> bool:
        return self.state == "COMPLETED" and self.jct_s is not None

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "job_id": self.job_id,
            "name": self.name,
            "user": self.user,
            "submitted_s": self.submitted_s,
            "started_s": self.started_s,
            "ended_s": self.ended_s,
            "state": self.state,
            "jct_s": self.jct_s,
            "gpu_hours": self.gpu_hours,
            "restarts": self.restarts,
            "resizes": self.resizes,
            "preemptions": self.preemptions,
            "phases": [dict(p) for p in self.phases],
        }


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """Figures over the finished jobs (seconds of wall time; multiply by the factor for
    trace time)."""

    jobs: int
    finished: int
    avg_jct_s: float
    p99_jct_s: float
    makespan_s: float
    gpu_hours: float
    resizes: int
    preemptions: int
    phase_medians_s: Mapping[str, float]

    def as_dict(self) -> dict[str, object]:
        return {
            "jobs": self.jobs,
            "finished": self.finished,
            "avg_jct_s": self.avg_jct_s,
            "p99_jct_s": self.p99_jct_s,
            "makespan_s": self.makespan_s,
            "gpu_hours": self.gpu_hours,
            "resizes": self.resizes,
            "preemptions": self.preemptions,
            "phase_medians_s": dict(self.phase_medians_s),
        }


class TxLike(Protocol):
    """A resize transaction as the replay read it (slurmgpu.lab.replay.TxSeen)."""

    @property
    def policy(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def phases(self) -> Mapping[str, float]: ...


class ObservedLike(Protocol):
    """One job as the replay watched it (slurmgpu.lab.replay.Observed)."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def job_id(self) -> int | None: ...
    @property
    def submitted_s(self) -> float | None: ...
    @property
    def started_s(self) -> float | None: ...
    @property
    def ended_s(self) -> float | None: ...
    @property
    def state(self) -> str: ...
    @property
    def gpu_seconds(self) -> float: ...
    @property
    def restarts(self) -> int: ...
    @property
    def transactions(self) -> Sequence[TxLike]: ...


# Resize transactions that requeued the job (its restart count grew by one).
_REQUEUED = ("running", "rolled_back", "ended", "overtaken")


def outcomes(observed: Sequence[ObservedLike]) -> list[JobOutcome]:
    """Per job: resizes are the daemon's completed resizes (transactions closed at the
    new size) other than LAS's; preemptions are LAS's requeues through the transaction
    plus the restarts no transaction explains (Slurm's own QOS preemption)."""
    out: list[JobOutcome] = []
    for o in observed:
        txs = list(o.transactions)
        las = [t for t in txs if t.policy == "las" and t.state in _REQUEUED]
        resizes = [t for t in txs if t.policy != "las" and t.state == "running"]
        requeued = sum(1 for t in txs if t.state in _REQUEUED)
        out.append(
            JobOutcome(
                index=o.index,
                job_id=o.job_id,
                name=o.name,
                user=o.user,
                submitted_s=o.submitted_s,
                started_s=o.started_s,
                ended_s=o.ended_s,
                state=o.state,
                gpu_hours=o.gpu_seconds / 3600.0,
                restarts=o.restarts,
                resizes=len(resizes),
                preemptions=len(las) + max(0, o.restarts - requeued),
                phases=tuple(t.phases for t in txs if t.state == "running"),
            )
        )
    return out


def summarise(outcomes: Sequence[JobOutcome]) -> ReplaySummary:
    """Average and p99 JCT and makespan (first submission to last end) of the finished
    jobs; NaN where no job finished. Phase medians over every completed resize."""
    done = [o for o in outcomes if o.finished]
    jcts = [o.jct_s for o in done if o.jct_s is not None]
    subs = [o.submitted_s for o in outcomes if o.submitted_s is not None]
    ends = [o.ended_s for o in done if o.ended_s is not None]
    phases: dict[str, list[float]] = {}
    for o in outcomes:
        for p in o.phases:
            for key, value in p.items():
                phases.setdefault(key, []).append(value)
    return ReplaySummary(
        jobs=len(outcomes),
        finished=len(done),
        avg_jct_s=sum(jcts) / len(jcts) if jcts else math.nan,
        p99_jct_s=percentile(jcts, 99) if jcts else math.nan,
        makespan_s=max(ends) - min(subs) if ends and subs else math.nan,
        gpu_hours=sum(o.gpu_hours for o in outcomes),
        resizes=sum(o.resizes for o in outcomes),
        preemptions=sum(o.preemptions for o in outcomes),
        phase_medians_s={k: percentile(v, 50) for k, v in sorted(phases.items())},
    )


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def render(outcomes: Sequence[JobOutcome], summary: ReplaySummary) -> str:
    """A plain-text table, one line per job, then the summary."""
    head = f"{'#':>3} {'job':>6} {'name':<12} {'user':<8} {'state':<11} "
    head += f"{'JCT s':>7} {'GPU-h':>7} {'resz':>4} {'prmt':>4}"
    lines = [head]
    for o in outcomes:
        lines.append(
            f"{o.index:>3} {o.job_id if o.job_id is not None else '-':>6} {o.name[:12]:<12} "
            f"{o.user:<8} {o.state[:11]:<11} {_num(o.jct_s):>7} {o.gpu_hours:>7.4f} "
            f"{o.resizes:>4} {o.preemptions:>4}"
        )
    s = summary
    lines.append(
        f"{s.finished}/{s.jobs} finished; avg JCT {_num(s.avg_jct_s)} s, p99 "
        f"{_num(s.p99_jct_s)} s, makespan {_num(s.makespan_s)} s, {s.gpu_hours:.3f} GPU-h, "
        f"{s.resizes} resizes, {s.preemptions} preemptions"
    )
    if s.phase_medians_s:
        lines.append(
            "resize phases (median s): "
            + ", ".join(f"{k} {v:.1f}" for k, v in s.phase_medians_s.items())
        )
    return "\n".join(lines)

"""A replay's per-job costs, read off the lab's slurmctld log: what the simulator charges
every job (sim.costs ``first_startup``, ``submit_delay`` and ``completing``), measured
on the run it is held to.

All three come from the one clock of slurmctld's log (milliseconds), not from the
replay's own records (Slurm's start and end times there are whole seconds):

- **start-up**: a job's run in the log (its allocation to its completion) less the run
  time the replay planned for it, for jobs that ran once. The stand-in's process start,
  its first step and its exit, plus the batch step's launch.
- **submission delay**: a submission to the job's start, for jobs that had room when
  they were submitted: a node with as many GPUs free as they asked, and no room for any
  job waiting before them. What Slurm takes to start a job that nothing holds back (its pass after a
  submission).
- **completing**: a job's end to the next start on its node, for a job that was waiting
  for it (it was submitted before that end, and the node had no room for it before).
  The COMPLETING hold (epilog, the node's message back) and the scheduling pass it
  triggers.

Pure: reads text, not files.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmgpu.lab.replay import CtldTimeline
from slurmgpu.slurm.parse import expand_hostlist

__all__ = ["JobCostSamples", "PlannedJob", "job_cost_samples"]


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """What the replay asked of one Slurm job: its GPUs (on one node) and its planned run
    time in wall seconds (None: not known, e.g. a resized job)."""

    gpus: int
    run_s: float | None


@dataclass(frozen=True, slots=True)
class JobCostSamples:
    """The samples of each cost (seconds), one per job that shows it."""

    startup: tuple[float, ...]
    submit_delay: tuple[float, ...]
    completing: tuple[float, ...]

    def __add__(self, other: JobCostSamples) -> JobCostSamples:
        """Both runs' samples (pooled over sets or runs)."""
        return JobCostSamples(
            self.startup + other.startup,
            self.submit_delay + other.submit_delay,
            self.completing + other.completing,
        )

    def medians(self) -> dict[str, float | None]:
        return {
            "first_startup": _median(self.startup),
            "submit_delay": _median(self.submit_delay),
            "completing": _median(self.completing),
        }

    def lines(self) -> list[str]:
        """``start-up 0.54 s (median of 63)``, one line per cost."""
        out = []
        for label, samples in (
            ("start-up", self.startup),
            ("submission delay", self.submit_delay),
            ("completing", self.completing),
        ):
            if samples:
                out.append(
                    f"{label:<17}{statistics.median(samples):6.2f} s  (median of "
                    f"{len(samples)}; quartiles {_quartiles(samples)})"
                )
            else:
                out.append(f"{label:<17}     -    (no job shows it)")
        return out


def _median(samples: tuple[float, ...]) -> float | None:
    return statistics.median(samples) if samples else None


def _quartiles(samples: tuple[float, ...]) -> str:
    if len(samples) < 2:
        return f"{samples[0]:.2f}"
    q = statistics.quantiles(samples, n=4)
    return f"{q[0]:.2f}-{q[2]:.2f}"


@dataclass(frozen=True, slots=True)
class _Run:
    job_id: int
    node: str
    gpus: int
    start: datetime
    end: datetime | None


def job_cost_samples(
    timeline: CtldTimeline, planned: Mapping[int, PlannedJob], gpus_per_node: int
) -> JobCostSamples:
    """The per-job cost samples of a replay whose Slurm jobs are ``planned`` (by job id;
    jobs of the log not there are left out), on nodes of ``gpus_per_node`` GPUs."""
    runs: list[_Run] = []
    for job_id, spans in timeline.runs.items():
        plan = planned.get(job_id)
        if plan is None:
            continue
        names = timeline.nodes.get(job_id, [])
        for k, (start, end) in enumerate(spans):
            hosts = expand_hostlist(names[k]) if k < len(names) and names[k] else ()
            if len(hosts) == 1:  # the replay's jobs run on one node
                runs.append(_Run(job_id, hosts[0], plan.gpus, start, end))
    startup = tuple(
        (end - start).total_seconds() - plan.run_s
        for job_id, spans in timeline.runs.items()
        if (plan := planned.get(job_id)) is not None and plan.run_s is not None and len(spans) == 1
        for start, end in spans
        if end is not None
    )
    submitted = {j: at for j, (at, _) in timeline.submitted.items() if j in planned}
    first_start = {j: spans[0][0] for j, spans in timeline.runs.items() if j in planned}
    nodes = sorted({r.node for r in runs})

    def used(node: str, at: datetime) -> int:
        return sum(
            r.gpus
            for r in runs
            if r.node == node and r.start <= at and (r.end is None or at < r.end)
        )

    def waiting(job_id: int, at: datetime) -> list[int]:
        """The GPUs each job submitted before ``job_id`` and still waiting at ``at`` asks."""
        return [
            planned[other].gpus
            for other, sub in submitted.items()
            if other != job_id
            and sub < at
            and (other not in first_start or first_start[other] > at)
        ]

    submit_delay: list[float] = []
    for job_id, at in submitted.items():
        began = first_start.get(job_id)
        if began is None or began < at:
            continue
        room = max((gpus_per_node - used(n, at) for n in nodes), default=gpus_per_node)
        # room for it, and none for any job before it (which Slurm would start first)
        if room >= planned[job_id].gpus and all(g > room for g in waiting(job_id, at)):
            submit_delay.append((began - at).total_seconds())
    completing: list[float] = []
    for r in runs:
        sub = submitted.get(r.job_id)
        if sub is None or first_start.get(r.job_id) != r.start:
            continue
        ends = [
            o.end
            for o in runs
            if o.node == r.node
            and o.job_id != r.job_id
            and o.end is not None
            and sub < o.end <= r.start
        ]
        if not ends:
            continue
        last = max(ends)
        just_before = last - timedelta(milliseconds=1)
        if gpus_per_node - used(r.node, just_before) < r.gpus:
            completing.append((r.start - last).total_seconds())
    return JobCostSamples(startup, tuple(submit_delay), tuple(completing))

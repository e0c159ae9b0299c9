"""Rightsizing: bring a pending job's requests down to what its history says it uses.

For every PENDING job with an estimate (:mod:`slurmgpu.policy.priors`) the policy
proposes at most one ``update`` action that combines every field worth changing. Held
jobs are candidates (a hold does not change what the job needs), requeued jobs are
candidates, and a pending array meta-record (``120_[3-9]``) is one candidate addressed as
that range, since its tasks share one shape; tasks already split out are their own jobs.

Rules (defaults in :class:`~slurmgpu.policy.settings.RightsizeSettings`):

- ``TimeLimit`` = the larger of ``time_quantile`` (0.95) * ``time_headroom`` (1.3) of past
  run times (for the job's GPU count: runs that asked as many GPUs, else every run
  scaled so that it never errs short, see :mod:`slurmgpu.policy.priors`),
  ``min_time_limit`` (15 min), and ``time_headroom`` * the longest elapsed time of a
  RUNNING job with the same user and name (a sibling running for 2 h proves a run can
  take 2 h), rounded up to ``time_round`` (5 min). A job with no limit
  (``UNLIMITED``) gets one. Only from runs of the job's own script or name unless
  ``time_from_other_jobs``: the user's other jobs say little about this one's run time,
  and a limit too short is a killed run (on Pollux workloads 1, 2 and 4, 66 of the 71
  timeouts after rightsizing came from the ``user+partition`` level).
- ``MinMemoryNode`` (MiB per node) = ``ceil(memory_headroom * peak of the busiest
  node)`` rounded up to ``memory_round_mib`` (256 MiB); a past run without a per-node
  figure counts with its total, which only errs high. Never when any run at the key ran
  out of memory, or when the request is unknown or 0 (all of a node).
- ``NumCPUs`` (total) and ``MinCPUsNode`` (per node), GPU jobs only: the larger of
  ``ceil(cpu_headroom * the most cores a past run used on average)``,
  ``target_cores_per_gpu`` (12) per GPU, one per task and one per node. Never when a past
  run kept >= 90 % of its cores busy (its demand is unknown).
- GPUs: the most GPUs any past run kept busy (at least 1), when at least
  ``min_history`` runs had GPU samples and none of them asked for fewer GPUs than this
  job. Written as ``TresPerNode=gres/gpu[:type]:K`` (``gres:gpu:K`` before Slurm 23.02,
  as slurmctld itself prints it) for ``--gpus-per-node`` / ``--gres`` requests, or
  ``TresPerJob`` for ``--gpus``; ``--gpus-per-task`` and shard requests are left alone.
  ``TresPerNode`` replaces the job's whole per-node TRES string: the actuator must keep
  any other GRES the job asked for.

A field is proposed only when it shrinks the request by at least
``min_change_fraction`` (20 %); no field ever grows. Whether the action runs is the
engine's call: ``requires_opt_in`` is set unless ``apply_to_all``, and the engine then
suppresses it for jobs not in ``PolicySnapshot.opted_in``. ``numbers`` carry, for each
field, the current and proposed value, plus the history count, key level and quantile.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import timedelta

from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import Action, HistoryRecord, PolicySnapshot, slurm_job_ref
from slurmgpu.policy.priors import LEVELS, Estimate, Priors
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.slurm.parse import format_time_limit

__all__ = ["PriorsFactory", "RightsizePolicy", "gres_prefix"]

PriorsFactory = Callable[[Sequence[HistoryRecord]], Priors]
Numbers = dict[str, float | int | str | None]

_JobKey = tuple[str, str, str, int]
_VERSION_RE = re.compile(r"(\d+)\.(\d+)")
# History levels keyed by the job itself (its script or name), not the user's other jobs.
_OWN_LEVELS = frozenset(level for level in LEVELS if "script" in level or "name" in level)


def gres_prefix(slurm_version: str) -> str:
    """Return how ``tres_per_*`` strings name a GRES: ``gres:`` before 23.02, else ``gres/``.

    An unknown version gets the current form.

    >>> gres_prefix("22.05.9"), gres_prefix("24.11.1"), gres_prefix("")
    ('gres:', 'gres/', 'gres/')
    """
    m = _VERSION_RE.match(slurm_version.strip())
    if m and (int(m.group(1)), int(m.group(2))) < (23, 2):
        return "gres:"
    return "gres/"


_LIMIT_TEXTS: dict[float, str] = {}


def _limit_text(seconds: float) -> str:
    """``format_time_limit`` of a limit in seconds, memoised: queues hold few distinct
    limits and proposals are rounded to ``time_round``."""
    text = _LIMIT_TEXTS.get(seconds)
    if text is None:
        text = format_time_limit(timedelta(seconds=seconds))
        if len(_LIMIT_TEXTS) < 4096:
            _LIMIT_TEXTS[seconds] = text
    return text


def _round_up(value: float, step: float) -> float:
    return math.ceil(value / step - 1e-9) * step


def _shrinks_enough(current: float, proposed: float, fraction: float) -> bool:
    return proposed < current and (current - proposed) >= fraction * current - 1e-9


class _Derived:
    """What one estimate implies under the settings, computed once per estimate."""

    __slots__ = ("cpus_needed", "gpus_used", "history_numbers", "memory_mib", "reason", "time_s")

    def __init__(self, est: Estimate, s: RightsizeSettings) -> None:
        self.history_numbers: Numbers = {
            "history_samples": est.samples,
            "history_level": est.level,
            "history_key": "/".join(est.key),
            "time_quantile": est.quantile,
            # the run time is for this many GPUs: from runs with as many, or scaled
            "history_gpus": est.gpus,
            "history_gpu_samples": est.gpu_samples,
            "history_gpu_scaled": int(est.gpu_scaled),
        }
        self.reason = f"{est.samples} past runs ({est.level}) suggest "
        self.time_s: int | None = None
        if s.time_limit and (s.time_from_other_jobs or est.level in _OWN_LEVELS):
            history_s = est.run_time.total_seconds() * s.time_headroom
            self.time_s = int(
                _round_up(
                    max(history_s, s.min_time_limit.total_seconds()),
                    s.time_round.total_seconds(),
                )
            )
        # Never total / nodes for memory: an uneven job would starve its busiest node.
        # Runs without a per-node figure count with their total, which only errs high.
        peak = est.peak_node_memory_mib
        self.memory_mib: int | None = None
        if s.memory and peak is not None and not est.oom_runs:
            step = s.memory_round_mib
            self.memory_mib = max(step, int(_round_up(math.ceil(s.memory_headroom * peak), step)))
        self.cpus_needed: int | None = None
        if s.cpus and est.max_cpu_pct is not None and not est.cpu_saturated:
            self.cpus_needed = math.ceil(s.cpu_headroom * est.max_cpu_pct / 100.0 - 1e-9)
        self.gpus_used: int | None = None
        if s.gpus and est.gpus_used is not None and est.gpus_used_samples >= s.min_history:
            self.gpus_used = max(1, est.gpus_used)


class RightsizePolicy:
    """Proposes smaller time limits, memory, CPUs and GPUs for pending jobs.

    ``priors_factory`` turns ``snapshot.history`` into :class:`Priors`; the default uses
    the settings' quantile and ``min_history``. The priors of the last history tuple seen
    are kept, so a daemon or simulator that passes the same tuple again pays for them
    once.
    """

    name = "rightsize"

    def __init__(
        self,
        settings: RightsizeSettings | None = None,
        priors_factory: PriorsFactory | None = None,
    ) -> None:
        self.settings = settings or RightsizeSettings()
        s = self.settings
        self._factory: PriorsFactory = priors_factory or (
            lambda records: Priors.from_history(
                records, quantile=s.time_quantile, min_samples=s.min_history
            )
        )
        self._cached: tuple[Sequence[HistoryRecord], Priors] | None = None
        # Keyed by id(): the estimates live as long as the cached priors.
        self._derived: dict[int, _Derived] = {}
        # (user, name, partition, GPUs) -> estimate and what it implies ((None, None):
        # none), as long as the cached priors: most pending jobs are still pending next
        # cycle, so a key costs one look-up after its first cycle.
        self._keyed: dict[_JobKey, tuple[Estimate | None, _Derived | None]] = {}
        self._keep = 1.0 - s.min_change_fraction
        self._round_s = s.time_round.total_seconds()

    def priors(self, history: Sequence[HistoryRecord]) -> Priors:
        """Return priors for ``history``, reusing them when it is the same object."""
        if self._cached is None or self._cached[0] is not history:
            self._cached = (history, self._factory(history))
            self._derived = {}
            self._keyed = {}
        return self._cached[1]

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        """Return one ``update`` action per pending job whose requests history can shrink."""
        s = self.settings
        jobs = snapshot.cluster.jobs
        pending = [j for j in jobs if j.state is JobState.PENDING]
        if not pending:
            return []
        priors = self.priors(snapshot.history)
        keyed = self._keyed
        # The longest a RUNNING job of the same user and name has run so far, as a floor
        # for the time limit (with the same headroom and rounding as history); by user,
        # then name, so a pending job's look-up builds no tuple.
        at = snapshot.at
        sibling_s: dict[str, dict[str, float]] = {}
        for j in jobs:
            if j.state is JobState.RUNNING and j.start_time is not None:
                elapsed = (at - j.start_time).total_seconds()
                if elapsed > 0.0:
                    names = sibling_s.get(j.user)
                    if names is None:
                        sibling_s[j.user] = {j.name: elapsed}
                    elif elapsed > names.get(j.name, 0.0):
                        names[j.name] = elapsed
        prefix = gres_prefix(snapshot.cluster.slurm_version)
        # Pending jobs share keys (resubmissions, arrays, the same jobs next cycle): each
        # key's estimate (for the job's GPU count) and what that implies are resolved once
        # per priors.
        headroom, round_s = s.time_headroom, self._round_s
        actions: list[Action] = []
        for job in pending:
            job_key = (job.user, job.name, job.partition, job.gpus.gpus)
            known = keyed.get(job_key)
            if known is None:
                known = keyed[job_key] = self._resolve(job, priors)
            est, d = known
            if est is None or d is None:
                continue
            time_s = d.time_s
            sibling: float | None = None
            names = sibling_s.get(job.user)
            if names is not None:
                sibling = names.get(job.name)
                if time_s is not None and sibling is not None:
                    time_s = max(time_s, int(_round_up(sibling * headroom, round_s)))
            action = self._propose_one(job, est, d, time_s, sibling, prefix, snapshot)
            if action is not None:
                actions.append(action)
        return actions

    def _resolve(self, job: Job, priors: Priors) -> tuple[Estimate | None, _Derived | None]:
        """Return the job's estimate and what it implies, or (None, None)."""
        est = priors.estimate(job)
        if est is None:
            return None, None
        d = self._derived.get(id(est))
        if d is None:
            d = self._derived[id(est)] = _Derived(est, self.settings)
        return est, d

    def _propose_one(
        self,
        job: Job,
        est: Estimate,
        d: _Derived,
        time_s: int | None,
        sibling_s: float | None,
        prefix: str,
        snapshot: PolicySnapshot,
    ) -> Action | None:
        s = self.settings
        keep = self._keep  # a change must leave at most this share of the request
        nodes = job.node_count if job.node_count > 1 else 1

        # Decide every field with plain numbers first: most jobs change nothing. A value
        # is proposed when proposed <= keep * current (and below it), i.e. it shrinks
        # the request by at least min_change_fraction.
        new_time: int | None = None
        if time_s is not None:
            limit = job.time_limit
            if limit is None:
                new_time = time_s
            else:
                current_s = limit.total_seconds()
                if time_s < current_s and time_s <= keep * current_s + 1e-6:
                    new_time = time_s
        new_memory: int | None = None
        current_memory = 0
        if d.memory_mib is not None and job.memory_mib:
            current_memory = -(-job.memory_mib // nodes)
            if d.memory_mib < current_memory and d.memory_mib <= keep * current_memory + 1e-6:
                new_memory = d.memory_mib
        request = job.gpus
        gpus_after = request.gpus
        new_gpus: int | None = None  # per node, or per job for --gpus
        gpu_field = ""
        used = d.gpus_used
        if (
            used is not None
            and gpus_after > 0
            and not request.shards
            and est.gpus_requested >= gpus_after
        ):
            if request.per_node:
                per_node = -(-used // nodes)
                if _shrinks_enough(request.per_node, per_node, s.min_change_fraction):
                    new_gpus, gpu_field, gpus_after = per_node, "TresPerNode", per_node * nodes
            elif (
                request.per_job
                and not request.per_task
                and _shrinks_enough(request.per_job, used, s.min_change_fraction)
            ):
                new_gpus, gpu_field, gpus_after = used, "TresPerJob", used
        new_cpus: int | None = None
        cpus = job.cpus
        if d.cpus_needed is not None and gpus_after > 0 and cpus > 0:
            proposed_cpus = max(
                d.cpus_needed, s.target_cores_per_gpu * gpus_after, job.tasks, nodes
            )
            if proposed_cpus < cpus and proposed_cpus <= keep * cpus + 1e-6:
                new_cpus = proposed_cpus
        if new_time is None and new_memory is None and new_gpus is None and new_cpus is None:
            return None

        fields: dict[str, str] = {}
        numbers = dict(d.history_numbers)
        changes: list[str] = []
        if new_time is not None:
            limit = job.time_limit
            fields["TimeLimit"] = text = _limit_text(new_time)
            numbers["time_limit_current_s"] = limit.total_seconds() if limit is not None else None
            numbers["time_limit_proposed_s"] = new_time
            # the names the notification template reads
            numbers["time_limit_s"] = numbers["time_limit_current_s"]
            numbers["proposed_time_limit_s"] = new_time
            numbers["run_time_quantile_s"] = est.run_time.total_seconds()
            numbers["sibling_elapsed_s"] = sibling_s
            was = "UNLIMITED" if limit is None else _limit_text(limit.total_seconds())
            changes.append(f"TimeLimit {text} (was {was})")
        if new_memory is not None:
            fields["MinMemoryNode"] = str(new_memory)
            numbers["memory_per_node_current_mib"] = current_memory
            numbers["memory_per_node_proposed_mib"] = new_memory
            numbers["memory_mib"] = current_memory
            numbers["proposed_memory_mib"] = new_memory
            numbers["peak_node_memory_mib"] = est.peak_node_memory_mib
            changes.append(f"MinMemoryNode {new_memory} MiB (was {current_memory} MiB)")
        if new_gpus is not None:
            gpu = f"{prefix}gpu:{request.gpu_type}:" if request.gpu_type else f"{prefix}gpu:"
            fields[gpu_field] = f"{gpu}{new_gpus}"
            numbers["gpus_current"] = request.gpus
            numbers["gpus_proposed"] = gpus_after
            numbers["gpus"] = request.gpus
            numbers["proposed_gpus"] = gpus_after
            numbers["gpus_used_max"] = est.gpus_used
            if gpu_field == "TresPerNode":
                numbers["gpus_per_node_current"] = request.per_node
                numbers["gpus_per_node_proposed"] = new_gpus
                changes.append(f"{new_gpus} GPU(s) per node (was {request.per_node})")
            else:
                changes.append(f"{new_gpus} GPU(s) (was {request.per_job})")
        if new_cpus is not None:
            fields["NumCPUs"] = str(new_cpus)
            fields["MinCPUsNode"] = str(math.ceil(new_cpus / nodes))
            numbers["cpus_current"] = job.cpus
            numbers["cpus_proposed"] = new_cpus
            numbers["cpu_used_max_pct"] = est.max_cpu_pct
            changes.append(f"{new_cpus} CPUs (was {job.cpus})")
        opted = snapshot.opted_in
        numbers["opted_in"] = int(
            job.job_id in opted or (job.array_job_id is not None and job.array_job_id in opted)
        )
        return Action(
            policy=self.name,
            kind="update",
            job_id=job.job_id,
            user=job.user,
            reason=d.reason + "; ".join(changes),
            numbers=numbers,
            fields=fields,
            alert="rightsize",
            requires_opt_in=not s.apply_to_all,
            slurm_id=slurm_job_ref(job),
        )

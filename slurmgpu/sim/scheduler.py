"""SimSlurm's scheduler model: Slurm's FIFO + EASY backfill over nodes, GPUs and shards.

Pending jobs in priority order (submit order, behind any job of a lower ``Nice``, unless
a ``priority`` key replaces it: how the Tiresias and QSSF baselines plug in); the first
that does not fit gets a reservation at the earliest time it fits *by the running jobs'
time limits*; later jobs start now only if they fit and either end by that time or leave
the reserved GPUs alone. At most ``bf_max_job_test`` jobs are tried per pass. Also here:
placement (best fit, typed nodes, shards and MPS shares, MIG slices), starting and
stopping runs, and what a job's END, LIMIT, ELIGIBLE and CHECKPOINT events do.

With ``scheduling`` (a :class:`~slurmgpu.sim.slurmsched.SlurmScheduling`) the passes are
Slurm's own instead: a main pass in strict priority order on every change, a full one
every ``sched_interval_s``, and a conservative backfill pass every ``bf_interval_s``
(sim.slurmsched says what each does and what is left out).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from slurmgpu.model import JobState, Node
from slurmgpu.policy.slices import MIG_COMPUTE_SLICES, MigProfile
from slurmgpu.sim.progress import ElasticRuntime, ProgressModel
from slurmgpu.sim.slurmsched import NodePlans, SlurmScheduling
from slurmgpu.sim.state import JobRun, SimJob

__all__ = ["ListsPriority", "PriorityKey", "SchedulerModel"]

PriorityKey = Callable[["SimJob", float], tuple[float, ...]]


@runtime_checkable
class ListsPriority(Protocol):
    """A priority key that also gives Slurm's number for a job, as squeue's %Q lists it
    (sim.fairshare.FairTree); submit order and the baselines' ranking keys give none."""

    def priority(self, job: SimJob, now: float) -> float: ...


class SchedulerModel(ProgressModel):
    """Which pending job starts where, and the lifecycle of a run."""

    gpus_per_node: int
    shards_per_gpu: int
    mps_per_gpu: int
    mig_profiles: dict[str, MigProfile]
    _shares: bool  # shards, MPS or MIG slices to place besides whole GPUs
    runtime: ElasticRuntime
    priority: PriorityKey | None
    bf_max_job_test: int
    scheduling: SlurmScheduling | None  # Slurm's main + conservative backfill passes
    _bf_last: float  # when the last backfill pass ran
    _bf_at: float  # when the next backfill pass is due (inf: none armed)
    _main_at: float  # when the next full main pass is due (inf: none armed)
    kill_wait_s: float
    completing_s: float  # an ended job's whole GPUs stay allocated this long (COMPLETING)
    _holds: list[tuple[float, list[tuple[int, tuple[int, ...]]]]]  # (until, GPUs) held
    _free_counts: list[int]  # whole GPUs free, per node
    _node_objs: list[Node | None]  # each node's listing, None once a job took or left it
    _pending: dict[int, SimJob]
    _running: dict[int, SimJob]
    _throttle: dict[int, int]
    _recent: list[SimJob]  # finished, listed until min_job_age_s
    finished: list[SimJob]
    listeners: list[Callable[[SimJob], None]]  # called when a job ends

    def _fire(self, kind: int, job: SimJob) -> None:
        if kind == self._END and job.state is JobState.RUNNING:
            self._finish(job, JobState.COMPLETED)
        elif kind == self._LIMIT and job.state is JobState.RUNNING:
            # SIGTERM at the limit, SIGKILL ``kill_wait_s`` later: a runtime that can
            # checkpoint in that window keeps its progress for a resubmission.
            if self.runtime.checkpoint_s <= self.kill_wait_s:
                job.checkpoint_work = job.work_at(self.now)
            self._finish(job, JobState.TIMEOUT)
        elif kind == self._ELIGIBLE:
            self._dirty = True
        elif kind == self._PHASE and job.state is JobState.RUNNING:
            self._rates_for([job])  # a new slice of training: its efficiency changed
        elif kind == self._CHECKPOINT and job.state is JobState.RUNNING:
            job.checkpoint_work = job.base_work
            job.checkpointed_s = self.now
            self._changed(job)

    def _start(
        self,
        job: SimJob,
        alloc: list[tuple[int, tuple[int, ...]]],
        shard: tuple[int, int, int] | None,
        mig: tuple[int, int] | None = None,
    ) -> None:
        del self._pending[job.job_id]
        self._running[job.job_id] = job
        job.state = JobState.RUNNING
        job.start_s = self.now
        if math.isnan(job.first_start_s):
            job.first_start_s = self.now
        job.end_s = math.nan
        job.alloc = alloc
        job.shard_alloc = shard
        job.mig_alloc = mig
        for n, gpus in alloc:
            for g in gpus:
                self._nodes[n].gpu_owner[g] = job.job_id
            self._free_counts[n] -= len(gpus)
            self._node_objs[n] = None
        if shard is not None:
            n, g, s = shard
            self._node_objs[n] = None
            if not self._nodes[n].gpu_shards[g]:
                self._free_counts[n] -= 1
            self._nodes[n].gpu_shards[g][job.job_id] = s
        kind = "gpu"
        share = float(job.allocated_gpus)
        if shard is not None:
            kind = "mps" if job.mps else "shard"
            units = self.mps_per_gpu if job.mps else self.shards_per_gpu
            share = shard[2] / max(1, units)
        elif mig is not None:
            n, k = mig
            self._nodes[n].slice_owner[k] = job.job_id
            self._node_objs[n] = None
            kind = "mig"
            share = min(self._nodes[n].slices[k][0].slices, MIG_COMPUTE_SLICES) / MIG_COMPUTE_SLICES
        # a share's kernels run on its one GPU (its util counts there in full)
        compute = float(job.allocated_gpus if shard is None and mig is None else 1)
        job.runs.append(
            JobRun(
                self.now,
                math.nan,
                float(share),
                compute_gpus=compute,
                by_type=self._by_type(job, float(share)),
                placement=job.placement if shard is None and mig is None else (),
                kind=kind,
            )
        )
        job.batch_for = ()  # a new run: its runtime picks its batch again
        startup = self.runtime.startup_s if job.restarts else self.runtime.first_startup_s
        job.base_work = min(job.base_work, job.model.work)
        job.busy_from = self.now + startup
        job.rate = 0.0
        self._rates_for([job, *self._sharers(job)])

    def _close_run(self, job: SimJob) -> None:
        if job.runs and math.isnan(job.runs[-1].end_s):
            self._fold(job)
            run = job.runs[-1]
            run.end_s = self.now
            job.attained_gpu_s += (run.end_s - run.start_s) * run.gpus

    def _stop(self, job: SimJob, *, hold_s: float = 0.0) -> None:
        """Take a running job off its GPUs (the caller sets its new state); with
        ``hold_s``, its whole GPUs stay allocated that much longer (Slurm's COMPLETING)."""
        self._fold(job)
        self._close_run(job)
        sharers = self._sharers(job)
        if hold_s > 0 and job.alloc:
            hold = (self.now + hold_s, list(job.alloc))
            self._holds.append(hold)

            def release() -> None:
                self._holds.remove(hold)
                self._free_whole(hold[1])

            self.call_at(hold[0], release)
        else:
            self._free_whole(job.alloc)
        if job.shard_alloc is not None:
            n, g, _ = job.shard_alloc
            self._node_objs[n] = None
            self._nodes[n].gpu_shards[g].pop(job.job_id, None)
            if not self._nodes[n].gpu_shards[g]:
                self._free_counts[n] += 1
        if job.mig_alloc is not None:
            n, k = job.mig_alloc
            self._nodes[n].slice_owner[k] = None
            self._node_objs[n] = None
        del self._running[job.job_id]
        self._by_limit_remove(job)
        job.version += 1
        job.rate = 0.0
        job.busy_from = math.inf
        job.start_s = math.nan
        self._rates_for(sharers)
        self._dirty = True

    def _free_whole(self, alloc: list[tuple[int, tuple[int, ...]]]) -> None:
        """Give a job's whole GPUs back to their nodes (after its COMPLETING hold)."""
        for n, gpus in alloc:
            for g in gpus:
                self._nodes[n].gpu_owner[g] = None
            self._free_counts[n] += len(gpus)
            self._node_objs[n] = None
        self._dirty = True

    def _finish(self, job: SimJob, state: JobState) -> None:
        work = job.work_at(self.now)
        self._stop(job, hold_s=self.completing_s)
        job.base_work = work
        job.state = state
        job.end_s = self.now
        self._ended(job)

    def _ended(self, job: SimJob) -> None:
        self._changed(job)
        self._recent.append(job)
        self.finished.append(job)
        self._dirty = True
        for listener in self.listeners:
            listener(job)

    def _eligible(self) -> list[SimJob]:
        now = self.now
        running_tasks: dict[int, int] = {}
        if self._throttle:
            for j in self._running.values():
                if j.array_job_id is not None:
                    running_tasks[j.array_job_id] = running_tasks.get(j.array_job_id, 0) + 1
        out = []
        for job in self._pending.values():
            if job.held or job.eligible_s > now:
                continue
            if job.array_job_id is not None:
                limit = self._throttle.get(job.array_job_id, 0)
                if limit and running_tasks.get(job.array_job_id, 0) >= limit:
                    continue
                if limit:
                    running_tasks[job.array_job_id] = running_tasks.get(job.array_job_id, 0) + 1
            out.append(job)
        if self.priority is None:
            # priority/basic: submit order, less the nice (a higher nice waits behind)
            out.sort(key=lambda j: (j.nice, j.submit_s, j.job_id))
        else:
            key = self.priority
            out.sort(key=lambda j: (*key(j, now), j.submit_s, j.job_id))
        return out

    def _fit(self, job: SimJob, free: list[int]) -> list[tuple[int, int]] | None:
        """Return (node, count) pairs for a whole-GPU job on ``free``, or None."""
        need = job.gpus
        if job.gpu_type is not None:  # only the nodes of the type it asked for
            free = [
                f if n.gpu_type == job.gpu_type else 0
                for f, n in zip(free, self._nodes, strict=True)
            ]
        if job.gpus_per_node:
            k = job.gpus_per_node
            m = max(1, need // k)
            nodes = sorted((f, i) for i, f in enumerate(free) if f >= k)
            if len(nodes) < m:
                return None
            return [(i, k) for _, i in nodes[:m]]
        if need <= self.gpus_per_node:
            best = -1
            for i, f in enumerate(free):
                if f >= need and (best < 0 or f < free[best]):
                    best = i
                    if f == need:
                        break
            if best >= 0:
                return [(best, need)]
        if sum(free) < need:
            return None
        out: list[tuple[int, int]] = []
        left = need
        for f, i in sorted(
            ((f, i) for i, f in enumerate(free) if f > 0), key=lambda x: (-x[0], x[1])
        ):
            take = min(f, left)
            out.append((i, take))
            left -= take
            if left == 0:
                return out
        return None

    def _fit_shard(self, job: SimJob) -> tuple[int, int, int] | None:
        """A GPU for a shard (or MPS) job: one already shared that has room first."""
        s = job.mps or job.shards
        fresh: tuple[int, int, int] | None = None
        for n in self._nodes:
            if job.gpu_type is not None and n.gpu_type != job.gpu_type:
                continue
            room = n.mps_per_gpu if job.mps else n.shards_per_gpu
            for g, owner in enumerate(n.gpu_owner):
                if owner is not None:
                    continue
                used = sum(n.gpu_shards[g].values())
                if used and used + s <= room:
                    return (n.index, g, s)
                if not used and fresh is None and s <= room:
                    fresh = (n.index, g, s)
        return fresh

    def _fit_mig(self, job: SimJob) -> tuple[int, int] | None:
        """A free MIG slice of the profile the job asked for (first fit), or None."""
        for n in self._nodes:
            for k, ((profile, _), owner) in enumerate(zip(n.slices, n.slice_owner, strict=True)):
                if owner is None and profile.name == job.gpu_type:
                    return (n.index, k)
        return None

    def _free(self) -> list[int]:
        return list(self._free_counts)

    def _reservation(self, job: SimJob, free: list[int]) -> tuple[float, list[int]] | None:
        """Earliest time (by time limits) ``job`` fits, and the GPUs it reserves per node."""
        future = list(free)
        if self._holds:  # GPUs of ended jobs, free in a moment
            for _, alloc in self._holds:
                for n, gpus in alloc:
                    future[n] += len(gpus)
            fit = self._fit(job, future)
            if fit is not None:
                reserved = [0] * len(free)
                for n, c in fit:
                    reserved[n] = c
                return max(until for until, _ in self._holds), reserved
        for end, jid in self._by_limit:
            if not math.isfinite(end):
                break
            other = self._running[jid]
            for n, gpus in other.alloc:
                future[n] += len(gpus)
            if other.shard_alloc is not None:
                n, g, _ = other.shard_alloc
                if len(self._nodes[n].gpu_shards[g]) == 1:
                    future[n] += 1
            fit = self._fit(job, future)
            if fit is not None:
                reserved = [0] * len(free)
                for n, c in fit:
                    reserved[n] = c
                return end, reserved
        return None

    def _schedule(self) -> None:
        if self.scheduling is not None:
            self._dirty = False
            self._main_pass()
            self._arm_timers()
            return
        self._dirty = False
        free = self._free()
        if not any(free) and not self._shares:
            return
        queue = self._eligible()
        if not queue:
            return
        shadow: float | None = None
        reserved: list[int] | None = None
        spare: list[int] | None = None  # free GPUs the reservation leaves, per node
        failed: dict[tuple[bool, int, str], float] = {}
        tested = 0
        for job in queue:
            if not any(free) and not self._shares:
                break
            if shadow is not None:
                tested += 1
                if tested > self.bf_max_job_test:
                    break
            if job.gpu_type is not None and job.gpu_type in self.mig_profiles:
                # a slice is no whole GPU: starting it never delays the reservation
                slot = self._fit_mig(job)
                if slot is not None:
                    self._start(job, [], None, slot)
                continue
            if job.shards or job.mps:
                place = self._fit_shard(job)
                if place is None:
                    continue
                n = place[0]
                takes_fresh = not self._nodes[n].gpu_shards[place[1]]
                if takes_fresh and reserved is not None and shadow is not None:
                    ends = self.now + (job.time_limit_s or math.inf)
                    if ends > shadow and free[n] - 1 < reserved[n]:
                        continue
                self._start(job, [], place)
                if takes_fresh:
                    free[n] -= 1
                    spare = None
                    failed.clear()
                continue
            if reserved is None:
                fit = self._fit(job, free)
                if fit is not None:
                    self._start_whole(job, fit, free)
                    continue
                res = self._reservation(job, free)
                if res is not None:
                    shadow, reserved = res
                continue
            ends = self.now + (job.time_limit_s if job.time_limit_s is not None else math.inf)
            assert shadow is not None
            beyond = ends > shadow
            # A job of N GPUs that did not fit on a vector that has not changed since
            # means no job of N or more fits either (--gpus=N fits are monotone in N):
            # this keeps a long backfill queue at O(1) per job.
            key = (beyond, job.gpus_per_node or 0, job.gpu_type or "")
            if job.gpus >= failed.get(key, math.inf):
                continue
            if beyond:
                if spare is None:
                    spare = [max(0, f - r) for f, r in zip(free, reserved, strict=True)]
                fit = self._fit(job, spare)
            else:
                fit = self._fit(job, free)
            if fit is None:
                failed[key] = min(failed.get(key, math.inf), job.gpus)
                continue
            self._start_whole(job, fit, free)
            spare = None
            failed.clear()

    def _start_whole(self, job: SimJob, fit: list[tuple[int, int]], free: list[int]) -> None:
        alloc = []
        for n, count in fit:
            gpus = tuple(self._nodes[n].free_gpus()[:count])
            alloc.append((n, gpus))
            free[n] -= count
        self._start(job, alloc, None)

    # ---- Slurm's own passes (scheduling is set; sim.slurmsched)

    def _waiting(self) -> bool:
        return any(not j.held for j in self._pending.values())

    def _arm_timers(self) -> None:
        """Arm the backfill pass and the periodic full main pass while jobs wait."""
        sched = self.scheduling
        if sched is None or not self._waiting():
            return
        if not math.isfinite(self._bf_at):
            self._bf_at = sched.next_backfill(self._bf_last, self.now)
            self.call_at(self._bf_at, self._backfill_tick)
        if not math.isfinite(self._main_at):
            period = sched.sched_interval_s
            self._main_at = (math.floor(self.now / period) + 1) * period
            self.call_at(self._main_at, self._main_tick)

    def _backfill_tick(self) -> None:
        self._bf_at = math.inf
        if self._waiting():
            self._backfill_pass()
            self._bf_last = self.now
        self._arm_timers()

    def _main_tick(self) -> None:
        self._main_at = math.inf
        if self._waiting():
            self._main_pass()
        self._arm_timers()

    def _main_pass(self) -> None:
        """Slurm's main scheduler: strict priority order; the first job that cannot
        start stops the pass (the rest of its partition waits, reason Priority)."""
        free = self._free()
        for job in self._eligible():
            if job.gpu_type is not None and job.gpu_type in self.mig_profiles:
                slot = self._fit_mig(job)
                if slot is None:
                    return
                self._start(job, [], None, slot)
                continue
            if job.shards or job.mps:
                place = self._fit_shard(job)
                if place is None:
                    return
                fresh = not self._nodes[place[0]].gpu_shards[place[1]]
                self._start(job, [], place)
                if fresh:
                    free[place[0]] -= 1
                continue
            fit = self._fit(job, free)
            if fit is None:
                return
            self._start_whole(job, fit, free)

    def _releases(self) -> list[tuple[float, list[tuple[int, int]]]]:
        """Each running job's end by its time limit and the whole GPUs it frees then."""
        out: list[tuple[float, list[tuple[int, int]]]] = [
            (until, [(n, len(gpus)) for n, gpus in alloc]) for until, alloc in self._holds
        ]
        for end, jid in self._by_limit:
            if not math.isfinite(end):
                break
            other = self._running[jid]
            freed = [(n, len(gpus)) for n, gpus in other.alloc]
            if other.shard_alloc is not None:
                n, g, _ = other.shard_alloc
                if len(self._nodes[n].gpu_shards[g]) == 1:
                    freed.append((n, 1))
            out.append((end, freed))
        if self._holds:
            out.sort(key=lambda r: r[0])
        return out

    def _backfill_pass(self) -> None:
        """sched/backfill's pass: every waiting job, in priority order, starts now if it
        fits on nodes no earlier job's plan holds during its run, else plans its nodes
        from its earliest such start (conservative backfill, whole-node plans)."""
        sched = self.scheduling
        assert sched is not None
        now = self.now
        horizon = now + sched.bf_window_s
        plans = NodePlans(sched.bf_resolution_s)
        free = self._free()
        releases = self._releases()
        for tested, job in enumerate(self._eligible()):
            if tested >= sched.bf_max_job_test:
                break
            limit = job.time_limit_s if job.time_limit_s is not None else math.inf
            if (job.gpu_type is not None and job.gpu_type in self.mig_profiles) or (
                job.shards or job.mps
            ):
                self._backfill_share(job, plans.blocked(now, now + limit), free)
                continue
            times = {now}
            times.update(e for e, _ in releases if now < e <= horizon)
            times.update(e for e in plans.ends() if now < e <= horizon)
            avail = list(free)
            k = 0
            start = math.nan
            fit: list[tuple[int, int]] | None = None
            for t in sorted(times):
                while k < len(releases) and releases[k][0] <= t:
                    for n, c in releases[k][1]:
                        avail[n] += c
                    k += 1
                blocked = plans.blocked(t, t + limit)
                vec = [0 if i in blocked else f for i, f in enumerate(avail)]
                fit = self._fit(job, vec)
                if fit is not None:
                    start = t
                    break
            if fit is None:
                continue  # beyond the window: no plan
            if start == now:
                self._start_whole(job, fit, free)
                if math.isfinite(limit):
                    bisect.insort(releases, (now + limit, fit))
            else:
                plans.add(start, start + limit, frozenset(n for n, _ in fit))

    def _backfill_share(self, job: SimJob, blocked: set[int], free: list[int]) -> None:
        """A shard, MPS or MIG job in a backfill pass: starts now where it fits on a node
        no plan holds during its run; plans nothing otherwise."""
        if job.gpu_type is not None and job.gpu_type in self.mig_profiles:
            slot = self._fit_mig(job)
            if slot is not None and slot[0] not in blocked:
                self._start(job, [], None, slot)
            return
        place = self._fit_shard(job)
        if place is None or place[0] in blocked:
            return
        fresh = not self._nodes[place[0]].gpu_shards[place[1]]
        self._start(job, [], place)
        if fresh:
            free[place[0]] -= 1

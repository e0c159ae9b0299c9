"""Pollux (OSDI'21) as a baseline: its scheduling policy on our work model.

What the Pollux artifact does (petuum/adaptdl, branch ``osdi21-artifact``,
``simulator/simulator.py``, ``pollux.py``, ``goodput.py``, ``speedup.py``), rebuilt here
on the same throughput profiles and noise scales every other set runs on
(:mod:`slurmgpu.sim.profiles`), so that its figures sit beside ours:

- **Goodput** = throughput x statistical efficiency. A job at global batch ``B`` on a
  placement advances its progress at ``gain / step_time`` with ``gain = (B/B0) *
  (phi + B0) / (phi + B)`` and ``phi`` its gradient noise scale at that point of training
  (the slice of :attr:`Application.noise_scale` it is in). The job **co-adapts its batch
  size** (and, in the real system, its learning rate) to its allocation: it trains at the
  batch in ``[B0, max_batch_size]`` (each GPU at least the smallest profiled local batch,
  gradient accumulation beyond the largest) that maximises goodput on the placement it
  was given, re-chosen whenever its noise scale moves to the next slice (the artifact
  re-optimises between epochs). ncf keeps the fixed batch of 32,768 on one GPU, as the
  artifact configures it.
- **Speed-up** of a job on ``(nodes, replicas)``: its best goodput there over its best
  goodput on its fair share (``ceil(64 / jobs)`` GPUs; Pollux's ``_base_goodput``). A job
  that has never run has no fitted model yet: ``replicas / fair share`` (the artifact's
  ``lambda n, r: r`` divided by the fair share), and a job may grow to at most twice the
  most replicas it has run on (``max_profiled_replicas``), up to 64 and its batch limit.
  Unlike the artifact, the throughput model is the true profile, not a fit to what the
  job has seen (an oracle throughput model: kinder to Pollux, never to us).
- **Allocation search**: a genetic search over allocation matrices (jobs x nodes, GPUs
  per cell), seeded with last period's population: single-point crossover over jobs,
  the artifact's mutation (reset a job to its current allocation, zero some cells,
  increase some on nodes with free GPUs) and repair (one distributed job per node, a
  job's replica cap, node capacity, jobs in order of attained service then submission),
  maximising the power mean (p = -1) of the jobs' speed-ups scaled to a node's share,
  each changed job's speed-up multiplied by the restart discount ``max(age - restarts *
  delay, 0) / (age + delay)``. The artifact uses NSGA-II with the cluster utility as a
  second objective and then takes the solution of the best power mean; we keep that one
  objective and its elitist survival (the best ``population`` of parents and offspring).
  Population and generations are parameters (the artifact: 100 x 100); ``bench``
  measures what fewer cost.
- **Period** 60 s: every period the jobs advance, then the search runs and every job
  whose allocation changed restarts.

Two cost models (:class:`RestartCosts`), labelled in every result: the artifact's own
(``pollux-30s``: every allocation change, first start included, costs 30 s of no
progress, and the discount's delay is 30 s), and Slurm's as our sets pay them
(``pollux-slurm``: a first start costs the runtime's start-up, every later change the
checkpoint, the resize executor's fast path and the start-up again; the discount's
delay is that restart cost).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import numpy.typing as npt

from slurmgpu.sim.costs import CostSet
from slurmgpu.sim.metrics import percentile, rho_values
from slurmgpu.sim.profiles import Application, ThroughputProfile
from slurmgpu.sim.progress import ElasticRuntime
from slurmgpu.sim.workload import ProfiledJob, TraceJob

__all__ = [
    "FIXED_BATCH",
    "MAX_BATCH_SIZE",
    "POLLUX_BATCH_CEILINGS",
    "PolluxJob",
    "PolluxResult",
    "PolluxSearch",
    "RestartCosts",
    "simulate_pollux",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# The largest batch each application validated (the artifact's ``max_batch_size``, the
# top of the ranges its paper's Table 1 lists); ncf trains at a fixed batch on one GPU.
MAX_BATCH_SIZE: dict[str, int] = {
    "bert": 384,
    "cifar10": 4096,
    "deepspeech2": 640,
    "imagenet": 12800,
    "ncf": 32768,
    "yolov3": 512,
}
FIXED_BATCH: dict[str, int] = {"ncf": 32768}
# As ``SimOptions.batch_ceilings``: our batch-adaptive sets' jobs declaring Pollux's limits
# (the what-if of ``--batch-ceiling pollux`` in bench/sim_pollux.py and pollux_gap.py).
POLLUX_BATCH_CEILINGS: tuple[tuple[str, int], ...] = tuple(sorted(MAX_BATCH_SIZE.items()))
MAX_REPLICAS = 64  # "simulator can't handle more"
_BATCH_POINTS = 10  # candidate batch sizes per replica count (geometric, B0..max)


@dataclass(frozen=True, slots=True)
class RestartCosts:
    """Seconds of no progress a Pollux job pays per allocation change."""

    label: str
    first_start_s: float
    restart_s: float

    @classmethod
    def pollux(cls) -> RestartCosts:
        """The artifact's flat 30 s for every change (``Job.reallocate``)."""
        return cls("pollux-30s", 30.0, 30.0)

    @classmethod
    def slurm(cls, runtime: ElasticRuntime | None = None, executor_s: float = 3.0) -> RestartCosts:
        """What our sets pay on Slurm: start-up on a first start; checkpoint, the resize
        executor's fast path (hold, update, release: 3 s) and start-up on every change."""
        rt = runtime or ElasticRuntime()
        return cls("pollux-slurm", rt.startup_s, rt.checkpoint_s + executor_s + rt.startup_s)

    @classmethod
    def of_costs(cls, costs: CostSet) -> RestartCosts:
        """What our sets pay on Slurm with a cost set (sim.costs): a first start pays the
        submission delay and the first start-up; every change the checkpoint, the resize
        fast path as measured (stop, requeue delay, scheduling) and the start-up. The
        ``legacy`` set keeps :meth:`slurm`'s model (start-up on a first start, a 3-s
        executor), so its figures are reproduced."""
        if costs.name == "legacy":
            return cls.slurm(costs.runtime(), costs.fast_path_s)
        first = costs.submit_delay.seconds + costs.first_startup.seconds
        restart = costs.checkpoint.seconds + costs.fast_path_s + costs.startup.seconds
        return cls("pollux-slurm", first, restart)


@dataclass(frozen=True, slots=True)
class PolluxSearch:
    """The allocation search's size and the scheduling period."""

    population: int = 100
    generations: int = 100
    period_s: float = 60.0
    power: float = -1.0
    seed: int = 1


class _Goodputs:
    """Best goodput and batch per noise slice, node count and replica count of one app."""

    def __init__(self, app: Application, profile: ThroughputProfile, gpus_per_node: int) -> None:
        self.app = app
        self.profile = profile
        self.per_node = gpus_per_node
        k = len(app.noise_scale)
        self.phi = np.array(app.noise_scale, dtype=np.float64)
        self.max_batch = FIXED_BATCH.get(app.name, MAX_BATCH_SIZE.get(app.name, 0))
        # table[k, nodes, replicas]: best progress per second (0: not a valid layout)
        self.table = np.zeros((k, 17, MAX_REPLICAS + 1))
        for r in range(1, MAX_REPLICAS + 1):
            for n in range(max(1, math.ceil(r / gpus_per_node)), min(r, 16) + 1):
                rates = self._rates(_spread(r, n))
                if rates is not None:
                    self.table[:, n, r] = rates[0]
        # best goodput on at most r GPUs (compact layouts): the fair-share normaliser
        best = np.zeros((k, MAX_REPLICAS + 1))
        for r in range(1, MAX_REPLICAS + 1):
            best[:, r] = np.maximum(best[:, r - 1], self.table[:, :, r].max(axis=1))
        self.best_upto = best

    def _candidates(self, replicas: int) -> list[int]:
        b0 = self.app.init_batch_size
        if self.app.name in FIXED_BATCH:
            return [self.max_batch]
        lo = max(b0, replicas * int(self.profile.min_local_bsz))
        hi = self.max_batch
        if lo > hi:
            return []
        if lo == hi:
            return [lo]
        ratio = (hi / lo) ** (1.0 / (_BATCH_POINTS - 1))
        return sorted({round(lo * ratio**i) for i in range(_BATCH_POINTS)})

    def _rates(self, placement: tuple[int, ...]) -> tuple[FloatArray, IntArray] | None:
        """Per noise slice: the best progress rate on ``placement`` and its batch."""
        cands = self._candidates(sum(placement))
        if not cands:
            return None
        b0 = float(self.app.init_batch_size)
        bs = np.array(cands, dtype=np.float64)
        steps = np.array(
            [
                self.profile.step_time(
                    placement,
                    b,
                    max_local_bsz=self.app.max_local_bsz,
                    init_batch_size=self.app.init_batch_size,
                )
                for b in cands
            ]
        )
        phi = self.phi[:, None]
        gain = (bs / b0) * (phi + b0) / (phi + bs)  # (k, candidates)
        rate = gain / steps
        pick = rate.argmax(axis=1)
        return rate[np.arange(len(phi)), pick], bs[pick].astype(np.int64)

    @cache  # noqa: B019 -- one table per application per process, never freed on purpose
    def on(self, placement: tuple[int, ...], k: int) -> tuple[float, int]:
        """The progress rate and batch of a job in slice ``k`` on ``placement``."""
        found = self._rates(placement)
        if found is None:
            return 0.0, 0
        return float(found[0][k]), int(found[1][k])


@cache
def _goodputs(app: Application, profile: ThroughputProfile, gpus_per_node: int) -> _Goodputs:
    return _Goodputs(app, profile, gpus_per_node)


def _spread(replicas: int, nodes: int) -> tuple[int, ...]:
    """``replicas`` over ``nodes`` as evenly as possible (the layout a speed-up assumes)."""
    q, rem = divmod(replicas, nodes)
    return tuple(q + 1 if i < rem else q for i in range(nodes))


@dataclass(slots=True)
class PolluxJob:
    """One trace job under Pollux (what the artifact's ``Job`` tracks)."""

    key: int
    submit_s: float
    app: Application
    goodputs: _Goodputs
    trace_gpus: int
    model: ProfiledJob
    progress: float = 0.0
    attained_gpu_s: float = 0.0
    restarts: int = -1  # the artifact's None: never allocated
    rescale_s: float = 0.0
    alloc: tuple[int, ...] = ()  # GPUs per node (cluster order); () none
    end_s: float = math.nan
    max_seen: int = 0  # most replicas it has run on (max_profiled_replicas)
    gpu_s: float = 0.0
    resizes: int = 0  # a change between two non-empty allocations
    preemptions: int = 0  # a running job left with none
    batches: list[int] = field(default_factory=list)
    # every allocation change: (time, GPUs per node), () when it lost its GPUs
    history: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)

    @property
    def replicas(self) -> int:
        return sum(self.alloc)

    def slice_of(self) -> int:
        k = len(self.app.noise_scale)
        return min(k - 1, int(self.progress * k / self.app.progress))

    def max_replicas(self) -> int:
        if self.app.name in FIXED_BATCH:
            return 1
        cap = self.goodputs.max_batch // max(1, int(self.goodputs.profile.min_local_bsz))
        return max(1, min(max(2 * self.max_seen, 1), MAX_REPLICAS, cap))

    def advance(self, start_s: float, seconds: float) -> None:
        """Train for ``seconds`` from ``start_s`` on the current allocation."""
        r = self.replicas
        if r == 0 or not math.isnan(self.end_s):
            return
        placement = tuple(g for g in self.alloc if g)
        t = start_s
        delay = min(self.rescale_s, seconds)
        self.rescale_s -= delay
        t += delay
        left = seconds - delay
        kslices = len(self.app.noise_scale)
        while left > 0:
            k = self.slice_of()
            rate, batch = self.goodputs.on(placement, k)
            if not self.batches or self.batches[-1] != batch:
                self.batches.append(batch)
            if rate <= 0:
                t += left
                break
            boundary = (k + 1) * self.app.progress / kslices
            need = (boundary - self.progress) / rate
            if need > left:
                self.progress += rate * left
                t += left
                break
            self.progress = boundary
            t += need
            left -= need
            if k + 1 >= kslices:
                self.end_s = t
                break
        held = t - start_s
        self.attained_gpu_s += held * r
        self.gpu_s += held * r


@dataclass(frozen=True, slots=True)
class PolluxResult:
    """One Pollux run: the jobs as they ended, the cluster and how it was run."""

    jobs: tuple[PolluxJob, ...]
    nodes: int
    gpus_per_node: int
    costs: RestartCosts
    search: PolluxSearch

    def jct(self) -> list[float]:
        return [j.end_s - j.submit_s for j in self.jobs if not math.isnan(j.end_s)]

    def figures(self) -> dict[str, float]:
        """The figures ``bench/sim_pollux.py`` prints for every set, for this run:
        JCT (submission to end; the artifact's), p50/p99, makespan, GPU-hours held,
        preemptions and resizes per job, Themis' rho (worst, % above 1.05; ``T_id`` at
        the GPUs the trace asked for, at the trace's batch, as for our sets), timeouts
        (none: Pollux jobs have no time limit) and jobs left unfinished."""
        done = [j for j in self.jobs if not math.isnan(j.end_s)]
        jct = self.jct()
        n = max(1, len(self.jobs))
        rho = rho_values(
            [(j.submit_s, j.end_s, j.trace_gpus, j.model) for j in done],
            self.nodes * self.gpus_per_node,
            self.gpus_per_node,
        )
        first = min((j.submit_s for j in done), default=0.0)
        last = max((j.end_s for j in done), default=0.0)
        return {
            "avg_jct_s": sum(jct) / len(jct) if jct else math.nan,
            "p50_jct_s": percentile(jct, 50),
            "p99_jct_s": percentile(jct, 99),
            "makespan_s": max(0.0, last - first),
            "gpu_hours": sum(j.gpu_s for j in self.jobs) / 3600.0,
            "preemptions_per_job": sum(j.preemptions for j in self.jobs) / n,
            "resizes_per_job": sum(j.resizes for j in self.jobs) / n,
            "rho_max": max(rho, default=math.nan),
            "rho_over_pct": 100.0 * sum(r > 1.05 for r in rho) / len(rho) if rho else math.nan,
            "timeouts": 0.0,
            "unfinished": float(len(self.jobs) - len(done)),
        }


class _Search:
    """The genetic allocation search, its population carried from period to period."""

    def __init__(self, search: PolluxSearch, nodes: int, per_node: int) -> None:
        self.s = search
        self.nodes = nodes
        self.per_node = per_node
        self.rng = np.random.default_rng(search.seed)
        self.prev: IntArray | None = None
        self.prev_keys: list[int] = []
        # every application's goodput tables stacked: (applications x slices, nodes,
        # replicas); offsets[id(goodputs)] is where one application's slices start
        # (index 0: a job that never ran, whose speed-up is its replicas over the fair
        # share, the artifact's ``lambda n, r: r``)
        self.tables = np.broadcast_to(
            np.arange(MAX_REPLICAS + 1, dtype=np.float64), (1, 17, MAX_REPLICAS + 1)
        ).copy()
        self.offsets: dict[int, int] = {}

    def add(self, gp: _Goodputs) -> None:
        """Make ``gp``'s tables searchable (once per application)."""
        if id(gp) not in self.offsets:
            self.offsets[id(gp)] = self.tables.shape[0]
            self.tables = np.concatenate([self.tables, gp.table])

    def optimize(self, jobs: Sequence[PolluxJob], now: float, delay: float) -> IntArray:
        """The best allocation matrix (jobs x nodes) for ``jobs`` (already in order).

        The population is held as (states, nodes, jobs), the transpose of the
        allocation matrices: a job's sums over nodes are then 16 row additions, not a
        reduction along a short inner axis, which is most of the search's time. Every
        random draw keeps the shape and element order of the jobs x nodes form, so the
        search decides exactly what it did in that form."""
        nj, nn, g = len(jobs), self.nodes, self.per_node
        base = np.zeros((nn, nj), dtype=np.int64)  # (nodes, jobs)
        for i, job in enumerate(jobs):
            if job.alloc:
                base[:, i] = job.alloc
        maxrep = np.array([j.max_replicas() for j in jobs], dtype=np.int64)
        # each job's speed-up table: its goodput table in its noise slice over its
        # goodput on its fair share, or (never run) replicas over the fair share
        fair = max(1, math.ceil(nn * g / nj))
        table = np.zeros(nj, dtype=np.int64)
        norm = np.full(nj, float(fair))
        for i, job in enumerate(jobs):
            if job.max_seen > 0:
                k = job.slice_of()
                table[i] = self.offsets[id(job.goodputs)] + k
                norm[i] = job.goodputs.best_upto[k, min(fair, MAX_REPLICAS)] or math.inf
        scale = nn / (nn * g)  # a node's share of the cluster: speed-up 1 = one node's worth
        age = np.array([now - j.submit_s for j in jobs])
        restarts = np.array([max(j.restarts, 0) for j in jobs], dtype=np.float64)
        factor = np.maximum(age - restarts * delay, 0.0) / (age + delay)

        def fitness(states: IntArray) -> FloatArray:
            n_nodes = np.count_nonzero(states, axis=1)
            n_reps = np.minimum(states.sum(axis=1), MAX_REPLICAS)
            sp = self.tables[table[None, :], np.minimum(n_nodes, 16), n_reps] / norm * scale
            changed = np.any(states != base[None], axis=1)
            sp = np.where(changed, sp * factor[None, :], sp)
            p = self.s.power
            return np.asarray((np.mean((sp + 1e-3) ** p, axis=1)) ** (1.0 / p))

        def repair(states: IntArray) -> IntArray:
            # one distributed job per node (the first in job order keeps it)
            distributed = np.count_nonzero(states, axis=1) > 1
            mask = np.logical_and(states > 0, distributed[:, None, :])
            states[np.cumsum(mask, axis=2) > 1] = 0
            # at most max_replicas per job, nodes taken in a random order (only the
            # jobs over their cap change)
            over = np.nonzero(states.sum(axis=1) > maxrep[None, :])
            if len(over[0]):
                rows = states[over[0], :, over[1]]  # (jobs over their cap, nodes)
                shuffle = np.argsort(self.rng.random(rows.shape, dtype=np.float32), axis=1)
                rows = np.take_along_axis(rows, shuffle, axis=1)
                rows = _steps(np.minimum(np.cumsum(rows, axis=1), maxrep[over[1]][:, None]))
                states[over[0], :, over[1]] = np.take_along_axis(
                    rows, np.argsort(shuffle, axis=1), axis=1
                )
            # node capacity, jobs in order
            return _steps(np.minimum(np.cumsum(states, axis=2), g))

        def mutate(states: IntArray) -> IntArray:
            p = states.shape[0]
            reset = self.rng.random((p, nj), dtype=np.float32) < 0.1
            states = np.where(reset[:, None, :], base[None], states)
            chosen = np.nonzero(self.rng.random((p, nj), dtype=np.float32) < 0.1)
            if len(chosen[0]):
                rows = states[chosen[0], :, chosen[1]]
                rows[self.rng.random(rows.shape, dtype=np.float32) < 0.1] = 0
                states[chosen[0], :, chosen[1]] = rows
            free = g - states.sum(axis=2)  # (p, nodes)
            has_free = free > 0
            # a cell grows with probability p1 + p2 - p1 * p2: p1 = 1/jobs on a node
            # with free GPUs, p2 = 1/(the node's jobs) for a job already on it; both
            # are per node, so the sum is formed per node, not per cell
            prob1 = np.where(has_free, 1.0 / nj, 0.0)
            mask2 = np.logical_and(states > 0, has_free[:, :, None])
            prob2 = 1.0 / np.maximum(mask2.sum(axis=2), 1.0)
            both = prob1 + prob2 - prob1 * prob2
            prob = np.where(mask2, both[:, :, None], prob1[:, :, None]).transpose(0, 2, 1)
            m = np.nonzero(self.rng.random((p, nj, nn), dtype=np.float32) < prob)
            cells = (m[0], m[2], m[1])  # in jobs x nodes order, as the draws are
            low = states[cells]
            states[cells] = low + (self.rng.random(len(low)) * (g + 1 - low)).astype(np.int64)
            return states

        pop = self._seed_population(jobs, base)
        score = fitness(pop)
        for _ in range(self.s.generations):
            npop = pop.shape[0]
            pairs = self.rng.integers(0, npop, size=(max(1, self.s.population // 2), 2, 2))
            # binary tournament for each parent
            a = np.where(score[pairs[:, 0, 0]] >= score[pairs[:, 0, 1]], *pairs[:, 0].T)
            b = np.where(score[pairs[:, 1, 0]] >= score[pairs[:, 1, 1]], *pairs[:, 1].T)
            point = self.rng.integers(0, nj, size=len(a))[:, None]
            first = (np.arange(nj)[None, :] < point)[:, None, :]
            c1 = np.where(first, pop[a], pop[b])
            c2 = np.where(first, pop[b], pop[a])
            kids = repair(mutate(np.concatenate([c1, c2])))
            pop = np.concatenate([pop, kids])
            score = np.concatenate([score, fitness(kids)])
            keep = np.argsort(-score, kind="stable")[: self.s.population]
            pop, score = pop[keep], score[keep]
        self.prev = pop
        self.prev_keys = [j.key for j in jobs]
        return np.asarray(pop[int(np.argmax(score))].T)

    def _seed_population(self, jobs: Sequence[PolluxJob], base: IntArray) -> IntArray:
        """Last period's population on this period's jobs (new jobs with nothing), as the
        artifact's ``_adapt_prev_states``; the current allocation when there is none.
        Both ``base`` and the result are (nodes, jobs) per state."""
        if self.prev is None:
            return base[None].copy()
        where = {key: i for i, key in enumerate(self.prev_keys)}
        states = np.zeros((self.prev.shape[0], self.nodes, len(jobs)), dtype=np.int64)
        for i, job in enumerate(jobs):
            src = where.get(job.key)
            if src is not None:
                states[:, :, i] = self.prev[:, :, src]
        return np.concatenate([base[None], states])


def _steps(totals: IntArray) -> IntArray:
    """The increments of running totals along the last axis (``np.diff`` with
    ``prepend=0``, without its broadcasting and concatenation)."""
    out = totals.copy()
    out[..., 1:] -= totals[..., :-1]
    return out


def simulate_pollux(
    trace: Sequence[TraceJob],
    *,
    nodes: int = 16,
    gpus_per_node: int = 4,
    costs: RestartCosts | None = None,
    search: PolluxSearch | None = None,
    max_virtual_s: float = 60 * 86400.0,
) -> PolluxResult:
    """Run the Pollux policy over the Pollux-workload jobs of ``trace``.

    Raises ValueError naming the first job that is not a profiled (Pollux-workload) job.
    """
    cost = costs or RestartCosts.pollux()
    opts = search or PolluxSearch()
    jobs: list[PolluxJob] = []
    for i, tj in enumerate(trace):
        model = tj.model
        if not isinstance(model, ProfiledJob) or model.app.name not in MAX_BATCH_SIZE:
            raise ValueError(
                f"job {i + 1} ({tj.name}): Pollux runs only the Pollux workloads' profiled jobs"
            )
        jobs.append(
            PolluxJob(
                key=i,
                submit_s=tj.submit_s,
                app=model.app,
                goodputs=_goodputs(model.app, model.profile, gpus_per_node),
                trace_gpus=max(1, tj.gpus),
                model=model,
            )
        )
    searcher = _Search(opts, nodes, gpus_per_node)
    for job in jobs:
        searcher.add(job.goodputs)
    now = 0.0
    left = len(jobs)
    while left and now < max_virtual_s:
        for job in jobs:
            if job.alloc:
                job.advance(now, opts.period_s)
        now += opts.period_s
        for job in jobs:
            if job.alloc and not math.isnan(job.end_s):
                job.alloc = ()
                left -= 1
        active = [j for j in jobs if j.submit_s <= now and math.isnan(j.end_s)]
        if not active:
            continue
        active.sort(key=lambda j: (j.attained_gpu_s, j.submit_s, j.key))
        best = searcher.optimize(active, now, cost.restart_s)
        for job, row in zip(active, best, strict=True):
            new = tuple(int(x) for x in row) if row.any() else ()
            if new == job.alloc:
                continue
            if new:
                if job.alloc:
                    job.resizes += 1
                job.restarts += 1
                job.rescale_s = cost.first_start_s if job.restarts == 0 else cost.restart_s
                job.max_seen = max(job.max_seen, sum(new))
            elif job.alloc:
                job.preemptions += 1
            job.alloc = new
            job.history.append((now, new))
    return PolluxResult(tuple(jobs), nodes, gpus_per_node, cost, opts)

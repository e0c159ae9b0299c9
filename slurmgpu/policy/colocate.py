"""Co-location: pack light 1-GPU jobs onto shared GPUs, and separate them when it goes wrong.

Gandiva and Lucid (docs/ANCHORS.md §3) pack only jobs whose profile says they share well,
and the memory of the jobs on a GPU must fit it. Slurm's own sharing unit is ``gres/shard``
(``S`` shards per GPU, 4 on the lab cluster); Slurm puts a job's shards on one GPU of a
node and packs shard jobs first fit, so two jobs of ``S/2`` shards end up on one GPU.

**Packing** (pending jobs). A candidate is a pending single-node job that asks for one
whole GPU -- ``--gres=shard:S`` (a whole GPU's shards) or ``--gres=gpu:1`` where Slurm
lets a pending job switch from gres/gpu to gres/shard (``convert_gpu_requests``; Slurm
22.05 refuses) -- that opted in (``sgpu submit --shareable``, comment token
``sgpu:shareable``) or any job while ``apply_to_all``. Its profile: mean GPU util and
peak GPU memory of past runs (:class:`~slurmgpu.policy.priors.Priors`), memory also from
``--gpu-mem`` (``sgpu:gpu-mem=MiB``; the larger counts). History counts only at the job's
own keys (its script or its name, :data:`JOB_LEVELS`): the mean util of a user's *other*
jobs says nothing about this one (a user with a light sweep would have their heavy
training packed). ``--gpu-mem`` is required for a job without such history. It is
packed when

- light: util <= ``max_util_pct`` (a shareable job without history counts at that ceiling);
- memory fits: shards are memory budgets. ``N = max(ceil(S * mem / (device - margin)),
  ceil(S / max_jobs_per_gpu))`` (:meth:`SizingRules.shards
  <slurmgpu.policy.sizing.SizingRules.shards>`, the site's rules, which ``sgpu eff``
  advises by too); Slurm never puts more than ``S`` shards on a GPU, so the jobs on one GPU
  together never declare more than the device less the margin. ``N >= S`` is not sharing
  and is left alone;
- it shares well: the interference model's slowdown of the job next to the worst partners
  its GPU could get (as many as the remaining shards allow, each at the ceiling) and of such
  a partner next to it are both within ``max_slowdown``.

The action is an ``update`` with the intent ``NarrowToShards(N)`` (``slurmgpu.slurm.update``
spells it ``TresPerNode=gres/shard:N``, ``gres:shard:N`` before Slurm 23.02, whose
slurmctld silently ignores the ``gres/`` spelling).

**Separation** (running jobs). Jobs sharing one GPU are found from their allocations
(``NodeGpuAllocation.shard_indices`` / ``gpu_indices``; Slurm 22.05 also places a whole-GPU
job on a GPU that holds shards), and the agents' per-process samples give each its own util
and memory on that GPU (``JobUsage``). When the jobs on a GPU together use
``separate_memory_fraction`` of its memory, or more than the device less the margin (an
out-of-memory is near), or the model's slowdown of one of them (from the observed utils)
passes ``max_slowdown``, the newest job holding shards there (fewer than ``S``) is
separated: a ``requeue`` whose intents (``NarrowToShards(S)``, the whole GPU, and
``SetComment`` with the token ``sgpu:separated`` added, so it is never packed again) the
actuator applies while the job is held (``actuate.separate``). It is ``protective``: the
cooldown after its packing does not hold it back. A job that may not be requeued gets a
notice instead. One separation per GPU per cycle; the next cycle looks again.

Pure: reads only the snapshot (time is ``snapshot.at``), O(jobs) per cycle.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from slurmgpu.intent import Intent, NarrowToMps, NarrowToShards, SetComment, SetGpus
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node
from slurmgpu.policy.base import Action, GpuStat, HistoryRecord, PolicySnapshot, slurm_job_ref
from slurmgpu.policy.interference import COEFFICIENTS, InterferenceModel, slowdown_with
from slurmgpu.policy.priors import LEVELS, Priors
from slurmgpu.policy.settings import ColocateSettings
from slurmgpu.policy.sizing import SizingRules
from slurmgpu.policy.slices import (
    PartitionOffer,
    ShardFit,
    choose_slice,
    converts_request,
    partition_offers,
    shard_fit,
)
from slurmgpu.tokens import SEPARATED, add_to_comment, parse

__all__ = [
    "ALERT_PACK",
    "ALERT_SEPARATE",
    "ALERT_SEPARATE_NOTICE",
    "JOB_LEVELS",
    "ColocateHints",
    "ColocatePolicy",
    "ShardFit",
    "converts_gpu_to_shards",
    "hints_from_comment",
    "shard_fit",
    "shards_per_gpu",
]

ALERT_PACK = "colocate"
ALERT_SEPARATE = "colocate_separation"
ALERT_SEPARATE_NOTICE = "colocate_separation_notice"
# Priors levels keyed by the job itself (script or name); the user-wide ones are not.
JOB_LEVELS = frozenset(level for level in LEVELS if "script" in level or "name" in level)

Numbers = dict[str, float | int | str | None]


@dataclass(frozen=True, slots=True)
class ColocateHints:
    """What a job's comment says about sharing (``sgpu submit --shareable --gpu-mem``)."""

    shareable: bool = False
    gpu_memory_mib: int | None = None
    separated: bool = False


def hints_from_comment(comment: str) -> ColocateHints:
    """Return the co-location tokens in a job comment (:mod:`slurmgpu.tokens`); malformed
    ones are ignored.

    >>> hints_from_comment("run 3 sgpu:shareable sgpu:gpu-mem=8192")
    ColocateHints(shareable=True, gpu_memory_mib=8192, separated=False)
    """
    if "sgpu:" not in comment:
        return _NO_HINTS
    t = parse(comment)
    return ColocateHints(t.shareable, t.gpu_mem_mib, t.separated)


_NO_HINTS = ColocateHints()


_VERSION_RE = re.compile(r"(\d+)\.(\d+)")


def converts_gpu_to_shards(slurm_version: str) -> bool:
    """Whether slurmctld lets a pending job switch from gres/gpu to gres/shard: from
    23.02 (22.05 refuses the update); an unknown version counts as a current one.

    >>> converts_gpu_to_shards("22.05.9"), converts_gpu_to_shards("24.11.1")
    (False, True)
    """
    m = _VERSION_RE.match(slurm_version.strip())
    return not (m and (int(m.group(1)), int(m.group(2))) < (23, 2))


def shards_per_gpu(node: Node) -> int:
    """Return how many shards each GPU of ``node`` has (0 when it has no shards)."""
    if node.gpus <= 0 or node.shards <= 0:
        return 0
    return node.shards // node.gpus


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What packing one profile means: shared by every pending job with that profile."""

    reason: str
    numbers: Numbers
    intents: tuple[Intent, ...]


def _newest_first(job: Job) -> tuple[float, int]:
    started = job.start_time.timestamp() if job.start_time is not None else math.inf
    return (-started, -job.job_id)


class ColocatePolicy:
    """Proposes shard requests for light pending jobs and separations of bad pairs."""

    name = "colocate"

    def __init__(
        self,
        settings: ColocateSettings | None = None,
        model: InterferenceModel = COEFFICIENTS,
        *,
        sizing: SizingRules | None = None,
    ) -> None:
        self.settings = settings or ColocateSettings()
        self.sizing = sizing or SizingRules()  # the shard rule, its margin and jobs per GPU
        self.model = model
        self._cached: tuple[Sequence[HistoryRecord], Priors] | None = None

    def priors(self, history: Sequence[HistoryRecord]) -> Priors:
        """Return priors for ``history``, reusing them while it is the same object (and,
        for a new one, the statistics of every user whose runs are the same)."""
        if self._cached is None or self._cached[0] is not history:
            priors = Priors.from_history(history, min_samples=self.settings.min_history)
            if self._cached is not None:
                priors.carry_over(self._cached[1])
            self._cached = (history, priors)
        return self._cached[1]

    def propose(self, snapshot: PolicySnapshot) -> list[Action]:
        """Return separations of running jobs first, then shard requests for pending ones."""
        return [*self._separations(snapshot), *self._packing(snapshot)]

    # -- packing ---------------------------------------------------------------------

    def _device_memory_mib(self, snapshot: PolicySnapshot) -> float | None:
        if self.settings.device_memory_mib is not None:
            return float(self.settings.device_memory_mib)
        seen = [
            g.memory_total_mib
            for usage in snapshot.usage.values()
            for g in usage.gpus
            if g.memory_total_mib
        ]
        return min(seen) if seen else None

    def _shards_by_partition(self, nodes: Iterable[Node]) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for node in nodes:
            if node.available:
                for part in node.partitions:
                    out.setdefault(part, set()).add(shards_per_gpu(node))
        return out

    def _packing(self, snapshot: PolicySnapshot) -> list[Action]:
        s = self.settings
        cluster = snapshot.cluster
        pending = [j for j in cluster.jobs if j.state is JobState.PENDING]
        if not pending:
            return []
        device_mib = self._device_memory_mib(snapshot)
        if device_mib is None or device_mib - self.sizing.memory_margin_mib <= 0:
            return []
        convert_gpu = s.convert_gpu_requests == "always" or (
            s.convert_gpu_requests == "auto" and converts_gpu_to_shards(cluster.slurm_version)
        )
        by_partition = self._shards_by_partition(cluster.nodes)
        priors: Priors | None = None
        # Pending jobs share comments, partitions and profiles (resubmissions, arrays):
        # each is resolved once per cycle, and jobs with one verdict share its texts.
        hints_of: dict[str, ColocateHints] = {}
        shards_of: dict[str, int] = {}
        verdicts: dict[tuple[float, float, int, str, str, str], _Verdict | None] = {}
        actions: list[Action] = []
        offers = partition_offers(cluster.nodes)
        offer_of: dict[str, PartitionOffer] = {}
        for job in pending:
            hints = hints_of.get(job.comment)
            if hints is None:
                hints = hints_of[job.comment] = hints_from_comment(job.comment)
            if hints.separated or not (hints.shareable or s.apply_to_all) or job.node_count > 1:
                continue
            offer = offer_of.get(job.partition)
            if offer is None:
                offer = offer_of[job.partition] = _job_offer(job.partition, offers)
            if offer.mig_profiles or offer.mps_per_gpu:
                if priors is None:
                    priors = self.priors(snapshot.history)
                action = self._slice_action(job, hints, offer, priors, device_mib, cluster)
                if action is not None:
                    actions.append(action)
                continue
            shards = shards_of.get(job.partition)
            if shards is None:
                shards = shards_of[job.partition] = self._uniform_shards(job, by_partition)
            if shards < 2:
                continue
            request = job.gpus
            from_gpu = _one_gpu(request)
            whole_in_shards = request.gpus == 0 and request.shards_per_node == shards
            if not (whole_in_shards or (from_gpu and convert_gpu)):
                continue
            if priors is None:
                priors = self.priors(snapshot.history)
            profile = self._profile(job, hints, priors)
            if profile is None:
                continue
            util, util_source, memory, memory_source = profile
            before = (
                f"{request.shards_per_node} shards"
                if whole_in_shards
                else f"{request.per_node} GPU"
            )
            key = (util, memory, shards, util_source, before, memory_source)
            if key in verdicts:
                verdict = verdicts[key]
            else:
                verdict = verdicts[key] = self._verdict(
                    util, util_source, memory, memory_source, shards, device_mib, before
                )
            if verdict is not None:
                actions.append(self._pack_action(job, verdict))
        return actions

    def _pack_action(self, job: Job, verdict: _Verdict) -> Action:
        return Action(
            policy=self.name,
            kind="update",
            job_id=job.job_id,
            user=job.user,
            reason=verdict.reason,
            numbers=verdict.numbers,
            intents=verdict.intents,
            alert=ALERT_PACK,
            # Above rightsize's updates of the same pending job, which would
            # otherwise win the one-action-per-job contest every cycle.
            priority=1,
            slurm_id=slurm_job_ref(job),
        )

    def _profile(
        self, job: Job, hints: ColocateHints, priors: Priors
    ) -> tuple[float, str, float, str] | None:
        """(util, where from, memory, where from) of a job, or None: unknown, not packed."""
        s = self.settings
        est = priors.estimate(job)
        if est is not None and est.level not in JOB_LEVELS:
            est = None
        util = est.mean_gpu_util_pct if est is not None else None
        util_source = "history"
        if util is None:
            if not hints.shareable:
                return None
            util, util_source = s.max_util_pct, "declared shareable (assumed at the ceiling)"
        known_memory = [
            m
            for m in (hints.gpu_memory_mib, est.peak_gpu_memory_mib if est else None)
            if m is not None
        ]
        if not known_memory:
            return None
        memory = float(max(known_memory))
        memory_source = (
            "declared with --gpu-mem"
            if hints.gpu_memory_mib is not None and hints.gpu_memory_mib >= memory
            else "peak of its past runs"
        )
        return util, util_source, memory, memory_source

    def _slice_action(
        self,
        job: Job,
        hints: ColocateHints,
        offer: PartitionOffer,
        priors: Priors,
        device_mib: float,
        cluster: ClusterSnapshot,
    ) -> Action | None:
        """A partition with MIG or MPS nodes: narrow the job to the slice
        :func:`~slurmgpu.policy.slices.choose_slice` picks among what its request may
        become on this release (:func:`~slurmgpu.policy.slices.converts_request`)."""
        s = self.settings
        request = job.gpus
        version = cluster.slurm_version
        whole_mps = (
            request.mps > 0
            and request.gpus == 0
            and request.shards == 0
            and request.mps_per_node == offer.mps_per_gpu
        )
        if not (whole_mps or _one_gpu(request)):
            return None
        shards_ok = _one_gpu(request) and (
            s.convert_gpu_requests == "always"
            or (s.convert_gpu_requests == "auto" and converts_gpu_to_shards(version))
        )
        usable = PartitionOffer(
            mig_profiles=offer.mig_profiles if converts_request(request, "mig", version) else (),
            mps_per_gpu=offer.mps_per_gpu if converts_request(request, "mps", version) else 0,
            shards_per_gpu=offer.shards_per_gpu if shards_ok else 0,
        )
        if not (usable.mig_profiles or usable.mps_per_gpu or usable.shards_per_gpu):
            return None
        profile = self._profile(job, hints, priors)
        if profile is None:
            return None
        util, util_source, memory, memory_source = profile
        choice = choose_slice(util, memory, usable, device_mib, s, self.sizing, self.model)
        if choice is None:
            return None
        before = f"{request.mps_per_node} MPS" if whole_mps else f"{request.per_node} GPU"
        intent: Intent
        if choice.kind == "mig":
            intent = SetGpus(1, choice.profile)
        elif choice.kind == "mps":
            intent = NarrowToMps(choice.count)
        else:
            intent = NarrowToShards(choice.count)
        numbers: Numbers = {
            "util_pct": round(util, 1),
            "util_source": util_source,
            "gpu_memory_mib": round(memory),
            "gpu_memory_source": memory_source,
            "device_memory_mib": round(device_mib),
            "memory_margin_mib": self.sizing.memory_margin_mib,
            "slice": choice.gres,
            "slice_kind": choice.kind,
            "slice_memory_mib": round(choice.memory_mib),
            "gpu_fraction": round(choice.gpu_fraction, 3),
            "partners_max": choice.partners,
            "predicted_slowdown": round(choice.slowdown, 3),
            "predicted_partner_slowdown": round(choice.partner_slowdown, 3),
            "max_slowdown": s.max_slowdown,
        }
        util_from = "its past runs" if util_source == "history" else util_source
        reason = (
            f"light job: GPU util {util:.0f} % ({util_from}), {memory / 1024:.1f} GiB "
            f"GPU memory ({memory_source}): {choice.gres} ({choice.isolation}, "
            f"{choice.gpu_fraction:.0%} of a GPU) instead of {before}, predicted slowdown "
            f"{max(choice.slowdown, choice.partner_slowdown):.2f}x at most"
        )
        return self._pack_action(job, _Verdict(reason, numbers, (intent,)))

    @staticmethod
    def _uniform_shards(job: Job, by_partition: dict[str, set[int]]) -> int:
        """Shards per GPU on every node the job may run on; 0 when none or they differ."""
        counts: set[int] = set()
        for part in (job.partition or "").split(","):
            counts |= by_partition.get(part, set())
        return counts.pop() if len(counts) == 1 else 0

    def _verdict(
        self,
        util: float,
        util_source: str,
        memory_mib: float,
        memory_source: str,
        shards: int,
        device_mib: float,
        before: str,
    ) -> _Verdict | None:
        """The shard count and its justification for one profile, or None: leave it whole."""
        s = self.settings
        fit = shard_fit(util, memory_mib, shards, device_mib, s, self.sizing, self.model)
        if fit is None:
            return None
        n, partners, own, theirs = fit.shards, fit.partners, fit.slowdown, fit.partner_slowdown
        numbers: Numbers = {
            "util_pct": round(util, 1),
            "util_source": util_source,
            "gpu_memory_mib": round(memory_mib),
            "gpu_memory_source": memory_source,
            "device_memory_mib": round(device_mib),
            "memory_margin_mib": self.sizing.memory_margin_mib,
            "shards_per_gpu": shards,
            "shards_proposed": n,
            "partners_max": partners,
            "predicted_slowdown": round(own, 3),
            "predicted_partner_slowdown": round(theirs, 3),
            "max_slowdown": s.max_slowdown,
        }
        util_from = "its past runs" if util_source == "history" else util_source
        reason = (
            f"light job: GPU util {util:.0f} % ({util_from}), {memory_mib / 1024:.1f} GiB "
            f"GPU memory ({memory_source}): {n} of {shards} shards instead of {before}, "
            f"predicted slowdown {max(own, theirs):.2f}x at most"
        )
        return _Verdict(reason, numbers, (NarrowToShards(n),))

    # -- separation ------------------------------------------------------------------

    def _separations(self, snapshot: PolicySnapshot) -> list[Action]:
        cluster = snapshot.cluster
        running = [j for j in cluster.jobs if j.state is JobState.RUNNING and j.gpu_allocations]
        if len(running) < 2:
            return []
        shards_at = {n.name: shards_per_gpu(n) for n in cluster.nodes}
        # (node, Slurm GPU index) -> [(job, shards it holds there; 0 = the whole GPU)]
        occupants: dict[tuple[str, int], list[tuple[Job, int]]] = {}
        for job in running:
            for alloc in job.gpu_allocations:
                for index in alloc.gpu_indices:
                    occupants.setdefault((alloc.node, index), []).append((job, 0))
                shard_gpus = set(alloc.shard_indices)
                for index in shard_gpus:
                    held = alloc.shards if len(shard_gpus) == 1 else 1
                    occupants.setdefault((alloc.node, index), []).append((job, max(held, 1)))
        separated_since: dict[int, datetime] = {}
        for a in snapshot.alerts:
            if a.policy == self.name and a.kind in (ALERT_SEPARATE, ALERT_SEPARATE_NOTICE):
                separated_since[a.job_id] = a.at
        actions: list[Action] = []
        chosen: set[int] = set()
        for (node, index), members in sorted(occupants.items()):
            if len(members) < 2:
                continue
            action = self._judge(
                snapshot, node, index, members, shards_at.get(node, 0), separated_since
            )
            if action is not None and action.job_id not in chosen:
                chosen.add(action.job_id)
                actions.append(action)
        return actions

    def _judge(
        self,
        snapshot: PolicySnapshot,
        node: str,
        index: int,
        members: list[tuple[Job, int]],
        shards: int,
        separated_since: dict[int, datetime],
    ) -> Action | None:
        s = self.settings
        stats: dict[int, GpuStat] = {}
        for job, _ in members:
            usage = snapshot.usage.get(job.job_id)
            if usage is None:
                continue
            for g in usage.gpus:
                if g.node == node and g.gpu_index == index and g.samples >= s.min_samples:
                    stats[job.job_id] = g
        if not stats:
            return None
        totals = [g.memory_total_mib for g in stats.values() if g.memory_total_mib]
        total = max(totals) if totals else s.device_memory_mib
        used = sum(g.max_memory_mib or 0.0 for g in stats.values())
        utils = {j: g.mean_util_pct for j, g in stats.items() if g.mean_util_pct is not None}
        slowdowns = {
            j: slowdown_with(u, [v for k, v in utils.items() if k != j], self.model)
            for j, u in utils.items()
        }
        worst = max(slowdowns.values(), default=1.0)
        why: list[str] = []
        if total:
            fraction = used / total
            margin = self.sizing.memory_margin_mib
            if fraction >= s.separate_memory_fraction or used + margin > total:
                why.append(f"together {used / 1024:.1f} of {total / 1024:.1f} GiB ({fraction:.0%})")
        if worst > s.max_slowdown:
            slowest = max(slowdowns, key=lambda j: (slowdowns[j], -j))
            why.append(
                f"job {slowest} predicted {worst:.2f}x slower beside the others "
                f"(bound {s.max_slowdown:g}x)"
            )
        if not why:
            return None
        # Each job with its own figures, never a sum passed off as one job's.
        held = ", ".join(
            f"job {j.display_id} ({_own_figures(utils.get(j.job_id), stats.get(j.job_id))})"
            for j, _ in members
        )
        why.insert(0, f"{node} GPU {index} holds {held}")
        sharers = [job for job, held in members if 0 < held < shards or (held and not shards)]
        if not sharers:
            return None  # only whole-GPU jobs and whole-GPU shard jobs here: nothing to undo
        victim = min(sharers, key=_newest_first)
        since = separated_since.get(victim.job_id)
        if since is not None and (victim.start_time is None or since >= victim.start_time):
            return None  # already separated in this run (the requeue is on its way)
        numbers: Numbers = {
            "node": node,
            "gpu_index": index,
            "jobs_on_gpu": len(members),
            "memory_used_mib": round(used),
            "memory_total_mib": round(total) if total else None,
            "memory_fraction": round(used / total, 3) if total else None,
            "separate_memory_fraction": s.separate_memory_fraction,
            "worst_predicted_slowdown": round(worst, 3),
            "max_slowdown": s.max_slowdown,
            "victim_util_pct": utils.get(victim.job_id),
            "victim_memory_mib": stats[victim.job_id].max_memory_mib
            if victim.job_id in stats
            else None,
            "members": ", ".join(
                f"{j.job_id}:{_figure(utils.get(j.job_id))}%/"
                f"{_figure(stats[j.job_id].max_memory_mib if j.job_id in stats else None)}MiB"
                for j, _ in members
            ),
        }
        reason = "; ".join(why) + f": job {victim.display_id} (the newest sharer) separated"
        if not victim.requeue:
            return Action(
                policy=self.name,
                kind="warn",
                job_id=victim.job_id,
                user=victim.user,
                reason=reason + " -- it cannot be requeued, please resubmit it without sharing",
                numbers=numbers,
                alert=ALERT_SEPARATE_NOTICE,
                slurm_id=slurm_job_ref(victim),
            )
        comment = add_to_comment(victim.comment.strip(), [SEPARATED])
        whole = shards if shards else max(victim.gpus.shards_per_node or 1, 1)
        return Action(
            policy=self.name,
            kind="requeue",
            job_id=victim.job_id,
            user=victim.user,
            reason=reason + f" onto a whole GPU ({whole} shards)",
            numbers=numbers,
            intents=(NarrowToShards(whole), SetComment(comment)),
            alert=ALERT_SEPARATE,
            priority=10,
            slurm_id=slurm_job_ref(victim),
            protective=True,
        )


def _one_gpu(request: GpuRequest) -> bool:
    """A request for one whole GPU of one node (``--gres=gpu:1``, typed or not)."""
    return (
        request.shards == 0
        and request.mps == 0
        and request.gpus == 1
        and request.per_node == 1
        and request.per_task is None
        and request.per_job is None
    )


def _job_offer(partition: str, offers: dict[str, PartitionOffer]) -> PartitionOffer:
    """What every partition a job may run in offers; nothing when they differ."""
    found = {offers.get(p, _NO_OFFER) for p in (partition or "").split(",")}
    return found.pop() if len(found) == 1 else _NO_OFFER


_NO_OFFER = PartitionOffer()


def _own_figures(util: float | None, stat: GpuStat | None) -> str:
    """One job's figures on one GPU: ``25 % util, 3.0 GiB``, or that none are known."""
    if stat is None:
        return "no samples yet"
    memory = "? GiB" if stat.max_memory_mib is None else f"{stat.max_memory_mib / 1024:.1f} GiB"
    return f"{_figure(util)} % util, {memory}"


def _figure(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"

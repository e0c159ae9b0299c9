"""Which share of a GPU a light job needs: a MIG slice, an MPS share, shards, or the whole.

Sites share GPUs three ways, and Slurm shows each differently (docs/slurm.md):

* **MIG** -- typed GPUs named by their profile (``gpu:1g.10gb``): ``Ng.Mgb`` is N of the
  GPU's :data:`MIG_COMPUTE_SLICES` (7) compute slices and M GB of its memory, isolated in
  hardware (own SMs, memory, caches);
* **MPS** -- ``gres/mps``, a share of one GPU's SMs (100 a GPU on the usual gres.conf);
  kernels of the jobs run at once, memory bandwidth is shared: partly isolated;
* **shards** -- ``gres/shard``, an access token to a time-sliced GPU: no isolation.

:func:`choose_slice` picks one for a job of measured GPU util (percent of a whole GPU it
keeps busy) and peak GPU memory, among what the job's partition offers
(:class:`PartitionOffer`, from the nodes: :func:`partition_offers`):

* MIG: the profile with the fewest compute slices (then the least memory) whose memory
  holds the job's peak plus the site's margin and whose SM share keeps the job within
  ``max_slowdown`` (:func:`slowdown_shared` ``mig``: its own slice caps it, no partner);
* MPS: a share of ``max(util, the memory's share of the device less the margin,
  1 / max_jobs_per_gpu)`` of the GPU, in the node's MPS units (Slurm never gives more
  than a GPU's units on one GPU, so the jobs there never declare more memory than the
  device less the margin, as with shards); its slowdown and a partner's next to the
  worst partners the rest of the GPU could hold, each at the light ceiling with the
  share this rule gives such a job;
* shards: :func:`shard_fit`, the rule the shard packing (:mod:`slurmgpu.policy.colocate`)
  and ``sgpu eff``'s shard advice use.

The candidate that takes the smallest fraction of a GPU wins; a tie goes to the more
isolated (MIG, then MPS, then shards). None: keep the whole GPU (too busy, too big, or
slowed past ``max_slowdown`` on every offer).

Whether slurmctld lets a pending job's request change to the choice
(:func:`converts_request`), tried on the lab's mig-mps layout: 22.05.8 refuses an
untyped ``gres:gpu:1`` becoming ``gpu:1g.10gb:1`` ("Invalid GRES specification (with and
without type identification)") or ``mps:50`` ("Invalid generic resource (gres)
specification") and takes ``gpu:1g.10gb:2`` -> ``gpu:1g.10gb:1`` and ``mps:100`` ->
``mps:50``; 26.05.5 takes ``gpu:1`` -> ``gpu:1g.10gb:1`` and ``gpu:1`` -> ``mps:50``.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from slurmgpu.model import GpuRequest, Node
from slurmgpu.policy.interference import (
    COEFFICIENTS,
    InterferenceModel,
    slowdown_shared,
    slowdown_with,
)
from slurmgpu.policy.settings import ColocateSettings
from slurmgpu.policy.sizing import SizingRules

__all__ = [
    "MIG_COMPUTE_SLICES",
    "MigProfile",
    "PartitionOffer",
    "ShardFit",
    "SliceChoice",
    "SliceKind",
    "choose_slice",
    "converts_request",
    "partition_offers",
    "shard_fit",
]

# compute slices of a whole A100 / H100 / H200 (a 7g profile is the whole GPU)
MIG_COMPUTE_SLICES = 7
_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(?:\+\w+)?$")
_VERSION = re.compile(r"(\d+)\.(\d+)")
# Slurm from which a pending job's untyped gres/gpu may become a typed GPU or gres/mps
_CONVERTS_SINCE = (23, 2)

SliceKind = Literal["mig", "mps", "shard"]
_ISOLATION: dict[SliceKind, int] = {"mig": 0, "mps": 1, "shard": 2}
_ISOLATION_TEXT: dict[SliceKind, str] = {
    "mig": "isolated",
    "mps": "partly isolated",
    "shard": "not isolated",
}


@dataclass(frozen=True, slots=True, order=True)
class MigProfile:
    """A MIG profile as Slurm types the GPU: ``1g.10gb`` (``+me`` etc. kept in ``name``)."""

    slices: int
    memory_gb: int
    name: str

    @classmethod
    def parse(cls, name: str | None) -> MigProfile | None:
        """The profile ``name`` spells, or None when it is no MIG profile.

        >>> MigProfile.parse("3g.40gb+me"), MigProfile.parse("a100")
        (MigProfile(slices=3, memory_gb=40, name='3g.40gb+me'), None)
        """
        m = _PROFILE.match(name or "")
        if m is None or int(m.group(1)) < 1:
            return None
        return cls(int(m.group(1)), int(m.group(2)), name or "")

    @property
    def memory_mib(self) -> float:
        return self.memory_gb * 1024.0

    @property
    def sm_share_pct(self) -> float:
        return 100.0 * min(self.slices, MIG_COMPUTE_SLICES) / MIG_COMPUTE_SLICES


@dataclass(frozen=True, slots=True)
class PartitionOffer:
    """The ways a partition's available nodes share GPUs: the MIG profiles some node
    has, the MPS units per GPU of its MPS nodes (0: none, or they differ), the shards per
    GPU of its nodes (0: none, or they differ)."""

    mig_profiles: tuple[MigProfile, ...] = ()
    mps_per_gpu: int = 0
    shards_per_gpu: int = 0


def partition_offers(nodes: Iterable[Node]) -> dict[str, PartitionOffer]:
    """Each partition's :class:`PartitionOffer`, from its available nodes."""
    profiles: dict[str, set[MigProfile]] = {}
    mps: dict[str, set[int]] = {}
    shards: dict[str, set[int]] = {}
    for node in nodes:
        if not node.available:
            continue
        found = [p for t, _ in node.gpu_types if (p := MigProfile.parse(t)) is not None]
        untyped = node.gpus - sum(n for t, n in node.gpu_types)
        mps_gpus = untyped if untyped > 0 else node.gpus
        for part in node.partitions:
            profiles.setdefault(part, set()).update(found)
            if node.mps and mps_gpus > 0:
                mps.setdefault(part, set()).add(node.mps // mps_gpus)
            if node.shards and node.gpus:
                shards.setdefault(part, set()).add(node.shards // node.gpus)
    return {
        part: PartitionOffer(
            mig_profiles=tuple(sorted(profiles.get(part, set()))),
            mps_per_gpu=_uniform(mps.get(part)),
            shards_per_gpu=_uniform(shards.get(part)),
        )
        for part in {*profiles, *mps, *shards}
    }


def _uniform(values: set[int] | None) -> int:
    return next(iter(values)) if values and len(values) == 1 else 0


@dataclass(frozen=True, slots=True)
class SliceChoice:
    """A share of one GPU for a job: what to ask Slurm for and why it fits."""

    kind: SliceKind
    count: int  # 1 MIG slice; MPS units; shards
    profile: str | None  # the MIG profile
    gpu_fraction: float  # of one GPU: slices/7, units/per GPU, shards/per GPU
    memory_mib: float  # the memory the slice holds (MIG) or budgets (MPS, shards)
    slowdown: float  # the job's own, predicted
    partner_slowdown: float  # a worst-case partner's next to it (1.0 under MIG)
    partners: int

    @property
    def gres(self) -> str:
        """``--gres`` value: ``gpu:1g.10gb:1``, ``mps:25``, ``shard:4``."""
        if self.kind == "mig":
            return f"gpu:{self.profile}:1"
        return f"{self.kind}:{self.count}"

    @property
    def isolation(self) -> str:
        return _ISOLATION_TEXT[self.kind]


@dataclass(frozen=True, slots=True)
class ShardFit:
    """A light job's share of one GPU: ``shards`` of ``shards_per_gpu``, and the
    interference model's slowdowns next to the worst ``partners`` its GPU could get."""

    shards: int
    shards_per_gpu: int
    partners: int
    slowdown: float  # the job's own
    partner_slowdown: float  # such a partner's, next to it


def shard_fit(
    util_pct: float,
    memory_mib: float,
    shards_per_gpu: int,
    device_mib: float,
    settings: ColocateSettings,
    sizing: SizingRules,
    model: InterferenceModel = COEFFICIENTS,
) -> ShardFit | None:
    """Whether a job of this GPU util and memory is packed, and onto how many shards, or
    None: it stays on a whole GPU (too busy, too big, or it would slow a partner or be
    slowed past ``max_slowdown``). The daemon's packing decides with it
    (:class:`ColocatePolicy`), and ``sgpu eff``'s shard advice is it.

    >>> fit = shard_fit(10.0, 4096, 16, 40960, ColocateSettings(), SizingRules())
    >>> fit.shards, fit.partners
    (8, 1)
    >>> shard_fit(60.0, 4096, 16, 40960, ColocateSettings(), SizingRules()) is None
    True
    """
    if util_pct > settings.max_util_pct or device_mib - sizing.memory_margin_mib <= 0:
        return None
    n = sizing.shards(memory_mib, device_mib, shards_per_gpu)
    if n >= shards_per_gpu:
        return None
    least = math.ceil(shards_per_gpu / sizing.max_jobs_per_gpu)
    partners = min(sizing.max_jobs_per_gpu - 1, (shards_per_gpu - n) // least)
    ceiling = settings.max_util_pct
    own = slowdown_with(util_pct, [ceiling] * partners, model)
    theirs = slowdown_with(ceiling, [util_pct] + [ceiling] * (partners - 1), model)
    if max(own, theirs) > settings.max_slowdown:
        return None
    return ShardFit(n, shards_per_gpu, partners, own, theirs)


def _mig_choice(
    util: float, memory_mib: float, offer: PartitionOffer, settings: ColocateSettings, margin: float
) -> SliceChoice | None:
    for profile in sorted(offer.mig_profiles, key=lambda p: (p.slices, p.memory_gb)):
        if profile.slices >= MIG_COMPUTE_SLICES:
            continue  # the whole GPU
        if memory_mib + margin > profile.memory_mib:
            continue
        own = slowdown_shared(util, (), "mig", profile.sm_share_pct)
        if own > settings.max_slowdown:
            continue
        return SliceChoice(
            kind="mig",
            count=1,
            profile=profile.name,
            gpu_fraction=profile.slices / MIG_COMPUTE_SLICES,
            memory_mib=profile.memory_mib,
            slowdown=own,
            partner_slowdown=1.0,
            partners=0,
        )
    return None


def _mps_choice(
    util: float,
    memory_mib: float,
    per_gpu: int,
    device_mib: float,
    settings: ColocateSettings,
    sizing: SizingRules,
    model: InterferenceModel,
) -> SliceChoice | None:
    by_memory = sizing.shards(memory_mib, device_mib, per_gpu)  # memory share, jobs cap
    by_util = math.ceil(per_gpu * min(util, 100.0) / 100.0 - 1e-9)
    n = max(by_memory, by_util, 1)
    if n >= per_gpu:
        return None
    ceiling = settings.max_util_pct
    # a worst-case partner is at the light ceiling and so was given a share that holds it
    partner_units = max(
        math.ceil(per_gpu / sizing.max_jobs_per_gpu), math.ceil(per_gpu * ceiling / 100.0)
    )
    partners = min(sizing.max_jobs_per_gpu - 1, (per_gpu - n) // partner_units)
    if partners < 1:
        return None  # no light job would fit beside it: that is not sharing
    share = 100.0 * n / per_gpu
    partner_share = 100.0 * partner_units / per_gpu
    own = slowdown_shared(util, [ceiling] * partners, "mps", share, model)
    theirs = slowdown_shared(
        ceiling, [util] + [ceiling] * (partners - 1), "mps", partner_share, model
    )
    if max(own, theirs) > settings.max_slowdown:
        return None
    return SliceChoice(
        kind="mps",
        count=n,
        profile=None,
        gpu_fraction=n / per_gpu,
        memory_mib=(device_mib - sizing.memory_margin_mib) * n / per_gpu,
        slowdown=own,
        partner_slowdown=theirs,
        partners=partners,
    )


def choose_slice(
    util_pct: float,
    memory_mib: float,
    offer: PartitionOffer,
    device_mib: float,
    settings: ColocateSettings,
    sizing: SizingRules,
    model: InterferenceModel = COEFFICIENTS,
) -> SliceChoice | None:
    """The smallest share of a GPU that holds a job of this util and peak memory, among
    ``offer`` (see the module docstring); None: it keeps a whole GPU.

    >>> offer = PartitionOffer((MigProfile.parse("1g.10gb"),), mps_per_gpu=100)
    >>> choose_slice(8.0, 4096, offer, 81920, ColocateSettings(), SizingRules()).gres
    'gpu:1g.10gb:1'
    >>> choose_slice(30.0, 4096, offer, 81920, ColocateSettings(), SizingRules()).gres
    'mps:50'
    >>> choose_slice(60.0, 4096, offer, 81920, ColocateSettings(), SizingRules()) is None
    True
    """
    if util_pct > settings.max_util_pct or memory_mib < 0:
        return None
    margin = float(sizing.memory_margin_mib)
    candidates: list[SliceChoice] = []
    mig = _mig_choice(util_pct, memory_mib, offer, settings, margin)
    if mig is not None:
        candidates.append(mig)
    if offer.mps_per_gpu >= 2 and device_mib - margin > 0:
        mps = _mps_choice(
            util_pct, memory_mib, offer.mps_per_gpu, device_mib, settings, sizing, model
        )
        if mps is not None:
            candidates.append(mps)
    if offer.shards_per_gpu >= 2 and device_mib - margin > 0:
        fit = shard_fit(
            util_pct, memory_mib, offer.shards_per_gpu, device_mib, settings, sizing, model
        )
        if fit is not None:
            candidates.append(
                SliceChoice(
                    kind="shard",
                    count=fit.shards,
                    profile=None,
                    gpu_fraction=fit.shards / fit.shards_per_gpu,
                    memory_mib=(device_mib - margin) * fit.shards / fit.shards_per_gpu,
                    slowdown=fit.slowdown,
                    partner_slowdown=fit.partner_slowdown,
                    partners=fit.partners,
                )
            )
    if not candidates:
        return None
    return min(candidates, key=lambda c: (round(c.gpu_fraction, 6), _ISOLATION[c.kind]))


def converts_request(request: GpuRequest, kind: SliceKind, slurm_version: str) -> bool:
    """Whether this pending single-GPU request may become ``kind``: an MPS request only
    another MPS share (its user chose MPS: kernels of several processes at once), which
    slurmctld takes on every release; ``gpu:1`` (typed or not) a MIG slice or an MPS share
    from 23.02 (22.05 refused the untyped one and took a typed one only to fewer of the
    same type; see the module docstring). An unknown version counts as a current one.

    >>> one = GpuRequest(gpus=1, per_node=1)
    >>> converts_request(one, "mig", "22.05.8"), converts_request(one, "mig", "26.05.5")
    (False, True)
    """
    if kind == "shard":
        return False  # the shard packing's own rule (colocate.converts_gpu_to_shards)
    m = _VERSION.match(slurm_version.strip())
    current = not (m and (int(m.group(1)), int(m.group(2))) < _CONVERTS_SINCE)
    if request.mps and request.gpus == 0 and request.shards == 0:
        return kind == "mps"
    if request.gpus == 1 and request.per_node == 1 and request.shards == 0:
        return current
    return False

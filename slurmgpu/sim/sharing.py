"""How the simulated cluster shares its GPUs, and what a share does to a job's speed.

``sgpu simulate --sharing none,shards,mps,mig`` runs the same trace on the same GPUs
presented four ways, as a site's gres.conf would present them (docs/simulator.md):

* ``none`` -- whole GPUs only (no ``gres/shard``, no ``gres/mps``);
* ``shards`` -- every GPU split into ``shards_per_gpu`` ``gres/shard`` (time-sliced);
* ``mps`` -- every GPU also serves ``gres/mps``, :data:`MPS_PER_GPU` (100) a GPU;
* ``mig`` -- ``mig_gpus`` GPUs of every node MIG-enabled, each split as the layout
  (:data:`DEFAULT_MIG_LAYOUT`, the lab's: ``3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb`` of an
  80 GB A100/H100), listed as typed GPUs (``gpu:1g.10gb``); the rest stay whole. A
  layout is static (changing it needs a GPU reset): no mode re-partitions GPUs.

**Speed model** (the policy's own, :func:`slurmgpu.policy.interference.slowdown_shared`):

* a job on a MIG slice of ``k`` of 7 compute slices runs at ``min(1, (100 k / 7) / util)``
  of its speed alone -- its slice caps it, and it is isolated: no neighbour slows it
  (:func:`mig_speed`);
* a job on an MPS share of ``s`` % of the SMs is capped the same way at ``s`` and slowed
  by the contention terms of the interference model next to the other MPS jobs of its GPU
  (their utils summed), without the time-slicing term (:func:`mps_speed`). This is an
  assumption: Lucid measured its pairs time-sliced (shards), nobody measured MPS pairs
  here, so for MPS the model the policy admits with is also the truth, while shards on a
  Lucid workload are slowed by Lucid's measured pair speeds.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from slurmgpu.policy.interference import COEFFICIENTS, InterferenceModel, slowdown_shared
from slurmgpu.policy.slices import MIG_COMPUTE_SLICES, MigProfile

__all__ = [
    "DEFAULT_DEVICE_MIB",
    "DEFAULT_MIG_LAYOUT",
    "MPS_PER_GPU",
    "SHARING_MODES",
    "SHARING_SLURM_VERSION",
    "SharingMode",
    "mig_speed",
    "mps_speed",
    "parse_mig_layout",
    "parse_sharing",
]

SharingMode = Literal["none", "shards", "mps", "mig"]
SHARING_MODES: tuple[SharingMode, ...] = ("none", "shards", "mps", "mig")
# The lab's MIG layout (slurmgpu/lab/cluster/sharing.py): an 80 GB A100/H100's 7 slices.
DEFAULT_MIG_LAYOUT: tuple[str, ...] = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
DEFAULT_DEVICE_MIB = 81_920  # the 80 GB device that layout splits
MPS_PER_GPU = 100  # gres/mps per GPU on the usual gres.conf
# The release a sharing comparison's SimSlurm answers as: one that lets a pending
# ``gpu:1`` become ``gpu:1g.10gb:1`` or ``mps:N`` (22.05 refuses both:
# slurmgpu.policy.slices.converts_request).
SHARING_SLURM_VERSION = "24.11.4"


def parse_sharing(text: str) -> tuple[SharingMode, ...]:
    """``shards,mps,mig`` -> the modes, in order, each once; ValueError names a bad one.

    >>> parse_sharing("mig, none,mig")
    ('mig', 'none')
    """
    out: list[SharingMode] = []
    for part in text.split(","):
        name = part.strip().lower()
        if not name:
            continue
        mode = next((m for m in SHARING_MODES if m == name), None)
        if mode is None:
            raise ValueError(f"unknown sharing mode {name!r}; known: {', '.join(SHARING_MODES)}")
        if mode not in out:
            out.append(mode)
    if not out:
        raise ValueError(f"no sharing mode in {text!r}; known: {', '.join(SHARING_MODES)}")
    return tuple(out)


def parse_mig_layout(text: str | Sequence[str], device_mib: float) -> tuple[MigProfile, ...]:
    """One GPU's MIG instances (``3g.40gb,2g.20gb,1g.10gb,1g.10gb``); ValueError when a
    name is no MIG profile, or they take more than the GPU's 7 compute slices or its
    memory. (NVIDIA's placement rules are stricter: give a layout ``nvidia-smi mig``
    accepts.)

    >>> [p.name for p in parse_mig_layout("2g.20gb,1g.10gb", 81920)]
    ['2g.20gb', '1g.10gb']
    """
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    profiles: list[MigProfile] = []
    for name in names:
        if not name:
            continue
        profile = MigProfile.parse(name.lower())
        if profile is None:
            raise ValueError(f"MIG layout: {name!r} is no MIG profile (like 1g.10gb)")
        profiles.append(profile)
    if not profiles:
        raise ValueError("MIG layout: no profile given")
    slices = sum(p.slices for p in profiles)
    if slices > MIG_COMPUTE_SLICES:
        raise ValueError(
            f"MIG layout {','.join(p.name for p in profiles)}: {slices} compute slices, "
            f"a GPU has {MIG_COMPUTE_SLICES}"
        )
    memory = sum(p.memory_mib for p in profiles)
    if memory > device_mib:
        raise ValueError(
            f"MIG layout {','.join(p.name for p in profiles)}: {memory / 1024:.0f} GB, "
            f"the GPU has {device_mib / 1024:.0f} GB"
        )
    return tuple(profiles)


def mig_speed(util_pct: float, profile: MigProfile) -> float:
    """A job's speed on a MIG slice, relative to a whole GPU alone (isolated: its slice's
    SM share caps it, neighbours do not matter).

    >>> one = MigProfile(1, 10, "1g.10gb")
    >>> mig_speed(10.0, one), round(mig_speed(50.0, one), 3)
    (1.0, 0.286)
    """
    return 1.0 / slowdown_shared(util_pct, (), "mig", profile.sm_share_pct)


def mps_speed(
    util_pct: float,
    share_pct: float,
    partner_utils_pct: Iterable[float],
    model: InterferenceModel = COEFFICIENTS,
) -> float:
    """A job's speed on an MPS share of ``share_pct`` % of the SMs next to partners of
    these utils (the interference model's contention terms, no time-slicing).

    >>> mps_speed(30.0, 50.0, ())
    1.0
    >>> 0.5 < mps_speed(30.0, 50.0, [40.0]) < 1.0
    True
    """
    return 1.0 / slowdown_shared(util_pct, list(partner_utils_pct), "mps", share_pct, model)

"""The lab's GPU sharing layouts: nodes whose fake GPUs are MIG slices or serve MPS.

``sharing="none"`` (the default) gives every node 4 whole fake GPUs and 16 shards.
``sharing="mig-mps"`` (:data:`MIG_MPS`) keeps that on every node but two:

* :data:`MIG_NODE` (``gpu2``): its first :data:`MIG_GPUS` fake GPUs are MIG-enabled, each
  split as :data:`MIG_LAYOUT` (``3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb``, the 7 compute
  slices and 80 GB of an A100/H100 80GB), so Slurm sees typed GPUs
  ``gpu:3g.40gb:2,gpu:2g.20gb:2,gpu:1g.10gb:4`` and no shards. Each instance is a
  ``MultipleFiles=`` line naming its parent GPU's device file first and a capability
  file of its own, the way Slurm's ``AutoDetect=nvml`` writes MIG instances
  (``/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21``); the simulated probe groups the
  instances of one physical GPU by that first file. Before Slurm 23.02 each GPU is
  split as :data:`MIG_LAYOUT_22_05` (seven ``1g.10gb``: ``gpu:1g.10gb:14``): tried on
  22.05.8, when ``MultipleFiles`` lines of *several* types share device files a job
  asking for the second type runs with no GPU at all (``JOB_GRES=gpu:1g.10gb:0``,
  ``IDX:`` empty), while one type over two parents allocates as it should; 26.05
  allocates every type of the mixed layout;
* :data:`MPS_NODE` (``gpu3``): 4 whole GPUs and ``Name=mps Count=400`` over their files
  (100 per GPU), no shards (a job asks ``--gres=mps:50`` for half a GPU's SMs).

The layout needs at least 3 nodes. Fake device files are character devices of the host
(``/dev/ttyN``): the parents are the default GPUs' ``/dev/tty0..``, the capability
files ``/dev/tty{CAP_TTY_BASE}..``. Only the native lab renders it: the docker nodes have
no capability files.

Standard library only (the docker entrypoint renders with the image's ``python3``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CAP_TTY_BASE",
    "MIG_GPUS",
    "MIG_LAYOUT",
    "MIG_LAYOUT_22_05",
    "MIG_MPS",
    "MIG_NODE",
    "MPS_NODE",
    "MPS_PER_GPU",
    "SHARINGS",
    "NodeGres",
    "Sharing",
    "gres_conf_lines",
    "mig_layout",
    "node_gres",
]

Sharing = Literal["none", "mig-mps"]
SHARINGS: tuple[Sharing, ...] = ("none", "mig-mps")
MIG_MPS: Sharing = "mig-mps"

MIG_NODE = "gpu2"
MPS_NODE = "gpu3"
MIG_GPUS = 2
MIG_LAYOUT: tuple[str, ...] = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
MIG_LAYOUT_22_05: tuple[str, ...] = ("1g.10gb",) * 7
# Slurm releases from which MIG lines of several types may share a device file
MIXED_MIG_SINCE = (23, 2)
MPS_PER_GPU = 100
CAP_TTY_BASE = 20
GPUS_PER_NODE = 4
SHARDS_PER_NODE = 16


@dataclass(frozen=True, slots=True)
class NodeGres:
    """One node's ``Gres=`` in slurm.conf and its gres.conf lines (without ``NodeName=``)."""

    gres: str
    lines: tuple[str, ...]


def _tty(n: int) -> str:
    return f"/dev/tty{n}"


def _default(gpu_files: str) -> NodeGres:
    return NodeGres(
        f"gpu:{GPUS_PER_NODE},shard:{SHARDS_PER_NODE}",
        (f"Name=gpu File={gpu_files}", f"Name=shard Count={SHARDS_PER_NODE}"),
    )


def mig_layout(slurm_version: tuple[int, int] | None) -> tuple[str, ...]:
    """The MIG profiles of each MIG GPU for this Slurm (None: a current one)."""
    if slurm_version is not None and slurm_version < MIXED_MIG_SINCE:
        return MIG_LAYOUT_22_05
    return MIG_LAYOUT


def _mig(slurm_version: tuple[int, int] | None) -> NodeGres:
    layout = mig_layout(slurm_version)
    lines: list[str] = []
    counts: dict[str, int] = {}
    caps = iter(range(CAP_TTY_BASE, CAP_TTY_BASE + MIG_GPUS * len(layout)))
    instances = [(parent, profile, next(caps)) for parent in range(MIG_GPUS) for profile in layout]
    # grouped by profile, each profile's instances GPU by GPU
    for profile in dict.fromkeys(layout):
        for parent, kind, cap in instances:
            if kind == profile:
                lines.append(f"Name=gpu Type={profile} MultipleFiles={_tty(parent)},{_tty(cap)}")
                counts[profile] = counts.get(profile, 0) + 1
    gres = ",".join(f"gpu:{profile}:{n}" for profile, n in counts.items())
    return NodeGres(gres, tuple(lines))


def _mps() -> NodeGres:
    files = f"/dev/tty[0-{GPUS_PER_NODE - 1}]"
    total = MPS_PER_GPU * GPUS_PER_NODE
    return NodeGres(
        f"gpu:{GPUS_PER_NODE},mps:{total}",
        (f"Name=gpu File={files}", f"Name=mps Count={total} File={files}"),
    )


def node_gres(
    sharing: Sharing, node: str, gpu_files: str, slurm_version: tuple[int, int] | None = None
) -> NodeGres:
    """What ``node`` offers under ``sharing``; ``gpu_files`` are a default node's GPUs."""
    if sharing == MIG_MPS and node == MIG_NODE:
        return _mig(slurm_version)
    if sharing == MIG_MPS and node == MPS_NODE:
        return _mps()
    return _default(gpu_files)


def gres_conf_lines(
    sharing: Sharing,
    nodes: list[str],
    node_range: str,
    gpu_files: str,
    slurm_version: tuple[int, int] | None = None,
) -> str:
    """The ``NodeName=... Name=...`` lines of gres.conf for ``nodes`` (``node_range`` is
    their hostlist): one pair over the range without sharing, else per kind of node."""
    if sharing == "none":
        return "\n".join(f"NodeName={node_range} {ln}" for ln in _default(gpu_files).lines)
    plain = [n for n in nodes if n not in (MIG_NODE, MPS_NODE)]
    out = [f"NodeName={','.join(plain)} {ln}" for ln in _default(gpu_files).lines] if plain else []
    for node in (MIG_NODE, MPS_NODE):
        lines = node_gres(sharing, node, gpu_files, slurm_version).lines
        out += [f"NodeName={node} {ln}" for ln in lines]
    return "\n".join(out)

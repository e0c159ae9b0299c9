"""GPU-equivalent series for ``/metrics``: MIG slices and MPS shares as parts of a GPU.

``sgpu_gpus`` and ``sgpu_gpus_allocated`` count what Slurm counts, and Slurm counts each
MIG slice as a GPU: a node with two A100s split into seven ``1g.10gb`` slices each has
``gpus=14``. These series count the same hardware and allocations in GPU-equivalents
(slurmgpu/gpushare.py: a slice its compute slices out of 7, an MPS share
``mps / (node's mps per GPU)``, shards ``shards / (node's shards per GPU)``), by partition
and by how the GPU is shared (``sharing``: ``gpu`` whole, ``mig``, ``mps``, ``shard``):

- ``sgpu_gpu_equivalents{partition}``: the nodes' GPUs (a node's MIG slices add up to
  its boards);
- ``sgpu_gpu_equivalents_allocated{partition,sharing}``: held by running jobs;
- ``sgpu_gpu_equivalents_used``: of those, on GPUs an agent saw busy in the last 2
  minutes; ``..._util_unknown``: on GPUs whose job had processes but no known util (an
  MPS client sharing its GPU, a slice without GPM); ``..._idle``: the rest.

A job that asked for an untyped GPU on a node whose GPUs are all MIG slices holds a slice
(Slurm 22.05 runs it there): it counts that node's mean slice.

Pure apart from building the metric families: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from slurmgpu.gpushare import mig_gpu_fraction, share_fraction
from slurmgpu.model import Job, JobState, Node, NodeGpuAllocation

__all__ = ["SHARINGS", "equivalent_families", "held_equivalents", "node_equivalents"]

SHARINGS = ("gpu", "mig", "mps", "shard")


def node_equivalents(node: Node) -> float:
    """A node's GPUs in GPU-equivalents: typed MIG slices by their fraction, the rest 1."""
    typed = sum(count for _, count in node.gpu_types)
    slices = sum(count * (mig_gpu_fraction(kind) or 1.0) for kind, count in node.gpu_types)
    return slices + max(node.gpus - typed, 0)


def _gpu_fraction(job: Job, node: Node | None) -> tuple[str, float]:
    """How one of ``job``'s GPUs on ``node`` is shared, and its fraction of a GPU."""
    fraction = mig_gpu_fraction(job.gpus.gpu_type)
    if fraction is not None:
        return "mig", fraction
    if node is not None and node.gpus > 0:
        mig = sum(c for kind, c in node.gpu_types if mig_gpu_fraction(kind) is not None)
        if mig >= node.gpus:  # every GPU of the node is a slice
            return "mig", node_equivalents(node) / node.gpus
    return "gpu", 1.0


@dataclass(frozen=True, slots=True)
class Held:
    """A share of a GPU-set a job holds on one node: ``sharing`` kind, GPU-equivalents,
    and the Slurm indices of the GPUs it is on."""

    node: str
    sharing: str
    equivalents: float
    indices: tuple[int, ...]


def held_equivalents(job: Job, nodes: Mapping[str, Node]) -> list[Held]:
    """What a running job holds, node by node, in GPU-equivalents."""
    out: list[Held] = []
    for a in job.gpu_allocations:
        node = nodes.get(a.node)
        out.extend(_held_on(job, a, node))
    return out


def _held_on(job: Job, a: NodeGpuAllocation, node: Node | None) -> Iterator[Held]:
    if a.gpu_indices:
        sharing, fraction = _gpu_fraction(job, node)
        yield Held(a.node, sharing, fraction * len(a.gpu_indices), a.gpu_indices)
    gpus = node.gpus if node is not None and node.gpus > 0 else 0
    if a.shards and a.shard_indices:
        per_gpu = node.shards / gpus if node is not None and gpus else 0.0
        yield Held(a.node, "shard", share_fraction(a.shards, per_gpu), a.shard_indices)
    if a.mps and a.mps_indices:
        per_gpu = node.mps / gpus if node is not None and gpus else 0.0
        yield Held(a.node, "mps", share_fraction(a.mps, per_gpu), a.mps_indices)


def equivalent_families(
    nodes: Iterable[Node],
    jobs: Iterable[Job],
    busy: Set[tuple[str, int]],
    unknown: Set[tuple[str, int]],
) -> Iterator[Metric]:
    """The gauges above; ``busy``/``unknown``: (node, GPU index) seen busy / of unknown
    util in the last 2 minutes. A share on several GPUs is split evenly among them."""
    by_name = {n.name: n for n in nodes}
    total = GaugeMetricFamily(
        "sgpu_gpu_equivalents",
        "GPUs of the nodes in a partition in GPU-equivalents (a MIG slice counts its "
        "compute slices out of 7).",
        labels=["partition"],
    )
    labels = ["partition", "sharing"]
    families = {
        "allocated": GaugeMetricFamily(
            "sgpu_gpu_equivalents_allocated",
            "GPU-equivalents held by running jobs (MIG slice: compute slices / 7; MPS: "
            "mps / mps per GPU; shards: shards / shards per GPU), by partition and sharing.",
            labels=labels,
        ),
        "used": GaugeMetricFamily(
            "sgpu_gpu_equivalents_used",
            "Allocated GPU-equivalents on GPUs busy in the last 2 minutes of agent samples.",
            labels=labels,
        ),
        "unknown": GaugeMetricFamily(
            "sgpu_gpu_equivalents_util_unknown",
            "Allocated GPU-equivalents whose job had processes in the last 2 minutes but no "
            "known utilisation (an MPS client sharing its GPU, a MIG slice without GPM).",
            labels=labels,
        ),
        "idle": GaugeMetricFamily(
            "sgpu_gpu_equivalents_idle",
            "Allocated GPU-equivalents neither busy nor of unknown use in the last 2 minutes.",
            labels=labels,
        ),
    }
    per_partition: dict[str, float] = {}
    for node in by_name.values():
        for part in node.partitions or ("",):
            per_partition[part] = per_partition.get(part, 0.0) + node_equivalents(node)
    figures: dict[tuple[str, str], list[float]] = {}
    for job in jobs:
        if job.state is not JobState.RUNNING:
            continue
        for held in held_equivalents(job, by_name):
            keys = [(held.node, i) for i in held.indices]
            n_busy = sum(1 for k in keys if k in busy)
            n_unknown = sum(1 for k in keys if k in unknown and k not in busy)
            each = held.equivalents / len(keys)
            where = by_name.get(held.node)
            for part in (where.partitions if where is not None else ()) or ("",):
                row = figures.setdefault((part, held.sharing), [0.0, 0.0, 0.0])
                row[0] += held.equivalents
                row[1] += each * n_busy
                row[2] += each * n_unknown
    for part, value in sorted(per_partition.items()):
        total.add_metric([part], value)
    for (part, sharing), (alloc, used, unknown_eq) in sorted(figures.items()):
        families["allocated"].add_metric([part, sharing], alloc)
        families["used"].add_metric([part, sharing], used)
        families["unknown"].add_metric([part, sharing], unknown_eq)
        families["idle"].add_metric([part, sharing], max(alloc - used - unknown_eq, 0.0))
    yield total
    yield from families.values()

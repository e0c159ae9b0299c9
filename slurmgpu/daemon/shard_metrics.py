"""Shard series for ``/metrics``, by partition, from the daemon's latest snapshot.

``sgpu_shards``: the shards (``gres/shard``) of the nodes in a partition;
``sgpu_shards_allocated``: those its running jobs hold (the node usage the observer keeps,
the jobs' allocations where Slurm's ``gres_used`` disagrees); ``sgpu_shards_used``: the
allocated shards on GPUs busy in the agents' recent samples; ``sgpu_gpus_shared``: GPUs
holding shard work. A GPU held whole or through shards counts in ``sgpu_gpus_allocated``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set

from prometheus_client.core import GaugeMetricFamily, Metric

from slurmgpu.model import Node


def allocated_gpus(node: Node) -> set[int]:
    """The GPUs of a node holding any job's work: whole, or some of their shards."""
    return set(node.gpu_indices_used) | set(node.shard_gpus_used)


def allocated_gpu_count(node: Node) -> int:
    """How many GPUs hold work (22.05 names no whole-GPU index: its count then)."""
    held = allocated_gpus(node)
    whole = max(node.gpus_used, len(node.gpu_indices_used))
    return max(len(held), whole + len(set(node.shard_gpus_used) - set(node.gpu_indices_used)))


def shard_families(nodes: Iterable[Node], busy: Set[tuple[str, int]]) -> Iterator[Metric]:
    """The shard gauges by partition; ``busy`` is (node, GPU index) busy recently."""
    total = GaugeMetricFamily(
        "sgpu_shards", "Shards (gres/shard) of the nodes in a partition.", labels=["partition"]
    )
    alloc = GaugeMetricFamily(
        "sgpu_shards_allocated",
        "Shards held by running jobs, by partition (the jobs' allocations where Slurm's "
        "gres_used disagrees).",
        labels=["partition"],
    )
    used = GaugeMetricFamily(
        "sgpu_shards_used",
        "Allocated shards on GPUs busy in the last 2 minutes of agent samples, by partition.",
        labels=["partition"],
    )
    shared = GaugeMetricFamily(
        "sgpu_gpus_shared", "GPUs holding shard jobs' work, by partition.", labels=["partition"]
    )
    per: dict[str, list[int]] = {}
    for node in nodes:
        by_gpu = dict(node.shards_used_by_gpu)
        n_used = sum(n for i, n in by_gpu.items() if (node.name, i) in busy)
        for part in node.partitions or ("",):
            row = per.setdefault(part, [0, 0, 0, 0])
            row[0] += node.shards
            row[1] += node.shards_used
            row[2] += n_used
            row[3] += len(node.shard_gpus_used)
    for part, (n_total, n_alloc, n_used, n_shared) in sorted(per.items()):
        total.add_metric([part], n_total)
        alloc.add_metric([part], n_alloc)
        used.add_metric([part], n_used)
        shared.add_metric([part], n_shared)
    yield from (total, alloc, used, shared)

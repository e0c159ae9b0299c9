"""A node's GPU and shard usage from its running jobs' allocations, checked against Slurm's.

Slurm's node ``gres_used`` does not always hold: after a slurmctld restart, 22.05, 24.11
and 26.05 forget the shards of the shard jobs still running (``shard:0(-/4,-/4,0/4,0/4)``;
22.05 drops the GPU from ``shard:(null):N(IDX:…)``), and then start new shard jobs on GPUs
whose shards are taken, so one GPU holds more shards than it has. The jobs' own
allocations (``gres_detail``: GPU indices, shards per GPU) survive the restart.

:func:`reconcile` compares the two for every node and keeps the allocations' figure: a
node's ``gpus_used``/``gpu_indices_used``/``shards_used``/``shard_gpus_used``/
``shards_used_by_gpu`` become what its running jobs hold, and each difference is a
:class:`UsageFinding` (``gpus``, ``shards``; ``shard_overcommit`` for a GPU holding more
shards than it has). A node whose allocations are not all known (a running GPU job listed
without ``gres_detail`` for it, or a job still completing, whose GRES Slurm may have freed
already) keeps Slurm's figure and is not judged.

Pure: no I/O; the daemon logs and counts the findings (``slurmgpu.daemon.gres_watch``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from slurmgpu.model import Job, JobState, Node

__all__ = ["KINDS", "NodeAllocations", "UsageFinding", "node_allocations", "reconcile"]

# The kinds of finding, in the order metrics list them.
KINDS = ("gpus", "shards", "shard_overcommit")

_HOLDING = frozenset({JobState.RUNNING, JobState.SUSPENDED})


@dataclass(frozen=True, slots=True)
class UsageFinding:
    """One way a node's usage as Slurm reports it is not what its jobs hold.

    ``slurm`` and ``allocations`` are the two figures as short text for a log line;
    ``gpu`` is the GPU index of a ``shard_overcommit``."""

    node: str
    kind: str
    slurm: str
    allocations: str
    gpu: int | None = None

    @property
    def key(self) -> tuple[str, str, int | None]:
        return (self.node, self.kind, self.gpu)


@dataclass(frozen=True, slots=True)
class NodeAllocations:
    """What the running jobs hold on one node; ``complete`` is False when a job's part of
    it is not known (then the node's figures stay Slurm's)."""

    whole: frozenset[int]
    shard_gpus: frozenset[int]
    shards: int
    by_gpu: dict[int, int]  # shards per GPU, for the jobs whose shards sit on one GPU
    complete: bool


def node_allocations(jobs: Iterable[Job]) -> dict[str, NodeAllocations]:
    """Per node name: the allocations of the jobs holding resources there."""
    whole: dict[str, set[int]] = {}
    shard_gpus: dict[str, set[int]] = {}
    shards: dict[str, int] = {}
    by_gpu: dict[str, dict[int, int]] = {}
    incomplete: set[str] = set()
    for job in jobs:
        if job.state not in _HOLDING:
            continue
        if "COMPLETING" in job.state_flags:
            incomplete.update(job.nodes)
            continue
        if not job.gpus.wants_gpu and not job.gpu_allocations:
            continue
        seen = {a.node for a in job.gpu_allocations}
        if not job.gpu_allocations:
            incomplete.update(job.nodes)
        for a in job.gpu_allocations:
            whole.setdefault(a.node, set()).update(a.gpu_indices)
            if a.shards or a.shard_indices:
                shard_gpus.setdefault(a.node, set()).update(a.shard_indices)
                shards[a.node] = shards.get(a.node, 0) + a.shards
                if len(a.shard_indices) == 1:
                    per = by_gpu.setdefault(a.node, {})
                    per[a.shard_indices[0]] = per.get(a.shard_indices[0], 0) + a.shards
                elif not a.shard_indices:
                    incomplete.add(a.node)
        # A GPU job on several nodes whose gres_detail names fewer of them.
        if job.gpus.wants_gpu and job.nodes and len(seen) < len(job.nodes):
            incomplete.update(n for n in job.nodes if n not in seen)
    names = set(whole) | set(shard_gpus) | incomplete
    return {
        n: NodeAllocations(
            whole=frozenset(whole.get(n, ())),
            shard_gpus=frozenset(shard_gpus.get(n, ())),
            shards=shards.get(n, 0),
            by_gpu=by_gpu.get(n, {}),
            complete=n not in incomplete,
        )
        for n in names
    }


_NOTHING = NodeAllocations(frozenset(), frozenset(), 0, {}, True)


def _idx(indices: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(indices)) or "-"


def _findings(node: Node, alloc: NodeAllocations) -> list[UsageFinding]:
    out: list[UsageFinding] = []
    # Whole GPUs: 24.11+ name them (IDX), 22.05 only counts them.
    if node.gpu_indices_used:
        if set(node.gpu_indices_used) != alloc.whole:
            out.append(
                UsageFinding(
                    node.name,
                    "gpus",
                    f"gpu IDX {_idx(node.gpu_indices_used)}",
                    f"gpu IDX {_idx(alloc.whole)}",
                )
            )
    elif node.gpus_used != len(alloc.whole):
        out.append(
            UsageFinding(node.name, "gpus", f"{node.gpus_used} gpus", f"{len(alloc.whole)} gpus")
        )
    # Shards: 24.11+ count them per GPU, 22.05 names the GPUs holding some.
    if node.shards_used_by_gpu or (not node.shard_gpus_used and node.shards_used):
        slurm_by_gpu = dict(node.shards_used_by_gpu)
        differs = node.shards_used != alloc.shards or set(slurm_by_gpu) != alloc.shard_gpus
        differs = differs or any(slurm_by_gpu.get(i, 0) != n for i, n in alloc.by_gpu.items())
        if differs:
            out.append(
                UsageFinding(
                    node.name,
                    "shards",
                    f"{node.shards_used} shards on GPU {_idx(slurm_by_gpu)}",
                    f"{alloc.shards} shards on GPU {_idx(alloc.shard_gpus)}",
                )
            )
    elif set(node.shard_gpus_used) != alloc.shard_gpus:
        out.append(
            UsageFinding(
                node.name,
                "shards",
                f"shards on GPU {_idx(node.shard_gpus_used)}",
                f"{alloc.shards} shards on GPU {_idx(alloc.shard_gpus)}",
            )
        )
    # A GPU holding more shards than it has (Slurm's restart quirk lets it place them).
    if node.gpus > 0 and node.shards > 0:
        per_gpu = node.shards // node.gpus
        for gpu, n in sorted(alloc.by_gpu.items()):
            if n > per_gpu:
                out.append(
                    UsageFinding(
                        node.name,
                        "shard_overcommit",
                        str(per_gpu),
                        f"{n} shards",
                        gpu=gpu,
                    )
                )
    return out


def reconcile(nodes: Sequence[Node], jobs: Iterable[Job]) -> tuple[list[Node], list[UsageFinding]]:
    """The nodes with their usage as their running jobs' allocations say, and where that
    differs from Slurm's ``gres_used`` (see the module docstring)."""
    allocations = node_allocations(jobs)
    out: list[Node] = []
    findings: list[UsageFinding] = []
    for node in nodes:
        alloc = allocations.get(node.name, _NOTHING)
        if not alloc.complete:
            out.append(node)
            continue
        findings.extend(_findings(node, alloc))
        fixed = replace(
            node,
            gpus_used=len(alloc.whole),
            gpu_indices_used=tuple(sorted(alloc.whole)),
            shards_used=alloc.shards,
            shard_gpus_used=tuple(sorted(alloc.shard_gpus)),
            shards_used_by_gpu=tuple(sorted(alloc.by_gpu.items())),
        )
        # The same object when nothing changed, so the observer stores nothing new.
        out.append(node if fixed == node else fixed)
    return out, findings

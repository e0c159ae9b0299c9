"""Typed intents: what a policy wants changed on a job, in numbers, not in Slurm syntax.

A policy's :class:`~slurmgpu.policy.base.Action` carries a tuple of these, and they are
what ``SlurmClient.update_job`` takes: each backend renders them (``slurmgpu.slurm.update``:
``scontrol update`` fields for the release it talks to, e.g. ``gres:gpu:2`` on 22.05 and
``gres/gpu:2`` from 23.02; the simulator applies them directly) and ``slurm.update``
parses them back (the audit stores the rendered fields; ``actuate.confirm`` compares the
parsed intents with what Slurm lists). Nothing here knows a Slurm spelling, so pure
policies build them without importing ``slurmgpu.slurm``.

The action's ``kind`` says how they are carried out: ``update`` applies the job changes
in one ``scontrol update``; ``requeue`` with changes requeues the job held, applies them
and releases it (``actuate.separate``); ``resize`` carries one :class:`Resize` or
:class:`Preempt` (the checkpoint -> requeue -> update -> release transaction of
``cycle.resize``), plus the changes that go in its held job's update
(:class:`SetTimeLimit`, :class:`SetNice`).

Frozen ``msgspec.Struct`` with ``gc=False`` like ``Action``: a cycle over a big queue
builds tens of thousands, and an intent holds only numbers and strings.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec

__all__ = [
    "Intent",
    "NarrowToMps",
    "NarrowToShards",
    "Preempt",
    "Resize",
    "SetAdminComment",
    "SetComment",
    "SetCpus",
    "SetCpusPerNode",
    "SetGpus",
    "SetMemoryPerNode",
    "SetNice",
    "SetNodes",
    "SetTimeLimit",
    "StartSoon",
    "resize_of",
]


class Intent(msgspec.Struct, frozen=True, gc=False):
    """Base of every intent (frozen, untracked by the collector, compared in C)."""


class SetTimeLimit(Intent, frozen=True, gc=False):
    """The job's time limit in whole seconds; ``None`` is unlimited."""

    seconds: int | None

    @classmethod
    def of(cls, limit: timedelta | None) -> SetTimeLimit:
        """From a timedelta; a fraction of a second rounds up (a limit is never shortened)."""
        if limit is None:
            return cls(None)
        return cls(limit.days * 86400 + limit.seconds + (1 if limit.microseconds else 0))

    @property
    def limit(self) -> timedelta | None:
        return None if self.seconds is None else timedelta(seconds=self.seconds)


class SetMemoryPerNode(Intent, frozen=True, gc=False):
    """Memory per node, MiB."""

    mib: int


class SetCpus(Intent, frozen=True, gc=False):
    """The job's CPUs in total."""

    count: int


class SetCpusPerNode(Intent, frozen=True, gc=False):
    """The fewest CPUs per node."""

    count: int


class SetGpus(Intent, frozen=True, gc=False):
    """Whole GPUs: ``count`` per node (``per_node``) or per job, of ``gpu_type`` if named."""

    count: int
    gpu_type: str | None = None
    per_node: bool = True


class NarrowToShards(Intent, frozen=True, gc=False):
    """Shards per node instead of the job's request (co-location, or a whole GPU's worth)."""

    shards: int


class NarrowToMps(Intent, frozen=True, gc=False):
    """An MPS share per node instead of the job's request: ``gres/mps:share``, a share of
    one GPU's SMs (100 a GPU on the usual gres.conf)."""

    share: int


class SetNodes(Intent, frozen=True, gc=False):
    """The job's node count."""

    count: int


class SetComment(Intent, frozen=True, gc=False):
    """The job's whole comment (e.g. with an ``sgpu:`` token added)."""

    text: str


class SetAdminComment(Intent, frozen=True, gc=False):
    """The job's whole admin comment (the daemon's efficiency summary of a finished job)."""

    text: str


class SetNice(Intent, frozen=True, gc=False):
    """The job's nice value: where it waits in the queue (higher waits longer)."""

    nice: int


class StartSoon(Intent, frozen=True, gc=False):
    """Make a held job eligible ``delay_s`` seconds from now (the resize fast path)."""

    delay_s: int = 1


class Resize(Intent, frozen=True, gc=False):
    """A malleable job's GPU count (or an array pool's running tasks) ``from_gpus`` ->
    ``to_gpus``; ``gpu_type`` when it moves to another GPU type."""

    from_gpus: int
    to_gpus: int
    gpu_type: str | None = None


class Preempt(Intent, frozen=True, gc=False):
    """Checkpoint and requeue a running job at its own size (``gpus``)."""

    gpus: int


def resize_of(intents: tuple[Intent, ...]) -> Resize | Preempt | None:
    """The :class:`Resize` or :class:`Preempt` among ``intents``, if any."""
    for i in intents:
        if isinstance(i, Resize | Preempt):
            return i
    return None

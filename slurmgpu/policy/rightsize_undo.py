"""Rightsizing never leaves a job waiting for ever: the undo of a lowering (pure).

Slurm does not check an operator's or account coordinator's ``scontrol update`` against
the site's minimums. Seen on 22.05 (site lab, the daemon as coordinator of ``root``):
with QOS ``normal`` at ``MinTRESPerJob=cpu=4,gres/gpu=2``, the daemon's update of a
pending job to ``NumCPUs=2`` is taken (exit 0) and the job then waits with
``QOSMinCpuNotSatisfied``; one also cut to one GPU waits with ``BadConstraints``; with
``MinTRESPerJob=mem=2048`` an update to ``MinMemoryNode=1024`` leaves it waiting with
``QOSMinMemory``. None of these is ever left: Slurm does not re-check a job the limit
stopped, and it keeps the reason even after the limit is removed. A lowered time limit
meets no such minimum (there is no ``MinTime``; ``MaxTime``/``MaxWall`` only bind from
above).

So a pending job that waits with such a reason (:func:`stuck_by_limit`) after an
executed rightsize update gets back the request it had before the daemon's first
lowering of each field (the audit's ``*_current`` numbers, :class:`RightsizeChanges`),
with ``sgpu:norightsize`` added to its comment so rightsizing leaves it alone from then
on. Once per job: a job undone already (or whose reason predates any lowering and stays
after the undo) is not touched again. Other jobs of its user, name and partition are not
lowered that way again either: the daemon tells the policy which fields the reason
blames (:func:`blamed_fields`, ``RightsizePolicy.hold_back``). An undo Slurm refuses is
audited ``failed`` with Slurm's words and tried at most :data:`MAX_UNDO_TRIES` times. A
field whose value before the lowering was unknown (``UNLIMITED`` time) is not given back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurmgpu.intent import (
    Intent,
    SetComment,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetTimeLimit,
)
from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import Action, slurm_job_ref
from slurmgpu.tokens import NORIGHTSIZE, add_to_comment, rightsize_opted_out

__all__ = [
    "FIELDS",
    "MAX_UNDO_TRIES",
    "RIGHTSIZE_UNDO_ALERT",
    "STUCK_REASON_PREFIXES",
    "RightsizeChanges",
    "blamed_fields",
    "stuck_by_limit",
    "undo_action",
]

RIGHTSIZE_UNDO_ALERT = "rightsize_undo"  # the audit's alert of an undo (and its mark)
POLICY = "rightsize"
MAX_UNDO_TRIES = 3  # an undo Slurm refuses this often is left to the admin (audited)

# Pending reasons of a request below (or outside) what the site lets run, which Slurm
# never re-checks: QOS and association minimums (QOSMinCpuNotSatisfied, QOSMinMemory,
# QOSMinGRES...), a request the partition refuses (PartitionNodeLimit,
# PartitionTimeLimit, PartitionConfig) or no node can hold (BadConstraints).
STUCK_REASON_PREFIXES = (
    "QOSMin",
    "AssocMin",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "BadConstraints",
)


# The fields rightsizing lowers, as RightsizePolicy.hold_back names them.
FIELDS = frozenset({"time_limit", "memory", "cpus", "gpus"})

# What a reason says was lowered too far: the CPU, memory or GPU minimum of a QOS or an
# association; anything else (BadConstraints: a GPU minimum on 22.05, or a node that
# cannot hold the shape; a partition's limit) blames every field.
_BLAMES = (
    (("QOSMinCpu", "AssocMinCpu"), frozenset({"cpus"})),
    (("QOSMinMem", "AssocMinMem"), frozenset({"memory"})),
    (("QOSMinGRES", "AssocMinGRES"), frozenset({"gpus"})),
)


def blamed_fields(reason: str) -> frozenset[str]:
    """The fields rightsizing must not lower again for a key whose job waited with
    ``reason`` after being lowered.

    >>> sorted(blamed_fields("QOSMinMemory")), sorted(blamed_fields("BadConstraints"))
    (['memory'], ['cpus', 'gpus', 'memory', 'time_limit'])
    """
    for prefixes, fields in _BLAMES:
        if reason.startswith(prefixes):
            return fields
    return FIELDS


def stuck_by_limit(reason: str) -> bool:
    """Whether a pending job's ``reason`` is one it never leaves by itself.

    >>> stuck_by_limit("QOSMinCpuNotSatisfied"), stuck_by_limit("Resources")
    (True, False)
    """
    return reason.startswith(STUCK_REASON_PREFIXES)


@dataclass(frozen=True, slots=True)
class RightsizeChanges:
    """What the audit says of one job's executed rightsize updates: each field's value
    before the first update that lowered it (None: never lowered), and whether the job
    was undone already (or how often Slurm refused the undo). ``gpus_per_node``: True
    when the GPU figure is per node."""

    time_limit_s: float | None = None
    memory_per_node_mib: int | None = None
    cpus: int | None = None
    gpus: int | None = None
    gpus_per_node: bool = True
    undone: bool = False
    undo_failures: int = 0  # undos Slurm refused

    @property
    def lowered(self) -> bool:
        return any(
            v is not None
            for v in (self.time_limit_s, self.memory_per_node_mib, self.cpus, self.gpus)
        )


def undo_action(job: Job, changes: RightsizeChanges | None) -> Action | None:
    """The ``update`` that gives ``job`` back what it asked for before rightsizing, or
    None when the job is not one to undo (module docstring)."""
    if changes is None or changes.undone or not changes.lowered:
        return None
    if changes.undo_failures >= MAX_UNDO_TRIES:
        return None
    if job.state is not JobState.PENDING or not stuck_by_limit(job.reason):
        return None
    intents: list[Intent] = []
    # name and partition: the key the daemon holds rightsizing back for (hold_back)
    numbers: dict[str, float | int | str | None] = {
        "reason": job.reason,
        "name": job.name,
        "partition": job.partition,
    }
    back: list[str] = []
    if changes.time_limit_s is not None:
        seconds = math.ceil(changes.time_limit_s)
        intents.append(SetTimeLimit(seconds))
        numbers["restored_time_limit_s"] = seconds
        back.append("its time limit")
    if changes.memory_per_node_mib is not None:
        intents.append(SetMemoryPerNode(changes.memory_per_node_mib))
        numbers["restored_memory_per_node_mib"] = changes.memory_per_node_mib
        back.append(f"{changes.memory_per_node_mib} MiB per node")
    if changes.gpus is not None:
        intents.append(SetGpus(changes.gpus, job.gpus.gpu_type, per_node=changes.gpus_per_node))
        numbers["restored_gpus"] = changes.gpus
        back.append(f"{changes.gpus} GPU(s){' per node' if changes.gpus_per_node else ''}")
    if changes.cpus is not None:
        nodes = job.node_count if job.node_count > 1 else 1
        intents.append(SetCpus(changes.cpus))
        intents.append(SetCpusPerNode(math.ceil(changes.cpus / nodes)))
        numbers["restored_cpus"] = changes.cpus
        back.append(f"{changes.cpus} CPUs")
    comment = job.comment
    if not rightsize_opted_out(comment):
        comment = add_to_comment(comment, [NORIGHTSIZE])
    intents.append(SetComment(comment))
    return Action(
        POLICY,
        "update",
        job.job_id,
        job.user,
        f"waits with {job.reason} after rightsizing (a site limit Slurm never re-checks): "
        f"given back {', '.join(back)}, not rightsized again",
        numbers,
        tuple(intents),
        RIGHTSIZE_UNDO_ALERT,
        slurm_id=slurm_job_ref(job),
        protective=True,
    )

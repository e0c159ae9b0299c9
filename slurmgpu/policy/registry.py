"""The policies slurmgpu runs, in the one order the daemon and the simulator both use.

The order is the engine's pipeline (:class:`~slurmgpu.policy.engine.PolicyEngine`): it
breaks ties between decisions and decides which stage may follow another's change within
the cooldown (rightsize sets a pending job's limit, then malleable starts it smaller; an
earlier stage never redoes a later one's change). It was written twice before issue 37,
in ``daemon/policy_cycle.py`` and ``sim/policysets.py``; both now build their policies in
any order and hand them to :func:`in_pipeline_order`, and the simulator's ``all`` set is
every stage here.

Pure: names and classes only; which policies run and with what settings is the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from slurmgpu.policy.base import Policy
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.las import AttainedServicePolicy
from slurmgpu.policy.malleable import MalleablePolicy
from slurmgpu.policy.rightsize import RightsizePolicy

__all__ = ["PIPELINE", "Stage", "in_pipeline_order", "stage_names"]


@dataclass(frozen=True, slots=True)
class Stage:
    """One policy of the pipeline: its ``Policy.name`` (also its ``[policy.<table>]``
    where the config has one) and its class."""

    name: str
    policy: type[Policy]


PIPELINE: tuple[Stage, ...] = (
    Stage(IdleGpuPolicy.name, IdleGpuPolicy),  # frees idle GPUs first
    Stage(RightsizePolicy.name, RightsizePolicy),  # brings a pending request down
    Stage(ColocatePolicy.name, ColocatePolicy),  # then shares a GPU for a light one
    Stage(AttainedServicePolicy.name, AttainedServicePolicy),  # orders the queue
    Stage(MalleablePolicy.name, MalleablePolicy),  # fits what is left to the cluster
)


def stage_names() -> tuple[str, ...]:
    """The policies' names in pipeline order.

    >>> stage_names()
    ('idle_gpu', 'rightsize', 'colocate', 'las', 'malleable')
    """
    return tuple(stage.name for stage in PIPELINE)


T = TypeVar("T")


def in_pipeline_order(policies: Iterable[tuple[Policy, T]]) -> list[tuple[Policy, T]]:
    """``policies`` (each with what the caller runs it with, e.g. its mode) sorted into
    the pipeline's order, for :class:`~slurmgpu.policy.engine.PolicyEngine`. Raises
    ValueError for a policy that is not a stage here, or two of one stage (the engine
    would rank both as the first)."""
    rank = {name: i for i, name in enumerate(stage_names())}
    seen: set[str] = set()
    for policy, _ in (listed := list(policies)):
        if policy.name not in rank:
            raise ValueError(f"policy {policy.name!r} is not in the pipeline {stage_names()}")
        if policy.name in seen:
            raise ValueError(f"policy {policy.name!r} given twice")
        seen.add(policy.name)
    return sorted(listed, key=lambda pair: rank[pair[0].name])

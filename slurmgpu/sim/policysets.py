"""Policy sets the simulator can compare, built from the daemon's own policy classes.

A set is a list of the policies the daemon would run (every one in ``enforce`` mode, so
the simulation shows what acting would do) handed to the daemon's
:class:`~slurmgpu.policy.engine.PolicyEngine` with the configured guardrails -- never
a second implementation. Baseline schedulers (``tiresias``, ``qssf``) change how SimSlurm
orders and preempts jobs instead, and run no policy.

=============  ==============================================================
set            what runs
=============  ==============================================================
``slurm``      no policy: Slurm's priority order and EASY backfill on user limits
``rightsize``  :class:`~slurmgpu.policy.rightsize.RightsizePolicy` (every job opted in)
``colocate``   ``slurmgpu.policy.colocate`` (shard requests for light 1-GPU jobs)
``malleable``  ``slurmgpu.policy.malleable`` (shrink and expand opted-in jobs), type-blind
``malleable-types``  the same with ``type_aware`` on: untyped jobs grow (and start
               smaller) on the GPU type where they run fastest, from the speeds the
               simulator runs them at (``sim.gputypes``, Sia's measurements)
``las``        :class:`~slurmgpu.policy.las.AttainedServicePolicy` (attained-service
               queues through ``Nice``, preemption by the resize transaction)
``all``        every policy of the pipeline together (:mod:`slurmgpu.policy.registry`:
               idle-GPU, rightsize, colocate, LAS and malleable)
``tiresias``   baseline: discretised 2D-LAS, preemptive (no policy)
``qssf``       baseline: shortest expected GPU time first, from history (no policy)
=============  ==============================================================

Each set's settings come from :class:`SimPolicies` (the daemon's setting classes); a field
left at ``None`` means the set's own default, given with its builder below. The engine
gets a set's policies in the pipeline order of :mod:`slurmgpu.policy.registry`, as the
daemon's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from slurmgpu.policy.base import Mode, Policy
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.las import AttainedServicePolicy
from slurmgpu.policy.malleable import MalleablePolicy
from slurmgpu.policy.registry import in_pipeline_order, stage_names
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import (
    AttainedServiceSettings,
    ColocateSettings,
    EngineSettings,
    IdleGpuSettings,
    MalleableSettings,
    RightsizeSettings,
)
from slurmgpu.policy.sizing import SizingRules
from slurmgpu.sim.gputypes import SPEED, known_types, type_speeds

__all__ = [
    "BASELINES",
    "BATCH_ADAPTIVE",
    "POLICY_SETS",
    "STAGE_BUILDERS",
    "SimPolicies",
    "build_engine",
    "known_sets",
    "measured_speed_table",
]

BASELINES = ("tiresias", "qssf")
# Sets with the goodput allocator (the malleable policy): their jobs on the elastic
# runtime retune the global batch at every restart (sim.workload.elastic_batch), as
# Pollux's do; every other set runs the batch each job was submitted with.
BATCH_ADAPTIVE = frozenset({"malleable", "malleable-types", "all"})


@dataclass(frozen=True, slots=True)
class SimPolicies:
    """The settings the simulator builds policies from (the daemon's setting classes).

    ``colocate``, ``malleable`` and ``las`` left at ``None`` take the set's default;
    ``sizing`` is the site's sizing rules (rightsize and colocate take it);
    ``device_memory_mib`` the GPUs' memory the default ``colocate`` settings assume (a
    sharing comparison's cluster, ``ClusterShape.with_sharing``, has 80 GB GPUs)."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    sizing: SizingRules = field(default_factory=SizingRules)
    rightsize: RightsizeSettings = field(
        default_factory=lambda: RightsizeSettings(apply_to_all=True)
    )
    idle_gpu: IdleGpuSettings = field(default_factory=IdleGpuSettings)
    colocate: ColocateSettings | None = None
    malleable: MalleableSettings | None = None
    las: AttainedServiceSettings | None = None
    device_memory_mib: int = 32_768


def _rightsize(s: SimPolicies) -> Policy:
    return RightsizePolicy(replace(s.rightsize, mode=Mode.ENFORCE), sizing=s.sizing)


def _idle(s: SimPolicies) -> Policy:
    return IdleGpuPolicy(replace(s.idle_gpu, mode=Mode.ENFORCE))


def _colocate(s: SimPolicies) -> Policy:
    # Default: every job is a candidate (what if the site turned it on for all); SimSlurm
    # accepts a pending gpu -> shard update as Slurm 23.02+ does.
    settings = s.colocate or ColocateSettings(
        mode=Mode.ENFORCE,
        apply_to_all=True,
        convert_gpu_requests="always",
        device_memory_mib=s.device_memory_mib,
    )
    return ColocatePolicy(settings, sizing=s.sizing)


def _malleable(s: SimPolicies) -> Policy:
    return MalleablePolicy(s.malleable)


def measured_speed_table() -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """``MalleableSettings.type_speed`` for the Pollux applications (job name = app)."""
    rows = [(app, type_speeds(app, known_types())) for app in sorted(SPEED)]
    rows.append(("*", type_speeds(None, known_types())))
    return tuple(rows)


def _malleable_types(s: SimPolicies) -> Policy:
    base = s.malleable or MalleableSettings(mode=Mode.ENFORCE)
    settings = replace(base, type_aware=True, type_speed=base.type_speed or measured_speed_table())
    return MalleablePolicy(settings)


def _las(s: SimPolicies) -> Policy:
    return AttainedServicePolicy(s.las or AttainedServiceSettings(enabled=True, mode=Mode.ENFORCE))


def _las_beside_malleable(s: SimPolicies) -> Policy:
    # as the daemon builds it beside an enforcing malleable policy (daemon/policy_cycle.py)
    expands = s.malleable.expand if s.malleable is not None else True
    return AttainedServicePolicy(
        s.las or AttainedServiceSettings(enabled=True, mode=Mode.ENFORCE),
        malleable_expands=expands,
    )


Builder = Callable[[SimPolicies], Policy]
# Each stage of the pipeline (policy.registry), as the sets build it.
STAGE_BUILDERS: dict[str, Builder] = {
    "idle_gpu": _idle,
    "rightsize": _rightsize,
    "colocate": _colocate,
    "las": _las,
    "malleable": _malleable,
}
POLICY_SETS: dict[str, tuple[Builder, ...]] = {
    "slurm": (),
    "rightsize": (_rightsize,),
    "colocate": (_colocate,),
    "malleable": (_malleable,),
    "malleable-types": (_malleable_types,),
    "las": (_las,),
    # every stage; LAS knows the malleable policy runs beside it
    "all": tuple(
        _las_beside_malleable if name == "las" else STAGE_BUILDERS[name] for name in stage_names()
    ),
}


def known_sets() -> tuple[str, ...]:
    return (*POLICY_SETS, *BASELINES)


def build_engine(name: str, settings: SimPolicies | None = None) -> PolicyEngine:
    """Return the daemon's PolicyEngine with the policies of set ``name``, all enforcing.

    Raises ``KeyError`` for an unknown set.
    """
    s = settings or SimPolicies()
    if name in BASELINES:
        return PolicyEngine([], s.engine)
    builders = POLICY_SETS[name]
    policies = in_pipeline_order((build(s), Mode.ENFORCE) for build in builders)
    return PolicyEngine(policies, s.engine)

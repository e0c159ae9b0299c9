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
``all``        idle-GPU, rightsize, colocate, LAS and malleable together
``tiresias``   baseline: discretised 2D-LAS, preemptive (no policy)
``qssf``       baseline: shortest expected GPU time first, from history (no policy)
=============  ==============================================================

Policies written in other modules are imported when a set is built, never at import
time; a set whose module is missing (or has no policy class) raises
:class:`PolicySetUnavailable` with the reason, so a comparison reports "not available"
instead of silently running plain Slurm.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from slurmgpu.policy.base import Mode, Policy
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import EngineSettings, IdleGpuSettings, RightsizeSettings

__all__ = [
    "BASELINES",
    "BATCH_ADAPTIVE",
    "POLICY_SETS",
    "PolicySetUnavailable",
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


class PolicySetUnavailable(RuntimeError):
    """A policy set cannot be built here (its policy module is not installed yet)."""


@dataclass(frozen=True, slots=True)
class SimPolicies:
    """The settings the simulator builds policies from (the daemon's setting classes)."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    rightsize: RightsizeSettings = field(
        default_factory=lambda: RightsizeSettings(apply_to_all=True)
    )
    idle_gpu: IdleGpuSettings = field(default_factory=IdleGpuSettings)
    # Settings objects for policies defined elsewhere, passed to their constructors.
    extra: tuple[tuple[str, Any], ...] = ()

    def extra_for(self, name: str) -> Any:
        for key, value in self.extra:
            if key == name:
                return value
        return None


def _from_module(module: str, names: Sequence[str], label: str, settings: Any) -> Policy:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise PolicySetUnavailable(f"{label}: {module} is not available ({exc})") from None
    for name in names:
        cls = getattr(mod, name, None)
        if cls is not None:
            policy: Policy = cls(settings) if settings is not None else cls()
            return policy
    raise PolicySetUnavailable(f"{label}: {module} has no {' or '.join(names)}")


def _rightsize(s: SimPolicies) -> Policy:
    return RightsizePolicy(replace(s.rightsize, mode=Mode.ENFORCE))


def _idle(s: SimPolicies) -> Policy:
    return IdleGpuPolicy(replace(s.idle_gpu, mode=Mode.ENFORCE))


def _colocate(s: SimPolicies) -> Policy:
    settings = s.extra_for("colocate")
    if settings is None:
        try:
            from slurmgpu.policy.settings import ColocateSettings
        except ImportError:
            raise PolicySetUnavailable("colocate: no ColocateSettings yet") from None
        # Every job is a candidate (what if the site turned it on for all); SimSlurm
        # accepts a pending gpu -> shard update as Slurm 23.02+ does.
        settings = ColocateSettings(
            mode=Mode.ENFORCE,
            apply_to_all=True,
            convert_gpu_requests="always",
            device_memory_mib=32_768,
        )
    return _from_module("slurmgpu.policy.colocate", ("ColocatePolicy",), "colocate", settings)


def _malleable(s: SimPolicies) -> Policy:
    return _from_module(
        "slurmgpu.policy.malleable", ("MalleablePolicy",), "malleable", s.extra_for("malleable")
    )


def measured_speed_table() -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """``MalleableSettings.type_speed`` for the Pollux applications (job name = app)."""
    from slurmgpu.sim.gputypes import SPEED, known_types, type_speeds

    rows = [(app, type_speeds(app, known_types())) for app in sorted(SPEED)]
    rows.append(("*", type_speeds(None, known_types())))
    return tuple(rows)


def _malleable_types(s: SimPolicies) -> Policy:
    from slurmgpu.policy.settings import MalleableSettings

    base = s.extra_for("malleable") or MalleableSettings(mode=Mode.ENFORCE)
    settings = replace(base, type_aware=True, type_speed=base.type_speed or measured_speed_table())
    return _from_module("slurmgpu.policy.malleable", ("MalleablePolicy",), "malleable", settings)


def _las(s: SimPolicies) -> Policy:
    from slurmgpu.policy.las import AttainedServicePolicy
    from slurmgpu.policy.settings import AttainedServiceSettings

    settings = s.extra_for("las")
    if settings is None:
        settings = AttainedServiceSettings(enabled=True, mode=Mode.ENFORCE)
    return AttainedServicePolicy(settings)


Builder = Callable[[SimPolicies], Policy]
POLICY_SETS: dict[str, tuple[Builder, ...]] = {
    "slurm": (),
    "rightsize": (_rightsize,),
    "colocate": (_colocate,),
    "malleable": (_malleable,),
    "malleable-types": (_malleable_types,),
    "las": (_las,),
    "all": (_idle, _rightsize, _colocate, _las, _malleable),
}


def known_sets() -> tuple[str, ...]:
    return (*POLICY_SETS, *BASELINES)


def build_engine(name: str, settings: SimPolicies | None = None) -> PolicyEngine:
    """Return the daemon's PolicyEngine with the policies of set ``name``, all enforcing.

    Raises ``KeyError`` for an unknown set and :class:`PolicySetUnavailable` when a
    policy it needs cannot be built.
    """
    s = settings or SimPolicies()
    if name in BASELINES:
        return PolicyEngine([], s.engine)
    builders = POLICY_SETS[name]
    policies = [(build(s), Mode.ENFORCE) for build in builders]
    return PolicyEngine(policies, s.engine)

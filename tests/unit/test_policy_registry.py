"""One ordered list of policies (policy/registry.py): the daemon's engine and the
simulator's run the pipeline in its order, whatever order they build the policies in."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgpu.config import parse_settings
from slurmgpu.daemon.policy_cycle import build_policy_cycle
from slurmgpu.policy import registry
from slurmgpu.policy.base import Action, Mode, Policy, PolicySnapshot
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.registry import PIPELINE, in_pipeline_order, stage_names
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.sim.policysets import POLICY_SETS, STAGE_BUILDERS, SimPolicies, build_engine
from slurmgpu.store import open_store
from tests.fakes import FakeSlurm

EVERY_POLICY = '[policy.las]\nenabled = true\nmode = "enforce"\n'


def _names(engine: PolicyEngine) -> list[str]:
    return [policy.name for policy, _ in engine.policies]


def _daemon_engine(tmp_path: Path) -> PolicyEngine:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    return build_policy_cycle(parse_settings(EVERY_POLICY), store, FakeSlurm()).engine


def test_the_daemon_and_the_simulator_run_every_stage_in_the_registry_order(
    tmp_path: Path,
) -> None:
    assert stage_names() == ("idle_gpu", "rightsize", "colocate", "las", "malleable")
    assert _names(_daemon_engine(tmp_path)) == list(stage_names())
    assert _names(build_engine("all")) == list(stage_names())
    # each stage is the class the registry names, on both sides
    for engine in (_daemon_engine(tmp_path), build_engine("all")):
        classes = [type(policy) for policy, _ in engine.policies]
        assert classes == [stage.policy for stage in PIPELINE]


def test_both_take_their_order_from_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reorder the registry and both engines follow: neither keeps an order of its own."""
    reordered = (*PIPELINE[2:], *PIPELINE[:2])
    monkeypatch.setattr(registry, "PIPELINE", reordered)
    expected = [stage.name for stage in reordered]
    assert _names(_daemon_engine(tmp_path)) == expected
    assert _names(build_engine("all")) == expected


def test_the_simulator_builds_every_stage_and_its_sets_only_registered_ones() -> None:
    assert set(STAGE_BUILDERS) == set(stage_names())
    assert len(POLICY_SETS["all"]) == len(PIPELINE)
    for name in POLICY_SETS:
        in_pipeline_order((build(SimPolicies()), Mode.ENFORCE) for build in POLICY_SETS[name])


def test_an_unknown_or_repeated_policy_is_refused() -> None:
    class Stray:
        name = "stray"

        def propose(self, snapshot: PolicySnapshot) -> list[Action]:
            return []

    stray: Policy = Stray()
    with pytest.raises(ValueError, match="'stray' is not in the pipeline"):
        in_pipeline_order([(stray, Mode.ENFORCE)])
    twice = [(RightsizePolicy(), Mode.ENFORCE), (RightsizePolicy(), Mode.OBSERVE)]
    with pytest.raises(ValueError, match="'rightsize' given twice"):
        in_pipeline_order(twice)
    mixed: list[tuple[Policy, Mode]] = [
        (RightsizePolicy(), Mode.ENFORCE),
        (IdleGpuPolicy(), Mode.OBSERVE),
    ]
    assert [p.name for p, _ in in_pipeline_order(mixed)] == ["idle_gpu", "rightsize"]

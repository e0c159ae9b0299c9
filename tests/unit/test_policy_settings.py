"""Policy settings: anchored defaults, and config tables parsed with errors that name the key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from slurmgpu.policy.base import Mode
from slurmgpu.policy.settings import (
    EngineSettings,
    IdleGpuSettings,
    PolicyConfigError,
    RightsizeSettings,
    sizing_from_mappings,
)
from slurmgpu.policy.sizing import SizingRules


def test_defaults_are_the_anchored_ones() -> None:
    idle = IdleGpuSettings()
    assert (idle.warn_after, idle.second_warn_after, idle.act_after) == (
        timedelta(minutes=60),
        timedelta(minutes=105),
        timedelta(minutes=120),
    )
    assert (idle.sliding_warn_after, idle.sliding_act_after) == (
        timedelta(minutes=240),
        timedelta(minutes=300),
    )
    assert idle.mode is Mode.ADVISE and idle.action == "requeue" and idle.idle_fraction == 1.0
    assert idle.exempt_interactive
    rs = RightsizeSettings()
    assert rs.mode is Mode.ADVISE and not rs.apply_to_all
    assert (rs.time_quantile, rs.min_history, rs.target_cores_per_gpu) == (0.95, 3, 12)
    rules = SizingRules()
    assert (rules.time_headroom, rules.memory_headroom, rules.cpu_headroom) == (1.3, 1.2, 1.2)
    assert rules.min_time_limit == timedelta(minutes=15)
    assert rules.time_round == timedelta(minutes=5) and rules.memory_round_mib == 256
    assert (rules.memory_margin_mib, rules.max_jobs_per_gpu) == (2048, 2)
    assert rs.min_change_fraction == 0.2 and rs.max_judged_per_cycle == 25_000
    eng = EngineSettings()
    assert (eng.max_actions_per_cycle, eng.max_actions_per_user_per_hour) == (20, 10)
    assert eng.job_cooldown == timedelta(minutes=30) and eng.exempt_interactive


def test_empty_tables_give_the_defaults() -> None:
    assert IdleGpuSettings.from_mapping({}, "policy.idle_gpu") == IdleGpuSettings()
    assert RightsizeSettings.from_mapping({}, "policy.rightsize") == RightsizeSettings()
    assert EngineSettings.from_mapping({}, "policy.engine") == EngineSettings()


def test_tables_are_parsed_into_typed_values() -> None:
    idle = IdleGpuSettings.from_mapping(
        {
            "mode": "enforce",
            "warn_after": "30m",
            "second_warn_after": "off",
            "act_after": 3600,
            "action": "cancel",
            "idle_fraction": 0.5,
            "exempt_partitions": ["interactive", "debug"],
        },
        "policy.idle_gpu",
    )
    assert idle.mode is Mode.ENFORCE
    assert idle.warn_after == timedelta(minutes=30) and idle.act_after == timedelta(hours=1)
    assert idle.second_warn_after is None and idle.action == "cancel"
    assert idle.exempt_partitions == frozenset({"interactive", "debug"})
    rs = RightsizeSettings.from_mapping(
        {
            "apply_to_all": True,
            "time_quantile": 0.9,
            "gpus": False,
            "max_judged_per_cycle": 0,
        },
        "policy.rightsize",
    )
    assert rs.apply_to_all and rs.time_quantile == 0.9 and not rs.gpus
    assert rs.max_judged_per_cycle == 0  # no limit
    eng = EngineSettings.from_mapping(
        {"exempt_users": ["root"], "exempt_qos": "urgent", "max_actions_per_cycle": 5},
        "policy.engine",
    )
    assert eng.exempt_users == frozenset({"root"}) and eng.exempt_qos == frozenset({"urgent"})
    assert eng.max_actions_per_cycle == 5


@pytest.mark.parametrize(
    ("cls", "table", "key", "fragment"),
    [
        (IdleGpuSettings, {"warn_afer": "1h"}, "warn_afer", "not a known setting"),
        (IdleGpuSettings, {"warn_after": "soon"}, "warn_after", "must be a duration"),
        (IdleGpuSettings, {"action": "kill"}, "action", "requeue, cancel, notify"),
        (IdleGpuSettings, {"idle_fraction": 0}, "idle_fraction", "> 0"),
        (IdleGpuSettings, {"idle_fraction": 1.5}, "idle_fraction", "<= 1"),
        (IdleGpuSettings, {"mode": "yes"}, "mode", "observe, advise, enforce"),
        (IdleGpuSettings, {"act_after": "30m"}, "act_after", "warn_after"),
        (IdleGpuSettings, {"second_warn_after": "3h"}, "second_warn_after", "between"),
        (RightsizeSettings, {"memory": "yes"}, "memory", "true or false"),
        (RightsizeSettings, {"min_history": 0}, "min_history", ">= 1"),
        (RightsizeSettings, {"max_judged_per_cycle": -1}, "max_judged_per_cycle", ">= 0"),
        (RightsizeSettings, {"max_judged_per_cycle": 2.5}, "max_judged_per_cycle", "integer"),
        (EngineSettings, {"exempt_users": [1]}, "exempt_users", "list of names"),
        (EngineSettings, {"max_actions_per_cycle": True}, "max_actions_per_cycle", "integer"),
    ],
)
def test_bad_values_name_the_table_and_key(
    cls: Any, table: dict[str, Any], key: str, fragment: str
) -> None:
    with pytest.raises(PolicyConfigError) as info:
        cls.from_mapping(table, "policy.x")
    assert info.value.key == key
    assert info.value.where == "policy.x"
    assert str(info.value).startswith(f"policy.x.{key} ")
    assert fragment in info.value.message


def test_the_sizing_knobs_are_read_from_the_rightsize_and_colocate_tables() -> None:
    """One SizingRules per site, its knobs written where they always were: the time, memory
    and CPU ones in [policy.rightsize], the shard rule's in [policy.colocate]; each table
    comes back without them, for its own settings."""
    rules, rightsize, colocate = sizing_from_mappings(
        {"min_time_limit": "30m", "memory_round_mib": 512, "apply_to_all": True},
        {"memory_margin": "4GiB", "max_jobs_per_gpu": 4, "max_slowdown": 1.5},
    )
    assert rules == SizingRules(
        min_time_limit=timedelta(minutes=30),
        memory_round_mib=512,
        memory_margin_mib=4096,
        max_jobs_per_gpu=4,
    )
    assert rightsize == {"apply_to_all": True} and colocate == {"max_slowdown": 1.5}
    assert sizing_from_mappings({}, {})[0] == SizingRules()


@pytest.mark.parametrize(
    ("rightsize", "colocate", "where", "key", "fragment"),
    [
        ({"time_headroom": 0.5}, {}, "policy.rightsize", "time_headroom", ">= 1"),
        ({"time_round": "soon"}, {}, "policy.rightsize", "time_round", "must be a duration"),
        ({}, {"max_jobs_per_gpu": 1}, "policy.colocate", "max_jobs_per_gpu", ">= 2"),
        ({}, {"memory_margin": "lots"}, "policy.colocate", "memory_margin", "must be a size"),
    ],
)
def test_bad_sizing_knobs_name_their_table(
    rightsize: dict[str, Any], colocate: dict[str, Any], where: str, key: str, fragment: str
) -> None:
    with pytest.raises(PolicyConfigError) as info:
        sizing_from_mappings(rightsize, colocate)
    assert (info.value.where, info.value.key) == (where, key)
    assert fragment in info.value.message


def test_a_non_table_is_refused() -> None:
    with pytest.raises(PolicyConfigError, match="must be a table"):
        EngineSettings.from_mapping("nope", "policy.engine")  # type: ignore[arg-type]

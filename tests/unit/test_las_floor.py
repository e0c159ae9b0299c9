"""LAS's Nice against the site's priority settings: parsed from what 22.05, 24.11 and 26.05
printed for the lab's site profile (tests/golden/slurm-*/site_show_*.txt, written by
``scripts/record_golden.py --site-config``), checked by policy/las_floor.py, and warned
once by the daemon at start (daemon/las_check.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurmgpu.daemon.las_check import check_las_priority
from slurmgpu.policy.las_floor import SitePriority, nice_warnings
from slurmgpu.policy.settings import AttainedServiceSettings
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.client import SlurmParseError
from slurmgpu.slurm.config import (
    PriorityConfig,
    parse_partition_factors,
    parse_show_config,
    priority_config,
)
from slurmgpu.slurm.runner import CommandResult, CommandTimeout
from tests.fakes import FakeSlurm

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RELEASES = ("22.05", "24.11", "26.05")


def golden(release: str, name: str) -> str:
    return (GOLDEN / f"slurm-{release}" / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("release", RELEASES)
def test_each_releases_site_profile_is_read(release: str) -> None:
    config = priority_config(
        golden(release, "site_show_config.txt"), golden(release, "site_show_partition.txt")
    )
    # slurmgpu/lab/cluster/site.py: fair share 100000, every job's base 100000
    assert config == PriorityConfig("priority/multifactor", 100000, 100000, {"gpu": 1, "debug": 1})
    assert config.multifactor and config.base == 100000
    assert config.base_reason() == "PriorityWeightPartition=100000"


def test_keys_are_matched_without_case_and_empty_weights_are_zero() -> None:
    shown = parse_show_config(golden("22.05", "site_show_config.txt"))
    assert shown["priorityweightfairshare"] == "100000"  # printed PriorityWeightFairShare
    assert shown["priorityflags"] == ""
    text = "PriorityType = priority/basic\nPriorityWeightFairshare = (null)\n"
    basic = priority_config(text, "")
    assert (basic.multifactor, basic.weight_fairshare, basic.base) == (False, 0, 0)


def test_the_base_is_the_lowest_partitions_share() -> None:
    config = PriorityConfig("priority/multifactor", 1000, 100000, {"gpu": 4, "debug": 1})
    assert config.base == 25000
    assert config.base_reason() == (
        "PriorityWeightPartition=100000 x lowest/highest partition PriorityJobFactor 1/4"
    )
    assert PriorityConfig("priority/multifactor", 0, 100000, {}).base == 0


def test_what_is_not_slurms_output_is_refused_in_one_line() -> None:
    with pytest.raises(SlurmParseError, match="no PriorityType"):
        parse_show_config("<html>proxy error</html>")
    with pytest.raises(SlurmParseError, match="is not a number"):
        priority_config("PriorityType = priority/multifactor\nPriorityWeightPartition = x\n", "")
    with pytest.raises(SlurmParseError, match="no PriorityJobFactor"):
        parse_partition_factors("PartitionName=gpu State=UP\n")


SITE = SitePriority(multifactor=True, base=100000, base_from="X", weight_fairshare=100000)


def test_the_site_profile_breaks_neither_rule() -> None:
    assert nice_warnings(AttainedServiceSettings(), SITE) == []


def test_more_queues_than_the_base_holds_says_which_setting_to_change() -> None:
    settings = AttainedServiceSettings(queue_limits=(1.0, 4.0, 16.0))
    (line,) = nice_warnings(settings, SITE)
    assert "floor of 1" in line and "Nice is 300000" in line
    assert "set PriorityWeightPartition >= 300000 in slurm.conf" in line
    # a smaller nice_step would let fair share cross a queue: not offered
    assert "nice_step <=" not in line
    lower = SitePriority(multifactor=True, base=100000, base_from="X", weight_fairshare=10000)
    (line,) = nice_warnings(settings, lower)
    assert line.endswith("or [policy.las] nice_step <= 33333")


def test_a_nice_step_below_the_fair_share_weight_is_named() -> None:
    settings = AttainedServiceSettings(nice_step=50000)
    (line,) = nice_warnings(settings, SITE)
    assert "nice_step 50000 is below PriorityWeightFairshare 100000" in line
    assert "set nice_step >= 100000" in line


def test_no_base_at_all_and_both_rules_broken() -> None:
    bare = SitePriority(multifactor=True, base=0, base_from="Y", weight_fairshare=200000)
    floor, fair = nice_warnings(AttainedServiceSettings(), bare)
    assert "base priority is only 0 (Y)" in floor and "nice_step 100000 is below" in fair


def test_other_priority_plugins_are_not_checked() -> None:
    basic = SitePriority(multifactor=False, base=0, base_from="", weight_fairshare=0)
    assert nice_warnings(AttainedServiceSettings(queue_limits=(1.0, 2.0)), basic) == []


class ScriptedRunner:
    """A CommandRunner answering from a list (an exception is raised), recording argv."""

    def __init__(self, answers: list[CommandResult | BaseException]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], **_: object) -> CommandResult:
        self.calls.append(list(argv))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _client(config: str, partitions: str) -> tuple[CliSlurmClient, ScriptedRunner]:
    runner = ScriptedRunner(
        [
            CommandResult(0, config.encode(), b""),
            CommandResult(0, partitions.encode(), b""),
        ]
    )
    return CliSlurmClient(runner=runner), runner


def test_the_daemon_warns_once_per_problem_through_the_slurm_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, runner = _client(
        golden("26.05", "site_show_config.txt"), golden("26.05", "site_show_partition.txt")
    )
    settings = AttainedServiceSettings(queue_limits=(1.0, 4.0, 16.0))
    with caplog.at_level(logging.WARNING, logger="slurmgpu.daemon"):
        lines = check_las_priority(settings, client)
    assert runner.calls == [
        ["scontrol", "show", "config"],
        ["scontrol", "show", "partition", "-o"],
    ]
    assert len(lines) == 1 and [r.getMessage() for r in caplog.records] == lines


def test_a_slurm_that_does_not_answer_costs_one_line_and_no_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = CliSlurmClient(runner=ScriptedRunner([CommandTimeout()]))
    with caplog.at_level(logging.WARNING, logger="slurmgpu.daemon"):
        assert check_las_priority(AttainedServiceSettings(), client) == []
    (record,) = caplog.records
    assert "priority weights not read" in record.getMessage()
    # a client that cannot say (the simulator's, the tests' fake) is not asked
    assert check_las_priority(AttainedServiceSettings(), FakeSlurm()) == []

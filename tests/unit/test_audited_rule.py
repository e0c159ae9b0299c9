"""slurmgpu.daemon.audited_rule: the shape the daemon's after-cycle safety nets share."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from slurmgpu.actuate.actuator import ActuationResult, Actuator
from slurmgpu.daemon.audited_rule import carry_out_rule
from slurmgpu.model import Job
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.store.database import StoreError
from tests.unit.policy_builders import pending_job

AT = datetime(2026, 12, 7, tzinfo=UTC)


class RecordingActuator:
    def __init__(self) -> None:
        self.calls: list[Sequence[Decision]] = []

    def carry_out(self, decisions: Sequence[Decision], at: datetime) -> list[ActuationResult]:
        self.calls.append(list(decisions))
        return []


def _rule(job: Job, known: str | None) -> Action | None:
    return None if known is None else Action("rightsize", "update", job.job_id, job.user, known)


def test_the_rule_sees_what_the_audit_knows_and_its_actions_are_enforced() -> None:
    actuator = RecordingActuator()
    jobs = [pending_job(1), pending_job(2), pending_job(3)]
    asked: list[list[int]] = []

    def read(ids: list[int]) -> dict[int, str]:
        asked.append(ids)
        return {1: "one", 3: "three"}

    carry_out_rule(cast(Actuator, actuator), jobs, read, _rule, AT, unread="jobs {ids}")
    assert asked == [[1, 2, 3]]  # one read for all
    (decisions,) = actuator.calls
    assert [(d.action.job_id, d.action.reason) for d in decisions] == [(1, "one"), (3, "three")]
    assert all(d.mode is Mode.ENFORCE and d.execute and not d.notify for d in decisions)


def test_no_job_or_no_action_asks_nothing_of_the_store_or_slurm() -> None:
    actuator = RecordingActuator()

    def read(ids: list[int]) -> dict[int, Any]:
        raise AssertionError("read with no jobs")

    assert carry_out_rule(cast(Actuator, actuator), [], read, _rule, AT, unread="x") == []
    assert (
        carry_out_rule(
            cast(Actuator, actuator), [pending_job(1)], lambda ids: {}, _rule, AT, unread="x"
        )
        == []
    )
    assert actuator.calls == []


def test_a_store_outage_is_one_line_and_nothing_is_carried_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    actuator = RecordingActuator()

    def read(ids: list[int]) -> dict[int, str]:
        raise StoreError("database is locked\nwith a second line")

    with caplog.at_level(logging.WARNING, logger="slurmgpu.daemon"):
        results = carry_out_rule(
            cast(Actuator, actuator),
            [pending_job(7), pending_job(8)],
            read,
            _rule,
            AT,
            unread="timed-out jobs {ids} not checked for a lowered limit",
        )
    assert results == [] and actuator.calls == []
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("timed-out jobs 7, 8 not checked for a lowered limit: ")
    assert "\n" not in line and "database is locked" in line

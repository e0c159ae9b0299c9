"""``sgpu daemon`` with a SIGKILL at one named step of a multi-step action (tests only).

Run as ``python -m tests.slurm.fault_daemon POINT MARKER sgpu-args...``. ``POINT`` is
``STEP:KIND``: STEP one of

- ``after_record``: the decision is in the audit (outcome ``pending``), nothing done;
- ``after_execute``: Slurm has carried the change out, the audit still says ``pending``;
- ``after_outcome``: the outcome is stored (the action is complete): at once for a change
  made in Slurm (``AuditStore.set_outcome``), with the cycle's other outcomes for a
  notice (``AuditStore.set_outcomes``);

and KIND the action kind (``warn``, ``requeue``, ``update``, ``cancel``). The process
writes MARKER (the point and the job id), then SIGKILLs itself, exactly there: the real
daemon code runs unchanged around these seams.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.policy.base import Action, Decision
from slurmgpu.store.audit import AuditStore


def main(argv: Sequence[str]) -> None:
    point, marker = argv[0], Path(argv[1])
    step, kind = point.split(":")
    kinds: dict[int, tuple[str, int]] = {}

    def die(job_id: int) -> None:
        marker.write_text(f"{point} {job_id}\n")
        os.kill(os.getpid(), signal.SIGKILL)

    record, execute = AuditStore.record, Actuator._execute
    set_outcome, set_outcomes = AuditStore.set_outcome, AuditStore.set_outcomes

    def record_then_die(
        self: AuditStore, decisions: Sequence[Decision], at: datetime, *, slurm_version: str = ""
    ) -> list[int]:
        ids = record(self, decisions, at, slurm_version=slurm_version)
        for d, action_id in zip(decisions, ids, strict=True):
            kinds[action_id] = (d.action.kind, d.action.job_id)
            if step == "after_record" and d.action.kind == kind and (d.execute or d.notify):
                die(d.action.job_id)
        return ids

    def execute_then_die(self: Actuator, action: Action) -> None:
        execute(self, action)
        if step == "after_execute" and action.kind == kind:
            die(action.job_id)

    def outcome_then_die(
        self: AuditStore, action_id: int, outcome: str, error: str | None = None
    ) -> None:
        set_outcome(self, action_id, outcome, error)
        done_kind, job_id = kinds.get(action_id, ("", 0))
        if step == "after_outcome" and done_kind == kind:
            die(job_id)

    def outcomes_then_die(
        self: AuditStore, outcomes: Sequence[tuple[int, str, str | None]]
    ) -> None:
        set_outcomes(self, outcomes)
        for action_id, _, _ in outcomes:
            done_kind, job_id = kinds.get(action_id, ("", 0))
            if step == "after_outcome" and done_kind == kind:
                die(job_id)

    AuditStore.record = record_then_die  # type: ignore[method-assign]
    Actuator._execute = execute_then_die  # type: ignore[method-assign]
    AuditStore.set_outcome = outcome_then_die  # type: ignore[method-assign]
    AuditStore.set_outcomes = outcomes_then_die  # type: ignore[method-assign]

    from slurmgpu.cli.main import main as sgpu

    sgpu(list(argv[2:]), prog_name="sgpu")


if __name__ == "__main__":
    main(sys.argv[1:])

"""One single-step action carried out through a SlurmClient: the daemon's actuator
(``actuate.actuator``) and the simulator (``sim.run``, through SimSlurm) share it.

No store here: the simulator loads this module without SQLAlchemy.
"""

from __future__ import annotations

from slurmgpu.actuate.separate import separate
from slurmgpu.policy.base import Action
from slurmgpu.slurm.client import SlurmClient

__all__ = ["execute_action"]


def execute_action(slurm: SlurmClient, action: Action) -> None:
    """Carry out one single-step action through Slurm (the simulator calls this too)."""
    # Array tasks must be addressed as A_i: the bare array id would hit every task.
    ref: str | int = action.slurm_id or action.job_id
    if action.kind == "update":
        slurm.update_job(ref, action.intents)
    elif action.kind == "requeue" and action.intents:
        # requeue held, update, release
        separate(slurm, ref, action.intents)
    elif action.kind == "requeue":
        slurm.requeue(ref)
    elif action.kind == "cancel":
        slurm.cancel(ref)
    elif action.kind != "warn":
        raise ValueError(f"unknown action kind {action.kind!r}")

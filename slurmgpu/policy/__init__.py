"""Pure decisions: policies read a PolicySnapshot and propose Actions; the engine decides.

Nothing in this package does I/O or reads the clock (time is ``PolicySnapshot.at``), so
the daemon, the simulator and the tests run the same code.
"""

from __future__ import annotations

from slurmgpu.policy.base import (
    Action,
    Decision,
    GpuStat,
    HistoryRecord,
    JobUsage,
    Mode,
    Policy,
    PolicySnapshot,
    PriorAlert,
    slurm_job_ref,
)
from slurmgpu.policy.engine import ACTION_PRIORITY, CHANGE_KINDS, PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.priors import Estimate, Priors
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import (
    EngineSettings,
    IdleGpuSettings,
    PolicyConfigError,
    RightsizeSettings,
)

__all__ = [
    "ACTION_PRIORITY",
    "CHANGE_KINDS",
    "Action",
    "Decision",
    "EngineSettings",
    "Estimate",
    "GpuStat",
    "HistoryRecord",
    "IdleGpuPolicy",
    "IdleGpuSettings",
    "JobUsage",
    "Mode",
    "Policy",
    "PolicyConfigError",
    "PolicyEngine",
    "PolicySnapshot",
    "PriorAlert",
    "Priors",
    "RightsizePolicy",
    "RightsizeSettings",
    "slurm_job_ref",
]

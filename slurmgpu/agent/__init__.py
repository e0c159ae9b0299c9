"""The node agent: samples what every job on a GPU node uses and sends it to the daemon.

``NodeSampler`` turns one probe reading and /proc into wire samples; ``DaemonClient`` does
the two HTTP calls; ``BatchSpool`` keeps what could not be sent; ``AgentLoop`` runs them
every interval. This package does I/O (the network, /proc, the spool directory).
"""

from __future__ import annotations

from slurmgpu.agent.loop import AgentLoop, CycleReport
from slurmgpu.agent.sampler import NodeSampler, new_run_id, sample_uid
from slurmgpu.agent.sender import (
    AgentAuthError,
    Authenticator,
    Backoff,
    DaemonClient,
    HmacAuth,
    JobsUnavailableError,
    MungeAuth,
    SendOutcome,
    SendResult,
    choose_auth,
    read_node_token,
)
from slurmgpu.agent.spool import BatchSpool, SpooledBatch, SpoolError

__all__ = [
    "AgentAuthError",
    "AgentLoop",
    "Authenticator",
    "Backoff",
    "BatchSpool",
    "CycleReport",
    "DaemonClient",
    "HmacAuth",
    "JobsUnavailableError",
    "MungeAuth",
    "NodeSampler",
    "SendOutcome",
    "SendResult",
    "SpoolError",
    "SpooledBatch",
    "choose_auth",
    "new_run_id",
    "read_node_token",
    "sample_uid",
]

"""The Slurm seam: a protocol, a JSON CLI backend, a pyslurm backend and the parsers."""

from __future__ import annotations

from slurmgpu.slurm.client import (
    SlurmClient,
    SlurmCommandError,
    SlurmError,
    SlurmParseError,
    SlurmUnavailableError,
)

__all__ = [
    "SlurmClient",
    "SlurmCommandError",
    "SlurmError",
    "SlurmParseError",
    "SlurmUnavailableError",
]

"""The SlurmClient protocol: everything slurmgpu asks of Slurm, and the errors it raises.

Implementations: ``slurmgpu.slurm.cli.CliSlurmClient`` (squeue/sinfo/scontrol JSON),
``slurmgpu.slurm.pyslurm.PySlurmClient`` (optional) and ``slurmgpu.sim`` (virtual time).

:class:`AccountingClient` (``sacct``) and :class:`FullSignalClient` (``scancel --full``)
are optional extra capabilities: callers test for them with ``isinstance`` and do without
when a backend lacks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Protocol, runtime_checkable

from slurmgpu.intent import Intent
from slurmgpu.model import Job, Node


class SlurmError(Exception):
    """Base class of every error raised through the SlurmClient seam."""


class SlurmUnavailableError(SlurmError):
    """slurmctld did not answer (down, slow, or the command timed out)."""


class SlurmParseError(SlurmError):
    """Slurm answered with output we cannot understand (malformed or unknown format)."""


class SlurmCommandError(SlurmError):
    """Slurm understood the request and refused it (bad job id, permission denied…)."""

    def __init__(self, message: str, *, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


@runtime_checkable
class SlurmClient(Protocol):
    """What slurmgpu needs from Slurm. One call returns all jobs or all nodes."""

    def version(self) -> str:
        """Return the Slurm release, e.g. ``"22.05.8"``."""
        ...

    def jobs(self) -> list[Job]:
        """Return every job slurmctld knows (one squeue call, never one per job)."""
        ...

    def nodes(self) -> list[Node]:
        """Return every node (one sinfo call)."""
        ...

    def submit(
        self,
        sbatch_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> int:
        """Submit with sbatch (arguments passed as a list, never through a shell)."""
        ...

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        """Carry out ``intents`` on the job in one update (``scontrol update JobId=J K=V…``).

        Typed intents (:mod:`slurmgpu.intent`), never Slurm fields: each backend spells
        them for the release it talks to (``slurm.update.update_fields``). A
        :class:`~slurmgpu.intent.Resize` or :class:`~slurmgpu.intent.Preempt` is no update
        (SlurmCommandError), nor is an empty sequence.
        """
        ...

    def hold(self, job_id: str | int) -> None: ...

    def release(self, job_id: str | int) -> None: ...

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        """Requeue a job (``requeuehold`` when ``hold``); address array tasks as ``A_i``."""
        ...

    def signal(self, job_id: str | int, signal: str, *, batch_only: bool = False) -> None: ...

    def cancel(self, job_id: str | int) -> None: ...

    def set_array_throttle(self, array_job_id: int, max_running: int) -> None:
        """``scontrol update JobId=A ArrayTaskThrottle=N`` (0 = unlimited)."""
        ...

    def set_time_limit(self, job_id: str | int, limit: timedelta) -> None: ...


@runtime_checkable
class FullSignalClient(Protocol):
    """Optional: signal a job's batch script, its children and every step at once."""

    def signal_all(self, job_id: str | int, signal: str) -> None:
        """``scancel --full --signal=SIG J``: what a job's own Python process receives
        whether it runs in the batch script or under srun (a plain ``signal`` skips the
        batch step; ``batch_only`` reaches the shell but not its children)."""
        ...


@runtime_checkable
class AccountingClient(Protocol):
    """Optional: what Slurm's accounting database (``sacct``) knows of finished jobs."""

    def finished_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        """Return the jobs among ``job_ids`` that accounting records as finished.

        One job per id (its newest run), in a terminal state, with its real end state,
        times and exit code. Ids accounting does not know, or whose job is still pending
        or running there, are left out; ``[]`` when accounting storage is disabled.
        Raises :class:`SlurmError` subclasses like the listings do.
        """
        ...

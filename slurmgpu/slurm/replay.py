"""A read-only SlurmClient that replays recorded ``squeue --json`` / ``sinfo --json`` output.

Benchmarks and tests feed the observer recorded (or generated, or damaged) listings
through the same decoders the CLI backend uses. Each listing is read anew per call, as a
pipe from ``squeue`` would be, and decoded with a memo kept between listings like
:class:`~slurmgpu.slurm.cli.CliSlurmClient` keeps. It implements the whole
:class:`~slurmgpu.slurm.client.SlurmClient` protocol: every call that would change Slurm
raises :class:`~slurmgpu.slurm.client.SlurmCommandError` (a recording cannot be changed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

from slurmgpu.intent import Intent
from slurmgpu.model import Job, Node
from slurmgpu.slurm.client import SlurmCommandError
from slurmgpu.slurm.jsonformat import JobMemo, decode_sinfo, decode_squeue

__all__ = ["ReplaySlurmClient"]


class ReplaySlurmClient:
    """Listings from recorded documents: bytes held, or a file read on every call."""

    def __init__(
        self, squeue: bytes | Path, sinfo: bytes | Path, *, version: str = "22.05.8"
    ) -> None:
        self.squeue = squeue
        self.sinfo = sinfo
        self._version = version
        self._memo: JobMemo = {}

    @staticmethod
    def _read(source: bytes | Path) -> bytes:
        return source.read_bytes() if isinstance(source, Path) else source

    def version(self) -> str:
        return self._version

    def jobs(self) -> list[Job]:
        jobs, release = decode_squeue(self._read(self.squeue), self._memo)
        if release:
            self._version = release
        return jobs

    def nodes(self) -> list[Node]:
        return decode_sinfo(self._read(self.sinfo))

    def _refuse(self, call: str) -> SlurmCommandError:
        return SlurmCommandError(f"{call}: a replayed Slurm listing cannot be changed")

    def submit(
        self,
        sbatch_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> int:
        raise self._refuse("sbatch")

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        raise self._refuse("scontrol update")

    def hold(self, job_id: str | int) -> None:
        raise self._refuse("scontrol hold")

    def release(self, job_id: str | int) -> None:
        raise self._refuse("scontrol release")

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        raise self._refuse("scontrol requeue")

    def signal(self, job_id: str | int, signal: str, *, batch_only: bool = False) -> None:
        raise self._refuse("scancel --signal")

    def cancel(self, job_id: str | int) -> None:
        raise self._refuse("scancel")

    def set_array_throttle(self, array_job_id: int, max_running: int) -> None:
        raise self._refuse("scontrol update ArrayTaskThrottle")

    def set_time_limit(self, job_id: str | int, limit: timedelta) -> None:
        raise self._refuse("scontrol update TimeLimit")

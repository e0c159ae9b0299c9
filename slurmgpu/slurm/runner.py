"""How CliSlurmClient runs a Slurm command: a small protocol and its subprocess default.

The client builds the argument list and maps what came back (exit status, stdout,
stderr, a timeout, a missing binary) to SlurmError; the runner only runs. Tests give the
client a runner that answers with recorded outputs, so argv building and error mapping
are checked in milliseconds; real Slurm tests use :class:`SubprocessRunner`.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CommandResult", "CommandRunner", "CommandTimeout", "SubprocessRunner"]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a finished command gave back."""

    returncode: int
    stdout: bytes
    stderr: bytes


class CommandTimeout(Exception):
    """The command ran past its timeout and was killed."""


class CommandRunner(Protocol):
    """Run ``argv`` (no shell) to completion.

    Raises :class:`CommandTimeout` when it ran past ``timeout`` seconds, and ``OSError``
    (``FileNotFoundError``, ``PermissionError``, ...) when it could not be started.
    ``big_output``: stdout may be hundreds of MiB; hold it once, not as pipe chunks.
    """

    def __call__(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None,
        timeout: float,
        env: Mapping[str, str],
        cwd: str | None,
        big_output: bool,
    ) -> CommandResult: ...


class SubprocessRunner:
    """The real thing: :func:`subprocess.run`, stdin closed unless ``input`` is given."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None,
        timeout: float,
        env: Mapping[str, str],
        cwd: str | None,
        big_output: bool,
    ) -> CommandResult:
        stdin = None if input is not None else subprocess.DEVNULL
        try:
            if big_output:
                # stdout to a temporary file read back in one piece
                with tempfile.TemporaryFile(prefix="slurmgpu-") as out:
                    proc = subprocess.run(
                        list(argv),
                        input=input,
                        stdin=stdin,
                        stdout=out,
                        stderr=subprocess.PIPE,
                        env=dict(env),
                        cwd=cwd,
                        timeout=timeout,
                        check=False,
                    )
                    out.seek(0)
                    stdout = out.read()
            else:
                proc = subprocess.run(
                    list(argv),
                    input=input,
                    stdin=stdin,
                    capture_output=True,
                    env=dict(env),
                    cwd=cwd,
                    timeout=timeout,
                    check=False,
                )
                stdout = proc.stdout
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"{argv[0]} ran past {timeout:g} s") from None
        return CommandResult(proc.returncode, stdout or b"", proc.stderr or b"")

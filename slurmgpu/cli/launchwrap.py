"""What ``sgpu submit --malleable`` does to make a job's training run under ``sgpu launch``.

- A ``--wrap`` command becomes ``trap '' SIG; exec <python> -m slurmgpu launch -- CMD`` (through
  ``/bin/sh -c`` when it has shell syntax): the launcher is then the batch shell, which is
  what Slurm's ``--signal=B:...`` reaches at the time limit.
- A batch script is read: running ``sgpu launch`` with ``exec`` is right; ``sgpu launch``
  without ``exec``, or torchrun started directly (``exec torchrun``, ``python -m
  torch.distributed.run``), is refused with the line to write instead (torchrun dies of
  the checkpoint signal and leaves its workers behind; a shell in front of the launcher
  dies of the time-limit signal). Any other script gets a note: its program must receive
  the signal itself.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

__all__ = ["ScriptVerdict", "check_script", "launch_prefix", "wrap_command"]

_SHELL_CHARS = re.compile(r"[;&|<>`$()\n'\"\\*?~{}]")
_LAUNCH_RE = re.compile(r"(^|[\s/])(sgpu|slurmgpu)\s+launch(\s|$)|-m\s+slurmgpu\s+launch(\s|$)")
_SRUN_RE = re.compile(r"(^|[\s/])srun(\s|$)")
_TORCHRUN_RE = re.compile(r"(^|[\s/])torchrun(\s|$)|-m\s+torch\.distributed\.(run|launch)(\s|$)")
_MAX_SCRIPT_BYTES = 1 << 20


def launch_prefix(signal: str = "USR2") -> str:
    """How a job runs the launcher: this sgpu's own interpreter (found on every node that
    sees the submitting environment, like the user's own python), with the checkpoint
    ``signal`` ignored until the launcher catches it: a resize signalled in the second
    the interpreter takes to start would otherwise kill the job (the trace replay, issue
    33, lost a job that way 0.3 s after it started). Ignored stays ignored across
    ``exec``; the launcher then installs its own handler."""
    return (
        f"trap '' {shlex.quote(signal)}; exec {shlex.quote(sys.executable)} -m slurmgpu launch --"
    )


def _launch_under_srun(text: str) -> bool:
    """``srun ... sgpu launch -- ...``: one launcher per node, under srun."""
    launch = _LAUNCH_RE.search(text)
    srun = _SRUN_RE.search(text)
    return launch is not None and srun is not None and srun.start() < launch.start()


def wrap_command(cmd: str, signal: str = "USR2") -> str:
    """The ``--wrap`` command to submit for ``cmd`` (``signal``: the checkpoint signal).

    ``srun ... sgpu launch -- torchrun ...`` (a launcher per node) gets the batch launcher
    in front too: it is what the time limit's signal reaches, and it requeues the job.
    """
    text = cmd.strip()
    if _launch_under_srun(text):
        body = text.removeprefix("exec ").strip()
        if not _SHELL_CHARS.search(body):
            return f"{launch_prefix(signal)} {body}"
        return f"{launch_prefix(signal)} /bin/sh -c {shlex.quote(body)}"
    if _LAUNCH_RE.search(text):
        return text if text.startswith("exec ") else f"exec {text}"
    if not _SHELL_CHARS.search(text):
        return f"{launch_prefix(signal)} {text.removeprefix('exec ').strip()}"
    return f"{launch_prefix(signal)} /bin/sh -c {shlex.quote(text)}"


class ScriptVerdict:
    """``error`` (refuse the submission) or ``note`` (say so, submit), or neither."""

    def __init__(self, error: str | None = None, note: str | None = None) -> None:
        self.error = error
        self.note = note


def _commands(text: str) -> list[tuple[int, str]]:
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append((number, line))
    return out


def check_script(path: str | Path) -> ScriptVerdict:
    """Whether a malleable job's batch script runs its training under ``exec sgpu launch``."""
    name = Path(path).name
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_SCRIPT_BYTES)
    except OSError as exc:
        return ScriptVerdict(note=f"could not read {name} to check it: {exc.strerror}")
    lines = _commands(data.decode("utf-8", errors="replace"))
    launch = [(n, line) for n, line in lines if _LAUNCH_RE.search(line)]
    for number, line in launch:
        if _launch_under_srun(line) and not line.startswith("exec "):
            return ScriptVerdict(
                error=f"{name} line {number} runs a launcher per node under srun with no "
                "batch launcher in front: the time limit's signal reaches only the batch "
                f"shell; write `exec sgpu launch -- {line}`"
            )
        if not line.startswith("exec "):
            return ScriptVerdict(
                error=f"{name} line {number} runs `sgpu launch` without `exec`: the batch "
                "shell in front of it would die of the time-limit signal; write "
                f"`exec {line}`"
            )
    if launch:
        return ScriptVerdict()
    for number, line in lines:
        if _TORCHRUN_RE.search(line):
            return ScriptVerdict(
                error=f"{name} line {number} starts torchrun directly: torchrun dies of the "
                "checkpoint signal and its workers outlive the job; run it under the "
                f"launcher instead: `exec sgpu launch -- {_after_exec(line)}`"
            )
    return ScriptVerdict(
        note=f"{name} does not run its training with `exec sgpu launch -- ...`: the "
        "checkpoint signal reaches the batch shell (and, from the daemon, every process), "
        "so the program must handle it itself and nothing in front of it may die of it; "
        "the job is not requeued at its time limit"
    )


def _after_exec(line: str) -> str:
    return line.removeprefix("exec ").strip()

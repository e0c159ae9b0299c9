"""``sgpu daemon`` that SIGKILLs itself right after one Slurm call of a resize (tests only).

Run as ``python -m tests.slurm.resize_fault_daemon CALL MARKER sgpu-args...`` with CALL one
of ``signal`` (the checkpoint signal), ``requeue`` (requeue held), ``update`` (the new
GPU count) or ``release``. Right after that call succeeded, before the transaction's new
state is written (the worst moment for a daemon to die), the process writes MARKER (the
call and the job) and SIGKILLs itself. The real daemon code runs unchanged around it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurmgpu.intent import StartSoon
from slurmgpu.slurm.cli import CliSlurmClient

METHODS = {
    "signal": "signal_all",
    "requeue": "requeue",
    "update": "update_job",
    "release": "release",
}


def main(argv: Sequence[str]) -> None:
    call, marker = argv[0], Path(argv[1])
    name = METHODS[call]
    original: Callable[..., None] = getattr(CliSlurmClient, name)

    def call_then_die(self: CliSlurmClient, job_id: str | int, *args: Any, **kw: Any) -> None:
        original(self, job_id, *args, **kw)
        intents = tuple(args[0]) if name == "update_job" and args else ()
        if intents and all(isinstance(i, StartSoon) for i in intents):
            return  # the roll back's start-time-only update is not the resize's update
        marker.write_text(f"{call} {job_id}\n")
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(CliSlurmClient, name, call_then_die)

    from slurmgpu.cli.main import main as sgpu

    sgpu(list(argv[2:]), prog_name="sgpu")


if __name__ == "__main__":
    main(sys.argv[1:])

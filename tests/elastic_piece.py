"""One piece of a training run under ``sgpu launch``, signalled as the daemon would.

The framework tests (tests/integration/test_elastic_hf.py, test_elastic_accelerate.py)
train an example in pieces: each piece runs ``sgpu launch -- torchrun ...`` until its
training log shows a chosen step, gets the checkpoint signal (SIGUSR2), and once the
runtime's acknowledgement is on disk the requeue's SIGTERM; the last piece runs to the
end. What each piece saw is returned for the tests to compare with an uninterrupted run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["jsonl", "last_step", "read_ack", "run_piece"]


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` ([] before it exists)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_step(path: Path) -> int:
    """The last ``step`` a training log shows (0 before any)."""
    return max((d["step"] for d in jsonl(path) if "step" in d), default=0)


def read_ack(state_dir: Path, job: str) -> dict[str, Any] | None:
    """The runtime's acknowledgement file of ``job`` under ``SGPU_ELASTIC_DIR``."""
    path = state_dir / job / "ack.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_piece(
    *,
    cwd: Path,
    command: Sequence[str],
    env: Mapping[str, str],
    log: Path,
    job: str,
    world: int,
    signal_after: int | None,
) -> dict[str, Any]:
    """Run ``command`` under ``sgpu launch``; with ``signal_after``, SIGUSR2 to the launcher
    once ``log`` shows that step, then (after the ack) the requeue's SIGTERM. Returns the
    world size, the step signalled after, the ack, the last step while held and the log
    lines this piece added."""
    state = Path(env["SGPU_ELASTIC_DIR"])
    before = len(jsonl(log))
    acks_before = (read_ack(state, job) or {}).get("acks", 0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmgpu", "launch", "--", *command],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    info: dict[str, Any] = {"world": world}
    try:
        if signal_after is not None:
            deadline = time.monotonic() + 240
            while last_step(log) < signal_after:
                assert proc.poll() is None, proc.communicate()[0].decode()[-4000:]
                assert time.monotonic() < deadline, "no training progress"
                time.sleep(0.05)
            info["signalled_after"] = last_step(log)
            proc.send_signal(signal.SIGUSR2)
            while (ack := read_ack(state, job)) is None or ack["acks"] == acks_before:
                assert proc.poll() is None, proc.communicate()[0].decode()[-4000:]
                assert time.monotonic() < deadline, "no acknowledgement"
                time.sleep(0.05)
            info["ack"] = ack
            time.sleep(0.5)  # the run holds: no step after the checkpoint
            info["steps_while_held"] = last_step(log)
            proc.send_signal(signal.SIGTERM)  # what the daemon's requeue sends
        output = proc.communicate(timeout=300)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    # No worker failed; torchrun's own traceback of the SIGTERM (SignalException) may follow.
    assert "Traceback" not in output.split("sgpu launch: stop_signal")[0], output[-4000:]
    assert "ChildFailedError" not in output, output[-4000:]
    if signal_after is None:
        assert proc.returncode == 0, output[-4000:]
    else:
        # After the requeue's SIGTERM the workers leave at once (exit 0 after the durable
        # checkpoint) and the launcher kills what is left of torchrun's teardown, so its
        # own status is torchrun's SIGKILL; Slurm requeues the job whatever it is.
        assert "why=the training processes have exited" in output, output[-4000:]
    info["log"] = jsonl(log)[before:]
    return info

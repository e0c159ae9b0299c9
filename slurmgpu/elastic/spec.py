"""What the job and the daemon agree on: the state directory, the ack file.

A malleable job says so in its Slurm comment, where squeue shows it to the daemon and
job_submit.lua can read it: ``sgpu:malleable=MIN:MAX`` (GPUs) or ``sgpu:pool=MIN:MAX``
(an array pool: tasks running at once). ``sgpu submit --malleable`` writes the token and
the rest of the spec beside it, ``sgpu:ckpt=SIGNAL:GRACE_S`` and ``sgpu:edir=PATH``
(percent-encoded): the comment is what the daemon reads for every user's job, while the
store's ``submissions`` table (also written) is root's alone, so a job a user submitted
would otherwise resize with the default signal and grace. Those tokens are parsed and
written by :mod:`slurmgpu.tokens`; the daemon ignores, with a warning, any it cannot trust.

The job's runtime (:mod:`slurmgpu.elastic.runtime`) keeps its files in
``<state dir>/<job id>/``; the state dir must be on a filesystem the head node sees (the
checkpoint has to survive the job moving anyway). Two small JSON files there are the
daemon's only window into the job:

- ``ack.json``: written (atomically) after every checkpoint that answered a checkpoint
  request. ``acks`` counts them over the job's life, so the daemon, which read the count
  before it signalled, knows a newer checkpoint exists without comparing clocks across
  nodes.
- ``progress.json``: the measured throughput at each GPU count the job ran at.

The daemon reads these as root from a directory the user owns, so reading is defensive:
no symlinks followed, at most :data:`MAX_FILE_BYTES`, anything odd is "no ack".
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ACK_FILE",
    "DEFAULT_DIR_NAME",
    "MAX_FILE_BYTES",
    "Ack",
    "Progress",
    "job_dir",
    "parse_range",
    "read_ack",
    "read_progress",
]

DEFAULT_DIR_NAME = ".sgpu-elastic"
ACK_FILE = "ack.json"
PROGRESS_FILE = "progress.json"
MAX_FILE_BYTES = 64 * 1024
_RANGE_RE = re.compile(r"^\s*(\d{1,6})\s*:\s*(\d{1,6})\s*$")


def parse_range(text: str) -> tuple[int, int]:
    """``"2:4"`` → (2, 4); ValueError with a one-line reason otherwise."""
    m = _RANGE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not MIN:MAX (two whole numbers, e.g. 2:4)")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo < 1 or hi < lo:
        raise ValueError(f"{text!r}: need 1 <= MIN <= MAX")
    return lo, hi


def job_dir(state_dir: str | Path, job_id: int) -> Path:
    return Path(state_dir) / str(int(job_id))


def _read_json(path: Path) -> dict[str, Any] | None:
    """A small regular file's JSON object, not following symlinks; None if anything is off."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return None
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Ack:
    """The job's newest answered checkpoint request."""

    job_id: int
    acks: int  # answered requests so far, over every run of the job
    restart_count: int
    step: int | None
    gpus: int | None
    at: float  # the job's clock (seconds since the epoch), for display only

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "job_id": self.job_id,
            "acks": self.acks,
            "restart_count": self.restart_count,
            "step": self.step,
            "gpus": self.gpus,
            "at": self.at,
        }


def read_ack(state_dir: str | Path, job_id: int) -> Ack | None:
    """The job's ``ack.json``, or None when absent, unreadable or for another job."""
    raw = _read_json(job_dir(state_dir, job_id) / ACK_FILE)
    if raw is None or raw.get("version") != 1 or _int(raw.get("job_id")) != job_id:
        return None
    acks, restarts = _int(raw.get("acks")), _int(raw.get("restart_count"))
    at = raw.get("at")
    if acks is None or acks < 0 or restarts is None or not isinstance(at, int | float):
        return None
    return Ack(job_id, acks, restarts, _int(raw.get("step")), _int(raw.get("gpus")), float(at))


@dataclass(frozen=True, slots=True)
class Progress:
    """Measured throughput (units per second, e.g. samples/s) by GPU count."""

    job_id: int
    throughput: dict[int, float]
    step: int | None = None


def read_progress(state_dir: str | Path, job_id: int) -> Progress | None:
    raw = _read_json(job_dir(state_dir, job_id) / PROGRESS_FILE)
    if raw is None or raw.get("version") != 1 or _int(raw.get("job_id")) != job_id:
        return None
    table = raw.get("throughput")
    if not isinstance(table, dict):
        return None
    out: dict[int, float] = {}
    for key, value in list(table.items())[:64]:
        ok = isinstance(key, str) and key.isdigit() and isinstance(value, int | float)
        if ok and math.isfinite(value) and value >= 0:
            out[int(key)] = float(value)
    return Progress(job_id, out, _int(raw.get("step")))

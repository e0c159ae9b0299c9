"""What the job and the daemon agree on: opt-in tokens, the state directory, the ack file.

A malleable job says so in its Slurm comment, where squeue shows it to the daemon and
job_submit.lua can read it: ``sgpu:malleable=MIN:MAX`` (GPUs) or ``sgpu:pool=MIN:MAX``
(an array pool: tasks running at once). ``sgpu submit --malleable`` writes the token and
the rest of the spec beside it, ``sgpu:ckpt=SIGNAL:GRACE_S`` and ``sgpu:edir=PATH``
(percent-encoded): the comment is what the daemon reads for every user's job, while the
store's ``submissions`` table (also written) is root's alone, so a job a user submitted
would otherwise resize with the default signal and grace. The daemon validates both
tokens (:func:`parse_options`) and ignores, with a warning, any it cannot trust.

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
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

__all__ = [
    "ACK_FILE",
    "DEFAULT_DIR_NAME",
    "MALLEABLE_TOKEN",
    "MAX_FILE_BYTES",
    "POOL_TOKEN",
    "Ack",
    "CommentOptions",
    "Progress",
    "format_options",
    "format_token",
    "job_dir",
    "parse_options",
    "parse_range",
    "parse_token",
    "read_ack",
    "read_progress",
]

MALLEABLE_TOKEN = "sgpu:malleable"  # noqa: S105 - a comment tag, not a secret
POOL_TOKEN = "sgpu:pool"  # noqa: S105
DEFAULT_DIR_NAME = ".sgpu-elastic"
ACK_FILE = "ack.json"
PROGRESS_FILE = "progress.json"
MAX_FILE_BYTES = 64 * 1024
_TOKEN_RE = re.compile(r"^(sgpu:malleable|sgpu:pool)=(\d{1,6}):(\d{1,6})$")
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


def format_token(lo: int, hi: int, *, pool: bool = False) -> str:
    return f"{POOL_TOKEN if pool else MALLEABLE_TOKEN}={lo}:{hi}"


OPTIONS_TOKEN = "sgpu:ckpt"  # noqa: S105 - a comment tag, not a secret
DIR_TOKEN = "sgpu:edir"  # noqa: S105
MAX_GRACE_S = 65535  # what sbatch --signal accepts
MAX_DIR_CHARS = 1024
# Signals a checkpoint request may use: any catchable one (never KILL or STOP).
CHECKPOINT_SIGNALS = frozenset(
    s.name.removeprefix("SIG") for s in signal.Signals if s.name.startswith("SIG")
) - {"KILL", "STOP"}
_OPTIONS_RE = re.compile(r"^sgpu:ckpt=([A-Z0-9+]{1,12}):(\d{1,6})$")


@dataclass(frozen=True, slots=True)
class CommentOptions:
    """Checkpoint signal, grace and state directory from a comment (None: not given).

    ``problems`` names each token that was present but not trusted (one line each)."""

    signal: str | None = None
    grace_s: int | None = None
    state_dir: str | None = None
    problems: tuple[str, ...] = ()


def format_options(signal_name: str, grace_s: int, state_dir: str) -> list[str]:
    """The comment tokens carrying a malleable job's checkpoint options."""
    return [
        f"{OPTIONS_TOKEN}={signal_name}:{grace_s}",
        f"{DIR_TOKEN}={quote(state_dir, safe='/._-~+@')}",
    ]


def parse_options(comment: str) -> CommentOptions:
    """Validated checkpoint options from a job comment (the user's own text: trust nothing).

    The signal must be a catchable signal's name, the grace 1 to 65535 s, the state dir
    an absolute, normalised path of at most 1024 characters without control characters.
    """
    sig: str | None = None
    grace: int | None = None
    state_dir: str | None = None
    problems: list[str] = []
    for word in comment.replace(",", " ").replace(";", " ").split():
        if word.startswith(OPTIONS_TOKEN + "=") and sig is None:
            m = _OPTIONS_RE.match(word)
            if m and m.group(1) in CHECKPOINT_SIGNALS and 1 <= int(m.group(2)) <= MAX_GRACE_S:
                sig, grace = m.group(1), int(m.group(2))
            else:
                problems.append(f"{word[:60]!r} is not sgpu:ckpt=SIGNAL:SECONDS")
        elif word.startswith(DIR_TOKEN + "=") and state_dir is None:
            try:
                path = unquote(word.removeprefix(DIR_TOKEN + "="), errors="strict")
            except UnicodeDecodeError:
                path = ""
            ok = (
                0 < len(path) <= MAX_DIR_CHARS
                and os.path.isabs(path)
                and os.path.normpath(path) == path
                and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in path)
            )
            if ok:
                state_dir = path
            else:
                problems.append(f"{word[:60]!r} is not an absolute, normalised directory")
    return CommentOptions(sig, grace, state_dir, tuple(problems))


def parse_token(comment: str) -> tuple[int, int, bool] | None:
    """(min, max, is_pool) from a job comment's opt-in token, or None (also when malformed).

    The first well-formed token wins; a malformed one opts nothing in (resizing a job
    needs an unambiguous yes).
    """
    for word in comment.replace(",", " ").replace(";", " ").split():
        m = _TOKEN_RE.match(word)
        if not m:
            continue
        lo, hi = int(m.group(2)), int(m.group(3))
        if 1 <= lo <= hi:
            return lo, hi, m.group(1) == POOL_TOKEN
    return None


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

"""What the job and the daemon agree on: the state directory, the ack file.

A malleable job says so in its Slurm comment, where squeue shows it to the daemon and
job_submit.lua can read it: ``sgpu:malleable=MIN:MAX`` (GPUs) or ``sgpu:pool=MIN:MAX``
(an array pool: tasks running at once). ``sgpu submit --malleable`` writes the token and
the rest of the spec beside it, ``sgpu:ckpt=SIGNAL:GRACE_S`` and ``sgpu:edir=PATH``
(percent-encoded): the comment is what the daemon reads for every user's job (the
store, where the daemon records the submission from the job, is the daemon's alone:
slurmgpu/store/submission_record.py). Those tokens are parsed and
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

The daemon reads these as root from a directory the user owns, so reading is defensive
(:mod:`slurmgpu.userfiles`, :mod:`slurmgpu.boundedjson`): no link followed, no FIFO
waited on, at most :data:`MAX_FILE_BYTES`, JSON nested at most :data:`MAX_DEPTH` deep.
``load_ack``/``load_progress`` say why a file is unusable (:class:`UserFileRejected`);
``read_ack``/``read_progress`` never raise: an unusable file is "no ack" / "no
progress", logged once per job and cause and counted in ``/metrics``
(``sgpu_user_input_rejected_total``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from slurmgpu import boundedjson, userinput_stats
from slurmgpu.userfiles import UserFileRejected, read_user_file

__all__ = [
    "ACK_FILE",
    "DEFAULT_DIR_NAME",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "PROGRESS_FILE",
    "Ack",
    "Progress",
    "UserFileRejected",
    "job_dir",
    "load_ack",
    "load_progress",
    "parse_range",
    "read_ack",
    "read_progress",
]

DEFAULT_DIR_NAME = ".sgpu-elastic"
ACK_FILE = "ack.json"
PROGRESS_FILE = "progress.json"
MAX_FILE_BYTES: Final = 64 * 1024
# Both files are an object holding at most one more object (the throughput table).
MAX_DEPTH: Final = 8
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
    """The JSON object in the user's file ``path``; None when there is no file;
    :class:`UserFileRejected` when it is not a small regular file holding a JSON object
    nested at most :data:`MAX_DEPTH` deep (:mod:`slurmgpu.userfiles`,
    :mod:`slurmgpu.boundedjson`)."""
    data = read_user_file(path, max_bytes=MAX_FILE_BYTES)
    if data is None:
        return None
    try:
        value = boundedjson.loads(data, max_depth=MAX_DEPTH, max_bytes=MAX_FILE_BYTES)
    except boundedjson.JsonRejected as exc:
        raise UserFileRejected(exc.cause) from None
    if not isinstance(value, dict):
        raise UserFileRejected("not a JSON object")
    return value


def _check_record(raw: dict[str, Any], job_id: int) -> None:
    if raw.get("version") != 1:
        raise UserFileRejected("not a version-1 record")
    if _int(raw.get("job_id")) != job_id:
        raise UserFileRejected("written for another job")


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


def load_ack(state_dir: str | Path, job_id: int) -> Ack | None:
    """The job's ``ack.json``; None when absent; :class:`UserFileRejected` when it is
    there but unusable (see :func:`read_ack`)."""
    raw = _read_json(job_dir(state_dir, job_id) / ACK_FILE)
    if raw is None:
        return None
    _check_record(raw, job_id)
    acks, restarts = _int(raw.get("acks")), _int(raw.get("restart_count"))
    at = raw.get("at")
    if acks is None or acks < 0 or restarts is None or not isinstance(at, int | float):
        raise UserFileRejected("fields of the wrong type")
    if isinstance(at, bool) or not math.isfinite(at):
        raise UserFileRejected("fields of the wrong type")
    return Ack(job_id, acks, restarts, _int(raw.get("step")), _int(raw.get("gpus")), float(at))


def read_ack(state_dir: str | Path, job_id: int) -> Ack | None:
    """The job's ``ack.json``, or None when absent, unusable or for another job; never
    raises. An unusable one is logged once per job and cause, and counted
    (:mod:`slurmgpu.userinput_stats`, source ``ack``)."""
    try:
        return load_ack(state_dir, job_id)
    except UserFileRejected as exc:
        userinput_stats.rejected(
            "ack",
            job_id,
            exc.cause,
            what=f"{ACK_FILE} in {job_dir(state_dir, job_id)}",
            consequence="treated as no acknowledgement (a resize waiting on it is aborted)",
        )
        return None


@dataclass(frozen=True, slots=True)
class Progress:
    """Measured throughput (units per second, e.g. samples/s) by GPU count."""

    job_id: int
    throughput: dict[int, float]
    step: int | None = None


def load_progress(state_dir: str | Path, job_id: int) -> Progress | None:
    """The job's ``progress.json``; None when absent; :class:`UserFileRejected` when it
    is there but unusable. Entries of the throughput table that are not a GPU count and a
    finite rate >= 0 are left out (the rest is used); at most 64 entries are read."""
    raw = _read_json(job_dir(state_dir, job_id) / PROGRESS_FILE)
    if raw is None:
        return None
    _check_record(raw, job_id)
    table = raw.get("throughput")
    if not isinstance(table, dict):
        raise UserFileRejected("fields of the wrong type")
    out: dict[int, float] = {}
    for key, value in list(table.items())[:64]:
        ok = (
            isinstance(key, str)
            and key.isascii()
            and key.isdigit()
            and len(key) <= 6
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        )
        if ok and math.isfinite(value) and value >= 0:
            out[int(key)] = float(value)
    return Progress(job_id, out, _int(raw.get("step")))


def read_progress(state_dir: str | Path, job_id: int) -> Progress | None:
    """The job's ``progress.json``, or None when absent or unusable; never raises. An
    unusable one is logged once per job and cause, and counted (source ``progress``)."""
    try:
        return load_progress(state_dir, job_id)
    except UserFileRejected as exc:
        userinput_stats.rejected(
            "progress",
            job_id,
            exc.cause,
            what=f"{PROGRESS_FILE} in {job_dir(state_dir, job_id)}",
            consequence="no throughput is read from it",
        )
        return None

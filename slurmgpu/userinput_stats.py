"""Input from users that the daemon refused, logged once per job and counted.

A job's user writes its comment (``sgpu:`` tokens) and, for a malleable job, the files
in its state directory (``ack.json``, ``progress.json``). When one of them is refused
(a FIFO, a link, a file too large or nested too deep, a malformed token), the job is
treated as having said nothing there, and :func:`rejected` is told: it counts the
refusal by ``source`` for ``/metrics`` (``sgpu_user_input_rejected_total``, every read
refused: a file that stays bad adds one per cycle) and logs one warning per job, source
and cause while the process lives (not one per cycle). Counted for the whole process,
like :mod:`slurmgpu.slurm.decode_stats`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Final

__all__ = ["MAX_REMEMBERED", "SOURCES", "counts", "forget_logged", "rejected"]

log = logging.getLogger("slurmgpu.userinput")

# Always exported (at 0 until the first refusal), so rate() works from the start.
SOURCES: Final = ("ack", "progress", "comment")
# (source, job, cause) already logged; the oldest are forgotten past this many, so a
# flood of bad jobs costs bounded memory (a forgotten one may be logged once more).
MAX_REMEMBERED: Final = 10_000

_lock = threading.Lock()
_counts: dict[str, int] = {}
_logged: OrderedDict[tuple[str, int, str], None] = OrderedDict()


def rejected(source: str, job_id: int, cause: str, *, what: str, consequence: str) -> bool:
    """Count a refusal of job ``job_id``'s ``source`` (``what`` names it in the log line,
    ``cause`` says what was wrong, ``consequence`` what the daemon does instead).
    Returns whether it was logged (the first time for this job, source and cause)."""
    key = (source, int(job_id), cause)
    with _lock:
        _counts[source] = _counts.get(source, 0) + 1
        first = key not in _logged
        if first:
            _logged[key] = None
            while len(_logged) > MAX_REMEMBERED:
                _logged.popitem(last=False)
    if first:
        log.warning("job %d: %s ignored: %s; %s", job_id, what, cause, consequence)
    return first


def counts() -> dict[str, int]:
    """Refusals since the process started, by source (every one of :data:`SOURCES`)."""
    with _lock:
        return {source: _counts.get(source, 0) for source in (*SOURCES, *_counts)}


def forget_logged() -> None:
    """Forget which refusals were logged (the counts stay): the next of each is logged
    again. The daemon never needs it; tests do, so each starts afresh."""
    with _lock:
        _logged.clear()

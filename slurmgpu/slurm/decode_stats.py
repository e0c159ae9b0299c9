"""What the Slurm output decoders left out, counted for the whole process.

The decoders (:mod:`slurmgpu.slurm.jsonformat`, :mod:`slurmgpu.slurm.sacct`) skip a bad
record or a value that does not parse rather than lose a whole listing; each time they
log a warning and count it here. The daemon's ``/metrics`` reads :func:`snapshot` at
scrape time (``sgpu_slurm_records_skipped``, ``sgpu_slurm_values_unparsed``,
``sgpu_slurm_data_parser``), so an admin sees a Slurm whose output slurmgpu only half
understands. An unknown data_parser version is logged once per process, not per cycle.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

__all__ = ["DecodeStats", "note_data_parser", "records_skipped", "snapshot", "values_unparsed"]

log = logging.getLogger("slurmgpu.slurm")


@dataclass(frozen=True)
class DecodeStats:
    """Counts since the process started, by listing (``squeue``, ``sinfo``, ``sacct``)."""

    records_skipped: dict[str, int] = field(default_factory=dict)
    values_unparsed: dict[str, int] = field(default_factory=dict)
    # data_parser version → True when slurmgpu knows it, for every version seen.
    data_parsers: dict[str, bool] = field(default_factory=dict)


_lock = threading.Lock()
_skipped: dict[str, int] = {}
_unparsed: dict[str, int] = {}
_versions: dict[str, bool] = {}


def records_skipped(listing: str, n: int) -> None:
    if n > 0:
        with _lock:
            _skipped[listing] = _skipped.get(listing, 0) + n


def values_unparsed(listing: str, n: int) -> None:
    if n > 0:
        with _lock:
            _unparsed[listing] = _unparsed.get(listing, 0) + n


def note_data_parser(version: str, known: bool, what: str) -> None:
    """Remember a data_parser version seen; warn once per process about an unknown one."""
    with _lock:
        first = version not in _versions
        _versions[version] = known
    if first and not known:
        log.warning(
            "%s: data_parser %s is not one slurmgpu was tested with; decoding what it can "
            "(fields that changed shape are skipped and counted in /metrics)",
            what,
            version,
        )


def snapshot() -> DecodeStats:
    with _lock:
        return DecodeStats(dict(_skipped), dict(_unparsed), dict(_versions))

"""Units: durations in settings (``"30s"``, ``"1h30m"``), sizes (``"10GiB"``) and Slurm time
limits (``D-HH:MM:SS``).

A leaf module: it imports nothing from slurmgpu, so settings readers, the pure policies and
the Slurm adapters can all use it without an import circle.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = [
    "MAX_DURATION",
    "SlurmValueError",
    "TimeStringError",
    "format_time_limit",
    "parse_duration",
    "parse_size_mib",
    "parse_time_limit",
]

# The longest duration any setting accepts: beyond it a value is a typo, and date
# arithmetic on it would overflow (``history_days = 1000000`` once passed ``sgpu policy
# check`` and then killed the daemon with an OverflowError).
MAX_DURATION = timedelta(days=3650)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class SlurmValueError(ValueError):
    """Base class: a Slurm string that does not parse (slurm.parse has the others)."""


class TimeStringError(SlurmValueError):
    """A time limit that is not one of Slurm's time formats."""


def _show(value: object, limit: int = 80) -> str:
    """``repr`` of a bad input, shortened so messages stay one line."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


# --------------------------------------------------------------------------- durations


def parse_duration(text: str | int | float) -> timedelta:
    """Return the timedelta of ``"30s"``, ``"5m"``, ``"1h30m"``, ``"2d"`` or a number of seconds.

    >>> parse_duration("1h30m")
    datetime.timedelta(seconds=5400)
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"{text!r} is negative")
        return _seconds(text, text)
    s = text.strip().lower()
    if not s:
        raise ValueError("empty duration")
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return _seconds(float(s), text)
    pos = 0
    total = 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos and s[pos : m.start()].strip():
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos == 0 or s[pos:].strip():
        raise ValueError(f'{text!r} is not a duration like "30s", "5m" or "1h30m"')
    return _seconds(total, text)


def _seconds(seconds: float, text: object) -> timedelta:
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{str(text)[:40]!r} is too long a duration") from None


# --------------------------------------------------------------------------- sizes

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgtp])(?:i?b)?|(b))?", re.IGNORECASE)
_MIB_PER_UNIT = {"k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0**2, "p": 1024.0**3}


def parse_size_mib(text: str) -> int:
    """Return MiB for ``"10GiB"``, ``"512MiB"``, ``"8G"``, ``"1.5T"`` or a bare number of MiB.

    Units are binary whatever the spelling (``G`` = ``GB`` = ``GiB`` = 1024 MiB), as in
    Slurm's ``--mem``; a bare number is MiB, also as in Slurm.

    >>> parse_size_mib("10GiB"), parse_size_mib("512MiB"), parse_size_mib("8G")
    (10240, 512, 8192)
    """
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f'{text!r} is not a size like "10GiB", "512MiB" or "8G"')
    number, unit, byte_unit = float(m.group(1)), m.group(2), m.group(3)
    if byte_unit:
        return round(number / (1024 * 1024))
    return round(number * (_MIB_PER_UNIT[unit.lower()] if unit else 1.0))


# --------------------------------------------------------------------------- time limits

_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "INFINITY"})
_TIME_RE = re.compile(r"(?:(\d{1,12})-)?(\d{1,15})(?::(\d{1,15}))?(?::(\d{1,15}))?")


def parse_time_limit(value: str | int | None) -> timedelta | None:
    """Parse a Slurm time limit; ``None`` means no limit.

    Accepts ``UNLIMITED`` / ``INFINITE`` (and ``None``), an integer number of minutes,
    and the strings ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS`` (as sbatch ``--time`` does).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise TimeStringError(f"invalid time limit {_show(value)}")
    if isinstance(value, int):
        if value < 0:
            raise TimeStringError(f"invalid time limit {_show(value)}: negative")
        try:
            return timedelta(minutes=value)
        except OverflowError:
            raise TimeStringError(f"invalid time limit {_show(value)}: too large") from None
    if not isinstance(value, str):
        raise TimeStringError(f"invalid time limit {_show(value)}: not a string")
    text = value.strip()
    if text.upper() in _UNLIMITED:
        return None
    m = _TIME_RE.fullmatch(text)
    if not m:
        raise TimeStringError(f"invalid time limit {_show(value)}")
    days_s, a, b, c = m.groups()
    x, y, z = int(a), (int(b) if b is not None else None), (int(c) if c is not None else None)
    if days_s is not None:
        # D-HH, D-HH:MM, D-HH:MM:SS
        days = int(days_s)
        hours, minutes, seconds = x, (y or 0), (z or 0)
    elif z is not None:  # HH:MM:SS
        days, hours, minutes, seconds = 0, x, y or 0, z
    elif y is not None:  # MM:SS
        days, hours, minutes, seconds = 0, 0, x, y
    else:  # MM
        days, hours, minutes, seconds = 0, 0, x, 0
    try:
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:
        raise TimeStringError(f"invalid time limit {_show(value)}: too large") from None


def format_time_limit(limit: timedelta | None) -> str:
    """Format a limit the way Slurm prints and accepts it: ``D-HH:MM:SS`` / ``HH:MM:SS``.

    ``None`` gives ``UNLIMITED``. Fractions of a second are rounded up (a limit is never
    shortened). ``parse_time_limit(format_time_limit(x)) == x`` for whole seconds.
    """
    if limit is None:
        return "UNLIMITED"
    if not isinstance(limit, timedelta):
        raise TimeStringError(f"invalid time limit {_show(limit)}: not a timedelta")
    if limit < timedelta(0):
        raise TimeStringError(f"invalid time limit {_show(limit)}: negative")
    total = limit.days * 86400 + limit.seconds + (1 if limit.microseconds else 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}"

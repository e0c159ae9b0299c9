"""Reading one settings table: ConfigError and the typed, validated TableReader.

A leaf module (it imports only slurmgpu.units): config.py, policy/settings.py and
notify/settings.py all read their tables with it, and none of them has to import another.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from slurmgpu.units import MAX_DURATION, parse_duration

__all__ = ["MAX_INTEGER", "ConfigError", "TableReader"]

# The largest integer any setting accepts: beyond it a value is a typo.
MAX_INTEGER = 2**31 - 1


class ConfigError(Exception):
    """A configuration problem, phrased as one line a user can act on."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        line: int | None = None,
        table: str | None = None,
        key: str | None = None,
    ) -> None:
        if len(message) > 300:  # a pasted megabyte must still give one readable line
            message = message[:297] + "..."
        self.path = path
        self.line = line
        self.reason = message
        # Where the bad key is (``table`` dotted, e.g. "policy.idle_gpu"), when one key is
        # to blame: parse_settings then drops it and reads on, to report every bad key.
        self.table = table
        if key is not None or not hasattr(self, "key"):  # a subclass may have set its own
            self.key = key
        self.others: tuple[ConfigError, ...] = ()
        where = ""
        if path is not None:
            where = f" in {path}" + (f", line {line}" if line else "")
        super().__init__(f"config error{where}: {message}")

    def __str__(self) -> str:
        """One line per bad key: this one first, then the others found in the same file."""
        first = super().__str__()
        return "\n".join([first, *(ConfigError.__str__(o) for o in self.others)])


class TableReader:
    """Typed, validated reads of one TOML table's keys.

    Keys are popped as they are read, so whatever is left at ``finish()`` is an unknown key
    (a misspelt setting must not be silently ignored). Subclasses say how a bad key is
    reported (``fail``), so each section's errors name it the way its users write it.
    """

    duration_example = '"30s"'

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw: dict[str, Any] = dict(raw)

    def fail(self, key: str, message: str) -> Exception:
        """The exception that reports ``key`` as bad (raised by the caller)."""
        raise NotImplementedError

    def boolean(self, key: str, default: bool) -> bool:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, not {value!r}")
        return value

    def integer(
        self, key: str, default: int, *, minimum: int = 0, maximum: int = MAX_INTEGER
    ) -> int:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}, not {value!r}")
        if value > maximum:
            raise self.fail(key, f"must be at most {maximum}, not {value!r}")
        return value

    def duration(
        self,
        key: str,
        default: timedelta,
        *,
        minimum: timedelta | None = None,
        maximum: timedelta = MAX_DURATION,
    ) -> timedelta:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        try:
            d = parse_duration(value)
        except (ValueError, TypeError, AttributeError):
            raise self.fail(
                key, f"must be a duration like {self.duration_example}, not {value!r}"
            ) from None
        if minimum is not None and d < minimum:
            raise self.fail(key, f"must be at least {minimum.total_seconds():g}s")
        if d > maximum:
            raise self.fail(key, f"must be at most {maximum.days}d, not {value!r}")
        return d

    def finish(self) -> None:
        if self.raw:
            key = sorted(map(str, self.raw))[0]
            raise self.fail(key, "is not a known setting (check the spelling)")

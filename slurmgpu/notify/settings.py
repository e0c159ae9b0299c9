"""The ``[notify]`` settings: SMTP relay, addresses, rate limit, dry run.

Example (every key is optional; these are the defaults except where marked)::

    [notify]
    enabled = false
    smtp_host = "localhost"
    smtp_port = 25
    starttls = false
    username = "slurmgpu"                       # example; default: no SMTP AUTH
    password_file = "/etc/slurmgpu/smtp.pass"   # example; 0600, one line
    sender = "slurmgpu@localhost"
    domain = "example.edu"                      # example; mail goes to {user}@{domain}
    address_map_file = "/etc/slurmgpu/addresses" # example; "user: address" lines, wins over domain
    admin_recipients = ["hpc-admins@example.edu"]  # example; who gets admin reports
    contact = "hpc-help@example.edu"            # example; who users ask for an exemption
    min_interval = "7d"                         # at most one email per (user, alert) per window

    [notify.alert_intervals]                    # example; per-alert windows, "0s" = no limit
    idle_gpu_cancel = "0s"
    timeout = "10s"
    dry_run = false                             # log what would be sent, send nothing
    template_dir = "/etc/slurmgpu/templates"    # example; site templates win over ours

The password never appears in the configuration itself: only the path of a file that only
its owner can read. Files are read when the ``Mailer`` starts, not when settings are parsed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from email.utils import parseaddr
from pathlib import Path
from typing import Any

from slurmgpu.settings_table import ConfigError, TableReader
from slurmgpu.units import parse_duration

_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_ALERT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_DOMAIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")


class NotifyConfigError(ConfigError):
    """A ``[notify]`` key is unknown or has a bad value; ``key`` names it.

    >>> str(NotifyConfigError("smtp_port", "must be an integer from 1 to 65535, not 'x'"))
    "config error: notify.smtp_port must be an integer from 1 to 65535, not 'x'"
    """

    def __init__(self, key: str, message: str, *, where: str | Path | None = None) -> None:
        self.key = key
        self.message = message
        self.where = where
        subject = f"notify.{key}" if key else "[notify]"
        super().__init__(f"{subject} {message}", path=Path(where) if where else None)


def valid_address(text: str) -> bool:
    """Return whether ``text`` is one usable address (``a@b`` or ``Name <a@b>``), no newlines."""
    if not text or "\r" in text or "\n" in text:
        return False
    _name, addr = parseaddr(text)
    local, at, domain = addr.rpartition("@")
    return bool(at and local and domain and not any(c.isspace() for c in addr))


@dataclass(frozen=True, slots=True)
class NotifySettings:
    """How slurmgpu emails users and admins.

    >>> NotifySettings().enabled
    False
    >>> NotifySettings.from_mapping({"enabled": True, "domain": "example.edu"}).min_interval
    datetime.timedelta(days=7)
    """

    enabled: bool = False
    smtp_host: str = "localhost"
    smtp_port: int = 25
    starttls: bool = False
    username: str | None = None
    password_file: Path | None = None
    sender: str = "slurmgpu@localhost"
    domain: str | None = None
    address_map_file: Path | None = None
    admin_recipients: tuple[str, ...] = ()
    contact: str = ""
    min_interval: timedelta = timedelta(days=7)
    alert_intervals: tuple[tuple[str, timedelta], ...] = ()  # (alert, window) overrides
    timeout: timedelta = timedelta(seconds=10)
    dry_run: bool = False
    template_dir: Path | None = None

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str | Path | None = None) -> NotifySettings:
        """Return settings from the ``[notify]`` table, or raise NotifyConfigError naming a key.

        ``where`` (the config file) only goes into error messages.
        """
        reader = _Reader(d, where)
        settings = cls(
            enabled=reader.boolean("enabled", False),
            smtp_host=reader.string("smtp_host", "localhost"),
            smtp_port=reader.port("smtp_port", 25),
            starttls=reader.boolean("starttls", False),
            username=reader.optional_string("username"),
            password_file=reader.path("password_file"),
            sender=reader.address("sender", "slurmgpu@localhost"),
            domain=reader.domain("domain"),
            address_map_file=reader.path("address_map_file"),
            admin_recipients=reader.addresses("admin_recipients"),
            contact=reader.string("contact", "", allow_empty=True),
            min_interval=reader.duration("min_interval", timedelta(days=7)),
            alert_intervals=reader.intervals("alert_intervals"),
            timeout=reader.duration("timeout", timedelta(seconds=10), minimum=timedelta(seconds=1)),
            dry_run=reader.boolean("dry_run", False),
            template_dir=reader.path("template_dir"),
        )
        reader.finish()
        settings.check(where)
        return settings

    def interval_for(self, alert: str) -> timedelta:
        """Return the rate-limit window of ``alert``: its override, else ``min_interval``."""
        for name, interval in self.alert_intervals:
            if name == alert:
                return interval
        return self.min_interval

    def check(self, where: str | Path | None = None) -> None:
        """Raise NotifyConfigError when keys that depend on each other disagree."""
        if self.username is not None and self.password_file is None:
            raise NotifyConfigError(
                "password_file", "must be set when username is set", where=where
            )
        if self.password_file is not None and self.username is None:
            raise NotifyConfigError(
                "username", "must be set when password_file is set", where=where
            )
        if self.username is not None and not self.starttls and self.smtp_host not in _LOCAL_HOSTS:
            raise NotifyConfigError(
                "starttls",
                f"must be true to log in to {self.smtp_host} (the password would cross the "
                "network in clear)",
                where=where,
            )
        if self.enabled and self.domain is None and self.address_map_file is None:
            raise NotifyConfigError(
                "domain",
                'must be set (mail goes to "{user}@{domain}") or address_map_file given',
                where=where,
            )


class _Reader(TableReader):
    """Reads the ``[notify]`` table, turning bad values into NotifyConfigError."""

    duration_example = '"7d" or "10s"'

    def __init__(self, d: Mapping[str, Any], where: str | Path | None) -> None:
        if not isinstance(d, Mapping):
            raise NotifyConfigError("", "must be a table", where=where)
        super().__init__(d)
        self.where = where

    def fail(self, key: str, message: str) -> NotifyConfigError:
        return NotifyConfigError(key, message, where=self.where)

    _fail = fail

    def string(self, key: str, default: str, *, allow_empty: bool = False) -> str:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise self._fail(key, f"must be a one-line string, not {value!r}")
        if not value.strip() and not allow_empty:
            raise self._fail(key, "must not be empty")
        return value.strip()

    def optional_string(self, key: str) -> str | None:
        return self.string(key, "") or None if key in self.raw else None

    def path(self, key: str) -> Path | None:
        value = self.optional_string(key)
        return Path(value) if value else None

    def port(self, key: str, default: int) -> int:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
            raise self._fail(key, f"must be an integer from 1 to 65535, not {value!r}")
        return value

    def address(self, key: str, default: str) -> str:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, str) or not valid_address(value.strip()):
            raise self._fail(key, f'must be an address like "slurmgpu@example.edu", not {value!r}')
        return value.strip()

    def addresses(self, key: str) -> tuple[str, ...]:
        if key not in self.raw:
            return ()
        value = self.raw.pop(key)
        if not isinstance(value, list):
            raise self._fail(key, f'must be a list like ["hpc@example.edu"], not {value!r}')
        for item in value:
            if not isinstance(item, str) or not valid_address(item.strip()):
                raise self._fail(key, f"has {item!r}, which is not an email address")
        return tuple(item.strip() for item in value)

    def domain(self, key: str) -> str | None:
        value = self.optional_string(key)
        if value is not None and not _DOMAIN.fullmatch(value):
            raise self._fail(key, f'must be a mail domain like "example.edu", not {value!r}')
        return value

    def intervals(self, key: str) -> tuple[tuple[str, timedelta], ...]:
        if key not in self.raw:
            return ()
        value = self.raw.pop(key)
        if not isinstance(value, Mapping):
            raise self._fail(
                key, f'must be a table like {{ idle_gpu_cancel = "0s" }}, not {value!r}'
            )
        out: list[tuple[str, timedelta]] = []
        for alert, text in value.items():
            if not isinstance(alert, str) or not _ALERT.fullmatch(alert):
                raise self._fail(f"{key}.{alert}", "is not an alert name")
            try:
                out.append((alert, parse_duration(text)))
            except (ValueError, TypeError, AttributeError):
                raise self._fail(
                    f"{key}.{alert}", f'must be a duration like "7d" or "0s", not {text!r}'
                ) from None
        return tuple(out)

    def finish(self) -> None:
        if "password" in self.raw:
            raise self._fail(
                "password",
                "is not read from the config: put it in a file only its owner can read "
                "(chmod 600) and set password_file",
            )
        super().finish()

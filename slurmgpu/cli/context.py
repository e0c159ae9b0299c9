"""What every ``sgpu`` command shares: settings, store and Slurm access, one-line errors.

Exit codes: 0 success; 1 other error; 2 usage error; 3 configuration error;
4 database error; 5 Slurm unavailable or refused the request; 6 the database is damaged
(corrupt, or not a database file): restore it from a backup, restarting does not help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from slurmgpu.config import ConfigError, Settings, load_settings
from slurmgpu.slurm.client import SlurmClient, SlurmError
from slurmgpu.store import JobStore, StoreDamagedError, StoreError, open_store
from slurmgpu.units import parse_duration

EXIT_CONFIG = 3
EXIT_STORE = 4
EXIT_SLURM = 5
EXIT_DAMAGED = 6


class SgpuError(click.ClickException):
    """A one-line error; subclasses carry the documented exit codes."""

    def show(self, file: Any = None) -> None:
        click.echo(f"sgpu: {self.format_message()}", err=True)


class UsageError(SgpuError):
    exit_code = 2


class ConfigExit(SgpuError):
    exit_code = EXIT_CONFIG


class StoreExit(SgpuError):
    exit_code = EXIT_STORE


class SlurmExit(SgpuError):
    exit_code = EXIT_SLURM


class DamagedExit(SgpuError):
    exit_code = EXIT_DAMAGED


_BY_CODE: dict[int, type[SgpuError]] = {
    2: UsageError,
    EXIT_CONFIG: ConfigExit,
    EXIT_STORE: StoreExit,
    EXIT_SLURM: SlurmExit,
    EXIT_DAMAGED: DamagedExit,
}


def fail(message: str, exit_code: int = 1) -> NoReturn:
    """Stop the command with one ``sgpu: …`` line on stderr and ``exit_code``."""
    raise _BY_CODE.get(exit_code, SgpuError)(message)


@dataclass
class AppContext:
    """What every command gets: settings and the ability to open the store and Slurm."""

    config_path: Path | None
    db_override: str | None
    _settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            try:
                s = load_settings(self.config_path)
            except ConfigError as exc:
                fail(str(exc), EXIT_CONFIG)
            if self.db_override:
                s = s.with_database(self.db_override)
            self._settings = s
        return self._settings

    def store(self, *, migrate: bool = True, check: bool = False) -> JobStore:
        """The store, migrated when ``migrate``; ``check``: its integrity checked first."""
        try:
            return open_store(
                self.settings.daemon.database,
                self.settings.slurm.cluster,
                migrate=migrate,
                check=check,
            )
        except StoreError as exc:
            fail(str(exc), store_exit_code(exc))

    def slurm(self) -> SlurmClient:
        from slurmgpu.slurm.backend import select_backend

        try:
            return select_backend(
                prefer=self.settings.slurm.backend,
                timeout_s=self.settings.slurm.command_timeout.total_seconds(),
            )
        except SlurmError as exc:
            fail(str(exc), EXIT_SLURM)


def store_exit_code(exc: StoreError) -> int:
    """6 for a damaged database (restore it), 4 for any other database error."""
    return EXIT_DAMAGED if isinstance(exc, StoreDamagedError) else EXIT_STORE


pass_app = click.make_pass_decorator(AppContext)


def duration_option(value: str) -> float:
    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None

"""``sgpu``: the command line. Thin: parse options, call the library, render.

Exit codes: 0 success; 1 other error; 2 usage error; 3 configuration error;
4 database error; 5 Slurm unavailable or refused the request.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import click

from slurmgpu import __version__
from slurmgpu.cli.context import AppContext


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        stream=sys.stderr,
    )


# Command name -> "module:attribute". Imported when that command runs (or for --help), so
# `sgpu report` does not import the daemon, the agent and the simulator first (~1 s of
# the report's 5 s budget on a loaded node).
COMMANDS = {
    "actions": "slurmgpu.cli.actions:actions",
    "advice": "slurmgpu.cli.advice:advice",
    "agent": "slurmgpu.cli.agent:agent",
    "policy": "slurmgpu.cli.policy:policy",
    "daemon": "slurmgpu.cli.daemon:daemon",
    "submit": "slurmgpu.cli.submit:submit",
    "launch": "slurmgpu.cli.launch:launch",
    "jobs": "slurmgpu.cli.jobs:jobs",
    "db": "slurmgpu.cli.db:db",
    "eff": "slurmgpu.cli.eff:eff",
    "report": "slurmgpu.cli.report:report",
    "resizes": "slurmgpu.cli.resizes:resizes",
    "fakeload": "slurmgpu.cli.fakeload:fakeload",
    "node-token": "slurmgpu.cli.token:node_token_command",
    "cluster": "slurmgpu.cli.cluster:cluster",
    "simulate": "slurmgpu.cli.simulate:simulate_command",
}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (see :data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module, attribute = COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="sgpu", message="%(prog)s %(version)s")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="SGPU_CONFIG",
    help="TOML config file (default /etc/slurmgpu/config.toml if present).",
)
@click.option(
    "--db", "db_override", metavar="URL", help="SQLAlchemy database URL (overrides the config)."
)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.pass_context
def main(
    ctx: click.Context, config_path: Path | None, db_override: str | None, verbose: int, quiet: bool
) -> None:
    """slurmgpu: make Slurm GPU clusters waste less."""
    _setup_logging(verbose, quiet)
    ctx.obj = AppContext(config_path=config_path, db_override=db_override)

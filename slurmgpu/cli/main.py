"""``sgpu``: the command line. Thin: parse options, call the library, render.

Exit codes: 0 success; 1 other error; 2 usage error; 3 configuration error;
4 database error; 5 Slurm unavailable or refused the request; 6 the database is damaged
(corrupt, or not a database file): restore it from a backup.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from slurmgpu import __version__
from slurmgpu.cli import logs
from slurmgpu.cli.context import AppContext

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
    "whatif": "slurmgpu.cli.whatif:whatif_command",
    "monitoring": "slurmgpu.cli.monitoring:monitoring",
}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (see :data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module, attribute = COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attribute)
            from slurmgpu.cli.examples import attach

            attach(command, cmd_name)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # A database that breaks mid-command (a corrupt page, a table another program
            # dropped, a full disk) is one line naming the cause, like one that cannot be
            # opened: exit 4 ("may be corrupt: run `sgpu db check`"), 6 not a database.
            if type(exc).__module__.startswith("sqlalchemy"):
                from slurmgpu.cli.context import fail, store_exit_code
                from slurmgpu.store.database import store_error

                app = ctx.find_object(AppContext)
                url = app.settings.daemon.database if app is not None else "sqlite://"
                error = store_error(url, exc)
                fail(str(error), store_exit_code(error))
            raise


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\nExamples:\n  sgpu submit --rightsize --gres=gpu:1 train.sh\n  sgpu jobs --active\n"
    "  sgpu actions --taken\n\nEach command has --help, e.g. sgpu submit --help.",
)
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
@click.option(
    "-v", "--verbose", count=True, help="Libraries' log lines too (-vv: everything, debug)."
)
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default="text",
    envvar="SGPU_LOG_FORMAT",
    show_default=True,
    help="Log lines as text or one JSON object each (journald, Loki).",
)
@click.pass_context
def main(
    ctx: click.Context,
    config_path: Path | None,
    db_override: str | None,
    verbose: int,
    quiet: bool,
    log_format: str,
) -> None:
    """slurmgpu: make Slurm GPU clusters waste less."""
    logs.configure(verbose, quiet, log_format)
    ctx.obj = AppContext(config_path=config_path, db_override=db_override)

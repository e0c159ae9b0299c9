"""``sgpu``: the command line. Thin: parse options, call the library, render.

Exit codes: 0 success; 1 other error; 2 usage error; 3 configuration error;
4 database error; 5 Slurm unavailable or refused the request.
"""

from __future__ import annotations

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


def _register() -> None:
    from slurmgpu.cli.actions import actions
    from slurmgpu.cli.advice import advice
    from slurmgpu.cli.agent import agent
    from slurmgpu.cli.daemon import daemon
    from slurmgpu.cli.db import db
    from slurmgpu.cli.eff import eff
    from slurmgpu.cli.fakeload import fakeload
    from slurmgpu.cli.jobs import jobs
    from slurmgpu.cli.policy import policy
    from slurmgpu.cli.report import report
    from slurmgpu.cli.resizes import resizes
    from slurmgpu.cli.submit import submit
    from slurmgpu.cli.token import node_token_command

    main.add_command(actions)
    main.add_command(advice)
    main.add_command(agent)
    main.add_command(policy)
    main.add_command(daemon)
    main.add_command(submit)
    main.add_command(jobs)
    main.add_command(db)
    main.add_command(eff)
    main.add_command(report)
    main.add_command(resizes)
    main.add_command(fakeload)
    main.add_command(node_token_command)
    from slurmgpu.cli.cluster import cluster

    main.add_command(cluster)
    from slurmgpu.cli.simulate import simulate_command

    main.add_command(simulate_command)


_register()

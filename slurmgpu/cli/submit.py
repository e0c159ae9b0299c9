"""``sgpu submit``: a faithful sbatch wrapper that records what slurmgpu needs.

Every argument after ``submit`` goes to sbatch unchanged, as an argument list (never
through a shell). sbatch runs as the caller, so slurmgpu never gains privileges here.
"""

from __future__ import annotations

import getpass
import os
from datetime import UTC, datetime

import click

from slurmgpu.cli.context import EXIT_SLURM, AppContext, fail, pass_app
from slurmgpu.slurm.client import SlurmCommandError, SlurmError
from slurmgpu.store import StoreError, open_store


def _wants_parsable(args: tuple[str, ...]) -> bool:
    return any(a == "--parsable" for a in args)


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    add_help_option=False,
)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@pass_app
def submit(app: AppContext, sbatch_args: tuple[str, ...]) -> None:
    """Submit a batch job: ``sgpu submit [sbatch options] script [args]``.

    Prints ``Submitted batch job N`` like sbatch (just ``N`` with --parsable).
    """
    if sbatch_args in {("-h",), ("--help",)}:
        click.echo(click.get_current_context().get_help())
        return
    # sbatch reads the script from stdin when none is named; it inherits ours unchanged.
    slurm = app.slurm()
    try:
        job_id = slurm.submit(list(sbatch_args), cwd=os.getcwd())
    except SlurmCommandError as exc:
        fail(f"sbatch refused the job: {exc}", EXIT_SLURM)
    except SlurmError as exc:
        fail(str(exc), EXIT_SLURM)
    click.echo(str(job_id) if _wants_parsable(sbatch_args) else f"Submitted batch job {job_id}")
    _record(app, job_id, sbatch_args)


def _record(app: AppContext, job_id: int, args: tuple[str, ...]) -> None:
    """Store the submission when the database is reachable; the job runs either way."""
    settings = app.settings
    try:
        store = open_store(settings.daemon.database, settings.slurm.cluster, migrate=False)
        store.record_submission(
            job_id,
            at=datetime.now(UTC),
            uid=os.getuid(),
            user=getpass.getuser(),
            cwd=os.getcwd(),
            argv=list(args),
        )
    except StoreError as exc:
        click.echo(f"sgpu: note: job {job_id} submitted but not recorded: {exc}", err=True)

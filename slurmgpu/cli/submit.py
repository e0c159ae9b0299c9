"""``sgpu submit``: a faithful sbatch wrapper that records what slurmgpu needs.

Every argument after ``submit`` goes to sbatch unchanged, as an argument list (never
through a shell). sbatch runs as the caller, so slurmgpu never gains privileges here.

slurmgpu's own options (not sbatch's) are taken out before the batch script:

- ``--rightsize``: opt this job in to rightsizing (adds the token ``sgpu:rightsize`` to
  the job's comment, which job_submit.lua and the daemon both read).
- ``--shareable``: the job may share its GPU with other light jobs (token
  ``sgpu:shareable``; the co-location policy decides, see docs/policies.md).
- ``--gpu-mem SIZE`` (``8GiB``, ``512MiB``): the most GPU memory the job will use (token
  ``sgpu:gpu-mem=MiB``), which co-location needs to know before packing a job.
"""

from __future__ import annotations

import getpass
import os
from datetime import UTC, datetime

import click

from slurmgpu.cli.context import EXIT_SLURM, AppContext, fail, pass_app
from slurmgpu.policy.colocate import GPU_MEM_MARK, SHAREABLE_MARK
from slurmgpu.slurm.client import SlurmCommandError, SlurmError
from slurmgpu.store import StoreError, open_store

RIGHTSIZE_OPT_IN = "sgpu:rightsize"
SGPU_FLAGS = frozenset({"--rightsize", "--shareable"})
GPU_MEM_OPTION = "--gpu-mem"


def take_gpu_mem(args: tuple[str, ...]) -> tuple[int | None, tuple[str, ...]]:
    """Return (MiB of ``--gpu-mem SIZE`` / ``--gpu-mem=SIZE`` before the script, the rest).

    Raises ValueError for a missing or malformed size.
    """
    from slurmgpu.telemetry.fakeload import parse_size_mib

    mib: int | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == GPU_MEM_OPTION or arg.startswith(GPU_MEM_OPTION + "="):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise ValueError("--gpu-mem needs a size like 8GiB")
            mib = parse_size_mib(value)
        else:
            rest.append(arg)
            if not arg.startswith("-") and os.path.isfile(arg):
                rest.extend(args[i + 1 :])
                break
        i += 1
    return mib, tuple(rest)


def _wants_parsable(args: tuple[str, ...]) -> bool:
    return any(a == "--parsable" for a in args)


def split_sgpu_options(args: tuple[str, ...]) -> tuple[set[str], list[str]]:
    """Return (slurmgpu flags, sbatch arguments): our flags count only before the script.

    The script is the first argument naming an existing file; everything after it belongs
    to the script, so a script's own ``--rightsize`` argument is left alone.
    """
    flags: set[str] = set()
    rest: list[str] = []
    for i, arg in enumerate(args):
        if arg in SGPU_FLAGS:
            flags.add(arg)
            continue
        rest.append(arg)
        if not arg.startswith("-") and os.path.isfile(arg):
            rest.extend(args[i + 1 :])
            break
    return flags, rest


def add_comment_token(args: list[str], token: str) -> list[str]:
    """Append ``token`` to the job's ``--comment`` (or add one), before the script."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("--comment="):
            out[i] = f"{arg} {token}"
            return out
        if arg == "--comment" and i + 1 < len(out):
            out[i + 1] = f"{out[i + 1]} {token}"
            return out
        if not arg.startswith("-") and os.path.isfile(arg):
            break
    return [f"--comment={token}", *out]


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
    try:
        gpu_mem_mib, passed = take_gpu_mem(sbatch_args)
    except ValueError as exc:
        fail(f"--gpu-mem: {exc}", 2)
    flags, args = split_sgpu_options(passed)
    if "--rightsize" in flags:
        args = add_comment_token(args, RIGHTSIZE_OPT_IN)
    if "--shareable" in flags:
        args = add_comment_token(args, SHAREABLE_MARK)
    if gpu_mem_mib is not None:
        args = add_comment_token(args, f"{GPU_MEM_MARK}{gpu_mem_mib}")
    # sbatch reads the script from stdin when none is named; it inherits ours unchanged.
    slurm = app.slurm()
    try:
        job_id = slurm.submit(args, cwd=os.getcwd())
    except SlurmCommandError as exc:
        fail(f"sbatch refused the job: {exc}", EXIT_SLURM)
    except SlurmError as exc:
        fail(str(exc), EXIT_SLURM)
    click.echo(str(job_id) if _wants_parsable(sbatch_args) else f"Submitted batch job {job_id}")
    hints: dict[str, object] = {}
    if "--rightsize" in flags:
        hints["rightsize"] = True
    if "--shareable" in flags:
        hints["shareable"] = True
    if gpu_mem_mib is not None:
        hints["gpu_mem_mib"] = gpu_mem_mib
    _record(app, job_id, tuple(args), hints=hints or None)


def _record(
    app: AppContext, job_id: int, args: tuple[str, ...], *, hints: dict[str, object] | None
) -> None:
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
            hints=hints,
        )
    except StoreError as exc:
        click.echo(f"sgpu: note: job {job_id} submitted but not recorded: {exc}", err=True)

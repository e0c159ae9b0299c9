"""``sgpu launch -- CMD``: run a training command malleably inside a Slurm job.

Write it as the batch script's last line, with ``exec`` so that the launcher *is* the
batch shell (Slurm's time-limit signal goes to the batch shell only)::

    exec sgpu launch -- torchrun --nproc-per-node=$SLURM_GPUS_ON_NODE train.py

See :mod:`slurmgpu.elastic.launcher` for what it does with each signal.
"""

from __future__ import annotations

import click


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def launch(command: tuple[str, ...]) -> None:
    """Run COMMAND (e.g. torchrun ...) so that it survives resizes and the time limit.

    Relays the checkpoint signal to the processes that handle it, requeues the job after
    the checkpoint at the time limit, and leaves no process of COMMAND behind. Use as the
    batch script's last line: ``exec sgpu launch -- torchrun ... train.py``. The command
    sees ``SGPU_GPUS`` (GPUs on this node).
    """
    from slurmgpu.elastic.launcher import main

    args = list(command)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise click.UsageError("no command to launch (sgpu launch -- torchrun ... train.py)")
    try:
        code = main(args)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    raise SystemExit(code)

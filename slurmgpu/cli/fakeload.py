"""``sgpu fakeload``: declare fake GPU load for the simulated probe (lab cluster jobs).

Run inside a job that got fake GPUs::

    sgpu fakeload --util 80 --mem 10GiB --pattern constant --duration 60s

Exit codes: 0 the run completed its duration; 2 usage error; 1 it cannot run (no GPU in
the environment, state directory not writable); 143 stopped by SIGTERM (as scancel does),
after removing its declarations.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import click

from slurmgpu.lab.fakeload import (
    FakeloadError,
    FakeloadOutcome,
    parse_duration_s,
    run_fakeload,
)
from slurmgpu.telemetry.simgpu import default_state_dir
from slurmgpu.units import parse_size_mib

EXIT_TERMINATED = 128 + 15


class _Fail(click.ClickException):
    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"sgpu: {self.format_message()}", err=True)


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size_mib(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float | None:
    try:
        return parse_duration_s(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _devices(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise click.BadParameter(f'{value!r} is not a list of device indices like "0,1"')
    return [int(p) for p in parts]


@click.command("fakeload", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--util",
    "util_pct",
    type=click.FloatRange(0, 100),
    default=100.0,
    show_default=True,
    help="Declared GPU utilization per device, percent.",
)
@click.option(
    "--mem",
    "memory_mib",
    default="1GiB",
    show_default=True,
    callback=_size,
    help="Declared GPU memory per device (10GiB, 512MiB, 8G; a bare number is MiB).",
)
@click.option(
    "--mem-max",
    "mem_max_mib",
    default=None,
    callback=_size,
    help="Memory cap of the mem-growth pattern.",
)
@click.option(
    "--pattern",
    default="constant",
    show_default=True,
    help="constant | idle-after:60s | bursty[:10s] | mem-growth[:5m]",
)
@click.option(
    "--duration",
    "duration_s",
    default="inf",
    show_default=True,
    callback=_duration,
    help='How long to run ("60s", "1h"; "inf" until SIGTERM).',
)
@click.option(
    "--interval",
    "interval_s",
    default="5s",
    show_default=True,
    callback=_duration,
    help="How often declarations are refreshed; the probe drops them after 3 intervals.",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Declaration directory (default $SGPU_SIMGPU_DIR or /var/tmp/slurmgpu-simgpu).",
)
@click.option("--node", default=None, help="Node name (default $SLURMD_NODENAME, else host name).")
@click.option(
    "--devices",
    default=None,
    callback=_devices,
    help="Slurm device indices, e.g. 0,1 (default: from CUDA_VISIBLE_DEVICES).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bursty pattern.")
def fakeload(
    util_pct: float,
    memory_mib: int,
    mem_max_mib: int | None,
    pattern: str,
    duration_s: float | None,
    interval_s: float | None,
    state_dir: Path | None,
    node: str | None,
    devices: list[int] | None,
    seed: int,
) -> None:
    """Declare fake GPU load on this job's (simulated) GPUs for the simulated probe."""
    if interval_s is None or interval_s <= 0:
        raise click.BadParameter("must be a positive duration", param_hint="'--interval'")
    try:
        outcome = run_fakeload(
            util_pct,
            memory_mib,
            pattern,
            duration_s,
            state_dir if state_dir is not None else default_state_dir(),
            node,
            interval_s,
            devices=devices,
            mem_max_mib=mem_max_mib,
            seed=seed,
        )
    except FakeloadError as exc:
        raise _Fail(str(exc)) from None
    except OSError as exc:
        raise _Fail(f"cannot write declarations: {exc}") from None
    if outcome is FakeloadOutcome.STOPPED:
        raise SystemExit(EXIT_TERMINATED)


if __name__ == "__main__":
    fakeload(prog_name="sgpu fakeload")

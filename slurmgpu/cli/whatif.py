"""``sgpu whatif``: what would sgpu have saved on this site's own jobs?

Reads the finished GPU jobs of a window from the daemon's store (what each asked for and
what its end-of-job summary says it used), replays them through the simulator under each
policy set on the site's shape (inferred from the stored nodes, or ``--cluster``), and
prints what each set changes against plain Slurm: GPU-hours returned, mean queue wait,
mean and p99 JCT, energy, jobs touched. These are simulator figures (docs/simulator.md
"whatif"); the table says so.

Exit codes: 0 compared (or nothing to compare: one line says why); 2 bad option;
4 the store cannot be read.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cli.context import EXIT_STORE, AppContext, fail, pass_app
from slurmgpu.cli.report import parse_window
from slurmgpu.sim.policysets import known_sets
from slurmgpu.sim.run import ClusterShape
from slurmgpu.sim.whatif import DEFAULT_POLICIES, compare, site_shape
from slurmgpu.store import StoreError
from slurmgpu.store.whatif import read_window
from slurmgpu.whatif_figures import WhatifFigures, signed_duration


@click.command("whatif")
@click.option(
    "--since",
    default="30d",
    show_default=True,
    help="Start: a duration before now (30d, 12h) or a date/time (2026-03-01, UTC).",
)
@click.option("--until", default="now", show_default=True, help="End: same forms as --since.")
@click.option(
    "--policies",
    default=",".join(DEFAULT_POLICIES),
    show_default=True,
    help="Comma-separated policy sets compared with plain Slurm: " + ", ".join(known_sets()),
)
@click.option(
    "--cluster",
    "cluster_text",
    help="NODESxGPUS, or groups: 2x8,4x4 (default: the stored nodes, each at its size).",
)
@click.option("--seeds", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--json", "json_out", is_flag=True, help="Print JSON instead of a table.")
@pass_app
def whatif_command(
    app: AppContext,
    since: str,
    until: str,
    policies: str,
    cluster_text: str | None,
    seeds: int,
    json_out: bool,
) -> None:
    """What each policy set would have changed on the jobs of a window, against Slurm."""
    now = datetime.now(UTC)
    start, end = parse_window(since, until, now)
    sets = [s.strip() for s in policies.split(",") if s.strip() and s.strip() != "slurm"]
    unknown = [s for s in sets if s not in known_sets()]
    if unknown or not sets:
        known = ", ".join(known_sets())
        fail(f"unknown policy set {', '.join(unknown) or '(none)'}; known: {known}", 2)
    store = app.store(migrate=False)
    try:
        window = read_window(store.engine, store.cluster, start, end)
    except (StoreError, SQLAlchemyError) as exc:
        cause = getattr(exc, "orig", None) or exc
        fail(
            f"cannot read the store: {str(cause).splitlines()[0]} (run `sgpu db upgrade`?)",
            EXIT_STORE,
        )
    span = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    runs = window.runs
    if not runs:
        line = f"no finished GPU jobs in the store from {span}: nothing to replay"
        if json_out:
            click.echo(json.dumps({"window": span, "jobs": 0, "message": line}))
        else:
            click.echo(line)
        return
    if cluster_text:
        try:
            shape = ClusterShape.parse(cluster_text)
        except ValueError as exc:
            fail(str(exc), 2)
        shape_note = f"cluster {cluster_text} (--cluster)"
    else:
        try:
            shape, shape_note = site_shape(window.node_gpus, window.shards_per_gpu)
        except ValueError as exc:
            fail(str(exc), 2)
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=json_out or not console.is_terminal,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def tick(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            if done % 64 == 0 or done == total:  # total grows as timed-out jobs resubmit
                bar.update(tasks[name], completed=done, total=total)

        figures = compare(
            runs,
            shape,
            window=span,
            shape_note=shape_note,
            policies=sets,
            seeds=seeds,
            progress=tick,
        )
    if json_out:
        click.echo(json.dumps(figures.as_json(), indent=2))
        return
    out = Console()
    if not out.is_terminal:
        out = Console(width=max(out.width, 140))
    out.print(_table(figures))
    for note in figures.notes:
        out.print(f"[dim]{note}[/dim]")


def _table(figures: WhatifFigures) -> Table:
    t = Table(title=f"what if: {figures.jobs} GPU jobs, {figures.window} (vs plain Slurm)")
    for col in (
        "policy set",
        "GPU-h",
        "GPU-h returned",
        "mean wait",
        "Δ wait",
        "mean JCT",
        "Δ JCT",
        "p99 JCT",
        "energy kWh",
        "kWh saved",
        "jobs touched",
    ):
        t.add_column(col, justify="left" if col == "policy set" else "right")
    for r in figures.rows:
        base = r.is_baseline
        returned = "-" if base else f"{r.gpu_hours_returned:,.1f}"
        if not base and figures.seeds > 1:
            returned += f" ± {r.gpu_hours_spread:,.1f}"
        t.add_row(
            r.policy_set,
            f"{r.gpu_hours:,.1f}",
            returned,
            signed_duration(r.avg_queue_s).lstrip("+"),
            "-" if base else signed_duration(-r.avg_queue_saved_s),
            signed_duration(r.avg_jct_s).lstrip("+"),
            "-" if base else signed_duration(-r.avg_jct_saved_s),
            signed_duration(r.p99_jct_s).lstrip("+"),
            f"{r.energy_kwh:,.1f}",
            "-" if base else f"{r.energy_saved_kwh:,.1f}",
            "-" if base else str(r.jobs_touched),
        )
    return t

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
import math
import time
from datetime import UTC, datetime

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cli.context import EXIT_STORE, AppContext, fail, pass_app
from slurmgpu.cli.report import parse_window
from slurmgpu.sim.fromstore import Savings, infer_shape, priors, savings, to_trace
from slurmgpu.sim.metrics import RunSummary, summarise
from slurmgpu.sim.policysets import known_sets
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.store import StoreError
from slurmgpu.store.whatif import read_window

DEFAULT_POLICIES = "rightsize,colocate,malleable,all"
FIDELITY = (
    "simulator figures, not measurements: the simulator's fidelity against real Slurm "
    "is not yet measured (issue 33); jobs replay at their real run time and asked-for "
    "GPUs, with the util their summaries recorded"
)


def _hours(s: float) -> str:
    if math.isnan(s):
        return "-"
    return f"{s / 3600:+.2f} h" if abs(s) >= 600 else f"{s:+.0f} s"


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
    default=DEFAULT_POLICIES,
    show_default=True,
    help="Comma-separated policy sets compared with plain Slurm: " + ", ".join(known_sets()),
)
@click.option("--cluster", "cluster_text", help="NODESxGPUS (default: from the stored nodes).")
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
        inferred = infer_shape(window.node_gpus)
        if inferred is None:
            fail("no GPU nodes in the store to infer the cluster from; give --cluster NxG", 2)
        spg = max(window.shards_per_gpu, default=4) or 4
        shape = ClusterShape(inferred[0], inferred[1], spg)
        shape_note = (
            f"cluster {inferred[0]}x{inferred[1]} (from {len(window.node_gpus)} stored GPU nodes)"
        )
    without = sum(1 for r in runs if not r.has_usage)
    notes = [FIDELITY, shape_note]
    if without:
        notes.append(
            f"{without} of {len(runs)} jobs have no usage summary: replayed at 100 % util "
            "(nothing to rightsize or share), so savings are understated"
        )
    metered = [r.energy_j for r in runs if r.energy_j is not None]
    measured_kwh = sum(metered) / 3.6e6 if metered else None
    notes.append(
        "energy: the simulator's own GPU power model, not the meters; "
        + (
            f"the {len(metered)} metered jobs of the window used {measured_kwh:,.1f} kWh"
            if measured_kwh is not None
            else "no job of the window has metered energy"
        )
    )
    if seeds > 1:
        notes.append(
            f"means over {seeds} seeds (seeds draw the missing time limits and the "
            "simulator's random choices); ± is half the range of GPU-hours returned"
        )
    console = Console(stderr=True)
    options = SimOptions(record_decisions=True, history=priors(runs))
    order = ["slurm", *sets]
    results: dict[str, list[RunSummary]] = {name: [] for name in order}
    touched: dict[str, list[int]] = {name: [] for name in order}
    traces = {
        seed: to_trace(runs, seed=seed, gpus_per_node=shape.gpus_per_node, max_gpus=shape.gpus)
        for seed in range(1, seeds + 1)
    }
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=json_out or not console.is_terminal,
    ) as bar:
        for name in order:
            task = bar.add_task(name, total=len(runs) * seeds)
            for i, seed in enumerate(traces):

                def tick(done: int, total: int, i: int = i, task: object = task) -> None:
                    if done % 64 == 0 or done == total:
                        bar.update(task, completed=i * len(runs) + done)  # type: ignore[arg-type]

                began = time.perf_counter()
                run = simulate(traces[seed], shape, name, options, progress=tick)
                results[name].append(summarise(run, time.perf_counter() - began))
                touched[name].append(
                    len({d.job_id for d in run.decisions if d.outcome in ("done", "started")})
                )
    base = results["slurm"]
    rows = [savings(base, results[name], touched[name]) for name in order]
    if json_out:
        doc = {
            "window": span,
            "jobs": len(runs),
            "jobs_without_usage": without,
            "cluster": f"{shape.nodes}x{shape.gpus_per_node}",
            "seeds": seeds,
            "measured_energy_kwh": measured_kwh,
            "sets": {r.policy_set: r.as_dict() for r in rows},
            "notes": notes,
        }
        click.echo(json.dumps(doc, indent=2))
        return
    out = Console()
    if not out.is_terminal:
        out = Console(width=max(out.width, 140))
    out.print(_table(rows, span, len(runs), seeds))
    for note in notes:
        out.print(f"[dim]{note}[/dim]")


def _table(rows: list[Savings], span: str, jobs: int, seeds: int) -> Table:
    t = Table(title=f"what if: {jobs} GPU jobs, {span} (vs plain Slurm)")
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
    for r in rows:
        base = r.policy_set == "slurm"
        returned = "-" if base else f"{r.gpu_hours_returned:,.1f}"
        if not base and seeds > 1:
            returned += f" ± {r.gpu_hours_spread:,.1f}"
        t.add_row(
            r.policy_set,
            f"{r.gpu_hours:,.1f}",
            returned,
            _hours(r.avg_queue_s).lstrip("+"),
            "-" if base else _hours(-r.avg_queue_saved_s),
            _hours(r.avg_jct_s).lstrip("+"),
            "-" if base else _hours(-r.avg_jct_saved_s),
            _hours(r.p99_jct_s).lstrip("+"),
            f"{r.energy_kwh:,.1f}",
            "-" if base else f"{r.energy_saved_kwh:,.1f}",
            "-" if base else str(r.jobs_touched),
        )
    return t

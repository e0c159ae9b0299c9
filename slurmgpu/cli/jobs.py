"""``sgpu jobs``: the jobs slurmgpu knows, as a table or JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from slurmgpu.cli.context import AppContext, pass_app
from slurmgpu.model import Job
from slurmgpu.plaintext import plain
from slurmgpu.report.eff import elapsed_of
from slurmgpu.slurm.parse import format_time_limit
from slurmgpu.store import StoredJob

_STATE_STYLE = {
    "RUNNING": "green",
    "PENDING": "yellow",
    "COMPLETED": "blue",
    "FAILED": "red",
    "TIMEOUT": "red",
    "CANCELLED": "magenta",
    "OUT_OF_MEMORY": "red",
    "NODE_FAIL": "red",
}


def gpu_request_text(job: Job) -> str:
    """Return what the job asked for, e.g. ``2``, ``1/node``, ``shard:2`` or ``-``."""
    g = job.gpus
    parts = []
    if g.gpus:
        parts.append(f"{g.gpu_type}:{g.gpus}" if g.gpu_type else str(g.gpus))
    if g.shards:
        parts.append(f"shard:{g.shards}")
    return ",".join(parts) or "-"


def placement_text(job: Job) -> str:
    """Return nodes with the GPU indices held there, e.g. ``gpu1[0,1] gpu2[3]``."""
    if not job.gpu_allocations:
        return ",".join(job.nodes) or (f"({job.reason})" if job.reason else "")
    out = []
    for a in job.gpu_allocations:
        idx = [str(i) for i in a.gpu_indices] + [f"s{i}" for i in a.shard_indices]
        out.append(f"{a.node}[{','.join(idx)}]" if idx else a.node)
    return " ".join(out)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def job_json(stored: StoredJob, now: datetime) -> dict[str, Any]:
    job = stored.job
    el = elapsed_of(job, now)
    return {
        "job_id": job.job_id,
        "display_id": job.display_id,
        "name": job.name,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "state": job.state.value,
        "state_flags": sorted(job.state_flags),
        "reason": job.reason,
        "gpus_requested": job.gpus.gpus,
        "shards_requested": job.gpus.shards,
        "gpu_type": job.gpus.gpu_type,
        "nodes": list(job.nodes),
        "gpu_allocations": [
            {
                "node": a.node,
                "gpus": list(a.gpu_indices),
                "shard_gpus": list(a.shard_indices),
                "shards": a.shards,
            }
            for a in job.gpu_allocations
        ],
        "submit_time": _iso(job.submit_time),
        "start_time": _iso(job.start_time),
        "end_time": _iso(job.end_time) if job.state.is_terminal else None,
        "elapsed_s": int(el.total_seconds()) if el is not None else None,
        "time_limit_s": int(job.time_limit.total_seconds()) if job.time_limit else None,
        "restart_count": job.restart_count,
        "exit_code": job.exit_code,
        "gone": stored.gone,
    }


@click.command()
@click.option("--state", "-t", "states", multiple=True, help="Only these states (repeatable).")
@click.option("--user", "-u", help="Only this user's jobs.")
@click.option("--active", is_flag=True, help="Only jobs Slurm still lists.")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_app
def jobs(
    app: AppContext,
    states: tuple[str, ...],
    user: str | None,
    active: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List the jobs slurmgpu has observed, newest first."""
    store = app.store(migrate=False)
    rows = store.jobs(
        states=[s.upper() for s in states] or None, user=user, include_gone=not active, limit=limit
    )
    now = datetime.now(UTC)
    if as_json:
        click.echo(json.dumps([job_json(r, now) for r in rows], indent=2))
        return
    table = Table(title=f"{len(rows)} job(s)", title_justify="left", header_style="bold")
    for col in (
        "JOBID",
        "NAME",
        "USER",
        "STATE",
        "GPUS",
        "NODES[GPU]",
        "ELAPSED",
        "LIMIT",
        "RESTARTS",
    ):
        table.add_column(col, no_wrap=col in {"JOBID", "STATE"})
    for r in rows:
        job = r.job
        el = elapsed_of(job, now)
        state = job.state.value + (
            "+" + ",".join(sorted(job.state_flags)) if job.state_flags else ""
        )
        # Every cell is plain text: a name like "[/bold]" is shown, never parsed as markup.
        table.add_row(
            plain(job.display_id),
            plain(job.name),
            plain(job.user),
            plain(state, style=_STATE_STYLE.get(job.state.value, "white")),
            plain(gpu_request_text(job)),
            plain(placement_text(job)),
            format_time_limit(el) if el is not None else "-",
            format_time_limit(job.time_limit),
            str(job.restart_count),
        )
    console = Console()
    if not console.is_terminal:  # piped or logged: never cut columns to 80 characters
        console = Console(width=max(console.width, 160))
    console.print(table)

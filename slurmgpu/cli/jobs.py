"""``sgpu jobs``: the jobs slurmgpu knows, as a table, JSON, or a live table (--watch)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console, RenderableType
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cli.context import AppContext, duration_option, fail, pass_app
from slurmgpu.model import Job, JobState
from slurmgpu.plaintext import plain
from slurmgpu.report.eff import elapsed_of
from slurmgpu.store import JobStore, StoredJob, StoreError
from slurmgpu.units import format_time_limit

if TYPE_CHECKING:
    from slurmgpu.store.audit import AuditRecord
    from slurmgpu.store.usage_query import GpuUsage

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


def gpu_use_text(usage: list[GpuUsage]) -> str:
    """A job's recent GPU use: mean utilisation over its GPUs and the most memory of one.

    ``41% 6.1/80G``; ``-`` without samples.
    """
    utils = [u.mean_util_pct for u in usage if u.mean_util_pct is not None]
    if not utils:
        return "-"
    text = f"{sum(utils) / len(utils):.0f}%"
    mems = [u.max_memory_mib for u in usage if u.max_memory_mib is not None]
    totals = [u.memory_total_mib for u in usage if u.memory_total_mib]
    if mems:
        text += f" {max(mems) / 1024:.1f}" + (f"/{max(totals) / 1024:.0f}G" if totals else "G")
    return text


def decision_text(record: AuditRecord | None) -> str:
    """The daemon's newest decision about a job, e.g. ``12:03:04 rightsize update (done): …``."""
    if record is None:
        return "-"
    from slurmgpu.cli.actions import what_text

    return (
        f"{record.at:%H:%M:%S} {record.policy} {what_text(record)} ({record.outcome}): "
        f"{record.reason}"
    )


def jobs_table(
    rows: list[StoredJob],
    now: datetime,
    *,
    usage: dict[int, list[GpuUsage]] | None = None,
    decisions: dict[int, AuditRecord] | None = None,
) -> Table:
    """The jobs table; with ``usage``/``decisions`` also GPU USE and LAST DECISION columns."""
    live = usage is not None or decisions is not None
    table = Table(title=f"{len(rows)} job(s)", title_justify="left", header_style="bold")
    columns = ["JOBID", "NAME", "USER", "STATE", "GPUS", "NODES[GPU]", "ELAPSED", "LIMIT"]
    columns += ["GPU USE", "LAST DECISION"] if live else ["RESTARTS"]
    for col in columns:
        if col == "LAST DECISION":
            table.add_column(col, no_wrap=True, overflow="ellipsis", ratio=1)
        else:
            table.add_column(col, no_wrap=col in {"JOBID", "STATE", "GPU USE"})
    for r in rows:
        job = r.job
        el = elapsed_of(job, now)
        state = job.state.value + (
            "+" + ",".join(sorted(job.state_flags)) if job.state_flags else ""
        )
        # Every cell is plain text: a name like "[/bold]" is shown, never parsed as markup.
        cells: list[RenderableType] = [
            plain(job.display_id),
            plain(job.name),
            plain(job.user),
            plain(state, style=_STATE_STYLE.get(job.state.value, "white")),
            plain(gpu_request_text(job)),
            plain(placement_text(job)),
            format_time_limit(el) if el is not None else "-",
            format_time_limit(job.time_limit),
        ]
        if live:
            cells.append(gpu_use_text((usage or {}).get(job.job_id, [])))
            cells.append(plain(decision_text((decisions or {}).get(job.job_id))))
        else:
            cells.append(str(job.restart_count))
        table.add_row(*cells)
    return table


@click.command()
@click.option("--state", "-t", "states", multiple=True, help="Only these states (repeatable).")
@click.option("--user", "-u", help="Only this user's jobs.")
@click.option("--active", is_flag=True, help="Only jobs Slurm still lists.")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--watch",
    is_flag=True,
    help="A live table, redrawn in place, with GPU use and last decision; Ctrl-C quits.",
)
@click.option(
    "--interval", metavar="DURATION", default="2s", show_default=True, help="--watch redraw period."
)
@pass_app
def jobs(
    app: AppContext,
    states: tuple[str, ...],
    user: str | None,
    active: bool,
    limit: int,
    as_json: bool,
    watch: bool,
    interval: str,
) -> None:
    """List the jobs slurmgpu has observed, newest first."""
    store = app.store(migrate=False)

    def read() -> list[StoredJob]:
        return store.jobs(
            states=[s.upper() for s in states] or None,
            user=user,
            include_gone=not active,
            limit=limit,
        )

    if watch:
        if as_json:
            fail("--watch shows a table; --json prints once", 2)
        _watch(store, read, duration_option(interval))
        return
    rows = read()
    now = datetime.now(UTC)
    if as_json:
        click.echo(json.dumps([job_json(r, now) for r in rows], indent=2))
        return
    console = Console()
    if not console.is_terminal:  # piped or logged: never cut columns to 80 characters
        console = Console(width=max(console.width, 160))
    console.print(jobs_table(rows, now))


def _watch(
    store: JobStore,
    read: Callable[[], list[StoredJob]],
    interval_s: float,
    *,
    console: Console | None = None,
    stop: threading.Event | None = None,
) -> None:
    from slurmgpu.cli import live
    from slurmgpu.store.audit import AuditStore
    from slurmgpu.store.usage import UsageStore

    if interval_s < 0.1:
        fail("--interval must be at least 0.1s", 2)
    usage_store = UsageStore(store.engine, store.cluster)
    audit = AuditStore(store.engine, store.cluster)
    # Recent use: the last few agent samples (agents sample every 10 s by default).
    window = timedelta(seconds=max(60.0, 3 * interval_s))
    last: list[Table] = []

    def render() -> RenderableType:
        now = datetime.now(UTC)
        try:
            rows = read()
            running = [r.job.job_id for r in rows if r.job.state is JobState.RUNNING]
            usage = usage_store.gpu_usage_many(running, since=now - window)
            decisions = audit.latest_by_job([r.job.job_id for r in rows])
        except (StoreError, SQLAlchemyError) as exc:
            problem = f"database: {str(exc).splitlines()[0][:200]}"
            return live.stacked(live.header("sgpu jobs", interval_s, now, problem), *last[-1:])
        last[:] = [jobs_table(rows, now, usage=usage, decisions=decisions)]
        return live.stacked(live.header("sgpu jobs", interval_s, now), last[0])

    live.watch(render, interval_s, console=console, stop=stop)

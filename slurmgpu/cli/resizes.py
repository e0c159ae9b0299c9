"""``sgpu resizes``: the resize transactions of malleable jobs and pools, with their phases."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from slurmgpu.cli.context import EXIT_STORE, AppContext, fail, pass_app
from slurmgpu.cycle.pool import KIND as POOL_KIND
from slurmgpu.cycle.resize import KIND, durations
from slurmgpu.cycle.transactions import TransactionRow
from slurmgpu.plaintext import plain
from slurmgpu.store.database import StoreError
from slurmgpu.store.transactions import TransactionStore

_STATE_STYLE = {
    "running": "green",
    "rolled_back": "yellow",
    "aborted": "yellow",
    "ended": "dim",
    "overtaken": "yellow",
}
_PHASES = ("checkpoint", "stop", "requeue_delay", "scheduling", "total")


def _sizes(row: TransactionRow) -> str:
    p = row.payload
    if row.kind == POOL_KIND:
        return f"throttle -> {p.get('to_tasks', '?')} tasks"
    return f"{p.get('from_gpus', '?')} -> {p.get('to_gpus', '?')} GPUs"


def record_json(row: TransactionRow) -> dict[str, object]:
    return {
        "id": row.id,
        "job_id": row.job_id,
        "kind": row.kind,
        "state": row.state,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "from_gpus": row.payload.get("from_gpus"),
        "to_gpus": row.payload.get("to_gpus"),
        "to_tasks": row.payload.get("to_tasks"),
        "policy": row.payload.get("policy"),
        "reason": row.payload.get("reason"),
        "timeline": row.payload.get("t", {}),
        "phases_s": durations(row) if row.kind == KIND else {},
        "error": row.error,
    }


@click.command()
@click.option("--job", "job_id", type=int, help="Only this job (or pool array id).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_app
def resizes(app: AppContext, job_id: int | None, limit: int, as_json: bool) -> None:
    """List resizes of malleable jobs and pools, newest first: state and phase seconds."""
    store = app.store(migrate=False)
    try:
        rows = TransactionStore(store.engine, store.cluster).recent(
            [KIND, POOL_KIND], job_id=job_id, limit=limit
        )
    except StoreError as exc:
        fail(str(exc), EXIT_STORE)
    if as_json:
        click.echo(json.dumps([record_json(r) for r in rows], indent=2))
        return
    table = Table(title=f"{len(rows)} resize(s)", title_justify="left", header_style="bold")
    for col in ("ID", "DECIDED", "JOB", "RESIZE", "STATE", *(p.upper() for p in _PHASES), "NOTE"):
        table.add_column(col, overflow="fold")
    for r in rows:
        phases = durations(r) if r.kind == KIND else {}
        table.add_row(
            str(r.id),
            r.created_at.strftime("%m-%d %H:%M:%S"),
            str(r.job_id),
            plain(_sizes(r)),
            plain(r.state, style=_STATE_STYLE.get(r.state, "white")),
            *(f"{phases[p]:.1f}" if p in phases else "-" for p in _PHASES),
            plain(r.error or ""),
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    console.print(table)

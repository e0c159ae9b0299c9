"""``sgpu advice``: what rightsizing suggests for pending jobs (stored even in advise mode)."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from slurmgpu.cli.actions import record_json
from slurmgpu.cli.context import AppContext, pass_app
from slurmgpu.plaintext import plain
from slurmgpu.store.audit import AuditRecord, AuditStore


def latest_per_job(records: list[AuditRecord]) -> list[AuditRecord]:
    """The newest rightsize decision of each job (records come newest first)."""
    seen: set[int | None] = set()
    out = []
    for r in records:
        if r.job_id in seen:
            continue
        seen.add(r.job_id)
        out.append(r)
    return out


@click.command()
@click.argument("job_id", type=int, required=False)
@click.option("--user", "-u", help="Only this user's jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_app
def advice(app: AppContext, job_id: int | None, user: str | None, as_json: bool) -> None:
    """Show the newest rightsizing advice per job (all jobs, or JOB_ID)."""
    store = app.store(migrate=False)
    rows = latest_per_job(
        AuditStore(store.engine, store.cluster).list(
            job_id=job_id, policy="rightsize", user=user, limit=5000
        )
    )
    if as_json:
        click.echo(json.dumps([record_json(r) for r in rows], indent=2))
        return
    table = Table(title=f"rightsizing advice for {len(rows)} job(s)", title_justify="left")
    for col in ("JOB", "USER", "SUGGESTED", "BASED ON", "MODE", "OUTCOME"):
        table.add_column(col, overflow="fold")
    for r in rows:
        suggested = " ".join(f"{k}={v}" for k, v in r.fields.items())
        basis = (
            f"{r.numbers.get('history_samples', '?')} runs ({r.numbers.get('history_level', '?')})"
        )
        outcome = r.outcome + (f" [{r.suppressed}]" if r.suppressed else "")
        table.add_row(
            str(r.job_id),
            plain(r.user),
            plain(suggested),
            plain(basis),
            plain(r.mode),
            plain(outcome),
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    console.print(table)

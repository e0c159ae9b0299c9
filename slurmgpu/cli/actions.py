"""``sgpu actions``: the audit of policy decisions, taken or suppressed."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from slurmgpu.cli.context import AppContext, pass_app
from slurmgpu.plaintext import plain
from slurmgpu.store.audit import AuditRecord, AuditStore

_OUTCOME_STYLE = {"done": "green", "notified": "cyan", "failed": "red", "skipped": "dim"}


def _what(r: AuditRecord) -> str:
    if r.fields:
        return r.kind + " " + " ".join(f"{k}={v}" for k, v in r.fields.items())
    return r.kind


def record_json(r: AuditRecord) -> dict[str, object]:
    return {
        "id": r.id,
        "at": r.at.isoformat(),
        "job_id": r.job_id,
        "user": r.user,
        "policy": r.policy,
        "kind": r.kind,
        "fields": r.fields,
        "mode": r.mode,
        "outcome": r.outcome,
        "reason": r.reason,
        "suppressed": r.suppressed,
        "numbers": r.numbers,
        "error": r.error,
        "caller_uid": r.caller_uid,
    }


@click.command()
@click.option("--job", "job_id", type=int, help="Only this job.")
@click.option("--policy", help="Only this policy (rightsize, idle_gpu, ...).")
@click.option("--user", "-u", help="Only this user's jobs.")
@click.option("--taken", is_flag=True, help="Hide decisions that were only recorded (skipped).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_app
def actions(
    app: AppContext,
    job_id: int | None,
    policy: str | None,
    user: str | None,
    taken: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List policy decisions, newest first, with their reason, mode and outcome."""
    store = app.store(migrate=False)
    rows = AuditStore(store.engine, store.cluster).list(
        job_id=job_id, policy=policy, user=user, include_skipped=not taken, limit=limit
    )
    if as_json:
        click.echo(json.dumps([record_json(r) for r in rows], indent=2))
        return
    table = Table(title=f"{len(rows)} decision(s)", title_justify="left", header_style="bold")
    for col in ("WHEN", "JOB", "USER", "POLICY", "ACTION", "MODE", "OUTCOME", "WHY"):
        table.add_column(col, overflow="fold")
    for r in rows:
        why = r.reason + (f" [suppressed: {r.suppressed}]" if r.suppressed else "")
        if r.error:
            why += f" [{'note' if r.outcome == 'done' else 'error'}: {r.error}]"
        table.add_row(
            r.at.strftime("%m-%d %H:%M:%S"),
            str(r.job_id or "-"),
            plain(r.user),
            plain(r.policy),
            plain(_what(r)),
            plain(r.mode),
            plain(r.outcome, style=_OUTCOME_STYLE.get(r.outcome, "white")),
            plain(why),
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 180))
    console.print(table)

"""``sgpu actions``: the audit of policy decisions, taken or suppressed (live: --watch)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import click
from rich.console import Console, RenderableType
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cli.context import AppContext, duration_option, fail, pass_app
from slurmgpu.plaintext import plain
from slurmgpu.store import StoreError
from slurmgpu.store.audit import AuditRecord, AuditStore

_OUTCOME_STYLE = {"done": "green", "notified": "cyan", "failed": "red", "skipped": "dim"}


def what_text(r: AuditRecord) -> str:
    """The action and its fields, e.g. ``update gres=gpu:1``."""
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


def actions_table(rows: list[AuditRecord]) -> Table:
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
            plain(what_text(r)),
            plain(r.mode),
            plain(r.outcome, style=_OUTCOME_STYLE.get(r.outcome, "white")),
            plain(why),
        )
    return table


@click.command()
@click.option("--job", "job_id", type=int, help="Only this job.")
@click.option("--policy", help="Only this policy (rightsize, idle_gpu, ...).")
@click.option("--user", "-u", help="Only this user's jobs.")
@click.option("--taken", is_flag=True, help="Hide decisions that were only recorded (skipped).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--watch", is_flag=True, help="A live table of the newest decisions, redrawn; Ctrl-C quits."
)
@click.option(
    "--interval", metavar="DURATION", default="2s", show_default=True, help="--watch redraw period."
)
@pass_app
def actions(
    app: AppContext,
    job_id: int | None,
    policy: str | None,
    user: str | None,
    taken: bool,
    limit: int,
    as_json: bool,
    watch: bool,
    interval: str,
) -> None:
    """List policy decisions, newest first, with their reason, mode and outcome."""
    store = app.store(migrate=False)
    audit = AuditStore(store.engine, store.cluster)

    def read() -> list[AuditRecord]:
        return audit.list(
            job_id=job_id, policy=policy, user=user, include_skipped=not taken, limit=limit
        )

    if watch:
        if as_json:
            fail("--watch shows a table; --json prints once", 2)
        _watch(read, duration_option(interval))
        return
    rows = read()
    if as_json:
        click.echo(json.dumps([record_json(r) for r in rows], indent=2))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 180))
    console.print(actions_table(rows))


def _watch(
    read: Callable[[], list[AuditRecord]],
    interval_s: float,
    *,
    console: Console | None = None,
    stop: threading.Event | None = None,
) -> None:
    from slurmgpu.cli import live

    if interval_s < 0.1:
        fail("--interval must be at least 0.1s", 2)
    last: list[Table] = []

    def render() -> RenderableType:
        now = datetime.now(UTC)
        try:
            rows = read()
        except (StoreError, SQLAlchemyError) as exc:
            problem = f"database: {str(exc).splitlines()[0][:200]}"
            return live.stacked(live.header("sgpu actions", interval_s, now, problem), *last[-1:])
        last[:] = [actions_table(rows)]
        return live.stacked(live.header("sgpu actions", interval_s, now), last[0])

    live.watch(render, interval_s, console=console, stop=stop)

"""``sgpu report``: GPU-hours allocated vs used, waste, flagged jobs and actions, per window."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import click
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cli.context import EXIT_STORE, AppContext, fail, pass_app
from slurmgpu.report.build import GROUP_BY, GroupBy, build_report
from slurmgpu.report.html_page import render_html
from slurmgpu.report.render import render_table, to_csv, to_json
from slurmgpu.sim.whatif import compare, site_shape
from slurmgpu.store import StoreError
from slurmgpu.store.whatif import WindowRead, read_window
from slurmgpu.units import parse_duration
from slurmgpu.whatif_figures import WhatifFigures


def parse_moment(value: str, now: datetime, option: str) -> datetime:
    """``7d`` (that long before ``now``), ``now``, or an ISO date/time (UTC unless zoned)."""
    text = value.strip()
    if text == "now":
        return now
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration like 7d nor a date like 2026-03-01",
            param_hint=option,
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def parse_window(since: str, until: str, now: datetime) -> tuple[datetime, datetime]:
    """``--since``/``--until`` as a window; exits 2 with one line when it is empty."""
    start = parse_moment(since, now, "--since")
    end = parse_moment(until, now, "--until")
    if end <= start:
        fail(f"--until ({end:%Y-%m-%d %H:%M}) must come after --since ({start:%Y-%m-%d %H:%M})", 2)
    return start, end


def _whatif(window: WindowRead, start: datetime, end: datetime) -> WhatifFigures | str:
    """``sgpu whatif``'s figures (its defaults) on the report's window, or why there are none."""
    span = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    if not window.runs:
        return f"no finished GPU jobs in the store from {span}: nothing to replay"
    try:
        shape, note = site_shape(window.node_gpus, window.shards_per_gpu)
    except ValueError as exc:
        return f"not replayed: {exc}"
    return compare(window.runs, shape, window=span, shape_note=note)


@click.command()
@click.option(
    "--since",
    default="7d",
    show_default=True,
    help="Start: a duration before now (7d, 12h) or a date/time (2026-03-01, UTC).",
)
@click.option("--until", default="now", show_default=True, help="End: same forms as --since.")
@click.option("--by", type=click.Choice(GROUP_BY), default="user", show_default=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("table", "csv", "json", "html")),
    default="table",
    show_default=True,
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write to FILE instead of standard output.",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="How many top wasters to list.",
)
@click.option(
    "--whatif",
    "with_whatif",
    is_flag=True,
    help="Add what each policy set would have changed on the window's jobs (the "
    "figures of `sgpu whatif` with its defaults; html and json only; slow on long windows).",
)
@pass_app
def report(
    app: AppContext,
    since: str,
    until: str,
    by: str,
    fmt: str,
    output: Path | None,
    top: int,
    with_whatif: bool,
) -> None:
    """Report GPU efficiency of the jobs that ended in a window, and what slurmgpu did."""
    now = datetime.now(UTC)
    start, end = parse_window(since, until, now)
    if with_whatif and fmt not in ("html", "json"):
        fail("--whatif goes with --format html or json", 2)
    store = app.store(migrate=False)
    whatif: WhatifFigures | str | None = None
    try:
        result = build_report(
            store.engine,
            since=start,
            until=end,
            cluster=store.cluster,
            by=cast(GroupBy, by),
            top=top,
            now=now,
        )
        if with_whatif:
            whatif = _whatif(read_window(store.engine, store.cluster, start, end), start, end)
    except (StoreError, SQLAlchemyError) as exc:
        cause = getattr(exc, "orig", None) or exc
        fail(
            f"cannot read the store: {str(cause).splitlines()[0]} (run `sgpu db upgrade`?)",
            EXIT_STORE,
        )
    if fmt == "table":
        if output is None:
            console = Console()
            if not console.is_terminal:  # piped or logged: never cut lines to 80 characters
                console = Console(width=max(console.width, 140))
            console.print(render_table(result))
            return
        try:
            with output.open("w", encoding="utf-8") as fh:
                Console(file=fh, width=160).print(render_table(result))
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror}", 1)
        click.echo(f"wrote {output}", err=True)
        return
    if fmt == "csv":
        text = to_csv(result)
    elif fmt == "json":
        doc = to_json(result)
        if whatif is not None:
            doc["whatif"] = (
                whatif.as_json() if isinstance(whatif, WhatifFigures) else {"message": whatif}
            )
        text = json.dumps(doc, indent=2) + "\n"
    else:
        text = render_html(result, whatif)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}", 1)
    click.echo(f"wrote {output}", err=True)

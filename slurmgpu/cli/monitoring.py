"""``sgpu monitoring``: print or write the Prometheus rules shipped with slurmgpu."""

from __future__ import annotations

from pathlib import Path

import click

from slurmgpu.cli.context import fail
from slurmgpu.monitoring import rules_text


@click.group("monitoring")
def monitoring() -> None:
    """Prometheus rules for the daemon's /metrics (docs/metrics.md)."""


def _emit(text: str, out: Path | None, what: str) -> None:
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    click.echo(f"wrote {what} to {out}")


@monitoring.command("rules")
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the rule file here instead of printing it.",
)
def rules(out: Path | None) -> None:
    """The recording and alerting rules (a Prometheus rule file)."""
    _emit(rules_text(), out, "the Prometheus rules")

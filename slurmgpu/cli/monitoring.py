"""``sgpu monitoring``: print or write the Prometheus rules and the Grafana dashboard
shipped with slurmgpu."""

from __future__ import annotations

from pathlib import Path

import click

from slurmgpu.cli.context import fail
from slurmgpu.monitoring import dashboard_text, rules_text


@click.group("monitoring")
def monitoring() -> None:
    """Prometheus rules and a Grafana dashboard for the daemon's /metrics (docs/metrics.md)."""


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


@monitoring.command("dashboard")
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the dashboard here instead of printing it.",
)
def dashboard(out: Path | None) -> None:
    """The Grafana dashboard (JSON, for provisioning or import)."""
    _emit(dashboard_text(), out, "the Grafana dashboard")

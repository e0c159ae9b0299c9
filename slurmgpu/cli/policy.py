"""``sgpu policy show`` / ``sgpu policy check FILE``: the effective policy configuration."""

from __future__ import annotations

import dataclasses
import enum
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from slurmgpu.cli.context import EXIT_CONFIG, AppContext, fail, pass_app
from slurmgpu.config import ConfigError, Settings, load_settings


def _duration(d: timedelta) -> str:
    seconds = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _value(v: Any) -> Any:
    if isinstance(v, timedelta):
        return _duration(v)
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, frozenset | set | tuple | list):
        return sorted(_value(x) for x in v)
    if isinstance(v, Path):
        return str(v)
    return v


def _table(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name in {"password", "source"}:
            continue
        out[f.name] = _table(v) if dataclasses.is_dataclass(v) else _value(v)
    return out


def effective(settings: Settings) -> dict[str, Any]:
    """The settings as nested plain values, the way the TOML file spells them."""
    return {
        "daemon": _table(settings.daemon),
        "slurm": _table(settings.slurm),
        "policy": _table(settings.policy),
        "notify": _table(settings.notify),
    }


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if v is None:
        return '""'
    return json.dumps(str(v))


def to_toml(doc: dict[str, Any], prefix: str = "") -> str:
    lines: list[str] = []
    scalars = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    if prefix and scalars:
        lines.append(f"[{prefix}]")
    lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
    if scalars:
        lines.append("")
    for k, v in tables.items():
        lines.append(to_toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(lines)


@click.group()
def policy() -> None:
    """Show or validate the policy configuration."""


@policy.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of TOML.")
@pass_app
def policy_show(app: AppContext, as_json: bool) -> None:
    """Print the effective configuration (file values over defaults)."""
    doc = effective(app.settings)
    source = app.settings.source
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"# effective configuration ({source or 'defaults: no config file'})")
    click.echo(to_toml(doc).rstrip())


@policy.command("check")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
def policy_check(file: Path) -> None:
    """Validate FILE; exit 0 if it is a valid configuration, 3 with one line if not."""
    try:
        settings = load_settings(file)
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)
    p = settings.policy
    click.echo(
        f"{file}: OK (idle_gpu {p.idle_gpu.mode.value}, rightsize {p.rightsize.mode.value}, "
        f"notify {'on' if settings.notify.enabled else 'off'})"
    )

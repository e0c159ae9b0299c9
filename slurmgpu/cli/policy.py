"""``sgpu policy show`` / ``sgpu policy check FILE``: the effective policy configuration."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from slurmgpu.cli.context import EXIT_CONFIG, AppContext, fail, pass_app
from slurmgpu.config import ConfigError, Settings, load_settings


def _duration(d: timedelta) -> str | float:
    if d.microseconds:
        return d.total_seconds()  # parse_duration takes a number of seconds
    seconds = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# Settings fields whose key in the file is spelt differently.
_KEYS = {"device_memory_mib": "device_memory", "memory_margin_mib": "memory_margin"}
# What the file says for a field left None, where it has a word for it ("" is no value).
_NONE = {"device_memory": "auto", "second_warn_after": "off", "ack_timeout": "grace"}


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
        key = _KEYS.get(f.name, f.name)
        if f.name in {"password", "source"}:
            continue
        if dataclasses.is_dataclass(v):
            out[key] = _table(v)
        elif f.name == "alert_intervals":  # (alert, window) pairs: a table in the file
            out[key] = {alert: _duration(window) for alert, window in v}
        elif f.name == "type_speed":  # (pattern, ((type, speed), ...)) pairs: nested tables
            out[key] = {pattern: dict(speeds) for pattern, speeds in v}
        elif v is None:
            if key in _NONE:
                out[key] = _NONE[key]
        else:
            out[key] = _value(v)
    return out


def effective(settings: Settings) -> dict[str, Any]:
    """The settings as the TOML file spells them: ``sgpu policy check`` accepts the
    document and reads back the same settings. A setting that is not set (no SMTP
    username, no template directory…) is left out, as the file would leave it out."""
    return {
        "daemon": _table(settings.daemon),
        "slurm": _table(settings.slurm),
        "policy": _policy_table(settings),
        "notify": _table(settings.notify),
    }


def _policy_table(settings: Settings) -> dict[str, Any]:
    """``[policy]``, with the sizing rules' knobs written in the tables the file keeps them
    in (``SIZING_KEYS``: ``[policy.rightsize]`` and ``[policy.colocate]``)."""
    from slurmgpu.policy.settings import SIZING_KEYS

    doc = _table(settings.policy)
    sizing = doc.pop("sizing")
    for name, (table, key) in SIZING_KEYS.items():
        doc[table][key] = sizing[_KEYS.get(name, name)]
    return doc


def unset(settings: Settings) -> list[str]:
    """Dotted names of the optional settings that are not set (``notify.username``…)."""
    doc = effective(settings)
    out: list[str] = []

    def walk(obj: Any, table: dict[str, Any], prefix: str) -> None:
        for f in dataclasses.fields(obj):
            v, key = getattr(obj, f.name), _KEYS.get(f.name, f.name)
            if f.name in {"password", "source"} or (prefix, key) == ("policy", "sizing"):
                continue  # the sizing knobs are always set, in other tables (_policy_table)
            if dataclasses.is_dataclass(v):
                walk(v, table[key], f"{prefix}.{key}")
            elif key not in table:
                out.append(f"{prefix}.{key}")

    for section in doc:
        walk(getattr(settings, section), doc[section], section)
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def to_toml(doc: dict[str, Any], prefix: str = "") -> str:
    lines: list[str] = []
    scalars = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    if prefix and (scalars or not tables):
        lines.append(f"[{prefix}]")
    lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars.items())
    if scalars or (prefix and not tables):
        lines.append("")
    for k, v in tables.items():
        lines.append(to_toml(v, f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k)))
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
    missing = unset(app.settings)
    if missing:
        click.echo(f"# not set: {', '.join(missing)}")
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

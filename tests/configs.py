"""The daemon's TOML config as the tests write it, built from sections.

A section is ``{"policy.idle_gpu": {"mode": "enforce", ...}}``; :func:`config_toml`
renders several, later ones adding to (and overriding keys of) earlier ones, so a test
says what it changes next to the blocks it shares with other tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

TomlValue = str | int | float | bool | Sequence[float]
Sections = Mapping[str, Mapping[str, TomlValue]]

# Policy pacing in seconds (production defaults are minutes), for tests on a live stack.
QUICK_POLICY: Sections = {
    "policy": {"history_refresh": "1s"},
    "policy.engine": {"job_cooldown": "1s"},
}

# Idle-GPU enforcement on a test's clock: warned after 4 s, acted on after 10 s.
QUICK_IDLE_ENFORCE: Sections = {
    "policy.idle_gpu": {
        "mode": "enforce",
        "warn_after": "4s",
        "second_warn_after": "off",
        "act_after": "10s",
        "min_warning_lead": "3s",
    }
}


def observing(*policies: str) -> Sections:
    """``mode = "observe"`` for each of ``policies`` (``"rightsize"``, ``"idle_gpu"``...)."""
    return {f"policy.{name}": {"mode": "observe"} for name in policies}


def _value(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for what the tests write
    if isinstance(value, int | float):
        return repr(value)
    return "[" + ", ".join(repr(v) for v in value) + "]"


def config_toml(*parts: Sections) -> str:
    """The TOML text of ``parts`` merged in order, one ``[section]`` each."""
    merged: dict[str, dict[str, TomlValue]] = {}
    for part in parts:
        for section, keys in part.items():
            merged.setdefault(section, {}).update(keys)
    lines: list[str] = []
    for section, keys in merged.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"

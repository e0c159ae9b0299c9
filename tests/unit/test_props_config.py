"""Property tests for the configuration (config.py and the sections it delegates to).

The base document is the effective default configuration (``sgpu policy show``'s
tables) written as TOML. Each example damages it: a value of the wrong type or out of
range, a misspelt key or section, a broken line, random bytes. ``parse_settings`` must
return Settings or raise ``ConfigError`` in one line; when the error is about a key
that appears in the file, it must give that key's line. Counts print at the end.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu.cli.policy import effective, to_toml
from slurmgpu.config import ConfigError, Settings, load_settings, parse_settings
from tests.hypothesis_profiles import examples
from tests.unit.props_tally import Tally, report

TALLY = Tally()
tally_report = report(TALLY)
SETTINGS = settings(
    max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
_POLICY_TABLES = ("engine", "idle_gpu", "rightsize")


def _base() -> dict[str, Any]:
    # policy show's document is valid input (tests/unit/test_policy_show.py).
    doc = effective(Settings())
    doc["policy"] = {
        k: v for k, v in doc["policy"].items() if k in _POLICY_TABLES or not isinstance(v, dict)
    }
    return doc


BASE = _base()


def _keys(doc: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in doc.items():
        if isinstance(v, dict):
            out.extend(_keys(v, f"{prefix}.{k}" if prefix else k))
        elif prefix:
            out.append((prefix, k))
    return out


KEYS = _keys(BASE)

hostile_toml = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(f), repr(f))
    ),
    st.sampled_from(
        [
            '""',
            '"-5m"',
            '"0s"',
            '"1e400s"',
            '"30 parsecs"',
            "true",
            "[]",
            "{}",
            '["a", 1]',
            '"\\u0000"',
            '"' + "9" * 5000 + 's"',
            "1979-05-27",
            '"sqlite:////nonexistent/dir/x.db"',
            '"observe"',
            '"enforce"',
            '"off"',
        ]
    ),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=20).map(
        lambda t: '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'
    ),
)


def _set(doc: dict[str, Any], table: str, key: str, raw: str) -> str:
    """TOML text of ``doc`` with ``table.key`` given the raw TOML ``raw``."""
    text = to_toml(doc)
    lines = text.splitlines()
    header = f"[{table}]"
    inside = False
    for i, line in enumerate(lines):
        if line.startswith("["):
            inside = line.strip() == header
        elif inside and re.match(rf"{re.escape(key)} = ", line):
            lines[i] = f"{key} = {raw}"
    return "\n".join(lines) + "\n"


def _check_error(exc: ConfigError, text: str, table: str, key: str) -> None:
    if exc.line is not None:
        assert 1 <= exc.line <= max(len(text.splitlines()), 1), exc
    if f"{table}.{key}" in exc.reason and key in text:
        assert exc.line is not None, f"error about {table}.{key} has no line: {exc}"
        assert key in text.splitlines()[exc.line - 1] or table in text.splitlines()[exc.line - 1]


def test_the_base_document_is_valid() -> None:
    assert parse_settings(to_toml(BASE)) == parse_settings("")
    assert len(KEYS) > 40


@given(st.sampled_from(KEYS), hostile_toml)
@SETTINGS
def test_a_bad_value_anywhere_is_one_config_error_with_its_line(
    where: tuple[str, str], raw: str
) -> None:
    table, key = where
    text = _set(BASE, table, key, raw)
    try:
        parse_settings(text)
    except ConfigError as exc:
        TALLY.refuse("parse_settings (bad value)", exc)
        _check_error(exc, text, table, key)
        return
    TALLY.accept("parse_settings (bad value)")


@given(
    st.sampled_from(KEYS), st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
)
@SETTINGS
def test_a_misspelt_key_is_refused_with_its_line(where: tuple[str, str], typo: str) -> None:
    table, key = where
    if typo in {k for t, k in KEYS if t == table}:
        return
    text = to_toml(BASE).replace(f"\n{key} = ", f"\n{typo} = ", 1)
    try:
        parse_settings(text)
    except ConfigError as exc:
        TALLY.refuse("parse_settings (unknown key)", exc)
        assert exc.line is not None
        return
    TALLY.accept("parse_settings (unknown key)")


@given(st.data())
@SETTINGS
def test_damaged_lines_parse_or_raise_config_error(data: st.DataObject) -> None:
    lines = to_toml(BASE).splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        how = data.draw(st.sampled_from(["cut", "drop", "dup", "garbage", "header"]))
        if how == "cut":
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
        elif how == "drop":
            del lines[i]
        elif how == "dup":
            lines.insert(i, lines[i])
        elif how == "garbage":
            lines[i] = data.draw(st.text(max_size=40))
        else:
            lines.insert(i, "[" + data.draw(st.text(max_size=15)) + "]")
        if not lines:
            lines = [""]
    text = "\n".join(lines)
    TALLY.run("parse_settings (damaged lines)", lambda: parse_settings(text), ConfigError)


@given(st.binary(max_size=400))
@settings(max_examples=examples(200), deadline=None)
def test_any_file_content_loads_or_raises_config_error(raw: bytes) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".toml") as f:
        f.write(raw)
        f.flush()
        TALLY.run("load_settings (file bytes)", lambda: load_settings(Path(f.name)), ConfigError)


@pytest.mark.parametrize("path", ["/nonexistent/config.toml", "/etc", "/dev/null"])
def test_unreadable_config_paths_are_one_config_error(path: str) -> None:
    TALLY.run("load_settings (path)", lambda: load_settings(Path(path)), ConfigError)

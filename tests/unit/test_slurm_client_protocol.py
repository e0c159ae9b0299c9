"""Every SlurmClient implementation has every method the daemon calls.

The daemon, actuators and CLI call Slurm only through ``SlurmClient`` (and the optional
``FullSignalClient`` / ``AccountingClient`` / ``PriorityConfigClient``). A client that
misses a method fails only when that call is reached: ``bench/observe.py``'s replay
client lacked ``version()`` once snapshots carried Slurm's release, and nothing ran it.
So: (1) every ``slurm.X(...)`` call in slurmgpu/ names a protocol method, and (2) every
class anywhere in slurmgpu/, tests/ and bench/ that lists jobs and nodes (the real
backends, the simulator's, fakes and replays) has every protocol method, with the
protocol's parameters.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from slurmgpu.slurm.client import AccountingClient, FullSignalClient, SlurmClient
from slurmgpu.slurm.config import PriorityConfigClient
from tests.script_module import load_script
from tests.source_tree import parsed, python_files, source

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = (SlurmClient, FullSignalClient, AccountingClient, PriorityConfigClient)


def _members(proto: type) -> set[str]:
    return {
        name for name, value in vars(proto).items() if callable(value) and not name.startswith("_")
    }


REQUIRED = _members(SlurmClient)
OPTIONAL = _members(FullSignalClient) | _members(AccountingClient) | _members(PriorityConfigClient)


def _is_slurm(node: ast.expr) -> bool:
    """``slurm``, ``self.slurm``, ``self._slurm``, ``x.slurm``: what holds a client."""
    if isinstance(node, ast.Name):
        return node.id in ("slurm", "_slurm")
    return isinstance(node, ast.Attribute) and node.attr in ("slurm", "_slurm")


def calls_on_slurm() -> dict[str, list[str]]:
    """Method name -> where slurmgpu/ calls it on a Slurm client."""
    found: dict[str, list[str]] = {}
    for path in python_files("slurmgpu"):
        for node in ast.walk(parsed(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and _is_slurm(node.func.value)
            ):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.setdefault(node.func.attr, []).append(where)
    return found


def _load(path: Path) -> ModuleType:
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ("slurmgpu", "tests"):
        return importlib.import_module(".".join(rel.with_suffix("").parts))
    name = "_bench_" + path.stem  # bench/ holds scripts, not a package
    if name in sys.modules:
        return sys.modules[name]
    return load_script(name, path)


def implementations() -> list[tuple[str, Path]]:
    """(class name, file) of every class that defines both ``jobs`` and ``nodes``."""
    out = []
    for top in ("slurmgpu", "tests", "bench"):
        for path in python_files(top):
            text = source(path)
            if "def jobs(" not in text or "def nodes(" not in text:
                continue  # cheap: a class defining both names needs both in its file
            for node in ast.walk(parsed(path)):
                if not isinstance(node, ast.ClassDef):
                    continue
                defined = {b.name for b in node.body if isinstance(b, ast.FunctionDef)}
                is_protocol = any(ast.unparse(b) == "Protocol" for b in node.bases)
                if {"jobs", "nodes"} <= defined and not is_protocol:
                    out.append((node.name, path))
    return out


IMPLEMENTATIONS = implementations()


def _params(fn: Any) -> list[tuple[str, Any]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind) for p in sig.parameters.values() if p.name != "self"]


def test_the_daemon_calls_slurm_only_through_the_protocols() -> None:
    calls = calls_on_slurm()
    # The scan must see the daemon's known calls, or it would pass on finding nothing.
    assert {"version", "jobs", "nodes", "update_job", "requeue", "release"} <= set(calls)
    unknown = {m: w for m, w in calls.items() if m not in REQUIRED | OPTIONAL}
    assert not unknown, f"called on a Slurm client but in no protocol: {unknown}"


def test_the_scan_finds_every_kind_of_client() -> None:
    names = {name for name, _ in IMPLEMENTATIONS}
    assert {
        "CliSlurmClient",
        "PySlurmClient",
        "SimSlurm",
        "FakeSlurm",
        "ReplaySlurmClient",
    } <= names, names


@pytest.mark.parametrize(
    ("name", "path"),
    IMPLEMENTATIONS,
    ids=[f"{p.relative_to(ROOT)}::{n}" for n, p in IMPLEMENTATIONS],
)
def test_every_client_has_every_protocol_method(name: str, path: Path) -> None:
    cls = getattr(_load(path), name)
    missing = sorted(m for m in REQUIRED if not callable(getattr(cls, m, None)))
    assert not missing, f"{name} lacks {missing} (the daemon calls them)"
    for proto in PROTOCOLS:
        for method in _members(proto):
            impl = getattr(cls, method, None)
            if impl is None:
                continue  # an optional protocol this client does not offer
            want = _params(getattr(proto, method))
            assert _params(impl) == want, f"{name}.{method} takes {_params(impl)}, not {want}"
    assert isinstance(cls.__new__(cls), SlurmClient)

"""The real-cluster tests run on the site profile unless a test says why not (issue 32).

A module of tests/slurm that takes the 4-node lab (the ``slurm_cluster`` fixture, or
``stack``, the daemon and agents on it) names its reason in a module-level
``DEFAULT_LAB = "..."`` string; a module on the site lab has none (no stale reason).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SLURM_TESTS = Path(__file__).resolve().parents[1] / "slurm"
DEFAULT_FIXTURES = frozenset({"slurm_cluster", "stack"})
MODULES = sorted(SLURM_TESTS.glob("test_*.py"))


def _uses_default_lab(tree: ast.Module) -> bool:
    """Whether any function of the module takes one of :data:`DEFAULT_FIXTURES`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(a.arg in DEFAULT_FIXTURES for a in args):
                return True
    return False


def _reason(tree: ast.Module) -> str | None:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "DEFAULT_LAB" for t in targets):
            assert isinstance(node, ast.Assign)
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
            return repr(value)  # not a plain string: the test refuses it below
    return None


def test_the_tier_has_modules_on_both_labs() -> None:
    uses = [_uses_default_lab(ast.parse(p.read_text())) for p in MODULES]
    assert any(uses) and not all(uses)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_module_on_the_4_node_lab_says_why(path: Path) -> None:
    tree = ast.parse(path.read_text())
    reason = _reason(tree)
    if _uses_default_lab(tree):
        assert reason is not None and not reason.startswith("<") and len(reason.split()) >= 4, (
            f"{path.name} takes the 4-node lab: say why not the site profile in "
            'DEFAULT_LAB = "..." (a line)'
        )
    else:
        assert reason is None, f"{path.name} does not take the 4-node lab: drop DEFAULT_LAB"

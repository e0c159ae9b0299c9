"""No module under tests/ imports from a test module (``test_*.py``).

Importing a test module re-runs its module-level set-up and drags its tests into another
file's namespace, and ties two unrelated files together: what tests share lives in helper
modules (tests/fakes.py, tests/unit/policy_builders.py, tests/slurm/harness.py, ...).
Read with ``ast``; imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_tree import parsed

TESTS = Path(__file__).resolve().parents[1]


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def imports_of_test_modules(path: Path) -> list[str]:
    """``path:line module`` for each import in ``path`` of a test module."""
    found: list[str] = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
            if node.module is None or node.level:  # ``from . import test_x``
                names += [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{path}:{node.lineno} {name}" for name in names if _is_test_module(name)]
    return found


def test_no_module_under_tests_imports_a_test_module() -> None:
    found = [hit for path in sorted(TESTS.rglob("*.py")) for hit in imports_of_test_modules(path)]
    assert not found, "move what is shared into a helper module:\n" + "\n".join(found)


def test_the_scan_finds_each_form_of_import(tmp_path: Path) -> None:
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "from tests.unit.test_eff import make_job\n"
        "import tests.unit.test_store\n"
        "from . import test_store\n"
        "from .test_store import jobs\n"
        "def f():\n"
        "    from tests.slurm.test_malleable_real import Lab\n"
        "from tests.unit.eff_records import make_job\n"
        "from tests.unit import policy_builders\n"
    )
    hits = sorted(hit.removeprefix(f"{planted}:") for hit in imports_of_test_modules(planted))
    assert hits == [
        "1 tests.unit.test_eff",
        "2 tests.unit.test_store",
        "3 test_store",
        "4 test_store",
        "6 tests.slurm.test_malleable_real",
    ]

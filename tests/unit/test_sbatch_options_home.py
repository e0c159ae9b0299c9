"""sbatch options have one home: slurmgpu/slurm/sbatch.py (issue 37, item 2).

Slurm's syntax is written only in ``slurmgpu/slurm/``. This scans every other module's
source with ``ast`` (nothing is imported) for a string literal, or an f-string whose text
starts with one, that begins like an sbatch option slurmgpu writes (``--gpus=``,
``--gres=``, ``--mem=``, ``--time=``, ``--signal=``, ``--nodes=``): such a string builds an
option by hand instead of asking :mod:`slurmgpu.slurm.sbatch`. Docstrings (and comments,
which ``ast`` does not keep) may name options freely. The shipped alert templates are
checked too: they spell options through the ``sbatch_*`` filters only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import slurmgpu
from tests.source_tree import parsed

PACKAGE = Path(slurmgpu.__file__).parent
OPTION_PREFIXES = ("--gpus=", "--gres=", "--mem=", "--time=", "--signal=", "--nodes=")
# In a template: an option written out, outside a {# comment #}.
_TEMPLATE_OPTION = re.compile(r"--(?:gpus|gres|mem|time|signal|nodes)=")
_TEMPLATE_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of the module, its classes and its functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                found.add(id(body[0].value))
    return found


def option_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each literal in ``source`` that starts like an sbatch option: a
    plain string, or the text an f-string starts with. Docstrings are left out."""
    return literals_in(ast.parse(source))


def literals_in(tree: ast.Module) -> list[tuple[int, str]]:
    """:func:`option_literals` of a parsed module."""
    skip = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            # its pieces are judged here, as one string: only its start counts
            skip.update(id(v) for v in node.values)
            head = node.values[0] if node.values else None
            text = head.value if isinstance(head, ast.Constant) else None
            if isinstance(text, str) and text.startswith(OPTION_PREFIXES):
                found.append((node.lineno, text))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and node.value.startswith(OPTION_PREFIXES)
        ):
            found.append((node.lineno, node.value))
    return sorted(found)


def test_the_scan_finds_hand_built_options_and_leaves_docstrings_alone() -> None:
    source = (
        '"""Module docs: ``--gpus=2``."""\n'
        "def f(k, sig, mib):\n"
        '    """Asks for ``--mem=4G``."""\n'
        '    a = f"--gpus={k}"\n'
        '    b = "--gres=shard:" + str(k)\n'
        '    c = f"--signal=B:{sig}@60"\n'
        '    d = f"run with {k} --time=1:00"  # not at the start: prose\n'
        '    e = f"{k}--mem={mib}"  # the text starts with a value\n'
        '    g = f"--nodes=1 --gpus={k}"\n'
        "    return a, b, c, d, e, g\n"
    )
    assert option_literals(source) == [
        (4, "--gpus="),
        (5, "--gres=shard:"),
        (6, "--signal=B:"),
        (9, "--nodes=1 --gpus="),
    ]


def test_no_module_outside_slurm_builds_sbatch_options() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "slurm":
            continue
        for line, text in literals_in(parsed(path)):
            found.append(f"slurmgpu/{rel}:{line}: {text!r}")
    assert found == [], (
        "sbatch options built outside slurmgpu/slurm/ (use slurmgpu.slurm.sbatch):\n"
        + "\n".join(found)
    )


def test_the_shipped_templates_spell_options_through_the_sbatch_filters() -> None:
    found = []
    for path in sorted((PACKAGE / "notify" / "templates").glob("*.txt")):
        text = _TEMPLATE_COMMENT.sub(  # keeping the line numbers
            lambda m: "\n" * m.group().count("\n"), path.read_text(encoding="utf-8")
        )
        for number, line in enumerate(text.splitlines(), 1):
            if _TEMPLATE_OPTION.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert found == [], "options written out in templates (use | sbatch_time etc.):\n" + (
        "\n".join(found)
    )

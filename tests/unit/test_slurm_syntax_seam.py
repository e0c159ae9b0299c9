"""Slurm's update syntax is written and read only in slurmgpu/slurm/.

Everything else hands typed intents (slurmgpu/intent.py) to ``SlurmClient.update_job``;
a Slurm field name spelt as a string anywhere else (``{"TimeLimit": ...}``,
``fields["Nice"]``, ``"AdminComment"``) means a caller renders or edits Slurm syntax
itself, which is what this test refuses.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import slurmgpu.intent as intent_module
from slurmgpu.intent import (
    Intent,
    NarrowToMps,
    NarrowToShards,
    Preempt,
    Resize,
    SetAdminComment,
    SetComment,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetNice,
    SetNodes,
    SetTimeLimit,
    StartSoon,
)
from slurmgpu.slurm.update import UPDATE_FIELDS, update_fields
from tests.source_tree import parsed

PACKAGE = Path(__file__).resolve().parents[2] / "slurmgpu"
SEAM = PACKAGE / "slurm"

# One of each intent an update carries (a resize or preemption is a transaction).
EACH_UPDATE: tuple[Intent, ...] = (
    SetTimeLimit(60),
    SetMemoryPerNode(1024),
    SetCpus(2),
    SetCpusPerNode(2),
    SetGpus(1),
    SetGpus(1, per_node=False),
    NarrowToShards(2),
    NarrowToMps(50),
    SetNodes(1),
    SetComment("c"),
    SetAdminComment("a"),
    SetNice(1),
    StartSoon(1),
)
# Update fields slurmgpu writes outside update_fields, or Slurm spells alike elsewhere.
OTHER_FIELDS = frozenset({"ArrayTaskThrottle", "Gres", "TresPerTask", "MinMemoryCPU"})


def field_names() -> frozenset[str]:
    return UPDATE_FIELDS | OTHER_FIELDS


def slurm_field_literals(package: Path, fields: frozenset[str]) -> list[str]:
    """``path:line: 'Field'`` for every string literal outside ``package/slurm`` that is a
    Slurm update field name, or a ``Field=value`` pair of one (f-string parts included)."""
    hits: list[tuple[str, int, str]] = []
    for path in sorted(package.rglob("*.py")):
        if (package / "slurm") in path.parents:
            continue
        tree = parsed(path)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            if text in fields or (text.partition("=")[0] in fields and "=" in text):
                hits.append((str(path.relative_to(package.parent)), node.lineno, text))
    return [f"{p}:{line}: {text!r}" for p, line, text in sorted(hits)]


def test_every_update_intent_is_covered_by_the_field_list() -> None:
    kinds = {
        cls
        for _, cls in inspect.getmembers(intent_module, inspect.isclass)
        if issubclass(cls, Intent) and cls is not Intent
    }
    assert kinds - {type(i) for i in EACH_UPDATE} == {Resize, Preempt}


def test_the_field_list_is_what_the_updates_write() -> None:
    """slurm/update.py's UPDATE_FIELDS (what the scan below looks for) names every field
    an intent is written as on either release, and no other."""
    written: set[str] = set()
    for i in EACH_UPDATE:
        written.update(update_fields((i,), "22.05.8"))
        written.update(update_fields((i,), "24.11.5"))
    assert written == UPDATE_FIELDS


def test_no_slurm_field_name_is_spelt_outside_slurmgpu_slurm() -> None:
    assert SEAM.is_dir()
    assert slurm_field_literals(PACKAGE, field_names()) == []


def test_the_scan_finds_a_field_name_where_one_is_spelt(tmp_path: Path) -> None:
    pkg = tmp_path / "slurmgpu"
    (pkg / "slurm").mkdir(parents=True)
    (pkg / "actuate").mkdir()
    (pkg / "slurm" / "update.py").write_text('F = {"TimeLimit": "1"}\n')
    (pkg / "actuate" / "x.py").write_text(
        'a = {"AdminComment": "x"}\nb = f"Nice={1}"\nc = fields.pop("TimeLimit")\nd = "Nice"\n'
        'ok = "the time limit"\n'
    )
    assert slurm_field_literals(pkg, field_names()) == [
        "slurmgpu/actuate/x.py:1: 'AdminComment'",
        "slurmgpu/actuate/x.py:2: 'Nice='",
        "slurmgpu/actuate/x.py:3: 'TimeLimit'",
        "slurmgpu/actuate/x.py:4: 'Nice'",
    ]

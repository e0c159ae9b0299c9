"""docs/architecture.md draws the layer order tests/unit/test_import_graph.py enforces
(the order itself is kept in tests/unit/import_graph.py).

The page's picture and its table are read back here and compared with ``LAYERS``, so the
page cannot drift from the code: a package moved in the test and not on the page (or the
other way round) fails.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.import_graph import LAYERS

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def table_layers(text: str) -> dict[str, int]:
    """Unit → layer from the ``| layer | packages | what |`` table under "## Layers"."""
    found: dict[str, int] = {}
    for line in _section(text, "Layers").splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if m:
            for name in re.findall(r"`([^`]+)`", m.group(2)):
                found[name.rstrip("/")] = int(m.group(1))
    return found


def picture_layers(text: str) -> dict[str, int]:
    """Unit → layer from the first drawing under "## The layers in one picture": a layer
    number in the first four columns, one unit per line in the name column (from the
    sixth), the leaves named on the ``leaves`` line and the lines continuing it."""
    block = _section(text, "The layers in one picture").split("```")[1]
    found: dict[str, int] = {}
    layer = -1
    in_leaves = False
    for line in block.splitlines():
        if not line.strip():
            continue
        if line[:4].strip():
            layer = int(line[:4])
        name, _, rest = line[5:].partition(" ")
        if name:
            in_leaves = name == "leaves"
            if not in_leaves:
                found[name.rstrip("/")] = layer
                continue
        if in_leaves:
            found.update(dict.fromkeys((rest if name else line).split(), layer))
    return found


def enforced() -> dict[str, int]:
    return {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def test_the_layer_table_is_the_one_the_import_graph_test_enforces() -> None:
    assert table_layers(DOC.read_text(encoding="utf-8")) == enforced()


def test_the_picture_puts_every_unit_on_its_layer() -> None:
    assert picture_layers(DOC.read_text(encoding="utf-8")) == enforced()


def test_the_readers_see_a_moved_package() -> None:
    """A page that put store/ on the cycle's layer, or left a leaf out, is told apart."""
    text = DOC.read_text(encoding="utf-8")
    moved = text.replace("| 5 | `store/` |", "| 4 | `store/` |")
    assert table_layers(moved)["store"] == 4 != enforced()["store"]
    dropped = text.replace("jobdiff nodeusage", "nodeusage")
    assert "jobdiff" not in picture_layers(dropped)
    assert picture_layers(text)["jobdiff"] == 0

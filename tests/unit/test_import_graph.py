"""The import graph of slurmgpu/: no circle anywhere, and policy/ is pure by import.

Built from the source with ``ast`` (nothing is imported): module-level imports, the ones
that run when a module is loaded, and the imports inside ``if TYPE_CHECKING:`` too. Those do
not run, but a circle through one is still a circle of the design (two modules that each
need the other to be read; issue 37 found settings.py <-> sizing.py hiding that way), and
mypy and every reader follow it. Imports inside functions (deliberately lazy ones) are left
out. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so those count as
edges too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

from tests.source_tree import parsed
from tests.unit.import_graph import (
    LAYERS,
    LEAF_LAYER,
    PACKAGE,
    from_module,
    import_graph,
    imported_names,
    slurmgpu_modules,
)

# policy/ decides; these packages talk to the world. Issue 21, item 2.
IO_PACKAGES = ("slurm", "store", "daemon", "actuate", "cli", "telemetry", "agent", "notify")

# Known policy → I/O imports not yet removed, each with the reason. Empty is the goal; an
# entry here is a debt the test names, not a silent pass (it fails if the import is gone).
POLICY_IO_ALLOWANCES: dict[tuple[str, str], str] = {}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_graph_sees_known_edges() -> None:
    """The builder itself works: edges every reader can check by eye are there."""
    graph = import_graph()
    assert "slurmgpu.policy.base" in graph["slurmgpu.policy"]
    assert "slurmgpu.config" in graph["slurmgpu.cli.context"]
    assert len(graph) > 100


def test_graph_counts_type_checking_imports(tmp_path: Path) -> None:
    """An import only type checkers read is still an edge of the circle test's graph (a
    circle through one is a circle of the design); the simulator's load test leaves it out,
    since nothing is loaded by it."""
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import slurmgpu.units\n"
        "if TYPE_CHECKING:\n"
        "    from slurmgpu.policy.priors import Estimate\n"
        "else:\n"
        "    import slurmgpu.tokens\n"
    )
    everything = imported_names("slurmgpu.mod", source)
    loaded = imported_names("slurmgpu.mod", source, type_checking=False)
    assert "slurmgpu.policy.priors.Estimate" in everything
    assert "slurmgpu.policy.priors.Estimate" not in loaded
    assert {"slurmgpu.units", "slurmgpu.tokens"} <= loaded <= everything


def test_cycle_detection_finds_a_planted_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_slurmgpu() -> None:
    circles = strongly_connected(import_graph())
    assert circles == [], "import circles (module level, TYPE_CHECKING too):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def test_policy_imports_nothing_that_does_io() -> None:
    graph = import_graph()
    found: set[tuple[str, str]] = set()
    for module, targets in graph.items():
        if not module.startswith("slurmgpu.policy"):
            continue
        for target in targets:
            if target.split(".")[1] in IO_PACKAGES:
                found.add((module, target))
    unexpected = sorted(found - POLICY_IO_ALLOWANCES.keys())
    assert unexpected == [], f"policy/ imports I/O modules: {unexpected}"
    stale = sorted(POLICY_IO_ALLOWANCES.keys() - found)
    assert stale == [], f"allowances no longer needed, remove them: {stale}"


def test_units_and_settings_table_are_leaves() -> None:
    """What every layer reads (durations, time limits, the table reader) depends on nothing."""
    graph = import_graph()
    assert graph["slurmgpu.units"] == set()
    assert graph["slurmgpu.settings_table"] == {"slurmgpu.units"}


# What the simulator may load from the I/O packages: value parsers and renderers of Slurm's
# syntax, the client protocol and its errors (SimSlurm implements it), the single-step
# executor the daemon uses too, and the GPU power model. Nothing that opens a database, a
# socket or a device. (The resize dispatcher and executors the simulator shares with the
# daemon live in cycle/, beside the transactions protocol they write through.)
# Function-level (lazy) imports, such as the sacct trace loader's, are not module-level
# edges and are left out.
SIM_IO_ALLOWED = frozenset(
    {
        "slurmgpu.slurm",
        "slurmgpu.slurm.client",
        "slurmgpu.slurm.parse",
        "slurmgpu.slurm.update",
        "slurmgpu.actuate",
        "slurmgpu.actuate.execute",
        "slurmgpu.actuate.separate",
        "slurmgpu.telemetry",
        "slurmgpu.telemetry.gpupower",
    }
)


def _closure(graph: dict[str, set[str]], roots: list[str]) -> dict[str, str]:
    """Every module loading ``roots`` loads → the module that imports it (a path back)."""
    via: dict[str, str] = {root: "" for root in roots}
    todo = list(roots)
    while todo:
        module = todo.pop()
        for target in sorted(graph.get(module, ())):
            if target not in via:
                via[target] = module
                todo.append(target)
    return via


def test_the_simulator_loads_no_io_module() -> None:
    graph = import_graph(type_checking=False)  # what is loaded: annotations load nothing
    via = _closure(graph, [m for m in graph if m.startswith("slurmgpu.sim")])
    bad = sorted(
        m
        for m in via
        if m.split(".")[1:2] and m.split(".")[1] in IO_PACKAGES
        if m not in SIM_IO_ALLOWED
    )

    def chain(module: str) -> str:
        out = [module]
        while via[out[-1]]:
            out.append(via[out[-1]])
        return " <- ".join(out)

    assert bad == [], "sim/ loads I/O modules:\n" + "\n".join(chain(m) for m in bad)
    assert "slurmgpu.sim.run" in via and "slurmgpu.actuate.execute" in via  # the walk ran


def test_the_simulator_runs_without_sqlalchemy_loaded() -> None:
    """The graph above sees slurmgpu's own modules; this sees third-party ones too."""
    code = (
        "import sys; import slurmgpu.sim.run, slurmgpu.sim.policysets, slurmgpu.sim.metrics; "
        "bad = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'sqlalchemy', 'alembic', 'psutil', 'pynvml', 'httpx', 'aiohttp'}); print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ---------------------------------------------------------------- layers (issue 37, item 4)


def _top_level_units() -> set[str]:
    """``store`` for slurmgpu/store/, ``model`` for slurmgpu/model.py (not __init__)."""
    return {
        path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts != ("__init__.py",)
    }


def _every_import(path: Path, package: str) -> list[tuple[str, int]]:
    """(dotted module, line) of every import in the file, wherever it stands."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = from_module(node, package)
            out.append((module, node.lineno))
            # ``from slurmgpu import store``: the name may be a package of its own
            if module == "slurmgpu":
                out.extend((f"slurmgpu.{alias.name}", node.lineno) for alias in node.names)
    return out


@cache
def unit_imports() -> dict[str, dict[str, list[str]]]:
    """Top-level unit → the other units it imports → where (``module:line``)."""
    found: dict[str, dict[str, list[str]]] = {}
    for name, path in slurmgpu_modules().items():
        parts = name.split(".")
        if len(parts) < 2:
            continue  # slurmgpu/__init__.py
        unit = parts[1]
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for module, line in _every_import(path, package):
            target = module.split(".")
            if target[0] != "slurmgpu" or len(target) < 2 or target[1] == unit:
                continue
            found.setdefault(unit, {}).setdefault(target[1], []).append(f"{name}:{line}")
    return found


def layer_violations(
    imports: dict[str, dict[str, list[str]]], layers: tuple[frozenset[str], ...]
) -> list[str]:
    level = {unit: i for i, layer in enumerate(layers) for unit in layer}
    bad: list[str] = []
    for unit, targets in sorted(imports.items()):
        for target, where in sorted(targets.items()):
            if target not in level or unit not in level:
                continue  # reported by the test that every unit has a layer
            mine, theirs = level[unit], level[target]
            if theirs > mine or (theirs == mine and mine != LEAF_LAYER):
                bad.append(f"{unit} (layer {mine}) imports {target} (layer {theirs}): {where[0]}")
    return bad


def test_every_package_and_top_level_module_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert sum(len(layer) for layer in LAYERS) == len(placed), "a unit in two layers"
    assert sorted(_top_level_units() - placed) == [], "add new packages to LAYERS and the doc"
    assert sorted(placed - _top_level_units()) == [], "LAYERS names units that are gone"


def test_layers_point_down_counting_type_checking_and_lazy_imports() -> None:
    bad = layer_violations(unit_imports(), LAYERS)
    assert bad == [], "imports that point up the layer order:\n" + "\n".join(bad)


def test_the_store_imports_nothing_from_the_layers_that_use_it() -> None:
    """Issue 37: store/ took the job diff from daemon/ and the SQL dialect from report/,
    and actuate/ wrote the actions table itself; the store's callers sit above it."""
    assert not unit_imports()["store"].keys() & {"daemon", "report", "actuate", "cli", "sim"}


def test_the_layer_check_finds_an_upward_import_even_under_type_checking(
    tmp_path: Path,
) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from slurmgpu.daemon.diff import JobDiff\n"
        "def f() -> None:\n"
        "    from ..report import sql_dialect\n"
        "from slurmgpu.model import Job\n"
    )
    path = tmp_path / "jobstore.py"
    path.write_text(source)
    found = sorted(m for m, _ in _every_import(path, "slurmgpu.store"))
    assert found == ["slurmgpu.daemon.diff", "slurmgpu.model", "slurmgpu.report", "typing"]
    imports = {"store": {"daemon": ["x:3"], "report": ["x:5"], "model": ["x:6"]}}
    assert layer_violations(imports, LAYERS) == [
        "store (layer 5) imports daemon (layer 8): x:3",
        "store (layer 5) imports report (layer 6): x:5",
    ]
    assert layer_violations({"slurm": {"telemetry": ["y:1"]}}, LAYERS) == [
        "slurm (layer 1) imports telemetry (layer 1): y:1"
    ]
    assert layer_violations({"tokens": {"checkpoint_signal": ["z:1"]}}, LAYERS) == []


def test_actuate_writes_through_the_store_never_sql_of_its_own() -> None:
    """The resize actuator linked its audit row to its transaction with its own UPDATE on
    the actions table; that is AuditStore.link_transaction now."""
    sql = sorted(
        f"{name}: {module}"
        for name, path in slurmgpu_modules().items()
        if name.startswith("slurmgpu.actuate")
        for module, _line in _every_import(path, name.rpartition(".")[0])
        if module.split(".")[0] == "sqlalchemy" or module.startswith("slurmgpu.store.schema")
    )
    assert sql == []

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

import slurmgpu

PACKAGE = Path(slurmgpu.__file__).parent

# policy/ decides; these packages talk to the world. Issue 21, item 2.
IO_PACKAGES = ("slurm", "store", "daemon", "actuate", "cli", "telemetry", "agent", "notify")

# Known policy → I/O imports not yet removed, each with the reason. Empty is the goal; an
# entry here is a debt the test names, not a silent pass (it fails if the import is gone).
POLICY_IO_ALLOWANCES: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("slurmgpu", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(name: str, path: Path, *, type_checking: bool = True) -> set[str]:
    """Dotted names ``name`` imports at module level; those in ``if TYPE_CHECKING:``
    blocks too unless ``type_checking`` is false (what loading the module runs)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                if type_checking or not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)  # a class body runs at import time

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


@cache  # the source does not change during a run; every test here reads the same graph
def import_graph(*, type_checking: bool = True) -> dict[str, set[str]]:
    """Module → the slurmgpu modules it imports (directly): with ``type_checking``, those
    its ``if TYPE_CHECKING:`` blocks name too; without, only those loading it loads first.
    Do not mutate it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for dotted in _imported_names(name, path, type_checking=type_checking):
            target = dotted
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target.startswith("slurmgpu"):
                continue
            # the packages above the target run their __init__ first; one's own are
            # already loading, so they are not edges of this module
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                step = ".".join(parts[:i])
                if step != name and not name.startswith(step + "."):
                    edges.add(step)
        graph[name] = edges
    return graph


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
    everything = _imported_names("slurmgpu.mod", source)
    loaded = _imported_names("slurmgpu.mod", source, type_checking=False)
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
# syntax, the client protocol and its errors (SimSlurm implements it), the one executor
# the daemon uses too, and the GPU power model. Nothing that opens a database, a socket
# or a device. Function-level (lazy) imports, such as the sacct trace loader's, are not
# module-level edges and are left out.
SIM_IO_ALLOWED = frozenset(
    {
        "slurmgpu.slurm",
        "slurmgpu.slurm.client",
        "slurmgpu.slurm.parse",
        "slurmgpu.slurm.update",
        "slurmgpu.actuate",
        "slurmgpu.actuate.confirm",
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

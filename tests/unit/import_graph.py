"""slurmgpu's import graph, read from the source with ast (nothing is imported)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import slurmgpu
from tests.source_tree import parsed

PACKAGE = Path(slurmgpu.__file__).parent


def slurmgpu_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("slurmgpu", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The dotted module a ``from ... import`` statement in ``package`` reads from."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_names(name: str, path: Path, *, type_checking: bool = True) -> set[str]:
    """Dotted names ``name`` imports at module level; those in ``if TYPE_CHECKING:``
    blocks too unless ``type_checking`` is false (what loading the module runs)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = from_module(node, package)
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                if type_checking or not is_type_checking(node.test):
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

    visit(parsed(path).body)
    return names


@cache  # the source does not change during a run; every test here reads the same graph
def import_graph(*, type_checking: bool = True) -> dict[str, set[str]]:
    """Module → the slurmgpu modules it imports (directly): with ``type_checking``, those
    its ``if TYPE_CHECKING:`` blocks name too; without, only those loading it loads first.
    Do not mutate it."""
    modules = slurmgpu_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for dotted in imported_names(name, path, type_checking=type_checking):
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


# The layer order of docs/architecture.md, bottom first: a package (or top-level module)
# imports only from layers below its own; the leaves may import each other (the circle
# test above keeps them acyclic). Unlike the graph above, this counts EVERY import
# statement: ``if TYPE_CHECKING:`` ones and function-level (lazy) ones too, since a
# layer that names an upper layer only for its types still depends on it.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset(  # leaves: values and pure helpers every layer may read
        {
            "boundedjson",
            "checkpoint_signal",
            "intent",
            "jobdiff",
            "listen_address",
            "model",
            "nodeusage",
            "plaintext",
            "replyauth",
            "settings_table",
            "stop_flag",
            "tokens",
            "units",
            "userfiles",
            "userinput_stats",
            "whatif_figures",
            "wire",
        }
    ),
    frozenset({"slurm", "telemetry"}),  # the outside world's syntax and devices
    frozenset({"policy"}),  # pure decisions
    frozenset({"elastic"}),  # the jobs' own runtime (goodput from policy)
    frozenset({"cycle"}),  # the one policy cycle, its protocols
    frozenset({"store"}),  # SQL: jobs, samples, audit, transactions
    # act on Slurm, tell people, read the store; Prometheus rules and Grafana dashboard
    frozenset({"actuate", "notify", "report", "monitoring"}),
    frozenset({"agent", "config", "lab", "sim"}),  # node agent, composition, lab, simulator
    frozenset({"daemon"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)
LEAF_LAYER = 0

"""Lab tooling stays out of the product: only the commands that front it import slurmgpu.lab.

The daemon, the agents and the policies must run without the lab cluster, the fake load or
the bench record (issue 21, item 5); ``sgpu cluster`` and ``sgpu fakeload`` are the two
doors into it.
"""

from __future__ import annotations

from tests.unit.import_graph import import_graph

LAB_DOORS = frozenset({"slurmgpu.cli.cluster", "slurmgpu.cli.fakeload"})


def test_only_the_lab_commands_import_the_lab_package() -> None:
    graph = import_graph()
    assert "slurmgpu.lab.cluster.launcher" in graph  # the lab is where it is said to be
    importers = {
        module
        for module, targets in graph.items()
        if not module.startswith("slurmgpu.lab")
        and any(t == "slurmgpu.lab" or t.startswith("slurmgpu.lab.") for t in targets)
    }
    assert importers == LAB_DOORS, f"lab tooling imported by {sorted(importers - LAB_DOORS)}"

"""One comparison for ``sgpu whatif`` and the report's whatif section: the numbers' one path.

:func:`compare` takes the window's stored jobs and nodes (plain values from
:func:`slurmgpu.store.whatif.read_window`), builds the simulated cluster, replays the jobs
under plain Slurm and each policy set over the seeds, and returns
:class:`~slurmgpu.whatif_figures.WhatifFigures`: per set the GPU-hours returned (± half
the range over the seeds), the changes in mean wait and JCT, p99 JCT, energy and jobs
touched, and the notes that qualify them (the fidelity caveat first). Pure: no store, no
terminal; the caller reads the store and shows the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from slurmgpu.sim.costs import DEFAULT, cost_set
from slurmgpu.sim.fromstore import StoredJobLike, priors, savings, to_trace
from slurmgpu.sim.metrics import RunSummary, summarise
from slurmgpu.sim.policysets import known_sets
from slurmgpu.sim.run import ClusterShape, SimOptions, simulate
from slurmgpu.whatif_figures import WhatifFigures

__all__ = ["DEFAULT_POLICIES", "FIDELITY", "MeteredJob", "Progress", "compare", "site_shape"]

DEFAULT_POLICIES = ("rightsize", "colocate", "malleable", "all")
FIDELITY = (
    "simulator figures, not measurements: against one real replay on Slurm 22.05 the "
    "simulator's mean JCT was within 10 %, its p99 and makespan 11-28 % short "
    "(docs/simulator.md); jobs replay at their real run time and asked-for GPUs, with "
    "the util their summaries recorded"
)

# (policy set, jobs submitted so far over every seed of that set, jobs x seeds)
Progress = Callable[[str, int, int], None]


class MeteredJob(StoredJobLike, Protocol):
    """A stored job as :func:`compare` reads it: the trace fields plus the meters."""

    @property
    def energy_j(self) -> float | None: ...
    @property
    def has_usage(self) -> bool: ...


def site_shape(node_gpus: Sequence[int], shards_per_gpu: Sequence[int]) -> tuple[ClusterShape, str]:
    """The simulated cluster of the stored GPU nodes and a note saying how it was built;
    ValueError when no GPU node is stored."""
    spg = max(shards_per_gpu, default=4) or 4
    try:
        shape = ClusterShape.of_nodes(node_gpus, spg)
    except ValueError:
        raise ValueError(
            "no GPU nodes in the store to infer the cluster from; give --cluster NxG"
        ) from None
    nodes = f"{shape.nodes} stored GPU node" + ("s" if shape.nodes != 1 else "")
    return shape, f"cluster {shape.text()} (the {nodes}, each at its own GPU count)"


def compare(
    runs: Sequence[MeteredJob],
    shape: ClusterShape,
    *,
    window: str,
    shape_note: str,
    policies: Sequence[str] = DEFAULT_POLICIES,
    seeds: int = 3,
    progress: Progress | None = None,
) -> WhatifFigures:
    """Replay ``runs`` on ``shape`` under plain Slurm and each of ``policies``."""
    unknown = [p for p in policies if p not in known_sets()]
    if unknown or not policies:
        raise ValueError(
            f"unknown policy set {', '.join(unknown) or '(none)'}; known: {', '.join(known_sets())}"
        )
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, not {seeds}")
    without = sum(1 for r in runs if not r.has_usage)
    notes = [FIDELITY, shape_note]
    if without:
        notes.append(
            f"{without} of {len(runs)} jobs have no usage summary: replayed at 100 % util "
            "(nothing to rightsize or share), so savings are understated"
        )
    metered = [r.energy_j for r in runs if r.energy_j is not None]
    measured_kwh = sum(metered) / 3.6e6 if metered else None
    notes.append(
        "energy: the simulator's own GPU power model, not the meters; "
        + (
            f"the {len(metered)} metered jobs of the window used {measured_kwh:,.1f} kWh"
            if measured_kwh is not None
            else "no job of the window has metered energy"
        )
    )
    if seeds > 1:
        notes.append(
            f"means over {seeds} seeds (seeds draw the missing time limits and the "
            "simulator's random choices); ± is half the range of GPU-hours returned"
        )
    costs = cost_set(DEFAULT)  # the measured costs, as sgpu simulate's default
    notes.append(f"costs: {costs.label} ({costs.about}; sgpu simulate --help lists the sets)")
    options = SimOptions.of_costs(costs, record_decisions=True, history=priors(runs))
    order = ["slurm", *(p for p in policies if p != "slurm")]
    results: dict[str, list[RunSummary]] = {name: [] for name in order}
    touched: dict[str, list[int]] = {name: [] for name in order}
    traces = [
        to_trace(runs, seed=seed, gpus_per_node=shape.gpus_per_node, max_gpus=shape.gpus)
        for seed in range(1, seeds + 1)
    ]
    for name in order:
        for i, trace in enumerate(traces):

            def tick(done: int, total: int, i: int = i, name: str = name) -> None:
                if progress is not None:
                    progress(name, i * total + done, total * seeds)

            began = time.perf_counter()
            run = simulate(trace, shape, name, options, progress=tick)
            results[name].append(summarise(run, time.perf_counter() - began))
            touched[name].append(
                len({d.job_id for d in run.decisions if d.outcome in ("done", "started")})
            )
    base = results["slurm"]
    return WhatifFigures(
        window=window,
        jobs=len(runs),
        jobs_without_usage=without,
        cluster=shape.text(),
        seeds=seeds,
        measured_energy_kwh=measured_kwh,
        rows=tuple(savings(base, results[name], touched[name]) for name in order),
        notes=tuple(notes),
    )

"""What ``sgpu whatif`` found, as plain values: one policy set's figures and the whole run.

A leaf so that the three places that show the figures read the same values: the CLI's
table and JSON (``sgpu whatif``), and the report's HTML section (``sgpu report --whatif``,
slurmgpu/report/, which sits below the simulator that computes them in
slurmgpu/sim/whatif.py). :meth:`WhatifFigures.as_json` is the ``--json`` document.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Savings", "WhatifFigures", "signed_duration"]

JsonValue = float | int | str | None


def signed_duration(s: float) -> str:
    """``+1.64 h`` from 600 s up, ``-42 s`` below, ``-`` for NaN: how both the table and
    the HTML show waits, JCTs and their changes."""
    if math.isnan(s):
        return "-"
    return f"{s / 3600:+.2f} h" if abs(s) >= 600 else f"{s:+.0f} s"


@dataclass(frozen=True, slots=True)
class Savings:
    """One policy set against plain Slurm (positive ``*_saved``: the set did better)."""

    policy_set: str
    gpu_hours: float
    gpu_hours_returned: float
    avg_queue_s: float
    avg_queue_saved_s: float
    avg_jct_s: float
    avg_jct_saved_s: float
    p99_jct_s: float
    p99_jct_saved_s: float
    energy_kwh: float
    energy_saved_kwh: float
    jobs_touched: int
    actions: int
    gpu_hours_spread: float = 0.0  # half the range of GPU-hours returned over the seeds

    @property
    def is_baseline(self) -> bool:
        return self.policy_set == "slurm"

    def as_dict(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {}
        for k in self.__slots__:
            v = getattr(self, k)
            out[k] = None if isinstance(v, float) and math.isnan(v) else v
        return out


@dataclass(frozen=True, slots=True)
class WhatifFigures:
    """Every set of one comparison (``slurm`` first), and the notes that qualify them."""

    window: str
    jobs: int
    jobs_without_usage: int
    cluster: str
    seeds: int
    measured_energy_kwh: float | None
    rows: tuple[Savings, ...]
    notes: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "window": self.window,
            "jobs": self.jobs,
            "jobs_without_usage": self.jobs_without_usage,
            "cluster": self.cluster,
            "seeds": self.seeds,
            "measured_energy_kwh": self.measured_energy_kwh,
            "sets": {r.policy_set: r.as_dict() for r in self.rows},
            "notes": list(self.notes),
        }

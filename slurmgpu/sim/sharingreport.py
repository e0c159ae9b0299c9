"""The sharing-mode comparison: one trace, the same GPUs shared as none, shards, MPS or
MIG (:mod:`slurmgpu.sim.sharing`), each policy set's figures per mode.

:func:`narrowed` counts the jobs that ran on a share (a MIG slice, an MPS share, shards)
from SimSlurm's runs; :func:`sharing_table` and :func:`sharing_doc` render the rows for
the terminal and JSON. Pure: text and rich renderables, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from slurmgpu.sim.metrics import RunSummary
from slurmgpu.sim.state import SimJob

__all__ = ["SHARE_KINDS", "SharingRow", "narrowed", "sharing_doc", "sharing_table"]

SHARE_KINDS = ("mig", "mps", "shard")


def narrowed(jobs: Iterable[SimJob]) -> dict[str, int]:
    """Jobs whose last run held a share of a GPU, by kind (``mig``, ``mps``, ``shard``).

    A job's last run is the one that finished it: one narrowed, then separated onto a
    whole GPU, counts as whole.
    """
    out = dict.fromkeys(SHARE_KINDS, 0)
    for job in jobs:
        if job.runs and job.runs[-1].kind in out:
            out[job.runs[-1].kind] += 1
    return out


@dataclass(frozen=True, slots=True)
class SharingRow:
    """One policy set on one sharing mode: its summary (means over the seeds) and the
    jobs that ran on a share, by kind (means over the seeds)."""

    mode: str
    summary: RunSummary
    narrowed: Mapping[str, float]

    @property
    def policy_set(self) -> str:
        return self.summary.policy_set

    @property
    def jobs_narrowed(self) -> float:
        return sum(self.narrowed.values())


def _dur(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v / 3600:.2f} h" if v >= 3600 else f"{v:,.0f} s"


def _count(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def sharing_table(rows: Sequence[SharingRow], title: str) -> Table:
    """Per set and mode: avg JCT (and its change from the same set on ``none``), p99
    JCT, makespan, GPU-hours held, used utilisation and the jobs narrowed per kind."""
    table = Table(title=title, title_justify="left")
    table.add_column("policy set", style="bold")
    table.add_column("sharing")
    for heading in ("avg JCT", "p99 JCT", "makespan", "GPU-h", "used util", "narrowed"):
        table.add_column(heading, justify="right")
    for heading in ("mig", "mps", "shards"):
        table.add_column(heading, justify="right")
    plain = {r.policy_set: r.summary.avg_jct_s for r in rows if r.mode == "none"}
    for r in rows:
        s = r.summary
        avg = _dur(s.avg_jct_s)
        base = plain.get(r.policy_set)
        if r.mode != "none" and base and not math.isnan(s.avg_jct_s):
            avg += f" ({(s.avg_jct_s / base - 1) * 100:+.0f}%)"
        table.add_row(
            r.policy_set,
            r.mode,
            avg,
            _dur(s.p99_jct_s),
            _dur(s.makespan_s),
            f"{s.gpu_hours:,.1f}",
            f"{s.used_util_pct:.1f} %",
            _count(r.jobs_narrowed),
            *(_count(r.narrowed.get(k, 0)) for k in SHARE_KINDS),
        )
    return table


def sharing_doc(rows: Sequence[SharingRow]) -> list[dict[str, object]]:
    """The rows for JSON: mode, set, the jobs narrowed by kind and every summary figure
    (a NaN as null)."""
    out: list[dict[str, object]] = []
    for r in rows:
        figures = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in r.summary.as_dict().items()
        }
        out.append(
            {
                "mode": r.mode,
                "policy_set": r.policy_set,
                "jobs_narrowed": r.jobs_narrowed,
                "narrowed": dict(r.narrowed),
                "figures": figures,
            }
        )
    return out

"""The efficiency report as terminal tables, CSV and JSON (HTML: html_page.py).

Renderers only format what :func:`~slurmgpu.report.build.build_report` computed; they
never aggregate.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from slurmgpu.plaintext import csv_cell, plain
from slurmgpu.report.build import FLAGS, Figures, JobRow, Report
from slurmgpu.report.energy_section import EnergyFigures, EnergySection

JSON_VERSION = 1
HIST_BAR_WIDTH = 30
# The table lists this many groups (most allocated first); CSV, JSON and HTML list all.
TABLE_GROUPS = 40

__all__ = ["JSON_VERSION", "duration_text", "render_table", "to_csv", "to_json"]


def duration_text(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3.5h``, ``2.1d``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _h(value: float | None) -> str:
    """GPU-hours: one decimal, two below one hour (a small window's 0.05 is not 0.0)."""
    if value is None:
        return "-"
    return f"{value:,.1f}" if value == 0 or abs(value) >= 1 else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _eff_style(pct: float | None) -> str:
    if pct is None:
        return "dim"
    return "red" if pct <= 15 else ("yellow" if pct < 50 else "green")


def wait_bin_label(lo_s: float, hi_s: float | None) -> str:
    if hi_s is None:
        return f">= {duration_text(lo_s)}"
    return (
        f"< {duration_text(hi_s)}" if lo_s == 0 else f"{duration_text(lo_s)}-{duration_text(hi_s)}"
    )


def _figures_json(f: Figures) -> dict[str, Any]:
    out = asdict(f)
    out["efficiency_pct"] = f.efficiency_pct
    return out


def _job_json(j: JobRow) -> dict[str, Any]:
    out = asdict(j)
    out["flags"] = list(j.flags)
    return out


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def to_json(report: Report) -> dict[str, Any]:
    """The report as a stable JSON document (``version`` changes when fields do)."""
    return {
        "version": JSON_VERSION,
        "cluster": report.cluster,
        "since": _iso(report.since),
        "until": _iso(report.until),
        "by": report.by,
        "generated_at": _iso(report.generated_at),
        "bucket_s": report.bucket_s,
        "shards_per_gpu": report.shards_per_gpu,
        "mps_per_gpu": report.mps_per_gpu,
        "thresholds": asdict(report.thresholds),
        "totals": _figures_json(report.totals),
        "groups": [{"name": g.name, **_figures_json(g.figures)} for g in report.groups],
        "top_wasters": [
            {
                "name": w.group.name,
                **_figures_json(w.group.figures),
                "worst_jobs": [_job_json(j) for j in w.worst],
            }
            for w in report.wasters
        ],
        "flagged_jobs": [_job_json(j) for j in report.flagged],
        "efficiency_histogram": [asdict(b) for b in report.histogram],
        "series": [
            {**asdict(p), "start": _iso(p.start), "efficiency_pct": p.efficiency_pct}
            for p in report.series
        ],
        "queue_waits": [asdict(b) for b in report.waits],
        "actions": [asdict(a) for a in report.actions],
        "actions_over_time": [{**asdict(p), "start": _iso(p.start)} for p in report.action_series],
        "reclaimed": [asdict(r) for r in report.reclaimed],
        "energy": _energy_json(report.energy),
        "notes": list(report.notes),
    }


def _energy_figures_json(f: EnergyFigures) -> dict[str, Any]:
    return {
        "jobs": f.jobs,
        "jobs_measured": f.jobs_measured,
        "kwh": round(f.kwh, 4),
        "idle_kwh": round(f.idle_kwh, 4),
        "idle_pct": None if f.idle_pct is None else round(f.idle_pct, 1),
        "kwh_per_job": None if f.kwh_per_job is None else round(f.kwh_per_job, 4),
    }


def _energy_json(energy: EnergySection | None) -> dict[str, Any] | None:
    """GPU energy: totals and one entry per group (most kWh first); null when not computed."""
    if energy is None:
        return None
    return {
        "totals": _energy_figures_json(energy.totals),
        "groups": [{"name": g.name, **_energy_figures_json(g.figures)} for g in energy.groups],
    }


CSV_FIELDS = (
    "group",
    "jobs",
    "jobs_with_usage",
    "gpu_hours_allocated",
    "gpu_hours_used",
    "gpu_hours_idle",
    "gpu_hours_unused",
    "efficiency_pct",
    "jobs_flagged",
    *(f"flag_{f.replace('-', '_')}" for f in FLAGS),
    "wait_mean_s",
    "wait_max_s",
    "jobs_with_energy",
    "energy_kwh",
    "idle_energy_kwh",
)


def _csv_row(name: str, f: Figures, e: EnergyFigures | None = None) -> list[Any]:
    def num(x: float | None) -> str:
        return "" if x is None else f"{x:.4f}"

    return [
        name,
        f.jobs,
        f.jobs_with_usage,
        num(f.gpu_hours_allocated),
        num(f.gpu_hours_used),
        num(f.gpu_hours_idle),
        num(f.gpu_hours_unused),
        num(f.efficiency_pct),
        f.jobs_flagged,
        *(f.flags[flag] for flag in FLAGS),
        num(f.wait_mean_s),
        num(f.wait_max_s),
        "" if e is None else e.jobs_measured,
        "" if e is None or not e.jobs_measured else num(e.kwh),
        "" if e is None or not e.jobs_measured else num(e.idle_kwh),
    ]


def to_csv(report: Report) -> str:
    """One row per group (column ``group``: the user, account or partition), then ``TOTAL``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    energy = report.energy.by_name() if report.energy is not None else {}
    for g in report.groups:
        w.writerow(_csv_row(csv_cell(g.name), g.figures, energy.get(g.name)))
    total = report.energy.totals if report.energy is not None else None
    w.writerow(_csv_row("TOTAL", report.totals, total))
    return buf.getvalue()


def _summary(report: Report) -> Table:
    t = report.totals
    table = Table(title="GPU-hours", show_header=False, box=None, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("finished GPU jobs", f"{t.jobs:,} ({t.jobs_with_usage:,} with usage)")
    table.add_row("allocated", _h(t.gpu_hours_allocated))
    table.add_row("used", _h(t.gpu_hours_used))
    table.add_row("idle", _h(t.gpu_hours_idle))
    table.add_row("unused (allocated - used)", _h(t.gpu_hours_unused))
    table.add_row("efficiency", Text(_pct(t.efficiency_pct), style=_eff_style(t.efficiency_pct)))
    table.add_row(
        "jobs flagged",
        f"{t.jobs_flagged:,}: " + ", ".join(f"{k} {v:,}" for k, v in t.flags.items()),
    )
    table.add_row(
        "queue wait", f"mean {duration_text(t.wait_mean_s)}, max {duration_text(t.wait_max_s)}"
    )
    return table


def _groups(report: Report) -> Table:
    shown = report.groups[:TABLE_GROUPS]
    more = len(report.groups) - len(shown)
    caption = f"and {more:,} more: every {report.by} is in --format csv, json and html"
    table = Table(
        title=f"By {report.by}" + (f" (the {len(shown)} with most GPU-hours)" if more else ""),
        title_justify="left",
        caption=caption if more else None,
        caption_justify="left",
    )
    for name in ("", "jobs", "allocated", "used", "idle", "unused", "eff", "flagged", "wait"):
        table.add_column(name or report.by, justify="left" if not name else "right")
    for g in shown:
        f = g.figures
        table.add_row(
            plain(g.name or "-"),
            f"{f.jobs:,}",
            _h(f.gpu_hours_allocated),
            _h(f.gpu_hours_used),
            _h(f.gpu_hours_idle),
            _h(f.gpu_hours_unused),
            Text(_pct(f.efficiency_pct), style=_eff_style(f.efficiency_pct)),
            f"{f.jobs_flagged:,}",
            duration_text(f.wait_mean_s),
        )
    return table


def _kwh(value: float) -> str:
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def _energy(report: Report) -> Table | None:
    """GPU energy by group (those with most kWh first), with the total."""
    e = report.energy
    if e is None or not e.totals.jobs_measured:
        return None
    shown = [g for g in e.groups if g.figures.jobs_measured][:TABLE_GROUPS]
    table = Table(title=f"GPU energy by {report.by}", title_justify="left")
    for name in ("", "jobs measured", "kWh", "idle kWh", "idle", "kWh/job"):
        table.add_column(name or report.by, justify="left" if not name else "right")

    def row(name: str, f: EnergyFigures, style: str = "") -> None:
        table.add_row(
            name,
            f"{f.jobs_measured:,} of {f.jobs:,}",
            _kwh(f.kwh),
            _kwh(f.idle_kwh),
            _pct(f.idle_pct),
            "-" if f.kwh_per_job is None else _kwh(f.kwh_per_job),
            style=style,
        )

    for g in shown:
        row(g.name or "-", g.figures)
    row("total", e.totals, "bold")
    return table


def _jobs_table(title: str, jobs: tuple[JobRow, ...], group: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    if group is not None:
        table.add_column(group)
    for name in ("job", "user", "partition", "GPUs", "run", "alloc", "unused", "util", "flags"):
        table.add_column(name, justify="right" if name in {"GPUs", "alloc", "unused"} else "left")
    return table


def _add_job(table: Table, j: JobRow, group: str | None = None) -> None:
    cells: list[RenderableType] = [] if group is None else [plain(group)]
    cells += [
        str(j.job_id),
        plain(j.user),
        plain(j.partition),
        f"{round(j.gpus, 3):g}",
        duration_text(j.elapsed_s),
        _h(j.gpu_hours_allocated),
        _h(j.gpu_hours_unused),
        Text(_pct(j.util_pct), style=_eff_style(j.util_pct)),
        ", ".join(j.flags) or "-",
    ]
    table.add_row(*cells)


def _histogram(report: Report) -> Table:
    table = Table(title="Efficiency distribution (mean GPU util)", title_justify="left")
    table.add_column("util")
    table.add_column("jobs", justify="right")
    table.add_column("GPU-hours", justify="right")
    table.add_column("")
    top = max((b.gpu_hours for b in report.histogram), default=0.0) or 1.0
    for b in report.histogram:
        label = "unknown" if b.lo_pct is None else f"{b.lo_pct:.0f}-{b.hi_pct:.0f}%"
        bar = "#" * round(HIST_BAR_WIDTH * b.gpu_hours / top)
        table.add_row(label, f"{b.jobs:,}", _h(b.gpu_hours), bar)
    return table


def _waits(report: Report) -> Table:
    table = Table(title="Queue waits", title_justify="left")
    table.add_column("wait")
    table.add_column("jobs", justify="right")
    for b in report.waits:
        table.add_row(wait_bin_label(b.lo_s, b.hi_s), f"{b.jobs:,}")
    return table


def _actions(report: Report) -> RenderableType:
    table = Table(title="Actions", title_justify="left")
    for name in ("policy", "kind", "mode", "outcome", "count"):
        table.add_column(name, justify="right" if name == "count" else "left")
    for a in report.actions:
        table.add_row(a.policy, a.kind, a.mode, a.outcome, f"{a.count:,}")
    if not report.actions:
        table.add_row("-", "no decisions in this window", "", "", "")
    reclaimed = Table(title="What the executed actions reclaimed (estimates)", title_justify="left")
    for name in ("policy", "kind", "actions", "estimated", "GPU-h returned", "reservation GPU-h"):
        reclaimed.add_column(name, justify="left" if name in {"policy", "kind"} else "right")
    for r in report.reclaimed:
        reclaimed.add_row(
            r.policy,
            r.kind,
            f"{r.actions:,}",
            f"{r.estimated:,}",
            _h(r.gpu_hours_returned),
            _h(r.reserved_gpu_hours_released),
        )
    if not report.reclaimed:
        reclaimed.add_row("-", "no executed action in this window", "", "", "", "")
    return Group(table, Text(""), reclaimed, Text("queue time saved: not estimated", style="dim"))


def header_text(report: Report) -> str:
    cluster = f" of cluster {report.cluster}" if report.cluster else ""
    return (
        f"slurmgpu report{cluster}: jobs that ended {report.since:%Y-%m-%d %H:%M} to "
        f"{report.until:%Y-%m-%d %H:%M} UTC"
    )


def render_table(report: Report) -> RenderableType:
    """Every section as rich tables, in the order an admin reads them."""
    parts: list[RenderableType] = [Text(header_text(report), style="bold"), _summary(report)]
    parts.append(_groups(report))
    energy = _energy(report)
    if energy is not None:
        parts.append(energy)
    wasters = _jobs_table("Top wasters (unused GPU-hours) and their worst jobs", (), report.by)
    for w in report.wasters:
        label = f"{w.group.name or '-'} ({_h(w.group.figures.gpu_hours_unused)} h)"
        for j in w.worst:
            _add_job(wasters, j, label)
            label = ""
    if report.wasters:
        parts.append(wasters)
    flagged = _jobs_table("Flagged jobs", report.flagged)
    for j in report.flagged:
        _add_job(flagged, j)
    if report.flagged:
        parts.append(flagged)
    parts += [_histogram(report), _waits(report), _actions(report)]
    parts += [Text(f"note: {n}", style="yellow") for n in report.notes]
    spaced: list[RenderableType] = []
    for p in parts:
        spaced += [p, Text("")]
    return Group(*spaced)

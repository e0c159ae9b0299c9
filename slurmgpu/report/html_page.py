"""The efficiency report as one self-contained HTML file: inline CSS, inline SVG charts.

Clusters are often offline, so the page fetches nothing: no script, no font, no image,
no stylesheet from anywhere. The charts are SVG drawn here, server-side, so they show in
any browser (and in a mail client) without JavaScript. Every chart is an ``<svg>`` with
``data-chart="NAME"``, its marks ``<rect>``/``<polyline>`` with ``class="mark"``. With
``sgpu report --whatif`` a last section shows the :class:`~slurmgpu.whatif_figures.
WhatifFigures` of the window (one ``<tr data-set="SET">`` per policy set), the values
``sgpu whatif`` prints, formatted by the same helper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from slurmgpu.plaintext import shown, template_finalize
from slurmgpu.report.build import Report
from slurmgpu.report.render import duration_text, header_text, wait_bin_label
from slurmgpu.whatif_figures import WhatifFigures, signed_duration

__all__ = ["render_html"]

WIDTH = 760
BAR_H = 18
COLORS = {
    "used": "#2f7d32",
    "unused": "#e0a030",
    "unknown": "#b0b0b0",
    "allocated": "#9ab7d3",
    "idle": "#c62828",
    "done": "#2f7d32",
    "notified": "#1f77b4",
    "skipped": "#b0b0b0",
    "failed": "#c62828",
    "pending": "#7e57c2",
}
_OTHER = "#6d4c41"


def _num(x: float) -> str:
    return f"{x:.1f}"


def _text(x: float, y: float, s: str, *, anchor: str = "start", size: int = 11) -> str:
    return (
        f'<text x="{_num(x)}" y="{_num(y)}" font-size="{size}" '
        f'text-anchor="{anchor}">{escape(shown(s))}</text>'
    )


def _rect(x: float, y: float, w: float, h: float, color: str, title: str) -> str:
    return (
        f'<rect class="mark" x="{_num(x)}" y="{_num(y)}" width="{_num(max(w, 0.0))}" '
        f'height="{_num(max(h, 0.0))}" fill="{color}"><title>{escape(shown(title))}</title></rect>'
    )


def _svg(name: str, height: float, body: Sequence[str], label: str) -> Markup:
    # Safe: every text in ``body`` went through escape(), every number through _num().
    return Markup(  # noqa: S704
        f'<svg data-chart="{name}" role="img" aria-label="{escape(label)}" '
        f'width="{WIDTH}" height="{_num(height)}" viewBox="0 0 {WIDTH} {_num(height)}">'
        + "".join(body)
        + "</svg>"
    )


def _legend(x: float, y: float, items: Sequence[tuple[str, str]]) -> list[str]:
    out = []
    for label, color in items:
        out.append(f'<rect x="{_num(x)}" y="{_num(y - 9)}" width="10" height="10" fill="{color}"/>')
        out.append(_text(x + 14, y, label))
        x += 24 + 7 * len(label)
    return out


def _empty(name: str, what: str) -> Markup:
    return _svg(name, 40, [_text(10, 25, f"no {what} in this window")], what)


def chart_groups(report: Report, limit: int = 15) -> Markup:
    """Horizontal bars per group: used, unused (usage known) and unknown GPU-hours."""
    groups = [g for g in report.groups if g.figures.gpu_hours_allocated > 0][:limit]
    if not groups:
        return _empty("gpu-hours-by-group", "GPU-hours")
    label_w, right = 150.0, 70.0
    scale = (WIDTH - label_w - right) / max(g.figures.gpu_hours_allocated for g in groups)
    body = _legend(label_w, 14, [(k, COLORS[k]) for k in ("used", "unused", "unknown")])
    y = 26.0
    for g in groups:
        f = g.figures
        unknown = f.gpu_hours_allocated - f.gpu_hours_with_usage
        unused = max(f.gpu_hours_with_usage - f.gpu_hours_used, 0.0)
        x = label_w
        body.append(_text(label_w - 6, y + 13, g.name or "-", anchor="end"))
        for part, hours in (("used", f.gpu_hours_used), ("unused", unused), ("unknown", unknown)):
            if hours > 0:
                w = hours * scale
                body.append(_rect(x, y, w, BAR_H, COLORS[part], f"{g.name}: {hours:.1f} {part}"))
                x += w
        body.append(_text(x + 4, y + 13, f"{f.gpu_hours_allocated:,.1f} h"))
        y += BAR_H + 6
    return _svg("gpu-hours-by-group", y + 6, body, f"GPU-hours by {report.by}")


def chart_energy(report: Report, limit: int = 15) -> Markup:
    """Horizontal bars per group: kWh while the GPUs worked and kWh while they were idle."""
    e = report.energy
    groups = [g for g in (e.groups if e is not None else ()) if g.figures.kwh > 0][:limit]
    if not groups:
        return _empty("energy-by-group", "measured GPU energy")
    label_w, right = 150.0, 80.0
    scale = (WIDTH - label_w - right) / max(g.figures.kwh for g in groups)
    body = _legend(label_w, 14, [("busy", COLORS["used"]), ("idle", COLORS["idle"])])
    y = 26.0
    for g in groups:
        f = g.figures
        x = label_w
        body.append(_text(label_w - 6, y + 13, g.name or "-", anchor="end"))
        busy = max(f.kwh - f.idle_kwh, 0.0)
        parts = (("busy", busy, COLORS["used"]), ("idle", f.idle_kwh, COLORS["idle"]))
        for part, kwh, color in parts:
            if kwh > 0:
                w = kwh * scale
                body.append(_rect(x, y, w, BAR_H, color, f"{g.name}: {kwh:,.2f} kWh {part}"))
                x += w
        body.append(_text(x + 4, y + 13, f"{f.kwh:,.1f} kWh"))
        y += BAR_H + 6
    return _svg("energy-by-group", y + 6, body, f"GPU energy by {report.by}")


@dataclass(frozen=True, slots=True)
class _Axis:
    left: float
    top: float
    width: float
    height: float

    @property
    def bottom(self) -> float:
        return self.top + self.height


def _time_label(moment: datetime, bucket_s: int) -> str:
    return f"{moment:%m-%d %H:%M}" if bucket_s < 86400 else f"{moment:%m-%d}"


def _columns(n: int, axis: _Axis) -> tuple[float, float]:
    slot = axis.width / max(n, 1)
    return slot, max(slot * 0.8, 1.0)


def chart_series(report: Report) -> Markup:
    """Per bucket: allocated GPU-hours (bar), used (inner bar), efficiency % (line)."""
    points = report.series
    if not points:
        return _empty("utilisation-over-time", "finished GPU jobs")
    axis = _Axis(50, 24, WIDTH - 100, 180)
    top = max(p.gpu_hours_allocated for p in points) or 1.0
    slot, bar = _columns(len(points), axis)
    body = _legend(
        axis.left,
        14,
        [("allocated", COLORS["allocated"]), ("used", COLORS["used"]), ("efficiency %", "#000")],
    )
    body.append(_text(axis.left - 4, axis.top + 8, f"{top:,.0f} h", anchor="end"))
    body.append(_text(axis.left - 4, axis.bottom, "0", anchor="end"))
    body.append(_text(axis.left + axis.width + 4, axis.top + 8, "100%"))
    line: list[str] = []
    every = max(1, len(points) // 8)
    for i, p in enumerate(points):
        x = axis.left + i * slot + (slot - bar) / 2
        h = axis.height * p.gpu_hours_allocated / top
        when = _time_label(p.start, report.bucket_s)
        body.append(
            _rect(
                x,
                axis.bottom - h,
                bar,
                h,
                COLORS["allocated"],
                f"{when}: allocated {p.gpu_hours_allocated:.1f} h",
            )
        )
        hu = axis.height * p.gpu_hours_used / top
        body.append(
            _rect(
                x + bar * 0.2,
                axis.bottom - hu,
                bar * 0.6,
                hu,
                COLORS["used"],
                f"{when}: used {p.gpu_hours_used:.1f} h",
            )
        )
        if p.efficiency_pct is not None:
            cx = axis.left + (i + 0.5) * slot
            cy = axis.bottom - axis.height * p.efficiency_pct / 100
            line.append(f"{_num(cx)},{_num(cy)}")
            body.append(
                f'<circle class="mark" cx="{_num(cx)}" cy="{_num(cy)}" r="3" fill="#000">'
                f"<title>{escape(when)}: efficiency {p.efficiency_pct:.0f}%</title></circle>"
            )
        if i % every == 0:
            body.append(
                _text(
                    axis.left + (i + 0.5) * slot, axis.bottom + 14, when, anchor="middle", size=10
                )
            )
    if len(line) > 1:
        body.append(
            f'<polyline class="mark" fill="none" stroke="#000" stroke-width="1.5" '
            f'points="{" ".join(line)}"/>'
        )
    return _svg("utilisation-over-time", axis.bottom + 22, body, "GPU utilisation over time")


def chart_histogram(report: Report) -> Markup:
    """GPU-hours (and jobs) per 10 % bin of mean GPU utilisation."""
    bins = [b for b in report.histogram if b.lo_pct is not None]
    if not any(b.jobs for b in report.histogram):
        return _empty("efficiency-histogram", "jobs")
    axis = _Axis(50, 20, WIDTH - 70, 170)
    top = max(b.gpu_hours for b in bins) or 1.0
    slot, bar = _columns(len(bins), axis)
    body = [_text(axis.left - 4, axis.top + 8, f"{top:,.0f} h", anchor="end")]
    for i, b in enumerate(bins):
        x = axis.left + i * slot + (slot - bar) / 2
        h = axis.height * b.gpu_hours / top
        color = COLORS["idle"] if (b.hi_pct or 0) <= 20 else COLORS["used"]
        label = f"{b.lo_pct:.0f}-{b.hi_pct:.0f}%"
        body.append(
            _rect(
                x,
                axis.bottom - h,
                bar,
                h,
                color,
                f"{label}: {b.jobs} jobs, {b.gpu_hours:.1f} GPU-hours",
            )
        )
        body.append(
            _text(x + bar / 2, axis.bottom - h - 3, f"{b.jobs:,}", anchor="middle", size=10)
        )
        body.append(_text(x + bar / 2, axis.bottom + 14, label, anchor="middle", size=10))
    return _svg("efficiency-histogram", axis.bottom + 22, body, "Efficiency histogram")


def chart_actions(report: Report) -> Markup:
    """Decisions per bucket, stacked by outcome."""
    points = report.action_series
    if not points:
        return _empty("actions-over-time", "policy decisions")
    # The same time axis as the utilisation chart: every bucket of the window.
    starts = sorted({p.start for p in report.series} | {p.start for p in points})
    outcomes = sorted({p.outcome for p in points})
    counts = {(p.start, p.outcome): p.count for p in points}
    totals = {s: sum(counts.get((s, o), 0) for o in outcomes) for s in starts}
    axis = _Axis(50, 24, WIDTH - 70, 150)
    top = max(totals.values()) or 1
    slot, bar = _columns(len(starts), axis)
    body = _legend(axis.left, 14, [(o, COLORS.get(o, _OTHER)) for o in outcomes])
    body.append(_text(axis.left - 4, axis.top + 8, f"{top:,}", anchor="end"))
    every = max(1, len(starts) // 8)
    for i, s in enumerate(starts):
        x = axis.left + i * slot + (slot - bar) / 2
        y = axis.bottom
        when = _time_label(s, report.bucket_s)
        for o in outcomes:
            n = counts.get((s, o), 0)
            if n:
                h = axis.height * n / top
                y -= h
                body.append(_rect(x, y, bar, h, COLORS.get(o, _OTHER), f"{when}: {n} {o}"))
        if i % every == 0:
            body.append(
                _text(
                    axis.left + (i + 0.5) * slot, axis.bottom + 14, when, anchor="middle", size=10
                )
            )
    return _svg("actions-over-time", axis.bottom + 22, body, "Actions over time")


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("slurmgpu.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=template_finalize,  # user, account, partition names: controls escaped
    )
    env.filters["duration"] = duration_text
    env.filters["hours"] = lambda v: "-" if v is None else f"{v:,.1f}"
    env.filters["pct"] = lambda v: "-" if v is None else f"{v:.0f}%"
    env.filters["kwh"] = lambda v: "-" if v is None else f"{v:,.2f}"
    env.filters["shift"] = signed_duration
    env.filters["unsigned"] = lambda s: signed_duration(s).lstrip("+")
    env.globals["wait_label"] = wait_bin_label
    return env


def render_html(report: Report, whatif: WhatifFigures | str | None = None) -> str:
    """The whole report as one HTML document (no external resource of any kind).

    ``whatif``: the figures of ``sgpu whatif`` on the same window (a section of their
    own, the fidelity caveat first), or a line saying why they are missing."""
    template = _environment().get_template("report.html.j2")
    return template.render(
        r=report,
        whatif=whatif if isinstance(whatif, WhatifFigures) else None,
        whatif_missing=whatif if isinstance(whatif, str) else None,
        title=header_text(report),
        charts={
            "groups": chart_groups(report),
            "series": chart_series(report),
            "histogram": chart_histogram(report),
            "actions": chart_actions(report),
            "energy": chart_energy(report),
        },
    )

"""Comparison output: a rich table, JSON, CSV and a self-contained HTML page.

Pure: each renderer returns text (or a rich renderable); the CLI writes it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jinja2 import Environment, select_autoescape
from rich.table import Table

from slurmgpu.sim.metrics import RunSummary

__all__ = ["Comparison", "comparison_csv", "comparison_html", "comparison_json", "comparison_table"]

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # key, heading, format
    ("avg_jct_s", "avg JCT", "dur"),
    ("p50_jct_s", "p50 JCT", "dur"),
    ("p99_jct_s", "p99 JCT", "dur"),
    ("avg_queue_s", "avg queue", "dur"),
    ("p99_queue_s", "p99 queue", "dur"),
    ("makespan_s", "makespan", "dur"),
    ("gpu_hours", "GPU-h", "num"),
    ("allocated_util_pct", "alloc util", "pct"),
    ("used_util_pct", "used util", "pct"),
    ("restarts", "restarts", "int"),
    ("preemptions_per_job", "preempt/job", "frac"),
    ("resizes_per_job", "resize/job", "frac"),
    ("rho_max", "max rho", "num"),
    ("rho_over_pct", "rho>1.05", "pct"),
    ("timeouts", "timeouts", "int"),
    ("actions", "actions", "int"),
    ("energy_kwh", "kWh", "num"),
    ("kwh_per_job", "kWh/job", "num2"),
)


@dataclass
class Comparison:
    """One trace, several policy sets: their summaries."""

    trace: str
    cluster: str
    load: float
    seed: int
    results: list[RunSummary] = field(default_factory=list)
    published: Mapping[str, float] = field(default_factory=dict)  # scheduler -> avg JCT s
    seeds: tuple[int, ...] = ()  # more than one: results are means over these seeds
    avg_jct_ci_s: dict[str, float] = field(default_factory=dict)  # set -> 95 % half-width
    notes: list[str] = field(default_factory=list)
    costs: Mapping[str, object] = field(default_factory=dict)  # the cost set, as_dict()
    # ``--sharing``: sim.sharingreport.sharing_doc's rows (JSON only; none: no key)
    sharing: list[dict[str, object]] = field(default_factory=list)


def _fmt(value: float | int | str, kind: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if kind == "dur":
        v = float(value)
        if v >= 3600:
            return f"{v / 3600:.2f} h"
        return f"{v:,.0f} s"
    if kind == "pct":
        return f"{float(value):.1f} %"
    if kind == "num":
        return f"{float(value):,.1f}"
    if kind == "num2":
        return f"{float(value):,.2f}"
    if kind == "frac":
        return f"{float(value):.2f}"
    return f"{int(value):,}"


def comparison_table(c: Comparison) -> Table:
    """The terminal table: one row per policy set, published numbers under them."""
    seeds = (
        f"seeds {', '.join(map(str, c.seeds))} (means; avg JCT +- its 95 % CI)"
        if len(c.seeds) > 1
        else f"seed {c.seed}"
    )
    table = Table(title=f"{c.trace} on {c.cluster}, load {c.load:g}, {seeds}", title_justify="left")
    table.add_column("policy set", style="bold")
    with_ci = bool(c.avg_jct_ci_s)
    for key, heading, _ in COLUMNS:
        table.add_column(heading, justify="right")
        if key == "avg_jct_s" and with_ci:
            table.add_column("95% CI", justify="right")
    base = next((r.avg_jct_s for r in c.results if r.policy_set == "slurm"), None)
    for r in c.results:
        d = r.as_dict()
        cells = [_fmt(d[key], kind) for key, _, kind in COLUMNS]
        if base and r.policy_set != "slurm" and not math.isnan(r.avg_jct_s):
            cells[0] += f" ({(r.avg_jct_s / base - 1) * 100:+.0f}%)"
        if with_ci:
            ci = c.avg_jct_ci_s.get(r.policy_set, math.nan)
            cells.insert(1, "-" if math.isnan(ci) else f"+-{_fmt(ci, 'dur')}")
        table.add_row(r.policy_set, *cells)
    notes: list[str] = []
    if c.published:
        shown = ", ".join(f"{k} {_fmt(v, 'dur')}" for k, v in c.published.items())
        notes.append(
            f"published avg JCT on this workload (Pollux artifact; its Tiresias is comparable "
            f"with our tiresias set, its Pollux and Optimus retune batch sizes): {shown}"
        )
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


def _doc(c: Comparison) -> dict[str, object]:
    doc: dict[str, object] = {
        "trace": c.trace,
        "cluster": c.cluster,
        "load": c.load,
        "seed": c.seed,
        "seeds": list(c.seeds) or [c.seed],
        "avg_jct_ci95_s": dict(c.avg_jct_ci_s),
        "results": [r.as_dict() for r in c.results],
        "published_avg_jct_s": dict(c.published),
        "notes": list(c.notes),
        "costs": dict(c.costs),
    }
    if c.sharing:
        doc["sharing"] = list(c.sharing)
    return doc


def comparison_json(c: Comparison) -> str:
    def clean(v: object) -> object:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    doc = _doc(c)
    doc["results"] = [{k: clean(v) for k, v in r.as_dict().items()} for r in c.results]
    return json.dumps(doc, indent=2) + "\n"


def comparison_csv(c: Comparison) -> str:
    out = io.StringIO()
    keys: Sequence[str] = list(RunSummary.__dataclass_fields__)
    writer = csv.writer(out)
    writer.writerow(["trace", "cluster", "load", "seed", *keys])
    for r in c.results:
        d = r.as_dict()
        writer.writerow([c.trace, c.cluster, c.load, c.seed, *(d[k] for k in keys)])
    return out.getvalue()


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>sgpu simulate: {{ c.trace }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; } th, td { padding: .3em .7em; border-bottom: 1px solid #ddd; }
td { text-align: right; } td:first-child, th:first-child { text-align: left; font-weight: 600; }
.bar { background: #4a7; height: .8em; display: inline-block; vertical-align: middle; }
.pub { color: #777; }
</style></head><body>
<h1>Simulated comparison</h1>
<p>Trace <b>{{ c.trace }}</b> on <b>{{ c.cluster }}</b>, load {{ c.load }}, seed {{ c.seed }}.</p>
<table><thead><tr><th>policy set</th>{% for _, h, _ in columns %}<th>{{ h }}</th>{% endfor %}
<th>avg JCT</th></tr></thead><tbody>
{% for r in rows %}<tr><td>{{ r.name }}</td>{% for cell in r.cells %}<td>{{ cell }}</td>{% endfor %}
<td><span class="bar" style="width: {{ r.bar }}px"></span></td></tr>
{% endfor %}
{% for name, value in published %}<tr class="pub"><td>{{ name }} (published)</td>
<td>{{ value }}</td><td colspan="{{ columns|length }}"></td></tr>{% endfor %}
</tbody></table>
{% for n in c.notes %}<p>{{ n }}</p>{% endfor %}
</body></html>
"""


def comparison_html(c: Comparison) -> str:
    """A self-contained page (inline CSS, no scripts, no external resources)."""
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    worst = max((r.avg_jct_s for r in c.results if not math.isnan(r.avg_jct_s)), default=1.0)
    rows = []
    for r in c.results:
        d = r.as_dict()
        bar = 0 if math.isnan(r.avg_jct_s) or worst <= 0 else int(200 * r.avg_jct_s / worst)
        rows.append(
            {
                "name": r.policy_set,
                "cells": [_fmt(d[k], kind) for k, _, kind in COLUMNS],
                "bar": bar,
            }
        )
    published = [(k, _fmt(v, "dur")) for k, v in c.published.items()]
    return env.from_string(_HTML).render(c=c, rows=rows, columns=COLUMNS, published=published)

"""The Grafana dashboard of slurmgpu, built with Grafana's own Python SDK
(``grafana-foundation-sdk``, a dev dependency) and shipped as provisionable JSON
(``dashboard.json`` beside this file; ``sgpu monitoring dashboard`` prints it, without
the SDK).

Regenerate the JSON after changing a panel::

    PYTHONPATH=$PWD .venv/bin/python -m slurmgpu.monitoring.dashboard

tests/unit/test_monitoring_dashboard.py fails while the committed JSON differs from what
this module builds, and parses every panel's query with promtool;
tests/slurm/test_prometheus_real.py runs each query against a real Prometheus scraping
the lab's daemon.

Panels read the daemon's metrics directly (not the recording rules), so the dashboard
works without the shipped rules. Waste by user reads the bounded per-user series
(``sgpu_user_gpus_*``: the users with the most idle GPUs, the rest as ``(other)``); the
daemon exports no per-job figures, so that view is left to ``sgpu eff`` and ``sgpu
report`` (a text panel says so).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, text, timeseries
from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.text import TextMode

__all__ = ["DASHBOARD_FILE", "PANELS", "Query", "build", "render"]

DASHBOARD_FILE = Path(__file__).with_name("dashboard.json")
UID = "slurmgpu-overview"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
# The selections every query honours.
SEL = 'instance=~"$instance"'
PSEL = f'{SEL}, partition=~"$partition"'


@dataclass(frozen=True)
class Query:
    """One panel query: PromQL (with the dashboard's variables) and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: str  # "stat" | "timeseries" | "bargauge" (an instant query, one bar a series)
    unit: str
    queries: tuple[Query, ...]
    description: str = ""
    width: int = 12
    height: int = 8
    stacked: bool = False


ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    (
        "Cluster",
        (
            PanelSpec(
                "GPUs allocated",
                "stat",
                "none",
                (Query(f"sum(sgpu_gpus_allocated{{{SEL}}})"),),
                "Whole GPUs Slurm allocated to jobs (a node in two partitions counts twice).",
                width=4,
                height=5,
            ),
            PanelSpec(
                "GPUs used",
                "stat",
                "none",
                (Query(f"sum(sgpu_gpus_used{{{SEL}}})"),),
                "Allocated GPUs an agent saw busy (> 0.5 % utilisation) in the last 2 minutes.",
                width=4,
                height=5,
            ),
            PanelSpec(
                "Efficiency (used / allocated)",
                "stat",
                "percentunit",
                (
                    Query(
                        f"sum(sgpu_gpus_used{{{SEL}}})"
                        f" / clamp_min(sum(sgpu_gpus_allocated{{{SEL}}}), 1)"
                    ),
                ),
                width=4,
                height=5,
            ),
            PanelSpec(
                "Idle GPU-hours (time range)",
                "stat",
                "none",
                (Query(f"sum(sum_over_time(sgpu_gpus_idle{{{SEL}}}[$__range:1m])) / 60"),),
                "Allocated GPUs doing nothing, taken every minute over the dashboard's range.",
                width=4,
                height=5,
            ),
            PanelSpec(
                "GPU power",
                "stat",
                "watt",
                (Query(f"sum(sgpu_gpu_power_watts{{{SEL}}})"),),
                "Board power of the GPUs with samples in the last 2 minutes.",
                width=4,
                height=5,
            ),
            PanelSpec(
                "GPU energy (time range)",
                "stat",
                "kwatth",
                (Query(f"sum(increase(sgpu_gpu_energy_joules_total{{{SEL}}}[$__range])) / 3.6e6"),),
                "From NVML's energy counter (Volta and newer boards).",
                width=4,
                height=5,
            ),
        ),
    ),
    (
        "Partitions",
        (
            PanelSpec(
                "GPUs allocated and used, by partition",
                "timeseries",
                "none",
                (
                    Query(
                        f"sum by (partition) (sgpu_gpus_allocated{{{PSEL}}})",
                        "{{partition}} allocated",
                    ),
                    Query(f"sum by (partition) (sgpu_gpus_used{{{PSEL}}})", "{{partition}} used"),
                    Query(f"sum by (partition) (sgpu_gpus{{{PSEL}}})", "{{partition}} total"),
                ),
            ),
            PanelSpec(
                "Efficiency by partition",
                "timeseries",
                "percentunit",
                (
                    Query(
                        f"sum by (partition) (sgpu_gpus_used{{{PSEL}}})"
                        f" / clamp_min(sum by (partition) (sgpu_gpus_allocated{{{PSEL}}}), 1)",
                        "{{partition}}",
                    ),
                ),
            ),
            PanelSpec(
                "Idle GPUs by partition",
                "timeseries",
                "none",
                (Query(f"sum by (partition) (sgpu_gpus_idle{{{PSEL}}})", "{{partition}}"),),
                "Allocated and not busy; its area is the idle GPU-hours.",
                stacked=True,
            ),
            PanelSpec(
                "Shards allocated and used, by partition",
                "timeseries",
                "none",
                (
                    Query(
                        f"sum by (partition) (sgpu_shards_allocated{{{PSEL}}})",
                        "{{partition}} shards allocated",
                    ),
                    Query(
                        f"sum by (partition) (sgpu_shards_used{{{PSEL}}})",
                        "{{partition}} shards used",
                    ),
                    Query(
                        f"sum by (partition) (sgpu_gpus_shared{{{PSEL}}})",
                        "{{partition}} GPUs shared",
                    ),
                ),
                "Co-located (gres/shard) jobs: their shards, and the GPUs they share.",
            ),
            PanelSpec(
                "Idle GPU-hours in the last hour, by partition",
                "timeseries",
                "none",
                (
                    Query(
                        f"sum by (partition)"
                        f" (sum_over_time(sgpu_gpus_idle{{{PSEL}}}[59m59s:1m])) / 60",
                        "{{partition}}",
                    ),
                ),
                stacked=True,
            ),
        ),
    ),
    (
        "Users",
        (
            PanelSpec(
                "Idle GPU-hours by user (time range)",
                "bargauge",
                "none",
                (
                    Query(
                        "sort_desc(sum by (user)"
                        f" (sum_over_time(sgpu_user_gpus_idle{{{SEL}}}[$__range:1m])) / 60)",
                        "{{user}}",
                    ),
                ),
                "Waste by user: allocated GPUs no agent saw busy, taken every minute over the "
                "dashboard's range (whole GPUs of running jobs; every partition).",
                width=8,
            ),
            PanelSpec(
                "Idle GPUs by user",
                "timeseries",
                "none",
                (Query(f"sum by (user) (sgpu_user_gpus_idle{{{SEL}}})", "{{user}}"),),
                "Allocated and not busy in the last 2 minutes, per user; its area is the "
                "idle GPU-hours.",
                width=8,
                stacked=True,
            ),
            PanelSpec(
                "GPUs allocated by user",
                "timeseries",
                "none",
                (Query(f"sum by (user) (sgpu_user_gpus_allocated{{{SEL}}})", "{{user}}"),),
                "Whole GPUs held by each user's running jobs.",
                width=8,
                stacked=True,
            ),
        ),
    ),
    (
        "Energy",
        (
            PanelSpec(
                "GPU power by node",
                "timeseries",
                "watt",
                (Query(f"sum by (node) (sgpu_gpu_power_watts{{{SEL}}})", "{{node}}"),),
                stacked=True,
            ),
            PanelSpec(
                "GPU energy per hour, by node",
                "timeseries",
                "kwatth",
                (
                    Query(
                        f"sum by (node)"
                        f" (increase(sgpu_gpu_energy_joules_total{{{SEL}}}[1h])) / 3.6e6",
                        "{{node}}",
                    ),
                ),
                stacked=True,
            ),
        ),
    ),
    (
        "Actions",
        (
            PanelSpec(
                "Actions executed, by policy and kind",
                "timeseries",
                "none",
                (
                    Query(
                        "sum by (policy, kind)"
                        f' (increase(sgpu_actions_total{{{SEL}, outcome="done"}}[1h]))',
                        "{{policy}} {{kind}}",
                    ),
                ),
                "Per hour. Advice and suppressed decisions are in the next panel.",
                stacked=True,
            ),
            PanelSpec(
                "Decisions by mode and outcome",
                "timeseries",
                "none",
                (
                    Query(
                        f"sum by (mode, outcome) (increase(sgpu_actions_total{{{SEL}}}[1h]))",
                        "{{mode}} {{outcome}}",
                    ),
                ),
                "Per hour, every policy decision the audit recorded.",
                stacked=True,
            ),
            PanelSpec(
                "Resizes and pool moves by state",
                "timeseries",
                "none",
                (
                    Query(
                        f"sum by (kind, state) (sgpu_transactions{{{SEL}}})",
                        "{{kind}} {{state}}",
                    ),
                ),
                "Transactions kept in the store; open ones: planned, signaled, checkpointed, "
                "held, updated, released.",
            ),
            PanelSpec(
                "Resizes finished per hour, by outcome",
                "timeseries",
                "none",
                (
                    Query(
                        f'sum by (state) (delta(sgpu_transactions{{{SEL}, kind="resize",'
                        f' state=~"running|aborted|rolled_back|ended|overtaken"}}[1h]))',
                        "{{state}}",
                    ),
                ),
                "running: at the new size; aborted / rolled_back: kept the old size; "
                "overtaken: released, then still pending (others took its GPUs).",
            ),
        ),
    ),
    (
        "Daemon",
        (
            PanelSpec(
                "Observe cycles by outcome",
                "timeseries",
                "ops",
                (
                    Query(
                        f"sum by (outcome) (rate(sgpu_cycles_total{{{SEL}}}[$__rate_interval]))",
                        "{{outcome}}",
                    ),
                ),
                width=8,
            ),
            PanelSpec(
                "Failed cycles by cause",
                "timeseries",
                "none",
                (
                    Query(
                        "sum by (kind)"
                        f" (increase(sgpu_slurm_errors_total{{{SEL}}}[$__rate_interval]))",
                        "{{kind}}",
                    ),
                ),
                width=8,
            ),
            PanelSpec(
                "Cycle duration (p95)",
                "timeseries",
                "s",
                (
                    Query(
                        "histogram_quantile(0.95, sum by (le) (rate("
                        f"sgpu_cycle_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))",
                        "p95",
                    ),
                ),
                width=8,
            ),
            PanelSpec(
                "Agent samples ingested",
                "timeseries",
                "ops",
                (
                    Query(
                        f"sum(rate(sgpu_samples_ingested_total{{{SEL}}}[$__rate_interval]))",
                        "accepted",
                    ),
                    Query(
                        "sum by (reason)"
                        f" (rate(sgpu_samples_refused_total{{{SEL}}}[$__rate_interval]))",
                        "refused: {{reason}}",
                    ),
                ),
                width=8,
            ),
            PanelSpec(
                "Time since each node's agent last delivered samples",
                "timeseries",
                "s",
                (
                    Query(
                        f"time() - max by (node) (sgpu_agent_last_seen_timestamp_seconds{{{SEL}}})",
                        "{{node}}",
                    ),
                ),
                "Agents send every 10 s by default; SgpuAgentSilent fires past 10 minutes.",
                width=8,
            ),
            PanelSpec(
                "Requests refused",
                "timeseries",
                "ops",
                (
                    Query(
                        "sum by (reason)"
                        f" (rate(sgpu_api_rejected_total{{{SEL}}}[$__rate_interval]))",
                        "{{reason}}",
                    ),
                ),
                width=8,
            ),
            PanelSpec(
                "Slurm's gres_used disagreeing with allocations",
                "timeseries",
                "none",
                (
                    Query(
                        f"sum by (kind) (sgpu_node_gres_disagreeing{{{SEL}}})",
                        "{{kind}}",
                    ),
                ),
                "Nodes whose GPU / shard usage in Slurm disagrees with their jobs' allocations.",
                width=8,
            ),
            PanelSpec(
                "Store and MUNGE up",
                "timeseries",
                "none",
                (
                    Query(f"min(sgpu_store_up{{{SEL}}})", "store"),
                    Query(f"min(sgpu_munge_up{{{SEL}}})", "munge"),
                    Query(f'min(up{{job="slurmgpu", {SEL}}})', "daemon scraped"),
                ),
                width=8,
            ),
        ),
    ),
)

NOT_EXPORTED = (
    "Per-job figures are not exported to Prometheus (a series per job would never end): "
    "`sgpu eff JOBID` and `sgpu jobs --active` show a job; `sgpu report --by user` (or "
    "`--by account`) the finished jobs' waste over any window. The user panels name the "
    "`daemon.metrics_max_users` users with the most idle GPUs; the rest are `(other)`."
)


def queries() -> list[tuple[str, Query]]:
    """Every panel's queries, (panel title, query)."""
    return [(p.title, q) for _, panels in ROWS for p in panels for q in p.queries]


PANELS = [p.title for _, panels in ROWS for p in panels]


def _variables() -> list[dash.QueryVariable | dash.DatasourceVariable]:
    ds = dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    instance = (
        dash.QueryVariable("instance")
        .label("Daemon")
        .datasource(DATASOURCE)
        .query("label_values(sgpu_gpus, instance)")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    partition = (
        dash.QueryVariable("partition")
        .label("Partition")
        .datasource(DATASOURCE)
        .query('label_values(sgpu_gpus{instance=~"$instance"}, partition)')
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    return [ds, instance, partition]


def _panel(spec: PanelSpec) -> stat.Panel | timeseries.Panel | bargauge.Panel:
    panel: stat.Panel | timeseries.Panel | bargauge.Panel
    if spec.kind == "stat":
        panel = stat.Panel().reduce_options(
            common_builder.ReduceDataOptions().calcs(["lastNotNull"])
        )
    elif spec.kind == "bargauge":
        panel = (
            bargauge.Panel()
            .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]))
            .display_mode(common.BarGaugeDisplayMode.BASIC)
            .orientation(common.VizOrientation.HORIZONTAL)
        )
    else:
        panel = timeseries.Panel().legend(
            common_builder.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        if spec.stacked:
            panel = panel.stacking(
                common_builder.StackingConfig().mode(common.StackingMode.NORMAL)
            ).fill_opacity(30)
    panel = (
        panel.title(spec.title)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .span(spec.width)
        .height(spec.height)
    )
    if spec.description:
        panel = panel.description(spec.description)
    if spec.unit == "percentunit":
        panel = panel.min(0).max(1)
    for i, q in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i))
        if spec.kind == "bargauge":
            target = target.instant()
        if q.legend:
            target = target.legend_format(q.legend)
        panel = panel.with_target(target)
    return panel


def build() -> dash.Dashboard:
    """The dashboard, as the SDK's builder."""
    board = (
        dash.Dashboard("slurmgpu")
        .uid(UID)
        .description(
            "GPU allocation against use, idle GPU-hours, energy, actions and resizes, "
            "from the slurmgpu daemon's /metrics (docs/metrics.md)."
        )
        .tags(["slurmgpu", "slurm", "gpu"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-24h", "now")
        .refresh("1m")
        .timezone("browser")
    )
    for variable in _variables():
        board = board.with_variable(variable)
    for title, panels in ROWS:
        board = board.with_row(dash.Row(title))
        for spec in panels:
            board = board.with_panel(_panel(spec))
    board = board.with_row(dash.Row("Jobs"))
    board = board.with_panel(
        text.Panel()
        .title("Per job: sgpu eff, sgpu report")
        .mode(TextMode.MARKDOWN)
        .content(NOT_EXPORTED)
        .span(24)
        .height(3)
    )
    return board


def render() -> str:
    """The dashboard's provisionable JSON (sorted keys, 2-space indent, final newline)."""
    board = build().build()
    return json.dumps(board, cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Write dashboard.json (``--check``: exit 1 if it differs from what is built)."""
    text_out = render()
    if "--check" in argv:
        current = DASHBOARD_FILE.read_text() if DASHBOARD_FILE.exists() else ""
        if current != text_out:
            print(f"{DASHBOARD_FILE} is out of date: python -m slurmgpu.monitoring.dashboard")
            return 1
        return 0
    DASHBOARD_FILE.write_text(text_out)
    print(f"wrote {DASHBOARD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``sgpu simulate TRACE``: replay a workload through the daemon's policies in virtual time.

Runs every policy set of ``--policies`` on the same trace and prints one comparison
table (docs/simulator.md); with ``--sharing none,shards,mps,mig`` every set once per way
the cluster's GPUs are shared (``sim.sharing``), and a table comparing the modes. Needs
no Slurm, no database and no GPU.

Exit codes: 0 compared; 1 a trace, profile or cost file that cannot be read (the message
names the file and line); 2 bad option (cluster shape, load, unknown policy or cost set).

The costs it charges (checkpoint, start-up, requeue, per-job fixed costs) are a cost set
of ``slurmgpu.sim.costs`` (``--costs``: the measured default, ``legacy``, ... or a TOML
file); it prints the set and where each cost comes from, and the JSON carries them.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from slurmgpu.cli.context import fail
from slurmgpu.sim.costs import COST_SETS, CostError, CostSet, cost_set, parse_costs
from slurmgpu.sim.costs import DEFAULT as DEFAULT_COSTS
from slurmgpu.sim.fairshare import FairShareConfig, FairShareError, parse_fairshare
from slurmgpu.sim.loaders import FORMATS, TraceError, detect_format, load_trace
from slurmgpu.sim.lucid import LucidError, lucid_setup
from slurmgpu.sim.metrics import TypeUse, ci95, mean_summary, summarise, type_use
from slurmgpu.sim.policysets import SimPolicies, known_sets
from slurmgpu.sim.profiles import ProfileError, ThroughputProfile, load_profiles
from slurmgpu.sim.published import published_for
from slurmgpu.sim.render import (
    Comparison,
    comparison_csv,
    comparison_html,
    comparison_json,
    comparison_table,
)
from slurmgpu.sim.run import ClusterShape, SimOptions, scale_load, simulate
from slurmgpu.sim.sharing import (
    DEFAULT_MIG_LAYOUT,
    SHARING_MODES,
    SHARING_SLURM_VERSION,
    SharingMode,
    parse_sharing,
)
from slurmgpu.sim.sharingreport import SharingRow, narrowed, sharing_doc, sharing_table
from slurmgpu.sim.slurm import InterferenceModel
from slurmgpu.sim.slurmsched import SlurmScheduling
from slurmgpu.slurm.client import SlurmError

DEFAULT_POLICIES = "slurm,rightsize,colocate,malleable,all"
_WORKLOAD_RE = re.compile(r"workload-(\d+)\.csv$")


def _profiles_dir(trace: Path, given: Path | None) -> Path | None:
    if given is not None:
        return given
    for candidate in (
        trace.resolve().parent.parent / "profiles",
        Path("../shared/data/pollux/profiles"),
        Path("/work/shared/data/pollux/profiles"),
    ):
        if (candidate / "cifar10" / "placements.csv").exists():
            return candidate
    return None


def _interference() -> InterferenceModel | None:
    """The co-location model of ``slurmgpu.policy.interference`` when it is installed."""
    try:
        import importlib

        interference = importlib.import_module("slurmgpu.policy.interference")
    except ImportError:
        return None
    predict = getattr(interference, "predict", None)
    if not callable(predict):
        return None

    def pair(ua: float, ma: float, ub: float, mb: float) -> tuple[float, float]:
        p = predict(ua, ma, ub, mb)
        if isinstance(p, tuple):
            return float(p[0]), float(p[1])
        return float(p.slowdown_a), float(p.slowdown_b)

    return pair


def _is_lucid(trace: Path, fmt: str | None) -> bool:
    if fmt is not None:
        return fmt == "lucid"
    try:
        with trace.open(encoding="utf-8", errors="replace") as f:
            return detect_format(f.readline()) == "lucid"
    except (OSError, TraceError):
        return False


def _write(target: str, text: str, console: Console) -> None:
    if target == "-":
        click.echo(text, nl=False)
        return
    try:
        Path(target).write_text(text)
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}")
    console.print(f"wrote {target}")


@click.command("simulate")
@click.argument("trace", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--policies",
    default=DEFAULT_POLICIES,
    show_default=True,
    help="Comma-separated policy sets: " + ", ".join(known_sets()) + ".",
)
@click.option(
    "--cluster",
    "cluster_text",
    default="16x4",
    show_default=True,
    help="NODESxGPUS; groups of mixed sizes: 2x8,4x4; or typed groups: 8xa100:4,8xv100:4 "
    "(NODESxTYPE:GPUS,...).",
)
@click.option("--load", type=float, default=1.0, show_default=True, help="Arrival-rate factor.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of every random draw.")
@click.option(
    "--seeds",
    "seeds_text",
    metavar="A-B|A,B,..",
    help="Run every set once per seed; report means and avg JCT's 95 % CI over the seeds.",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Trace format (default: guess).")
@click.option(
    "--profiles", type=click.Path(path_type=Path, file_okay=False), help="Pollux profiles dir."
)
@click.option("--shards-per-gpu", type=int, default=4, show_default=True)
@click.option(
    "--costs",
    "costs_text",
    default=DEFAULT_COSTS,
    show_default=True,
    metavar="NAME|FILE.toml",
    help="The simulator's costs: a cost set (" + ", ".join(COST_SETS) + ") or a TOML file "
    "of costs (docs/simulator.md); printed with where each comes from.",
)
@click.option("--requeue-delay", type=float, help="Seconds; replaces the cost set's requeue_delay.")
@click.option(
    "--checkpoint", "checkpoint_s", type=float, help="Seconds; replaces the set's checkpoint."
)
@click.option("--startup", "startup_s", type=float, help="Seconds; replaces the set's startup.")
@click.option("--period", "period_s", type=float, default=60.0, show_default=True)
@click.option("--no-interference", is_flag=True, help="Co-located jobs run at full speed.")
@click.option(
    "--sharing",
    "sharing_text",
    metavar="MODES",
    help="Run every set once per way of sharing the GPUs and compare them: "
    + ",".join(SHARING_MODES)
    + " (80 GB GPUs; docs/simulator.md).",
)
@click.option(
    "--mig-layout",
    default=",".join(DEFAULT_MIG_LAYOUT),
    show_default=True,
    help="--sharing mig: the MIG instances of one split GPU.",
)
@click.option(
    "--mig-gpus",
    type=int,
    help="--sharing mig: GPUs split per node (default: half of a node's, at least 1).",
)
@click.option(
    "--scheduler",
    type=click.Choice(["easy", "slurm"]),
    default="easy",
    show_default=True,
    help="easy: one EASY-backfill pass at every change; slurm: sched/backfill's main pass "
    "and conservative backfill every 30 s with Slurm's defaults (slower; docs/simulator.md).",
)
@click.option(
    "--fairshare",
    "fairshare_path",
    type=click.Path(path_type=Path),
    help="Order the queue by the site's fair share (Slurm's multifactor, Fair Tree): a TOML "
    "file of its accounts, users and weights (docs/simulator.md). Default: submit order.",
)
@click.option("--json", "json_out", metavar="PATH", help="Write JSON ('-': stdout).")
@click.option("--csv", "csv_out", metavar="PATH", help="Write CSV ('-': stdout).")
@click.option("--html", "html_out", metavar="PATH", help="Write a self-contained HTML page.")
def simulate_command(
    trace: Path,
    policies: str,
    cluster_text: str,
    load: float,
    seed: int,
    seeds_text: str | None,
    fmt: str | None,
    profiles: Path | None,
    shards_per_gpu: int,
    costs_text: str,
    requeue_delay: float | None,
    checkpoint_s: float | None,
    startup_s: float | None,
    period_s: float,
    no_interference: bool,
    sharing_text: str | None,
    mig_layout: str,
    mig_gpus: int | None,
    scheduler: str,
    fairshare_path: Path | None,
    json_out: str | None,
    csv_out: str | None,
    html_out: str | None,
) -> None:
    """Compare policy sets on TRACE in a simulated Slurm cluster."""
    console = Console(stderr=json_out == "-" or csv_out == "-" or html_out == "-")
    if not console.is_terminal:
        console.width = max(console.width, 160)  # a log or a pipe: no wrapping mid-table
    try:
        shape = ClusterShape.parse(cluster_text, shards_per_gpu)
    except ValueError as exc:
        fail(str(exc), 2)
    if not (load > 0):
        fail(f"--load must be a number > 0, not {load}", 2)
    if period_s <= 0:
        fail(f"--period must be > 0, not {period_s}", 2)
    costs = _costs(costs_text)
    for key, value, option in (
        ("requeue_delay", requeue_delay, "--requeue-delay"),
        ("checkpoint", checkpoint_s, "--checkpoint"),
        ("startup", startup_s, "--startup"),
    ):
        if value is not None:
            try:
                costs = costs.with_cost(key, value, f"the {option} option")
            except CostError as exc:
                fail(str(exc), 2)
    seeds = [seed]
    if seeds_text:
        try:
            lo, dash, hi = seeds_text.partition("-")
            seeds = (
                list(range(int(lo), int(hi) + 1))
                if dash
                else [int(x) for x in seeds_text.split(",") if x.strip()]
            )
        except ValueError:
            fail(f"--seeds must look like 1-5 or 1,2,3, not {seeds_text!r}", 2)
        if not seeds or len(seeds) > 100:
            fail(f"--seeds must name 1 to 100 seeds, not {seeds_text!r}", 2)
    # (mode, cluster, release) per way of sharing: one, as given, without --sharing
    variants: list[tuple[SharingMode | None, ClusterShape]] = [(None, shape)]
    if sharing_text:
        try:
            variants = [
                (
                    mode,
                    shape.with_sharing(
                        mode,
                        shards_per_gpu=shards_per_gpu,
                        mig_layout=tuple(mig_layout.split(",")),
                        mig_gpus=mig_gpus,
                    ),
                )
                for mode in parse_sharing(sharing_text)
            ]
        except ValueError as exc:
            fail(f"--sharing: {exc}", 2)
    if mig_gpus is not None and not any(mode == "mig" for mode, _ in variants):
        fail("--mig-gpus needs --sharing with mig", 2)
    sets = [s.strip() for s in policies.split(",") if s.strip()]
    unknown = [s for s in sets if s not in known_sets()]
    if unknown or not sets:
        fail(
            f"unknown policy set {', '.join(unknown) or '(none)'}; known: "
            + ", ".join(known_sets()),
            2,
        )
    prof: dict[str, ThroughputProfile] | None = None
    pdir = _profiles_dir(trace, profiles)
    traces = {}
    try:
        if pdir is not None:
            prof = load_profiles(pdir)
        for one in seeds:
            jobs = load_trace(
                trace,
                prof,
                seed=one,
                gpus_per_node=shape.gpus_per_node,
                max_gpus=shape.gpus,
                fmt=fmt,
            )
            traces[one] = scale_load(jobs, load)
    except (TraceError, ProfileError) as exc:
        fail(str(exc))
    interference = None if no_interference else _interference()
    slowdown_source = "slurmgpu.policy.interference.predict"
    if interference is not None and _is_lucid(trace, fmt):
        # A workload drawn from Lucid's pairs: sharers slow each other as Lucid measured.
        try:
            _, interference = lucid_setup(trace)
        except LucidError as exc:
            fail(str(exc))
        slowdown_source = "Lucid's measured pair speeds (the model where a pair was not measured)"
    fairshare = _fairshare(fairshare_path) if fairshare_path is not None else None
    options = SimOptions.of_costs(
        costs,
        period_s=period_s,
        interference=interference,
        fairshare=fairshare,
        scheduling=SlurmScheduling() if scheduler == "slurm" else None,
    )
    comparison = Comparison(trace.name, cluster_text, load, seeds[0], seeds=tuple(seeds))
    comparison.costs = costs.as_dict()
    if scheduler == "slurm":
        comparison.notes.append(
            "scheduler: Slurm's main pass at every change and conservative backfill every "
            "30 s (sched/backfill's defaults)"
        )
    if fairshare is not None:
        comparison.notes.append(
            f"queue order: fair share from {fairshare_path} ({len(fairshare.accounts)} "
            f"accounts, {len(fairshare.users)} users; calculated every "
            f"{fairshare.calc_period_s:g} s, half-life {fairshare.half_life_s:g} s); "
            "Tiresias and QSSF keep their own"
        )
    m = _WORKLOAD_RE.search(trace.name)
    # The artifact's workloads-2.0/ files are its load 2.0; --load scales either further.
    native = 2.0 if trace.resolve().parent.name == "workloads-2.0" else 1.0
    if m and cluster_text == "16x4":
        published = published_for(native * load, int(m.group(1)))
        comparison.published = {k: float(v) for k, v in published.items()}
    comparison.notes.append(
        "co-location slowdown: " + (slowdown_source if interference else "none (full speed)")
    )
    sharing_rows: list[SharingRow] = []
    if sharing_text:
        comparison.notes.append(
            f"sharing: the same {shape.gpus} GPUs of {variants[0][1].device_memory_mib // 1024} "
            f"GB as {', '.join(str(m) for m, _ in variants)}; SimSlurm answers as Slurm "
            f"{SHARING_SLURM_VERSION} (a pending gpu:1 may become a MIG slice or an MPS share);"
            " MIG slices run at their SM share, isolated; MPS shares at theirs, slowed by "
            "the interference model's contention terms (the policy's own model: nobody "
            "measured MPS pairs)"
        )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        for mode, cluster in variants:
            run_options = options
            if mode is not None:
                run_options = replace(
                    options,
                    slurm_version=SHARING_SLURM_VERSION,
                    policies=SimPolicies(device_memory_mib=cluster.device_memory_mib),
                )
            for name in sets:
                label = name if mode is None else f"{name} [{mode}]"
                task = bar.add_task(label, total=len(jobs) * len(seeds))
                runs = []
                uses: list[dict[str, TypeUse]] = []
                shares: list[dict[str, int]] = []
                for i, one in enumerate(seeds):

                    def tick(done: int, total: int, task: TaskID = task, i: int = i) -> None:
                        if done % 64 == 0 or done == total:
                            bar.update(task, completed=i * len(jobs) + done)

                    started = time.perf_counter()
                    try:
                        run = simulate(traces[one], cluster, name, run_options, progress=tick)
                    except SlurmError as exc:
                        # only a MIG split leaves fewer whole GPUs than the trace was cut to
                        fail(f"--sharing {mode}: {exc} (its whole GPUs; give --mig-gpus fewer)", 2)
                    runs.append(summarise(run, time.perf_counter() - started))
                    uses.append(type_use(run))
                    shares.append(narrowed(run.jobs))
                if uses and uses[0]:
                    comparison.notes.append(_type_note(label, uses))
                if not runs:
                    bar.remove_task(task)
                    continue
                summary = replace(mean_summary(runs), policy_set=label)
                comparison.results.append(summary)
                if len(runs) > 1:
                    comparison.avg_jct_ci_s[label] = ci95([r.avg_jct_s for r in runs])
                if mode is not None:
                    sharing_rows.append(
                        SharingRow(
                            mode,
                            replace(summary, policy_set=name),
                            {k: sum(c[k] for c in shares) / len(shares) for k in shares[0]},
                        )
                    )
                bar.update(task, completed=len(jobs) * len(seeds))
    comparison.sharing = sharing_doc(sharing_rows)
    if json_out:
        _write(json_out, comparison_json(comparison), console)
    if csv_out:
        _write(csv_out, comparison_csv(comparison), console)
    if html_out:
        _write(html_out, comparison_html(comparison), console)
    if not (json_out == "-" or csv_out == "-" or html_out == "-"):
        console.print(comparison_table(comparison))
        if sharing_rows:
            title = f"sharing modes: {trace.name} on {cluster_text}, load {load:g}, " + (
                f"seeds {', '.join(map(str, seeds))} (means)" if len(seeds) > 1 else f"seed {seed}"
            )
            console.print(sharing_table(sharing_rows, title))
        for note in comparison.notes:
            console.print(f"[dim]{note}[/dim]")
    for line in costs.lines():  # which costs, from where (on stderr with '-' outputs)
        console.print(line, markup=False, highlight=False)


def _read(path: Path, what: str) -> str:
    """The text of ``path`` (a ``what`` file); one line and exit 1 if it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {what} file {path}: {getattr(exc, 'strerror', None) or exc}")


def _fairshare(path: Path) -> FairShareConfig:
    """The site's fair share read from ``path``; one line and exit 1 otherwise."""
    text = _read(path, "fair-share")
    try:
        return parse_fairshare(text, str(path))
    except FairShareError as exc:
        fail(str(exc))


def _costs(text: str) -> CostSet:
    """A cost set by name, or read from a TOML file; one line and exit 2 (a name that is
    no set) or 1 (a file that cannot be read or used) otherwise."""
    if text in COST_SETS:
        return cost_set(text)
    path = Path(text)
    if path.suffix != ".toml" and not path.exists():
        try:
            return cost_set(text)
        except CostError as exc:
            fail(str(exc), 2)
    data = _read(path, "cost")
    try:
        return parse_costs(data, str(path))
    except CostError as exc:
        fail(str(exc))


def _type_note(name: str, uses: list[dict[str, TypeUse]]) -> str:
    """``malleable per GPU type: a100 868 GPU-h, 197 kWh; v100 ...`` (mean over seeds)."""
    parts = []
    for t in uses[0]:
        hours = sum(u[t].gpu_hours for u in uses) / len(uses)
        kwh = sum(u[t].energy_kwh for u in uses) / len(uses)
        share = sum(u[t].allocated_pct for u in uses) / len(uses)
        parts.append(f"{t} {hours:,.0f} GPU-h ({share:.0f} % allocated), {kwh:,.1f} kWh")
    return f"{name} per GPU type: " + "; ".join(parts)

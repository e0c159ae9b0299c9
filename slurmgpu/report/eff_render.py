"""The terminal view of a job's efficiency: header, a bar per metric, detail tables, notes.

Builds rich renderables and prints nothing; the CLI chooses the console.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from slurmgpu.model import Job
from slurmgpu.plaintext import plain, shown
from slurmgpu.report.eff import EffThresholds, GpuEfficiency, JobEfficiency
from slurmgpu.report.eff_advice import Note
from slurmgpu.report.energy import format_energy
from slurmgpu.units import format_time_limit

BAR_WIDTH = 30

_STATUS_STYLE = {
    "ok": "green",
    "low": "yellow",
    "idle": "red",
    "no-process": "red",
    "no-data": "dim",
    "error": "magenta",
    "util-unknown": "dim",
}
_SEVERITY_MARK = {"alert": ("!!", "bold red"), "warn": ("! ", "yellow"), "info": ("- ", "cyan")}


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def gpu_request_text(job: Job) -> str:
    """Return what the job asked for in GPUs: ``2``, ``a100:4``, ``shard:2``, ``mps:50``
    or ``none``."""
    g = job.gpus
    parts = []
    if g.gpus:
        parts.append(f"{g.gpu_type}:{g.gpus}" if g.gpu_type else str(g.gpus))
    if g.per_node and job.node_count > 1:
        parts.append(f"({g.per_node} per node)")
    if g.shards:
        parts.append(f"shard:{g.shards}")
    if g.mps:
        parts.append(f"mps:{g.mps}")
    return " ".join(parts) or "none"


def placement_text(job: Job) -> str:
    """Return the nodes with the GPU indices held there, e.g. ``gpu1[0,1] gpu2[3]``."""
    out = []
    for a in job.gpu_allocations:
        idx = [str(i) for i in a.gpu_indices] + [f"s{i}" for i in a.shard_indices]
        idx += [f"m{i}" for i in a.mps_indices]
        out.append(f"{a.node}[{','.join(idx)}]" if idx else a.node)
    return " ".join(out) or "-"


def cpu_util_style(pct: float, th: EffThresholds) -> str:
    if pct < th.cpu_util_red_pct:
        return "red"
    return "yellow" if pct < 80.0 else "green"


def gpu_util_style(pct: float, th: EffThresholds) -> str:
    if pct <= th.gpu_util_red_pct:
        return "red"
    return "yellow" if pct < th.gpu_util_warn_pct else "green"


def memory_style(pct: float, th: EffThresholds) -> str:
    return "yellow" if pct < th.memory_note_pct else "green"


def _bar(label: str, pct: float | None, style: str, detail: str) -> Text:
    line = Text(f"  {label:<11} ")
    if pct is None:
        line.append("[" + " " * BAR_WIDTH + "]", style="dim")
        line.append("    -  ")
    else:
        filled = max(0, min(BAR_WIDTH, round(BAR_WIDTH * pct / 100.0)))
        line.append("[")
        line.append("█" * filled, style=style)
        line.append("·" * (BAR_WIDTH - filled), style="dim")
        line.append("]")
        line.append(f" {pct:4.0f}% ", style=style)
    line.append(f" {detail}")
    return line


def _header(eff: JobEfficiency) -> Table:
    job = eff.job
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    ident = job.display_id
    if ident != str(job.job_id):
        ident += f" (job id {job.job_id})"
    # Name, account, partition and node names come from Slurm users: shown, never parsed.
    grid.add_row("Job", plain(f"{ident}  {job.name}"))
    account = f" / {job.account}" if job.account else ""
    partition = f"  partition {job.partition}" if job.partition else ""
    grid.add_row("User", plain(f"{job.user}{account}{partition}"))
    state = job.state.value + (" (figures so far)" if eff.running else "")
    grid.add_row("State", state)
    names = ", ".join(n.node for n in eff.nodes) or "-"
    count = job.node_count or len(eff.nodes)
    grid.add_row("Nodes", plain(f"{count}: {names}" if count else "-"))
    grid.add_row("Cores", str(job.cpus) if job.cpus else "-")
    grid.add_row(
        "Memory", _gib(job.memory_mib) if job.memory_mib is not None else "not reported by Slurm"
    )
    gpus = f"requested {gpu_request_text(job)}"
    if job.gpu_allocations:
        gpus += f", allocated {job.allocated_gpus}"
        if job.allocated_shards:
            gpus += f" + {job.allocated_shards} shard(s)"
        mps = sum(a.mps for a in job.gpu_allocations)
        if mps:
            gpus += f" + mps {mps}"
        gpus += f": {placement_text(job)}"
    if eff.sharing != "gpu":
        gpus += f"; {_share_text(eff)}"
    grid.add_row("GPUs", plain(gpus))
    if eff.elapsed is None:
        grid.add_row("Run time", "not started")
    else:
        when = ""
        if job.start_time is not None:
            when = f"  (started {job.start_time:%Y-%m-%d %H:%M} UTC"
            if not eff.running and job.end_time is not None:
                when += f", ended {job.end_time:%Y-%m-%d %H:%M} UTC"
            when += ")"
        so_far = " so far" if eff.running else ""
        grid.add_row("Run time", f"{format_time_limit(eff.elapsed)}{so_far}{when}")
    limit = format_time_limit(job.time_limit)
    if eff.time_use_pct is not None:
        limit += f" ({eff.time_use_pct:.0f}% used)"
    grid.add_row("Time limit", limit)
    if eff.energy is not None:
        e = eff.energy
        grid.add_row(
            "GPU energy",
            f"{format_energy(e.energy_j)}, {e.idle_pct:.0f}% while idle  ({e.method_text})",
        )
    source = {
        "samples": "agent samples",
        "summary": "end-of-job summary (samples pruned)",
        "none": "none (only what Slurm knows)",
    }[eff.source]
    grid.add_row("Usage from", source)
    return grid


def _bars(eff: JobEfficiency) -> list[RenderableType]:
    th = eff.thresholds
    cpu = eff.cpu_util_pct
    busy = sum((n.mean_cpu_pct or 0.0) / 100.0 for n in eff.nodes)
    reported_cores = sum(n.cores or 0 for n in eff.nodes if n.mean_cpu_pct is not None)
    cpu_detail = f"{busy:.1f} of {reported_cores} cores busy" if cpu is not None else "no samples"
    mem = eff.cpu_memory_use_pct
    if eff.cpu_memory_max_mib is None:
        mem_detail = "no samples"
    elif eff.cpu_memory_requested_mib is None:
        mem_detail = f"peak {_gib(eff.cpu_memory_max_mib)} (request not known)"
    else:
        mem_detail = f"peak {_gib(eff.cpu_memory_max_mib)} of {_gib(eff.cpu_memory_requested_mib)}"
    gpu = eff.gpu_util_pct
    if not eff.gpus:
        gpu_detail = "no GPUs"
    elif gpu is None and any(g.status == "util-unknown" for g in eff.gpus):
        gpu_detail = "util unknown: not measurable (see the GPUs below)"
    elif gpu is None:
        gpu_detail = "no samples"
    else:
        marked = sum(1 for g in eff.counted_gpus if g.counted_as_zero)
        gpu_detail = f"{len(eff.counted_gpus)} GPU(s), {eff.gpus_busy} ever busy"
        if marked:
            gpu_detail += f", {marked} counted as 0%"
    gmem = eff.gpu_memory_use_pct
    if not eff.gpus:
        gmem_detail = "no GPUs"
    elif eff.gpu_memory_max_mib is None:
        gmem_detail = "no samples"
    else:
        gmem_detail = f"peak {_gib(eff.gpu_memory_max_mib)} on the fullest GPU"
    return [
        _bar("CPU util", cpu, cpu_util_style(cpu, th) if cpu is not None else "", cpu_detail),
        _bar("CPU memory", mem, memory_style(mem, th) if mem is not None else "", mem_detail),
        _bar("GPU util", gpu, gpu_util_style(gpu, th) if gpu is not None else "", gpu_detail),
        _bar("GPU memory", gmem, "cyan", gmem_detail),
    ]


def _share_text(eff: JobEfficiency) -> str:
    """``0.143 GPU-equivalents (MIG 1g.10gb)``: the part of a GPU a MIG slice, an MPS
    share or shards are (slurmgpu/gpushare.py)."""
    what = {
        "mig": f"MIG {eff.job.gpus.gpu_type}",
        "mps": f"MPS {eff.job.gpus.mps}",
        "shard": f"{eff.job.gpus.shards} shards",
    }.get(eff.sharing, "")
    return f"{eff.gpu_equivalents:.3g} GPU-equivalents ({what})"


def _node_table(eff: JobEfficiency) -> Table:
    th = eff.thresholds
    table = Table(title="Nodes", title_justify="left", header_style="bold", box=None)
    for col in ("NODE", "CORES", "CPU UTIL", "CORES BUSY", "MEMORY PEAK", "SAMPLES"):
        table.add_column(col, justify="left" if col == "NODE" else "right")
    for n in eff.nodes:
        util = Text(_pct(n.cpu_util_pct))
        if n.cpu_util_pct is not None:
            util.stylize(cpu_util_style(n.cpu_util_pct, th))
        table.add_row(
            plain(n.node),
            str(n.cores) if n.cores else "-",
            util,
            "-" if n.mean_cpu_pct is None else f"{n.mean_cpu_pct / 100:.1f}",
            _gib(n.max_memory_mib),
            str(n.samples) if n.reported else "none",
        )
    return table


def _gpu_row(g: GpuEfficiency, th: EffThresholds) -> list[RenderableType]:
    util = Text(_pct(g.mean_util_pct))
    if g.mean_util_pct is not None:
        util.stylize(gpu_util_style(g.mean_util_pct, th))
    mem = "-"
    if g.max_memory_mib is not None:
        mem = _gib(g.max_memory_mib)
        if g.memory_total_mib:
            mem += f" / {_gib(g.memory_total_mib)}"
    idle = "-" if g.trailing_idle is None else f"{int(g.trailing_idle.total_seconds() // 60)} min"
    status = g.status + (" (counted 0%)" if g.counted_as_zero and g.status == "no-data" else "")
    flags: list[str] = []
    if g.role != "gpu":
        flags.append(g.role)
    if g.shared:
        flags.append("shared")
    if g.error_samples:
        flags.append(f"{g.error_samples} error sample(s)")
    return [
        plain(g.label),
        Text(status, style=_STATUS_STYLE[g.status]),
        util,
        _pct(g.max_util_pct),
        mem,
        idle,
        str(g.samples),
        ", ".join(flags),
    ]


def _gpu_table(eff: JobEfficiency) -> Table:
    table = Table(title="GPUs", title_justify="left", header_style="bold", box=None)
    for col in ("GPU", "STATUS", "UTIL", "MAX", "MEMORY PEAK", "IDLE AT END", "SAMPLES", ""):
        table.add_column(col, justify="left" if col in {"GPU", "STATUS", ""} else "right")
    for g in eff.gpus:
        table.add_row(*_gpu_row(g, eff.thresholds))
    return table


def _notes(job_notes: Sequence[Note]) -> list[RenderableType]:
    out: list[RenderableType] = [Text("Notes", style="bold")]
    if not job_notes:
        out.append(Text("  none: this job used what it asked for"))
        return out
    # A grid gives each note a hanging indent when it wraps.
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=4, no_wrap=True)
    grid.add_column()
    for n in job_notes:
        mark, style = _SEVERITY_MARK[n.severity]
        grid.add_row(Text(f"  {mark}", style=style), Text(shown(n.text)))
    out.append(grid)
    return out


def render_report(eff: JobEfficiency, job_notes: Sequence[Note]) -> Group:
    """Return the whole report as one rich renderable."""
    parts: list[RenderableType] = [_header(eff), Text("")]
    parts.extend(_bars(eff))
    if eff.nodes:
        parts.extend([Text(""), _node_table(eff)])
    if eff.gpus:
        parts.extend([Text(""), _gpu_table(eff)])
    parts.append(Text(""))
    parts.extend(_notes(job_notes))
    return Group(*parts)

"""``sgpu eff JOBID``: what a job used of what it asked for, and what to ask for next time.

Exit codes: 0 report printed; 1 job not in the store; 2 malformed JOBID; 3 configuration
error; 4 database error.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import click
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cli.context import EXIT_STORE, AppContext, fail, pass_app
from slurmgpu.model import Job
from slurmgpu.policy.colocate import shards_per_gpu
from slurmgpu.policy.slices import PartitionOffer, partition_offers
from slurmgpu.report.eff import EffThresholds, UsageSourceKind, job_efficiency, usage_from_summary
from slurmgpu.report.eff_advice import notes
from slurmgpu.report.eff_json import to_json
from slurmgpu.report.eff_render import render_report
from slurmgpu.report.energy import JobEnergy, energy_from_json, job_energy
from slurmgpu.store import JobStore, StoreError
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.usage_query import GpuUsage, HostUsage

_JOB_ID = re.compile(r"(\d+)(?:_(\d+))?")


def parse_job_id(text: str) -> tuple[int, int | None]:
    """Return (job id, array task id) from ``123`` or ``120_3``."""
    m = _JOB_ID.fullmatch(text.strip())
    if not m:
        fail(f"JOBID must look like 123 or 120_3 (array task), not {text!r}", 2)
    return int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None


def find_job(store: JobStore, job_id: int, task_id: int | None) -> Job | None:
    """Return the newest stored job for ``123`` or array task ``120_3``."""
    if task_id is None:
        rows = store.jobs(job_ids=[job_id], limit=1)
    else:
        rows = store.jobs(array_job_id=job_id, array_task_id=task_id, limit=1)
    return rows[0].job if rows else None


def load_usage(
    usage: UsageStore, job: Job
) -> tuple[list[GpuUsage], list[HostUsage], UsageSourceKind]:
    """Return the job's usage: live aggregates when samples exist, else the stored summary."""
    gpus = usage.gpu_usage(job.job_id)
    hosts = usage.host_usage(job.job_id)
    if gpus or hosts:
        return gpus, hosts, "samples"
    if job.state.is_terminal:
        summary = usage.summary(job.job_id)
        if summary:
            gpus, hosts = usage_from_summary(job, summary)
            if gpus or hosts:
                return gpus, hosts, "summary"
    return [], [], "none"


def cluster_shards_per_gpu(store: JobStore, job: Job) -> int | None:
    """Shards per GPU on the nodes the job ran on (else on every known node), as the
    store last saw them; None when no node has shards or they differ."""
    nodes = store.known_nodes()
    names = set(job.nodes) | {a.node for a in job.gpu_allocations}
    mine = [n for name, n in nodes.items() if name in names] or list(nodes.values())
    counts = {shards_per_gpu(n) for n in mine} - {0}
    return counts.pop() if len(counts) == 1 else None


def cluster_offer(store: JobStore, job: Job) -> PartitionOffer | None:
    """What the job's partition offers to share GPUs by (MIG slices, MPS, shards), as the
    store last saw its nodes; None when unknown or its partitions differ."""
    offers = partition_offers(store.known_nodes().values())
    found = {offers.get(p) for p in (job.partition or "").split(",")}
    return found.pop() if len(found) == 1 else None


def load_energy(usage: UsageStore, job: Job, source: UsageSourceKind) -> JobEnergy | None:
    """Return the job's GPU energy: from its samples, else from its end-of-job summary."""
    if source == "samples":
        return job_energy(job, usage.gpu_energy(job.job_id), datetime.now(UTC))
    if source == "summary":
        summary = usage.summary(job.job_id) or {}
        return energy_from_json(summary.get("energy"))
    return None


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the report.")
@pass_app
def eff(app: AppContext, job_id: str, as_json: bool) -> None:
    """Show how efficiently JOBID (123, or array task 120_3) used its CPUs, memory and GPUs."""
    raw_id, task_id = parse_job_id(job_id)
    store = app.store(migrate=False)
    usage = UsageStore(store.engine, store.cluster)
    try:
        job = find_job(store, raw_id, task_id)
        if job is None:
            fail(
                f"job {job_id} is not in the store: slurmgpu only knows jobs its daemon "
                "has observed (see `sgpu jobs`)"
            )
        gpus, hosts, source = load_usage(usage, job)
        energy = load_energy(usage, job, source)
        shards = cluster_shards_per_gpu(store, job)
        offer = cluster_offer(store, job)
    except (StoreError, SQLAlchemyError) as exc:
        cause = getattr(exc, "orig", None) or exc
        fail(f"cannot read the store: {str(cause).splitlines()[0]}", EXIT_STORE)
    report = job_efficiency(
        job,
        gpus,
        hosts,
        datetime.now(UTC),
        # advice from the configuration the daemon reads: what it would set for such runs
        thresholds=EffThresholds.for_site(
            app.settings.policy.sizing, app.settings.policy.colocate, shards, offer
        ),
        source=source,
        energy=energy,
    )
    job_notes = notes(report)
    if as_json:
        click.echo(json.dumps(to_json(report, job_notes), indent=2))
        return
    console = Console()
    if not console.is_terminal:  # piped or logged: never cut lines to 80 characters
        console = Console(width=max(console.width, 140))
    console.print(render_report(report, job_notes))

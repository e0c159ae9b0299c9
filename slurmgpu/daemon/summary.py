"""End-of-job usage summaries: stored for ever, optionally copied into AdminComment.

The summary is jobstats-like (per node: CPUs, CPU use, memory; per GPU: util and
memory), so it outlives the raw samples' retention. In AdminComment it is written as
``SGPU1:`` + base64(gzip(JSON)), the same idea as jobstats' ``JS1:``.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
from datetime import UTC, datetime
from typing import Any

from slurmgpu.intent import SetAdminComment
from slurmgpu.model import Job
from slurmgpu.report.energy import energy_to_json, job_energy
from slurmgpu.slurm.client import SlurmClient, SlurmError
from slurmgpu.store.database import StoreError
from slurmgpu.store.usage import UsageStore

log = logging.getLogger("slurmgpu.daemon")

ADMIN_COMMENT_PREFIX = "SGPU1:"


def build_summary(job: Job, usage: UsageStore) -> dict[str, Any]:
    """Return the summary of ``job`` from the samples in the store."""
    nodes: dict[str, dict[str, Any]] = {}
    for h in usage.host_usage(job.job_id):
        nodes.setdefault(h.node, {})["host"] = {
            "samples": h.samples,
            "cpus": h.cpus_allocated,
            "cpu_pct_mean": h.mean_cpu_pct,
            "cpu_efficiency_pct": h.cpu_efficiency_pct,
            "memory_max_mib": h.max_memory_mib,
            "iowait_pct_mean": h.mean_iowait_pct,
        }
    for g in usage.gpu_usage(job.job_id):
        nodes.setdefault(g.node, {}).setdefault("gpus", {})[str(g.gpu_index)] = {
            "samples": g.samples,
            "util_pct_mean": g.mean_util_pct,
            "util_pct_max": g.max_util_pct,
            "memory_max_mib": g.max_memory_mib,
            "memory_total_mib": g.memory_total_mib,
            "idle_trailing_s": int(g.trailing_idle.total_seconds()),
            "never_busy": g.never_busy,
            "shared": g.shared,
        }
    elapsed = None
    if job.start_time and job.end_time:
        elapsed = max(int((job.end_time - job.start_time).total_seconds()), 0)
    return {
        "version": 1,
        "job_id": job.job_id,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "state": job.state.value,
        "elapsed_s": elapsed,
        "time_limit_s": int(job.time_limit.total_seconds()) if job.time_limit else None,
        "cpus": job.cpus,
        "memory_mib": job.memory_mib,
        "gpus_requested": job.gpus.gpus,
        "shards_requested": job.gpus.shards,
        "nodes": nodes,
        # The GPUs' energy (report/energy.py); None when no interval was measured.
        "energy": energy_to_json(
            job_energy(job, usage.gpu_energy(job.job_id), job.end_time or datetime.now(UTC))
        ),
    }


def encode_admin_comment(summary: dict[str, Any]) -> str:
    raw = json.dumps(summary, separators=(",", ":"), sort_keys=True).encode()
    return ADMIN_COMMENT_PREFIX + base64.b64encode(gzip.compress(raw, mtime=0)).decode()


def decode_admin_comment(text: str) -> dict[str, Any] | None:
    """Return the summary in an AdminComment, or None when it holds none."""
    if not text.startswith(ADMIN_COMMENT_PREFIX):
        return None
    try:
        value = json.loads(gzip.decompress(base64.b64decode(text[len(ADMIN_COMMENT_PREFIX) :])))
    except (ValueError, OSError, EOFError):
        return None
    return value if isinstance(value, dict) else None


class Summarizer:
    """Writes a summary for every job that ended in a cycle."""

    def __init__(
        self, usage: UsageStore, slurm: SlurmClient | None = None, *, admin_comment: bool = False
    ) -> None:
        self.usage = usage
        self.slurm = slurm
        self.admin_comment = admin_comment

    def job_ended(self, job: Job, at: datetime) -> dict[str, Any] | None:
        try:
            summary = build_summary(job, self.usage)
            self.usage.save_summary(job.job_id, summary, at)
        except StoreError as exc:
            log.warning("no summary for job %d: %s", job.job_id, exc)
            return None
        if self.admin_comment and self.slurm is not None and summary["nodes"]:
            try:
                self.slurm.update_job(job.job_id, (SetAdminComment(encode_admin_comment(summary)),))
            except SlurmError as exc:
                log.warning("could not write AdminComment of job %d: %s", job.job_id, exc)
        return summary

"""What the daemon knows of malleable jobs: their specs, and the throughput they report.

A job is malleable when its comment carries ``sgpu:malleable=MIN:MAX`` (or
``sgpu:pool=MIN:MAX`` for an array pool). Its checkpoint signal, grace and state
directory come from the comment's ``sgpu:ckpt=`` and ``sgpu:edir=`` tokens, which
``sgpu submit`` writes for every user (validated: :func:`slurmgpu.tokens.parse`); then from
the ``submissions`` row ``sgpu submit`` wrote when it could reach the store (root's
database: older jobs, root's jobs); defaults otherwise: USR2, 120 s,
``<work dir>/.sgpu-elastic``. Specs are cached per job id: a
job's spec does not change, so each malleable job costs one query in its life.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.actuate.resize import state_dir_of
from slurmgpu.elastic.spec import read_progress
from slurmgpu.model import ClusterSnapshot, Job, MalleableSpec
from slurmgpu.store import JobStore
from slurmgpu.store.database import StoreError
from slurmgpu.tokens import parse

log = logging.getLogger("slurmgpu.daemon")

__all__ = ["MalleableDirectory", "spec_from"]


def spec_from(job: Job, submission: dict[str, Any] | None) -> MalleableSpec | None:
    """The spec of ``job`` from its comment token and its recorded submission."""
    given = parse(job.comment)
    token = given.malleable
    if token is None:
        return None
    lo, hi, pool = token.lo, token.hi, token.pool
    key = job.array_job_id if (pool and job.array_job_id is not None) else job.job_id
    sub = submission or {}
    hints = sub.get("hints") or {}
    grace = sub.get("checkpoint_grace_s")
    for problem in given.problems:
        log.warning("job %d: comment token %s; ignored", job.job_id, problem)
    recorded_dir = str(hints.get("elastic_dir") or "") if isinstance(hints, dict) else ""
    return MalleableSpec(
        job_id=key,
        min_gpus=lo,
        max_gpus=hi,
        checkpoint_signal=given.ckpt_signal or str(sub.get("checkpoint_signal") or "USR2"),
        checkpoint_grace=timedelta(
            seconds=given.ckpt_grace_s or (grace if isinstance(grace, int) and grace > 0 else 120)
        ),
        pool=pool,
        state_dir=given.elastic_dir or recorded_dir,
    )


class MalleableDirectory:
    """Specs of the malleable jobs in a snapshot (cached), and their measured throughput."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._cache: dict[int, MalleableSpec | None] = {}

    def specs(self, cluster: ClusterSnapshot) -> dict[int, MalleableSpec]:
        out: dict[int, MalleableSpec] = {}
        live: set[int] = set()
        for job in cluster.jobs:
            if job.state.is_terminal or "sgpu:" not in job.comment:
                continue
            if parse(job.comment).malleable is None:
                continue
            key = job.array_job_id if job.array_job_id is not None else job.job_id
            live.add(key)
            if key not in self._cache:
                self._cache[key] = spec_from(job, self._submission(key))
            spec = self._cache[key]
            if spec is not None:
                out[spec.job_id] = spec
        for key in [k for k in self._cache if k not in live]:
            del self._cache[key]
        return out

    def _submission(self, job_id: int) -> dict[str, Any] | None:
        try:
            rows = self.store.submissions(job_id)
        except (StoreError, SQLAlchemyError) as exc:  # a read must not stop a cycle
            log.warning("submission of job %d not read: %s", job_id, exc)
            return None
        return rows[-1] if rows else None

    def throughput(
        self, cluster: ClusterSnapshot, specs: dict[int, MalleableSpec]
    ) -> dict[int, dict[int, float]]:
        """Throughput by GPU count that running malleable jobs reported (progress.json)."""
        out: dict[int, dict[int, float]] = {}
        for job in cluster.jobs:
            spec = specs.get(job.job_id)
            if spec is None or spec.pool or job.state.is_terminal:
                continue
            progress = read_progress(state_dir_of(spec, job), job.job_id)
            if progress is not None and progress.throughput:
                out[job.job_id] = progress.throughput
        return out

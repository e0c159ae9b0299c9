"""What the daemon knows of malleable jobs: their specs, and the throughput they report.

A job is malleable when its comment carries ``sgpu:malleable=MIN:MAX`` (or
``sgpu:pool=MIN:MAX`` for an array pool). Its checkpoint signal, grace and state
directory come from the comment's ``sgpu:ckpt=`` and ``sgpu:edir=`` tokens, which
``sgpu submit`` writes for every user (validated: :func:`slurmgpu.tokens.parse`); then from
the job's ``submissions`` row (the comment as the observer first saw it,
store/submission_record.py; rows ``sgpu submit`` itself wrote in older releases);
defaults otherwise: USR2, 120 s,
``<work dir>/.sgpu-elastic``. Specs are cached per job id: a
job's spec does not change, so each malleable job costs one query in its life.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from slurmgpu import userinput_stats
from slurmgpu.cycle.resize import state_dir_of
from slurmgpu.elastic.spec import (
    ACK_FILE,
    PROGRESS_FILE,
    UserFileRejected,
    job_dir,
    load_ack,
    load_progress,
)
from slurmgpu.model import ClusterSnapshot, Job, MalleableSpec
from slurmgpu.store import JobStore
from slurmgpu.store.database import StoreError
from slurmgpu.tokens import parse

log = logging.getLogger("slurmgpu.daemon")

__all__ = ["MalleableDirectory", "Measured", "spec_from"]


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
        userinput_stats.rejected(
            "comment",
            job.job_id,
            problem,
            what="comment token",
            consequence="the token is ignored (its default applies)",
        )
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


@dataclass(frozen=True, slots=True)
class Measured:
    """What running malleable jobs reported: throughput by GPU count (progress.json), and
    the jobs whose files were refused, which the policies do not see as malleable."""

    throughput: dict[int, dict[int, float]] = field(default_factory=dict)
    refused: frozenset[int] = frozenset()


class MalleableDirectory:
    """Specs of the malleable jobs in a snapshot (cached), and their measured throughput.

    One job's input costs that job only: a file of its state directory the daemon refuses
    (:func:`slurmgpu.elastic.spec.load_progress`: a FIFO, a link, too large, nested too
    deep...) withholds the job from the policies while it stays so (no resize is decided
    on input the daemon could not read), logged once and counted
    (``sgpu_user_input_rejected_total``); any other exception while gathering one job's
    inputs leaves that job out, logged once with its traceback and counted in ``errors``
    under ``inputs`` (``sgpu_policy_errors_total``).
    """

    def __init__(self, store: JobStore, *, errors: Counter[str] | None = None) -> None:
        self.store = store
        self.errors: Counter[str] = errors if errors is not None else Counter()
        self._cache: dict[int, MalleableSpec | None] = {}
        self._failing: set[tuple[str, int]] = set()

    def specs(self, cluster: ClusterSnapshot) -> dict[int, MalleableSpec]:
        out: dict[int, MalleableSpec] = {}
        live: set[int] = set()
        for job in cluster.jobs:
            try:
                spec = self._spec(job, live)
            except Exception:  # one job's comment or record must not cost the others
                self._failed("spec", job.job_id)
                continue
            if spec is not None:
                out[spec.job_id] = spec
        for key in [k for k in self._cache if k not in live]:
            del self._cache[key]
        listed = live | {job.job_id for job in cluster.jobs}
        self._failing = {(w, j) for w, j in self._failing if j in listed}
        return out

    def _spec(self, job: Job, live: set[int]) -> MalleableSpec | None:
        if job.state.is_terminal or "sgpu:" not in job.comment:
            return None
        if parse(job.comment).malleable is None:
            return None
        key = job.array_job_id if job.array_job_id is not None else job.job_id
        live.add(key)
        if key not in self._cache:
            self._cache[key] = spec_from(job, self._submission(key))
        return self._cache[key]

    def _submission(self, job_id: int) -> dict[str, Any] | None:
        try:
            rows = self.store.submissions(job_id)
        except (StoreError, SQLAlchemyError) as exc:  # a read must not stop a cycle
            log.warning("submission of job %d not read: %s", job_id, exc)
            return None
        return rows[-1] if rows else None

    def _failed(self, what: str, job_id: int) -> None:
        self.errors["inputs"] += 1
        if (what, job_id) not in self._failing:
            self._failing.add((what, job_id))
            log.exception("job %d: its malleable %s not read; the job is left out", job_id, what)

    def measure(self, cluster: ClusterSnapshot, specs: Mapping[int, MalleableSpec]) -> Measured:
        """Throughput by GPU count that running malleable jobs reported (progress.json),
        and the jobs whose ``progress.json`` or ``ack.json`` the daemon refused."""
        out: dict[int, dict[int, float]] = {}
        refused: set[int] = set()
        for job in cluster.jobs:
            spec = specs.get(job.job_id)
            if spec is None or spec.pool or job.state.is_terminal:
                continue
            try:
                rates = self._rates(spec, job)
            except UserFileRejected:
                refused.add(job.job_id)
                continue
            except Exception:
                self._failed("progress", job.job_id)
                refused.add(job.job_id)
                continue
            if rates:
                out[job.job_id] = rates
        return Measured(out, frozenset(refused))

    def _rates(self, spec: MalleableSpec, job: Job) -> dict[int, float]:
        state_dir = state_dir_of(spec, job)
        source, name = "progress", PROGRESS_FILE
        try:
            progress = load_progress(state_dir, job.job_id)
            source, name = "ack", ACK_FILE
            load_ack(state_dir, job.job_id)  # a resize would rest on it
        except UserFileRejected as exc:
            userinput_stats.rejected(
                source,
                job.job_id,
                exc.cause,
                what=f"{name} in {job_dir(state_dir, job.job_id)}",
                consequence="the job is not resized while it stays so",
            )
            raise
        return dict(progress.throughput) if progress is not None else {}

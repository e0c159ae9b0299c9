"""After each observe cycle: check held samples against the jobs Slurm now lists.

Samples of jobs the daemon had not seen wait in the hold (store/sample_hold.py). Once a
cycle has stored the listing, those of every stored job are moved to ``samples`` when they
fit the job's run and dropped otherwise. This runs before the cycle's end-of-job
summaries, so a job that ended in the cycle is summarised with its released samples; a
job that had already ended (its samples reached the hold while that cycle was being
stored) is summarised again, and the newer summary is the one reports read.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.daemon.observer import CycleResult
from slurmgpu.daemon.summary import Summarizer
from slurmgpu.model import Job
from slurmgpu.store.database import StoreError
from slurmgpu.store.jobstore import JobStore
from slurmgpu.store.sample_hold import HeldRuns, ReleaseResult
from slurmgpu.store.usage import UsageStore

__all__ = ["HoldRelease"]

log = logging.getLogger("slurmgpu.daemon")


class HoldRelease:
    """Releases held samples after each good observe cycle (one line per store outage)."""

    def __init__(
        self, usage: UsageStore, runs: HeldRuns, store: JobStore, summarizer: Summarizer
    ) -> None:
        self.usage = usage
        self.runs = runs
        self.store = store
        self.summarizer = summarizer
        self._trouble: str | None = None

    def after_cycle(self, result: CycleResult) -> ReleaseResult | None:
        """Release what fits now; re-summarise finished jobs that got samples (not those
        ending in this cycle: the caller summarises them next). None when the store failed."""
        try:
            released = self.usage.hold.release(self.runs, now=result.at.timestamp())
        except StoreError as exc:  # the store away: said once, tried again next cycle
            if str(exc) != self._trouble:
                log.warning("held samples not checked this cycle: %s", exc)
            self._trouble = str(exc)
            return None
        except Exception as exc:  # a bug on some row must not cost the cycle's summaries
            if str(exc) != self._trouble:
                log.exception("held samples not checked this cycle")
            self._trouble = str(exc)
            return None
        if self._trouble is not None:
            log.info("held samples are checked again")
            self._trouble = None
        if released.kept or released.dropped:
            # Releases are routine (every job's first samples): said at INFO only when
            # some were dropped (each node's first drop is also a store WARNING).
            log.log(
                logging.INFO if released.dropped else logging.DEBUG,
                "held samples: %d released to %d job(s), %d dropped",
                released.kept,
                len(released.jobs),
                released.dropped,
            )
        listed = {job.job_id: job for job in result.snapshot.jobs} if result.snapshot else {}
        for job_id in sorted(released.jobs - set(result.ended)):
            job = listed.get(job_id) or self._stored(job_id)
            if job is None or not job.state.is_terminal:
                continue
            try:
                self.summarizer.job_ended(job, result.at)
            except Exception:  # one job's summary must not cost the others theirs
                log.exception("summary of job %d failed; other jobs go on", job_id)
        return released

    def _stored(self, job_id: int) -> Job | None:
        try:
            rows = self.store.jobs(job_ids=[job_id], limit=1)
        except (StoreError, SQLAlchemyError) as exc:
            log.warning("job %d not summarised again with its released samples: %s", job_id, exc)
            return None
        return rows[0].job if rows else None

"""The observe step: one job listing + one node listing → diff → one stored transaction."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from slurmgpu.daemon.diff import JobDiff, diff_jobs
from slurmgpu.model import ClusterSnapshot, Job, JobState, Node
from slurmgpu.slurm.client import SlurmClient, SlurmError, SlurmParseError, SlurmUnavailableError
from slurmgpu.store.database import StoreError
from slurmgpu.store.jobstore import JobStore

log = logging.getLogger("slurmgpu.daemon")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one cycle did; ``ok`` is False when the cycle was skipped and state kept."""

    ok: bool
    at: datetime
    error: str = ""
    jobs_seen: int = 0
    new: int = 0
    changed: int = 0
    transitions: int = 0
    gone: int = 0
    vanished: int = 0
    nodes_changed: int = 0
    ended: tuple[int, ...] = ()  # jobs that reached a terminal state in this cycle
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    snapshot: ClusterSnapshot | None = None


class Observer:
    """Keeps the last listing in memory and stores only what changed.

    On construction it reloads the unfinished jobs from the store, so a restarted daemon
    diffs against what it recorded before, not against nothing.
    """

    def __init__(
        self,
        slurm: SlurmClient,
        store: JobStore,
        *,
        vanish_after_cycles: int = 2,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.slurm = slurm
        self.store = store
        self.vanish_after_cycles = vanish_after_cycles
        self.clock = clock
        active = store.active_jobs()
        self._jobs: dict[int, Job] = {jid: job for jid, (_, job) in active.items()}
        self._row_ids: dict[int, int] = {jid: rid for jid, (rid, _) in active.items()}
        self._missing: dict[int, int] = {}
        self._nodes: dict[str, Node] = store.known_nodes()
        # The last successful snapshot, for the API thread (replaced whole, never mutated).
        self.latest: ClusterSnapshot | None = None

    def cycle(self) -> CycleResult:
        """Observe once; never raises for Slurm or store trouble (the result says why)."""
        at = self.clock()
        t0 = time.perf_counter()
        try:
            jobs = self.slurm.jobs()
            t_jobs = time.perf_counter()
            nodes = self.slurm.nodes()
            t_nodes = time.perf_counter()
        except SlurmUnavailableError as exc:
            return CycleResult(
                False, at, f"slurm unavailable: {exc}", seconds=time.perf_counter() - t0
            )
        except SlurmParseError as exc:
            return CycleResult(
                False, at, f"slurm output not understood: {exc}", seconds=time.perf_counter() - t0
            )
        except SlurmError as exc:
            return CycleResult(False, at, f"slurm error: {exc}", seconds=time.perf_counter() - t0)
        return self.apply(
            jobs, nodes, at, t0=t0, t_fetch={"jobs": t_jobs - t0, "nodes": t_nodes - t_jobs}
        )

    def apply(
        self,
        jobs: list[Job],
        nodes: list[Node],
        at: datetime,
        *,
        t0: float | None = None,
        t_fetch: dict[str, float] | None = None,
    ) -> CycleResult:
        """Diff a listing against memory and store it (the cycle minus the Slurm calls)."""
        t0 = time.perf_counter() if t0 is None else t0
        t_diff0 = time.perf_counter()
        diff: JobDiff = diff_jobs(
            self._jobs, jobs, self._missing, vanish_after_cycles=self.vanish_after_cycles
        )
        changed_nodes = [n for n in nodes if self._nodes.get(n.name) != n]
        t_diff = time.perf_counter()
        row_ids = dict(self._row_ids)
        try:
            self.store.apply_cycle(diff, row_ids, changed_nodes, at)
        except StoreError as exc:
            return CycleResult(False, at, str(exc), seconds=time.perf_counter() - t0)
        t_store = time.perf_counter()
        # Commit to memory only after the database has the cycle.
        self._row_ids = row_ids
        self._missing = diff.missing
        for job in diff.new:
            self._jobs[job.job_id] = job
        for job in diff.changed:
            self._jobs[job.job_id] = job
        for job_id in (*diff.gone, *diff.vanished):
            self._jobs.pop(job_id, None)
        for node in changed_nodes:
            self._nodes[node.name] = node
        ended = tuple(
            t.job_id
            for t in diff.transitions
            if t.to_state is not None
            and t.kind in {"state", "submitted"}
            and JobState(t.to_state).is_terminal
        )
        snapshot = ClusterSnapshot(taken_at=at, jobs=tuple(jobs), nodes=tuple(nodes))
        self.latest = snapshot
        timings = dict(t_fetch or {})
        timings.update(diff=t_diff - t_diff0, store=t_store - t_diff)
        return CycleResult(
            True,
            at,
            jobs_seen=len(jobs),
            new=len(diff.new),
            changed=len(diff.changed),
            transitions=len(diff.transitions),
            gone=len(diff.gone),
            vanished=len(diff.vanished),
            nodes_changed=len(changed_nodes),
            ended=ended,
            seconds=time.perf_counter() - t0,
            timings=timings,
            snapshot=snapshot,
        )

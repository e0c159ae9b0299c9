"""The resize transaction: a running malleable job moved to another GPU count, crash-safe.

Slurm cannot change a running job's GPUs, so a resize is a sequence of Slurm calls, each
recorded in the ``transactions`` table before the next one is made::

    PLANNED ──signal──> SIGNALED ──ack──> CHECKPOINTED ──requeuehold──> HELD
        ──(job pending) update──> UPDATED ──release──> RELEASED ──(runs at new size)──> RUNNING

A job on several nodes shrinking by node count (``shrink_in_place``) leaves the requeue
out: CHECKPOINTED ──update NumNodes= (running) + TERM to its steps──> UPDATED
(``in_place``) ──(runs on the nodes kept)──> RUNNING; its batch launcher (``sgpu
launch``) starts the command again at the new size. Slurm refusing that update sends the
resize down the requeue path instead.

and the ways back, each leaving the job running or about to run, never held:

- PLANNED, SIGNALED: the job is not running at ``from`` any more, or no acknowledgement
  came before the deadline (the checkpoint grace) → ABORTED; nothing was requeued and the
  job keeps running (it may have written a checkpoint, which is harmless).
- CHECKPOINTED: the job stopped running, or the ack is older than half the grace (the
  job stops waiting after the grace and trains on, so a requeue would lose steps) →
  ABORTED.
- HELD: Slurm refuses the update → the old size's start time is set and the job is
  released at its old size → RELEASED with ``rolled_back`` → ROLLED_BACK once it runs.
- RELEASED: the job waits with a reason it never leaves (``QOSMaxGRESPerJob``,
  ``BadConstraints``...: Slurm takes an update past a QOS limit or past what a node holds
  from an operator or coordinator) → its request goes back to the old size → ROLLED_BACK
  once it runs.
- RELEASED, and still pending ``overtaken_after`` later: other jobs took the GPUs it was
  released for (Slurm starts whatever comes first when its allocation frees, and a job
  shrunk to fit beside others may no longer fit) → OVERTAKEN. The job stays pending at
  the request the resize gave it, an ordinary malleable job again: the policies may
  change it (start it at what fits, its queue's nice), which nothing may while a
  transaction is open (``resize in flight``), so no transaction holds a job for hours.
- Any state after the requeue: the job is released whatever else fails.

**A user's own hold.** Slurm (22.05) shows the requeue's hold as ``JobHeldUser`` too,
and a ``scontrol hold`` the user adds while the job is held by the resize (between the
requeue and the release, a few seconds) leaves nothing to tell the two apart: that
hold is lifted with ours (docs/reliability.md). A hold seen after the release is never
ours, so it is left alone and the transaction closes as ENDED.

**Idempotent steps.** Each step first looks at what Slurm shows (state, restart count,
reason) and only then acts, so repeating a step a crashed daemon already took does
nothing twice: a job whose restart count grew was requeued already; the update sets an
absolute count (applying it again changes nothing); a release of a job that is not held
is a no-op. The state moves by compare-and-set, so one transaction never advances twice.
One open transaction per job: a second resize of a job in flight is refused, so a job is
never resized twice for one decision.

**Restart.** ``recover()`` on daemon start: PLANNED rows (the daemon may have died before
or just after the signal) are aborted -- the job keeps running; every later state resumes
(the next cycles carry it forward), so a job requeued held by a dead daemon is released.

**Fastest correct path on Slurm 22.05.** ``scontrol requeue`` sets the job's begin time
to now + ``cred_expire`` + 1 s (121 s by default), and the job then waits for the next
scheduling pass. The delay exists so that a new launch credential for the same job id
is not refused by slurmd as revoked: slurmd refuses a credential whose creation second is
not after the revocation's (``ctime <= revoked``). Once the job is seen PENDING (its
old allocation has been revoked and released), setting ``StartTime=now+1`` makes
every later credential strictly newer, so the update also sets it (``fast_start``). The
release, 1.5 s later (once that begin time has passed), then triggers a scheduling pass
at once; released earlier, the job would wait for the next backfill pass (up to 30 s).
docs/malleable.md has the measurements.

**Acknowledgement.** The job's ``slurmgpu.elastic`` runtime writes ``ack.json`` in its
state directory (shared with the head node); its ``acks`` counter, read before the
signal, tells a fresh acknowledgement from an old one without comparing clocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from slurmgpu.cycle.transactions import (
    AckReader,
    GuardedAckReader,
    TransactionRow,
    Transactions,
)
from slurmgpu.elastic.spec import DEFAULT_DIR_NAME, read_ack
from slurmgpu.intent import (
    Intent,
    Preempt,
    Resize,
    SetGpus,
    SetNice,
    SetNodes,
    SetTimeLimit,
    StartSoon,
    resize_of,
)
from slurmgpu.model import ClusterSnapshot, Job, JobState, MalleableSpec
from slurmgpu.policy.base import Action, is_preempt, slurm_job_ref
from slurmgpu.slurm.client import FullSignalClient, SlurmClient, SlurmError
from slurmgpu.slurm.update import parse_fields, update_fields

log = logging.getLogger("slurmgpu.cycle.resize")
_I = TypeVar("_I", bound=Intent)

__all__ = [
    "CLOSED",
    "KIND",
    "OPEN",
    "OVERTAKEN",
    "ResizeError",
    "ResizeExecutor",
    "ResizeSettings",
    "durations",
    "job_gpus",
    "median_phases",
    "resize_intent",
    "state_dir_of",
]

KIND = "resize"
PLANNED = "planned"
SIGNALED = "signaled"
CHECKPOINTED = "checkpointed"
HELD = "held"
UPDATED = "updated"
RELEASED = "released"
RUNNING = "running"  # RUNNING-AT-NEW-SIZE: done
ABORTED = "aborted"  # never requeued; the job kept running at its old size
ROLLED_BACK = "rolled_back"  # requeued, update refused, running again at its old size
ENDED = "ended"  # the job ended (or vanished) after the requeue, or was held again
# after our release by its user or an admin (a hold slurmgpu never lifts)
OVERTAKEN = "overtaken"  # released, still pending after ``overtaken_after``: others ran
OPEN = (PLANNED, SIGNALED, CHECKPOINTED, HELD, UPDATED, RELEASED)
CLOSED = (RUNNING, ABORTED, ROLLED_BACK, ENDED, OVERTAKEN)
HELD_REASONS = ("job_requeued_in_held_state", "JobHeldAdmin", "JobHeldUser")
# Pending reasons of a request the job will never run with: over a site limit (QOS,
# association, partition) or more than the partition's nodes hold. Slurm takes such an
# update from an operator or account coordinator and the job then waits for ever (seen
# on 22.05: a QOS MaxTRESPerJob=gres/gpu=2 and a job updated to 4 GPUs, pending with
# QOSMaxGRESPerJob; a one-node job updated to 8 GPUs a node on 4-GPU nodes, pending with
# BadConstraints): the resize goes back to the old size.
NEVER_RUNS_REASON_PREFIXES = (
    "QOSMax",
    "AssocMax",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "BadConstraints",
)


class ResizeError(Exception):
    """A resize that cannot start (not malleable, out of bounds, not running...)."""


@dataclass(frozen=True, slots=True)
class ResizeSettings:
    """How the executor paces a resize: the ``[policy.resize]`` table of the config file.

    - ``ack_timeout``: how long to wait for the checkpoint acknowledgement; None (the
      file's ``"grace"``) uses each job's checkpoint grace.
    - ``requeue_within`` (0.5): share of the job's grace after its ack within which the
      requeue must happen, else the resize is aborted (the job stops waiting after the
      grace and trains on, so a later requeue would lose steps).
    - ``fast_start`` (true): set ``StartTime=now+1`` with the update (see the module
      docstring).
    - ``shrink_in_place`` (true): a job on several nodes that shrinks by node count keeps
      running: after the acknowledgement, ``NumNodes=`` on the running job releases the
      nodes it leaves, and a TERM to its steps ends the holding workers; its batch
      launcher starts the command again on the nodes kept (no requeue, no wait to be
      scheduled again). False: every resize takes the requeue path.
    - ``release_delay`` (1.5 s): with ``fast_start``, the release waits this long after
      the update, so that the begin time (now+1 on slurmctld's clock) has passed when the
      release triggers the scheduler: a job not yet eligible then waits for the next
      backfill pass.
    - ``release_after`` (10 min): a job requeued held that Slurm still shows completing
      after this long is released anyway (at whatever size it has then), so a stuck
      epilog never leaves a job held.
    - ``overtaken_after`` (10 min): a released job still pending this long was overtaken
      (others took the GPUs it was released for): its transaction closes as OVERTAKEN
      and the job is an ordinary pending job again (see the module docstring).
    - ``cycle_interval`` (1 s): how often the daemon observes while a resize is in
      flight (each step waits for the next observation).
    """

    ack_timeout: timedelta | None = None
    requeue_within: float = 0.5
    fast_start: bool = True
    shrink_in_place: bool = True
    release_delay: timedelta = timedelta(seconds=1.5)
    release_after: timedelta = timedelta(minutes=10)
    overtaken_after: timedelta = timedelta(minutes=10)
    cycle_interval: timedelta = timedelta(seconds=1)


def state_dir_of(spec: MalleableSpec, job: Job) -> str:
    if spec.state_dir:
        return spec.state_dir
    return str(Path(job.work_dir or ".") / DEFAULT_DIR_NAME)


def job_gpus(job: Job) -> int:
    """GPUs the job runs with (allocated), else what it asks for."""
    return job.allocated_gpus or job.gpus.gpus


def resize_intent(job: Job, to_gpus: int, *, by_nodes: bool = False) -> Intent:
    """The change that gives ``job`` ``to_gpus`` GPUs in total.

    ``--gres``/``--gpus-per-node`` jobs change their per-node count on one node, or their
    node count when ``to_gpus`` is a multiple of the per-node count (on more than one
    node, or with ``by_nodes``: a multi-node job shrunk to one node grows back by node
    count, keeping its GPUs per node); ``--gpus`` jobs their total. ``TresPerNode``
    replaces the whole per-node TRES string, so jobs that also ask for shards (or
    anything else per node) are refused.
    """
    req = job.gpus
    if to_gpus < 1:
        raise ResizeError("a job keeps at least one GPU")
    if req.shards or req.per_task is not None:
        raise ResizeError("only jobs asking for whole GPUs per node or per job are resized")
    if req.per_job is not None:
        return SetGpus(to_gpus, req.gpu_type or None, per_node=False)
    if req.per_node is None:
        raise ResizeError("the job's GPU request is not per node or per job")
    nodes = max(job.node_count, 1)
    if nodes == 1 and not by_nodes:
        return SetGpus(to_gpus, req.gpu_type or None)
    if to_gpus % req.per_node == 0:
        return SetNodes(to_gpus // req.per_node)
    raise ResizeError(
        f"{to_gpus} GPUs is not a whole number of nodes of {req.per_node} GPUs for this job"
    )


def _last(kind: type[_I], intents: Iterable[Intent]) -> _I | None:
    """The last intent of ``kind`` (a later one of a kind replaces an earlier one)."""
    out: _I | None = None
    for i in intents:
        if isinstance(i, kind):
            out = i
    return out


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _held(job: Job) -> bool:
    return job.state is JobState.PENDING and any(r in job.reason for r in HELD_REASONS)


def _never_runs(job: Job) -> bool:
    """The job waits because of a request it will never run with (a site limit, or more
    than the partition's nodes hold)."""
    return job.state is JobState.PENDING and job.reason.startswith(NEVER_RUNS_REASON_PREFIXES)


class ResizeExecutor:
    """Starts and advances resize transactions; never raises for Slurm trouble."""

    def __init__(
        self,
        slurm: SlurmClient,
        store: Transactions,
        settings: ResizeSettings | None = None,
        acks: AckReader | None = None,
    ) -> None:
        self.slurm = slurm
        self.store = store
        self.settings = settings or ResizeSettings()
        # ack.json in the job's state directory; the simulator reads SimSlurm's record.
        self.read_ack: AckReader = GuardedAckReader(acks or read_ack)

    # ------------------------------------------------------------------ start

    def start(
        self,
        action: Action,
        job: Job,
        spec: MalleableSpec | None,
        *,
        at: datetime,
        slurm_version: str = "",
        to_gpus: int,
    ) -> TransactionRow:
        """Record a PLANNED transaction and send the checkpoint signal; ResizeError if not."""
        if spec is None or spec.pool:
            raise ResizeError(f"job {job.job_id} is not malleable: it is never resized")
        if job.state is not JobState.RUNNING or "COMPLETING" in job.state_flags:
            raise ResizeError(f"job {job.job_id} is not running")
        if not job.requeue:
            raise ResizeError(f"job {job.job_id} cannot be requeued (submitted --no-requeue)")
        current = job_gpus(job)
        if not spec.min_gpus <= to_gpus <= spec.max_gpus:
            raise ResizeError(
                f"{to_gpus} GPUs is outside job {job.job_id}'s range "
                f"{spec.min_gpus}:{spec.max_gpus}"
            )
        preempt = is_preempt(action)  # the same transaction at the same size
        if to_gpus == current and not preempt:
            raise ResizeError(f"job {job.job_id} already has {current} GPUs")
        by_nodes = self._resized_by_nodes(job.job_id)
        old: list[Intent] = [resize_intent(job, current, by_nodes=by_nodes)]
        sized = resize_of(action.intents)
        moved = sized.gpu_type if isinstance(sized, Resize) else None
        # the changes for the held job's update besides its size (nice, time limit)
        nice = _last(SetNice, action.intents)
        limit = _last(SetTimeLimit, action.intents)
        if moved:
            # the type-aware malleable policy moves the job to another GPU type: the
            # new request names it (``gpu:TYPE:N``); the old update keeps the old type
            job = dataclasses.replace(job, gpus=dataclasses.replace(job.gpus, gpu_type=moved))
        new: list[Intent] = [resize_intent(job, to_gpus, by_nodes=by_nodes)]
        if nice is not None:
            # A preempted job waits in the queue its policy put it in.
            new.append(nice)
        if limit is not None:
            # The limit for the new size goes in the same pending update (the daemon runs
            # as SlurmUser/root, so it may raise it).
            new.append(limit)
            old.append(SetTimeLimit.of(job.time_limit))
        # The payload keeps both updates as fields (the format rows have always had;
        # read back with parse_fields), spelt for the release the decision was made on.
        fields = update_fields(new, slurm_version)
        old_fields = update_fields(old, slurm_version)
        state_dir = state_dir_of(spec, job)
        ack = self.read_ack(state_dir, job.job_id)
        grace = self.settings.ack_timeout or spec.checkpoint_grace
        payload: dict[str, Any] = {
            "ref": slurm_job_ref(job),
            "from_gpus": current,
            "to_gpus": to_gpus,
            "fields": fields,
            "old_fields": old_fields,
            "signal": spec.checkpoint_signal,
            "grace_s": spec.checkpoint_grace.total_seconds(),
            "state_dir": state_dir,
            "acks_before": ack.acks if ack else 0,
            "restart_before": job.restart_count,
            "policy": action.policy,
            "reason": action.reason,
            "t": {"decided": _iso(at)},
        }
        row = self.store.create(
            job.job_id, KIND, PLANNED, at=at, deadline=at + grace, payload=payload, open_states=OPEN
        )
        if row is None:
            raise ResizeError(f"job {job.job_id} already has a resize in flight")
        log.info(
            "resize %d: job %d %d -> %d GPUs planned (%s)",
            row.id,
            job.job_id,
            current,
            to_gpus,
            action.reason,
        )
        try:
            advanced = self._planned(row, job, at)
        except SlurmError as exc:
            # Left PLANNED: the next cycles send the signal again (recover() aborts it).
            log.warning("resize %d of job %d: signal not sent yet: %s", row.id, job.job_id, exc)
            return row
        return advanced or row

    def _resized_by_nodes(self, job_id: int) -> bool:
        """Whether the job's last completed resize changed its node count (``NumNodes``):
        a multi-node job shrunk to one node keeps being resized by node count."""
        try:
            rows = self.store.recent([KIND], job_id=job_id, limit=20)
        # The SQL store's StoreError (not imported: the simulator loads this module
        # without sqlalchemy); the history is a hint that never stops the resize.
        except Exception as exc:
            log.warning("resize history of job %d unreadable: %s", job_id, exc)
            return False
        for row in rows:  # newest first
            if row.state == RUNNING:
                intents, _ = parse_fields(row.payload.get("fields") or {}, strict=False)
                return any(isinstance(i, SetNodes) for i in intents)
        return False

    # ------------------------------------------------------------------ cycle

    def open(self) -> list[TransactionRow]:
        return self.store.in_states([KIND], OPEN)

    def recover(self, at: datetime) -> int:
        """On daemon start: abort PLANNED rows (job keeps running), keep the rest going."""
        rows = self.open()
        for row in rows:
            if row.state == PLANNED:
                self._close(row, ABORTED, at, "the daemon stopped before the checkpoint request")
            else:
                log.warning(
                    "resize %d of job %d resumes at %s after a daemon stop",
                    row.id,
                    row.job_id,
                    row.state,
                )
        return len(rows)

    def advance(self, cluster: ClusterSnapshot, at: datetime) -> list[TransactionRow]:
        """Take every open transaction as far as this snapshot allows; return them."""
        by_id = cluster.jobs_by_id()
        out = []
        for row in self.open():
            try:
                out.append(self._step(row, by_id.get(row.job_id), at))
            except SlurmError as exc:
                log.warning("resize %d of job %d: %s (retried next cycle)", row.id, row.job_id, exc)
                out.append(row)
        return out

    def _step(self, row: TransactionRow, job: Job | None, at: datetime) -> TransactionRow:
        # Several steps can follow each other in one cycle when Slurm's answer to one
        # is all the next needs; observation-dependent steps wait for the next snapshot.
        if row.state == PLANNED:
            return self._planned(row, job, at) or row
        if row.state == SIGNALED:
            return self._signaled(row, job, at) or row
        if row.state == CHECKPOINTED:
            return self._checkpointed(row, job, at) or row
        if row.state == HELD:
            return self._held(row, job, at) or row
        if row.state == UPDATED:
            return self._updated(row, job, at) or row
        if row.state == RELEASED:
            return self._released(row, job, at) or row
        return row

    # ------------------------------------------------------------------ steps

    def _timeline(self, row: TransactionRow, **moments: datetime | None) -> dict[str, Any]:
        t = dict(row.payload.get("t", {}))
        for key, value in moments.items():
            if value is not None and key not in t:
                t[key] = _iso(value)
        return {"t": t}

    def _close(
        self, row: TransactionRow, state: str, at: datetime, why: str, **moments: datetime | None
    ) -> TransactionRow | None:
        done = self.store.advance(
            row, state, at=at, payload=self._timeline(row, closed=at, **moments), error=why
        )
        level = logging.INFO if state == RUNNING else logging.WARNING
        log.log(level, "resize %d of job %d: %s (%s)", row.id, row.job_id, state, why)
        return done

    def _running_at_old_size(self, row: TransactionRow, job: Job | None) -> bool:
        return (
            job is not None
            and job.state is JobState.RUNNING
            and "COMPLETING" not in job.state_flags
            and job.restart_count == row.payload["restart_before"]
            and job_gpus(job) == row.payload["from_gpus"]
        )

    def _requeued(self, row: TransactionRow, job: Job | None) -> bool:
        return job is not None and job.restart_count > row.payload["restart_before"]

    def _planned(self, row: TransactionRow, job: Job | None, at: datetime) -> TransactionRow | None:
        if not self._running_at_old_size(row, job):
            return self._close(row, ABORTED, at, "the job is no longer running at its old size")
        if row.deadline is not None and at >= row.deadline:
            return self._close(row, ABORTED, at, "the checkpoint signal could not be sent in time")
        ref, sig = row.payload["ref"], row.payload["signal"]
        if isinstance(self.slurm, FullSignalClient):
            self.slurm.signal_all(ref, sig)
        else:
            self.slurm.signal(ref, sig)
        return self.store.advance(
            row,
            SIGNALED,
            at=at,
            deadline=row.deadline,
            payload=self._timeline(row, signaled=at),
        )

    def _signaled(
        self, row: TransactionRow, job: Job | None, at: datetime
    ) -> TransactionRow | None:
        if not self._running_at_old_size(row, job):
            return self._close(row, ABORTED, at, "the job stopped before it acknowledged")
        ack = self.read_ack(row.payload["state_dir"], row.job_id)
        fresh = (
            ack is not None
            and ack.acks > row.payload["acks_before"]
            and ack.restart_count == row.payload["restart_before"]
        )
        if ack is not None and fresh:
            # The job waits the grace after its ack; requeue well within it.
            within = float(row.payload["grace_s"]) * self.settings.requeue_within
            hold_by = at + timedelta(seconds=within)
            nxt = self.store.advance(
                row,
                CHECKPOINTED,
                at=at,
                deadline=hold_by,
                payload={**self._timeline(row, acked=at), "ack_step": ack.step},
            )
            return self._checkpointed(nxt, job, at) if nxt else None
        if row.deadline is not None and at >= row.deadline:
            return self._close(
                row, ABORTED, at, "no checkpoint acknowledgement in time; the job keeps running"
            )
        return None

    def _checkpointed(
        self, row: TransactionRow, job: Job | None, at: datetime
    ) -> TransactionRow | None:
        if self._requeued(row, job):
            # A daemon died after the requeuehold but before writing HELD.
            return self.store.advance(
                row, HELD, at=at, deadline=at + self.settings.release_after, payload={}
            )
        if not self._running_at_old_size(row, job):
            return self._close(row, ABORTED, at, "the job stopped after its checkpoint")
        if row.deadline is not None and at >= row.deadline:
            return self._close(
                row, ABORTED, at, "acknowledged too long ago (the job has trained on); not requeued"
            )
        if self._in_place(row, job):
            shrunk = self._shrink_in_place(row, at)
            if shrunk is None or shrunk.state != CHECKPOINTED:
                return shrunk
            row = shrunk  # refused: the requeue path, as for any other resize
        self.slurm.requeue(row.payload["ref"], hold=True)
        nxt = self.store.advance(
            row,
            HELD,
            at=at,
            deadline=at + self.settings.release_after,
            payload=self._timeline(row, requeued=at),
        )
        return nxt

    def _in_place(self, row: TransactionRow, job: Job | None) -> bool:
        """A shrink by node count of a running job on several nodes (and nothing else
        that only a pending job takes)."""
        if not self.settings.shrink_in_place or job is None or row.payload.get("in_place_refused"):
            return False
        update = self._update_of(row)
        nodes = _last(SetNodes, update)
        others = [i for i in update if not isinstance(i, SetNodes | SetTimeLimit)]
        return nodes is not None and not others and 1 <= nodes.count < job.node_count

    def _shrink_in_place(self, row: TransactionRow, at: datetime) -> TransactionRow | None:
        """``NumNodes=`` on the running job, then TERM to its steps (the workers hold
        after their checkpoint; the batch launcher starts the command again on the nodes
        kept). When Slurm refuses the update, the row noted so and still CHECKPOINTED:
        the caller requeues instead."""
        ref = row.payload["ref"]
        update = self._update_of(row)
        try:
            try:
                self.slurm.update_job(ref, update)
            except SlurmError:
                if _last(SetTimeLimit, update) is None:
                    raise
                update = [i for i in update if not isinstance(i, SetTimeLimit)]
                self.slurm.update_job(ref, update)
        except SlurmError as exc:
            log.warning(
                "resize %d of job %d: shrink in place refused (%s); requeueing instead",
                row.id,
                row.job_id,
                exc,
            )
            return self.store.note(row, {"in_place_refused": str(exc)}, at)
        with contextlib.suppress(SlurmError):  # steps already gone: nothing holds
            self.slurm.signal(ref, "TERM")
        return self.store.advance(
            row,
            UPDATED,
            at=at,
            deadline=at + self.settings.release_after,
            payload={"in_place": True, **self._timeline(row, updated=at)},
        )

    def _with_start(self, intents: Sequence[Intent]) -> tuple[Intent, ...]:
        return (*intents, StartSoon(1)) if self.settings.fast_start else tuple(intents)

    def _held(self, row: TransactionRow, job: Job | None, at: datetime) -> TransactionRow | None:
        ref = row.payload["ref"]
        if job is None or job.state.is_terminal:
            self._release_quietly(ref)
            return self._close(row, ENDED, at, "the job ended while held")
        if job.state is not JobState.PENDING:
            # Still completing (its old allocation is being revoked): not updatable yet.
            if row.deadline is not None and at >= row.deadline:
                self._release_quietly(ref)
                return self.store.advance(
                    row,
                    RELEASED,
                    at=at,
                    deadline=self._overtaken_by(at),
                    payload={"rolled_back": True, **self._timeline(row, released=at)},
                    error="still completing after release_after; released as it was",
                )
            return None
        moments = self._timeline(row, pending=at)
        update = self._update_of(row)
        refused: dict[str, str] = {}
        try:
            try:
                self.slurm.update_job(ref, self._with_start(update))
            except SlurmError as exc:
                if _last(SetTimeLimit, update) is None:
                    raise
                # A limit Slurm will not take (over the partition's MaxTime, say) must
                # not cost the resize: the new size alone, the limit as it was.
                log.warning("resize %d of job %d: time limit refused: %s", row.id, row.job_id, exc)
                update = [i for i in update if not isinstance(i, SetTimeLimit)]
                self.slurm.update_job(ref, self._with_start(update))
                refused = {"time_limit_refused": str(exc)}
        except SlurmError as exc:
            # Update refused: back to the old size, released, nothing lost.
            log.warning("resize %d of job %d: update refused: %s", row.id, row.job_id, exc)
            if self.settings.fast_start:  # the request is unchanged; only skip the delay
                with contextlib.suppress(SlurmError):
                    self.slurm.update_job(ref, (StartSoon(1),))
            nxt = self.store.advance(
                row,
                UPDATED,
                at=at,
                payload={"rolled_back": True, **moments},
                error=f"update refused: {exc}",
            )
            return self._updated(nxt, job, at) if nxt else None
        nxt = self.store.advance(
            row, UPDATED, at=at, payload={**refused, **self._timeline(row, pending=at, updated=at)}
        )
        return self._updated(nxt, job, at) if nxt else None

    def _update_of(self, row: TransactionRow) -> list[Intent]:
        """The held job's update, read back from the payload's fields."""
        intents, unread = parse_fields(row.payload["fields"], strict=False)
        if unread:
            log.warning(
                "resize %d of job %d: fields not understood: %s", row.id, row.job_id, unread
            )
        return [i for i in intents if not isinstance(i, Resize | Preempt)]

    def _release_quietly(self, ref: str) -> None:
        try:
            self.slurm.release(ref)
        except SlurmError as exc:
            log.debug("release %s: %s", ref, exc)

    def _updated(self, row: TransactionRow, job: Job | None, at: datetime) -> TransactionRow | None:
        if row.payload.get("in_place"):
            return self._shrunk(row, job, at)
        ref = row.payload["ref"]
        if self.settings.fast_start and at - row.updated_at < self.settings.release_delay:
            return None  # see ResizeSettings.release_delay
        try:
            self.slurm.release(ref)
        except SlurmError as exc:
            # A job that is not held (a daemon already released it) is fine; anything
            # else is retried next cycle, the transaction stays UPDATED.
            if job is not None and job.state is JobState.PENDING and _held(job):
                raise
            log.info("resize %d: release of %s: %s (not held)", row.id, ref, exc)
        return self.store.advance(
            row,
            RELEASED,
            at=at,
            deadline=self._overtaken_by(at),
            payload=self._timeline(row, released=at),
        )

    def _overtaken_by(self, released: datetime) -> datetime:
        """When a job released at ``released`` and not running yet was overtaken."""
        return released + self.settings.overtaken_after

    def _shrunk(self, row: TransactionRow, job: Job | None, at: datetime) -> TransactionRow | None:
        """After a shrink in place: done once Slurm shows the job running on the kept
        nodes (the launcher restarts the command there by itself)."""
        if job is None or job.state.is_terminal:
            return self._close(row, ENDED, at, "the job ended after its shrink in place")
        want = _last(SetNodes, self._update_of(row))
        nodes = want.count if want is not None else 1
        if job.state is JobState.RUNNING and job.node_count <= nodes:
            got = job_gpus(job)
            why = None if got == row.payload["to_gpus"] else f"runs at {got} GPUs"
            done = self.store.advance(
                row,
                RUNNING,
                at=at,
                payload={"running_gpus": got, **self._timeline(row, closed=at, running=at)},
                error=why,
            )
            log.info("resize %d of job %d done in place: runs at %d GPUs", row.id, row.job_id, got)
            return done
        if row.deadline is not None and at >= row.deadline:
            return self._close(row, ENDED, at, f"still on {job.node_count} nodes after the update")
        return None

    def _back_to_the_old_size(
        self, row: TransactionRow, job: Job, at: datetime
    ) -> TransactionRow | None:
        """The new size never runs: the pending job's request goes back to the old one (no
        hold needed: nothing lets it start meanwhile), and the transaction closes as
        ROLLED_BACK once it runs. A refused update is retried next cycle."""
        old, _unread = parse_fields(row.payload["old_fields"], strict=False)
        try:
            self.slurm.update_job(row.payload["ref"], self._with_start(old))
        except SlurmError as exc:
            log.warning("resize %d of job %d: back to the old size: %s", row.id, row.job_id, exc)
            return None
        log.warning(
            "resize %d of job %d: %d GPUs never runs (%s); back to %d",
            row.id,
            row.job_id,
            row.payload["to_gpus"],
            job.reason,
            row.payload["from_gpus"],
        )
        return self.store.advance(
            row,
            RELEASED,
            at=at,
            deadline=self._overtaken_by(at),
            payload={"rolled_back": True, "limit_reason": job.reason},
            error=f"the new size never runs ({job.reason}); back to the old size",
        )

    def _released_at(self, row: TransactionRow) -> datetime:
        released = row.payload.get("t", {}).get("released")
        return datetime.fromisoformat(released) if released else row.updated_at

    def _overtaken_at(self, row: TransactionRow) -> datetime:
        """The RELEASED row's deadline; a row written before it had one: its release's
        time plus ``overtaken_after``."""
        if row.deadline is not None:
            return row.deadline
        return self._overtaken_by(self._released_at(row))

    def _released(
        self, row: TransactionRow, job: Job | None, at: datetime
    ) -> TransactionRow | None:
        if job is None or job.state.is_terminal:
            return self._close(row, ENDED, at, "the job ended after its requeue")
        if _held(job):
            # Held again after our release: not by us (this row is written only after
            # the release succeeded, so a crash in between leaves the row UPDATED and
            # the release is retried there). The job's user or an admin held it: their
            # hold is theirs to lift, and the resize is over.
            return self._close(
                row, ENDED, at, "held again after the release (by its user or an admin); left held"
            )
        rolled_back = bool(row.payload.get("rolled_back"))
        if not rolled_back and _never_runs(job):
            return self._back_to_the_old_size(row, job, at)
        if job.state is JobState.PENDING and at >= self._overtaken_at(row):
            gpus = row.payload["from_gpus"] if rolled_back else row.payload["to_gpus"]
            waited = int((at - self._released_at(row)).total_seconds())
            return self._close(
                row,
                OVERTAKEN,
                at,
                f"overtaken: still pending {waited} s after the release at {gpus} GPUs "
                f"({job.reason or 'no reason'}); an ordinary pending job again",
            )
        if job.state is not JobState.RUNNING or "COMPLETING" in job.state_flags:
            return None
        want = row.payload["from_gpus"] if rolled_back else row.payload["to_gpus"]
        got = job_gpus(job)
        moments = {"started": job.start_time, "eligible": job.eligible_time, "running": at}
        note = {"running_gpus": got}
        if rolled_back:
            done = self.store.advance(
                row,
                ROLLED_BACK,
                at=at,
                payload={**note, **self._timeline(row, closed=at, **moments)},
                error=row.error or "released at the old size",
            )
            log.warning("resize %d of job %d rolled back: runs at %d GPUs", row.id, row.job_id, got)
            return done
        why = "" if got == want else f"runs at {got} GPUs, not {want}"
        done = self.store.advance(
            row,
            RUNNING,
            at=at,
            payload={**note, **self._timeline(row, closed=at, **moments)},
            error=why or None,
        )
        log.info("resize %d of job %d done: runs at %d GPUs", row.id, row.job_id, got)
        return done


def durations(row: TransactionRow) -> dict[str, float]:
    """Seconds of each phase of a finished resize, from its timeline.

    ``checkpoint``: signal → acknowledgement seen; ``stop``: requeue → job seen pending
    (killed, epilog done); ``requeue_delay``: requeue → the begin time Slurm gave it;
    ``scheduling``: the later of release and begin time → Slurm's start time;
    ``in_place``: a shrink in place's update → the daemon saw the job on the kept nodes;
    ``total``: decision → the daemon saw it running at the new size. Slurm's times have
    whole seconds.
    """
    t = {k: datetime.fromisoformat(v) for k, v in row.payload.get("t", {}).items() if v}
    out: dict[str, float] = {}

    def span(name: str, a: datetime | None, b: datetime | None) -> None:
        if a is not None and b is not None:
            out[name] = max((b - a).total_seconds(), 0.0)

    span("checkpoint", t.get("signaled"), t.get("acked"))
    span("stop", t.get("requeued"), t.get("pending"))
    span("requeue_delay", t.get("requeued"), t.get("eligible"))
    ready = [m for m in (t.get("released"), t.get("eligible")) if m is not None]
    span("scheduling", max(ready) if ready else None, t.get("started"))
    if row.payload.get("in_place"):
        span("in_place", t.get("updated"), t.get("running"))
    span("total", t.get("decided"), t.get("running"))
    return out


def median_phases(rows: Sequence[TransactionRow]) -> dict[str, float]:
    """Median of each phase over resizes that reached the new size."""
    phases: dict[str, list[float]] = {}
    for row in rows:
        if row.state != RUNNING:
            continue
        for k, v in durations(row).items():
            phases.setdefault(k, []).append(v)
    out = {}
    for k, values in phases.items():
        values.sort()
        out[k] = values[len(values) // 2]
    return out

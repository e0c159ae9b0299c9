"""Array pools: a job array whose concurrency (ArrayTaskThrottle) is malleable.

- **Expand**: raise the throttle (``scontrol update JobId=A ArrayTaskThrottle=N``); Slurm
  starts pending tasks as GPUs allow. One step, recorded as a closed transaction.
- **Shrink**: lower the throttle first (no new task starts beyond it; running tasks are
  untouched by a throttle), then ask the newest running tasks above the new limit to
  checkpoint, and requeue each one (addressed ``A_i``, never the array id, which would
  requeue every task) once it acknowledged. A task that does not acknowledge within its
  grace is not requeued: it finishes on its own, and the pool converges as tasks end.

**Slurm 22.05 refuses signals to array tasks while the array still has pending tasks**
(``scancel --signal`` to ``A_i``, to the task's own job id or to its batch step all
answer "Job can not be altered now, try again later", and scancel retries until it
times out; found on the lab cluster). A throttled pool always has pending tasks, so
there the chosen tasks are requeued at once: the requeue's SIGTERM is the checkpoint
request (``slurmgpu.elastic`` treats SIGTERM as "checkpoint now"), and the task has
``KillWait`` seconds (30 by default) to write it before SIGKILL. Arrays with no pending
tasks get the signal and are requeued after their acknowledgement, as above.

A shrink is one ``pool`` transaction (``signaled`` until every chosen task is requeued,
gone or given up on); each task's progress is written before the next Slurm call, and a
task whose restart count grew was requeued already, so a daemon killed at any point
requeues no task twice and no other task at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from slurmgpu.cycle.resize import ResizeError, state_dir_of
from slurmgpu.cycle.transactions import AckReader, GuardedAckReader, TransactionRow, Transactions
from slurmgpu.elastic.spec import read_ack
from slurmgpu.model import ClusterSnapshot, Job, JobState, MalleableSpec
from slurmgpu.policy.base import Action, slurm_job_ref
from slurmgpu.slurm.client import FullSignalClient, SlurmClient, SlurmError

log = logging.getLogger("slurmgpu.cycle.pool")

__all__ = ["KIND", "PoolExecutor", "shrink_victims"]

KIND = "pool"
SIGNALED = "signaled"
DONE = "running"
OPEN = (SIGNALED,)


def shrink_victims(tasks: Sequence[Job], keep: int) -> list[Job]:
    """The running tasks to requeue so that ``keep`` run: the newest (latest start) first."""
    running = [
        t for t in tasks if t.state is JobState.RUNNING and "COMPLETING" not in t.state_flags
    ]
    running.sort(
        key=lambda t: (t.start_time.timestamp() if t.start_time else 0.0, t.array_task_id or 0),
        reverse=True,
    )
    return running[: max(len(running) - keep, 0)]


class PoolExecutor:
    """Starts and advances pool resizes; never raises for Slurm trouble in ``advance``."""

    def __init__(
        self,
        slurm: SlurmClient,
        store: Transactions,
        ack_timeout: timedelta | None = None,
        acks: AckReader | None = None,
    ) -> None:
        self.slurm = slurm
        self.store = store
        self.ack_timeout = ack_timeout
        # ack.json in each task's state directory; the simulator reads SimSlurm's record.
        self._read_ack = GuardedAckReader(acks or read_ack)

    def start(
        self,
        action: Action,
        tasks: Sequence[Job],
        spec: MalleableSpec | None,
        *,
        at: datetime,
        to_tasks: int,
    ) -> TransactionRow:
        array_id = action.job_id
        if spec is None or not spec.pool:
            raise ResizeError(f"array {array_id} is not a malleable pool")
        if not spec.min_gpus <= to_tasks <= spec.max_gpus:
            raise ResizeError(
                f"{to_tasks} tasks is outside pool {array_id}'s range "
                f"{spec.min_gpus}:{spec.max_gpus}"
            )
        mine = [t for t in tasks if t.array_job_id == array_id]
        if not mine:
            raise ResizeError(f"array {array_id} has no tasks left")
        open_rows = [r for r in self.store.in_states([KIND], OPEN) if r.job_id == array_id]
        if open_rows:
            raise ResizeError(f"pool {array_id} already has a shrink in flight")
        self.slurm.set_array_throttle(array_id, to_tasks)
        victims = shrink_victims(mine, to_tasks)
        payload: dict[str, Any] = {
            "to_tasks": to_tasks,
            "signal": spec.checkpoint_signal,
            "policy": action.policy,
            "reason": action.reason,
            "t": {"decided": at.isoformat()},
            "tasks": {},
        }
        if not victims:
            row = self.store.create(
                array_id, KIND, DONE, at=at, deadline=None, payload=payload, open_states=OPEN
            )
            if row is None:
                raise ResizeError(f"pool {array_id} already has a shrink in flight")
            log.info("pool %d: throttle set to %d", array_id, to_tasks)
            return row
        grace = self.ack_timeout or spec.checkpoint_grace
        # See the module docstring: no signal reaches a task of an array with pending tasks.
        by_sigterm = any(t.array_task_spec for t in mine if t.state is JobState.PENDING)
        payload["by_sigterm"] = by_sigterm
        for task in victims:
            ack = self._read_ack(state_dir_of(spec, task), task.job_id)
            payload["tasks"][str(task.job_id)] = {
                "ref": slurm_job_ref(task),
                "state_dir": state_dir_of(spec, task),
                "acks_before": ack.acks if ack else 0,
                "restart_before": task.restart_count,
                "state": "planned",
            }
        row = self.store.create(
            array_id, KIND, SIGNALED, at=at, deadline=at + grace, payload=payload, open_states=OPEN
        )
        if row is None:
            raise ResizeError(f"pool {array_id} already has a shrink in flight")
        for task in victims:
            try:
                if by_sigterm:
                    row = self._requeue(row, str(task.job_id), at)
                else:
                    row = self._signal(row, str(task.job_id), spec.checkpoint_signal, at)
            except SlurmError as exc:  # retried by advance
                log.warning("pool %d: task %s: %s", array_id, task.job_id, exc)
        log.info(
            "pool %d: throttle %d, checkpoint asked of %s",
            array_id,
            to_tasks,
            ", ".join(slurm_job_ref(t) for t in victims),
        )
        return row

    def _signal(self, row: TransactionRow, key: str, sig: str, at: datetime) -> TransactionRow:
        task = row.payload["tasks"][key]
        if isinstance(self.slurm, FullSignalClient):
            self.slurm.signal_all(task["ref"], sig)
        else:
            self.slurm.signal(task["ref"], sig)
        return self._task_state(row, key, "signaled", at)

    def _requeue(self, row: TransactionRow, key: str, at: datetime) -> TransactionRow:
        self.slurm.requeue(row.payload["tasks"][key]["ref"])
        return self._task_state(row, key, "requeued", at)

    def _task_state(
        self, row: TransactionRow, key: str, state: str, at: datetime
    ) -> TransactionRow:
        tasks = {k: dict(v) for k, v in row.payload["tasks"].items()}
        tasks[key]["state"] = state
        tasks[key]["at"] = at.isoformat()
        return self.store.note(row, {"tasks": tasks}, at)

    def recover(self, at: datetime) -> int:
        rows = self.store.in_states([KIND], OPEN)
        for row in rows:
            log.warning(
                "pool shrink %d of array %d resumes after a daemon stop", row.id, row.job_id
            )
        return len(rows)

    def advance(self, cluster: ClusterSnapshot, at: datetime) -> list[TransactionRow]:
        by_id = cluster.jobs_by_id()
        out = []
        for row in self.store.in_states([KIND], OPEN):
            try:
                out.append(self._advance(row, by_id, at))
            except SlurmError as exc:
                log.warning("pool shrink %d: %s (retried next cycle)", row.id, exc)
                out.append(row)
        return out

    def _advance(
        self, row: TransactionRow, by_id: Mapping[int, Job], at: datetime
    ) -> TransactionRow:
        late = row.deadline is not None and at >= row.deadline
        for key, task in list(row.payload["tasks"].items()):
            if task["state"] not in ("planned", "signaled"):
                continue
            job = by_id.get(int(key))
            if job is not None and job.restart_count > task["restart_before"]:
                row = self._task_state(row, key, "requeued", at)  # a stopped daemon's requeue
                continue
            if job is None or job.state is not JobState.RUNNING:
                row = self._task_state(row, key, "gone", at)
                continue
            if task["state"] == "planned" and row.payload.get("by_sigterm"):
                row = self._requeue(row, key, at)
                continue
            if task["state"] == "planned":
                row = self._signal(row, key, row.payload["signal"], at)
                continue
            ack = self._read_ack(task["state_dir"], int(key))
            if ack is not None and ack.acks > task["acks_before"]:
                self.slurm.requeue(task["ref"])
                row = self._task_state(row, key, "requeued", at)
                log.info("pool %d: task %s checkpointed and requeued", row.job_id, task["ref"])
            elif late:
                row = self._task_state(row, key, "kept", at)
                log.warning("pool %d: task %s did not acknowledge; kept", row.job_id, task["ref"])
        pending = [
            t for t in row.payload["tasks"].values() if t["state"] in ("planned", "signaled")
        ]
        if pending:
            return row
        t = dict(row.payload.get("t", {}))
        t["closed"] = at.isoformat()
        done = self.store.advance(row, DONE, at=at, payload={"t": t})
        return done or row

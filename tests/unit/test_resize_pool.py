"""Array pools: expand raises the throttle; shrink lowers it and requeues only the newest
tasks that acknowledged their checkpoint, addressed A_i; a daemon killed after a requeue
never requeues a task twice."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from slurmgpu.cycle.pool import PoolExecutor, shrink_victims
from slurmgpu.cycle.resize import ResizeError
from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.spec import Ack
from slurmgpu.model import ClusterSnapshot, Job, JobState, MalleableSpec
from slurmgpu.policy.base import resize_action
from slurmgpu.store import open_store
from slurmgpu.store.transactions import TransactionStore
from tests.unit.resize_cluster import T0, Killed, ResizeSlurm, gpu_job

ARRAY = 100


def task(i: int) -> Job:
    base = gpu_job(ARRAY + i, gpus=1, comment="sgpu:pool=1:4")
    return replace(
        base,
        array_job_id=ARRAY,
        array_task_id=i,
        array_max_tasks=4,
        start_time=T0 + timedelta(seconds=i),
    )


class Pool:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = TransactionStore(open_store(f"sqlite:///{tmp / 's.db'}").engine)
        self.slurm = ResizeSlurm([task(i) for i in range(4)])
        self.spec = MalleableSpec(
            ARRAY, 1, 4, pool=True, checkpoint_grace=timedelta(seconds=30), state_dir=str(tmp)
        )
        self.executor = PoolExecutor(self.slurm, self.store)
        self.now = T0

    def ack(self, job_id: int) -> None:
        ack = Ack(job_id, 1, 0, 10, 1, 0.0)
        write_atomic(self.tmp / str(job_id) / "ack.json", json.dumps(ack.to_json()).encode())

    def resize(self, frm: int, to: int) -> None:
        jobs = self.slurm.jobs()
        action = resize_action("malleable", jobs[0], frm, to, "waiting jobs")
        self.executor.start(action, jobs, self.spec, at=self.now, to_tasks=to)

    def cycle(self, seconds: float = 1) -> None:
        self.now += timedelta(seconds=seconds)
        snap = ClusterSnapshot(self.now, tuple(self.slurm.jobs()), (), "22.05.8")
        self.executor.advance(snap, self.now)

    def restarts(self) -> dict[int, int]:
        return {j.array_task_id or 0: j.restart_count for j in self.slurm.jobs()}


def test_expanding_a_pool_raises_its_throttle_only(tmp_path: Path) -> None:
    p = Pool(tmp_path)
    p.resize(2, 4)
    assert p.slurm.log == [("throttle", "100", "4")]
    assert p.store.recent(["pool"])[0].state == "running"


def test_shrinking_requeues_only_the_newest_tasks_that_checkpointed(tmp_path: Path) -> None:
    p = Pool(tmp_path)
    p.resize(4, 2)
    assert p.slurm.log[0] == ("throttle", "100", "2")
    assert {(c, r) for c, r, _ in p.slurm.log[1:]} == {("signal", "100_3"), ("signal", "100_2")}
    p.ack(ARRAY + 3)
    p.cycle()
    assert ("requeue", "100_3", "") in p.slurm.log
    assert p.restarts() == {0: 0, 1: 0, 2: 0, 3: 1}
    assert p.store.recent(["pool"])[0].state == "signaled"  # task 2 has not answered
    p.cycle(31)
    row = p.store.recent(["pool"])[0]
    assert row.state == "running"
    assert row.payload["tasks"]["102"]["state"] == "kept"  # ignored the signal: not requeued
    assert p.restarts() == {0: 0, 1: 0, 2: 0, 3: 1}
    assert not any(c == "requeue" and r == "100" for c, r, _ in p.slurm.log)


def test_a_daemon_killed_after_requeueing_a_task_does_not_requeue_it_again(
    tmp_path: Path,
) -> None:
    p = Pool(tmp_path)
    p.resize(4, 3)
    p.ack(ARRAY + 3)
    p.slurm.kill_after = "requeue"
    with pytest.raises(Killed):
        p.cycle()
    p.executor = PoolExecutor(p.slurm, p.store)
    p.executor.recover(p.now)
    p.slurm.settle()
    p.cycle()
    assert [c for c, _, _ in p.slurm.log].count("requeue") == 1
    assert p.store.recent(["pool"])[0].state == "running"


def test_pool_bounds_and_non_pools_are_refused(tmp_path: Path) -> None:
    p = Pool(tmp_path)
    jobs = p.slurm.jobs()
    with pytest.raises(ResizeError, match="outside"):
        p.executor.start(resize_action("m", jobs[0], 4, 5, "x"), jobs, p.spec, at=p.now, to_tasks=5)
    with pytest.raises(ResizeError, match="not a malleable pool"):
        p.executor.start(resize_action("m", jobs[0], 4, 2, "x"), jobs, None, at=p.now, to_tasks=2)
    assert p.slurm.log == []


def test_victims_are_the_latest_started_running_tasks() -> None:
    tasks = [task(i) for i in range(4)]
    tasks[1] = replace(tasks[1], state=JobState.PENDING)
    assert [t.array_task_id for t in shrink_victims(tasks, 1)] == [3, 2]
    assert shrink_victims(tasks, 3) == []


def test_with_pending_tasks_slurm_refuses_signals_so_the_requeue_asks_for_the_checkpoint(
    tmp_path: Path,
) -> None:
    p = Pool(tmp_path)
    meta = replace(
        task(0),
        job_id=999,  # the meta record (its own id here: the fake keys jobs by id)
        state=JobState.PENDING,
        array_task_id=None,
        array_task_spec="4-5%4",
        gpu_allocations=(),
    )
    p.slurm.put(meta)
    p.resize(4, 3)
    assert [(c, r) for c, r, _ in p.slurm.log] == [("throttle", "100"), ("requeue", "100_3")]
    assert p.store.recent(["pool"])[0].payload["by_sigterm"] is True
    p.cycle()
    assert p.store.recent(["pool"])[0].state == "running"
    assert p.restarts()[3] == 1 and p.restarts()[0] == 0

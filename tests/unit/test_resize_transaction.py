"""The resize transaction on a real SQLite store against a Slurm fake that behaves like
22.05 (requeue leaves the job completing, updates need a pending job, release needs a
held one): the happy path, every way back, and a daemon killed after each Slurm call."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import event

from slurmgpu.cycle.resize import (
    ABORTED,
    CLOSED,
    OVERTAKEN,
    RELEASED,
    ROLLED_BACK,
    RUNNING,
    SIGNALED,
    ResizeError,
    ResizeExecutor,
    ResizeSettings,
    durations,
    resize_intent,
)
from slurmgpu.cycle.transactions import MemoryTransactions, TransactionRow
from slurmgpu.elastic.checkpoint import write_atomic
from slurmgpu.elastic.spec import Ack
from slurmgpu.intent import Intent, Resize, SetGpus, SetNice, SetNodes, SetTimeLimit, StartSoon
from slurmgpu.model import ClusterSnapshot, GpuRequest, JobState, MalleableSpec, NodeGpuAllocation
from slurmgpu.policy.base import preempt_action, resize_action
from slurmgpu.slurm.client import SlurmUnavailableError
from slurmgpu.store import open_store
from slurmgpu.store.transactions import TransactionStore
from tests.unit.resize_cluster import HELD, T0, USER_HELD, Killed, ResizeSlurm, gpu_job

JOB = 42


class World:
    def __init__(self, tmp: Path, *, grace_s: float = 60) -> None:
        self.tmp = tmp
        self.url = f"sqlite:///{tmp / 's.db'}"
        self.store = TransactionStore(open_store(self.url).engine)
        self.slurm = ResizeSlurm([gpu_job(JOB)])
        self.spec = MalleableSpec(
            JOB, 2, 4, checkpoint_grace=timedelta(seconds=grace_s), state_dir=str(tmp)
        )
        self.executor = ResizeExecutor(self.slurm, self.store)
        self.acks = 0
        self.now = T0

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(self.now, tuple(self.slurm.jobs()), (), "22.05.8")

    def ack(self) -> None:
        """What the job's runtime does after its checkpoint."""
        self.acks += 1
        job = self.slurm.job(JOB)
        ack = Ack(JOB, self.acks, job.restart_count, 100 + self.acks, 4, 0.0)
        write_atomic(self.tmp / str(JOB) / "ack.json", json.dumps(ack.to_json()).encode())

    def start(
        self, to: int = 2, intents: tuple[Intent, ...] = (), gpu_type: str | None = None
    ) -> TransactionRow:
        job = self.slurm.job(JOB)
        action = resize_action(
            "malleable", job, 4, to, "a 2-GPU job waits", intents=intents, gpu_type=gpu_type
        )
        return self.executor.start(
            action, job, self.spec, at=self.now, slurm_version="22.05.8", to_gpus=to
        )

    def cycle(self, seconds: float = 1.0) -> TransactionRow:
        self.now += timedelta(seconds=seconds)
        self.executor.advance(self.snapshot(), self.now)
        return self.row()

    def row(self) -> TransactionRow:
        return self.store.recent(["resize"], job_id=JOB, limit=1)[0]

    def calls(self) -> list[str]:
        return [c for c, _, _ in self.slurm.log]


def test_a_shrink_signals_waits_for_the_ack_then_requeues_held_updates_and_releases(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    row = w.start()
    assert row.state == SIGNALED
    assert w.slurm.log == [("signal", "42", "USR2")]
    assert w.cycle().state == SIGNALED  # no ack yet: nothing more happens
    w.ack()
    assert w.cycle().state == "held"
    assert w.calls() == ["signal", "requeuehold"]
    assert w.slurm.held() == [JOB]
    assert w.cycle().state == "held"  # still completing: not updatable yet
    w.slurm.settle()
    assert w.cycle().state == "updated"
    assert w.slurm.updates == [(JOB, (SetGpus(2), StartSoon(1)))]
    assert w.slurm.held() == [JOB]  # released once its begin time (now+1) has passed
    assert w.cycle(2).state == RELEASED
    assert w.slurm.held() == []
    w.slurm.schedule(w.now)
    done = w.cycle()
    assert done.state == RUNNING
    assert done.payload["running_gpus"] == 2
    assert w.calls() == ["signal", "requeuehold", "update", "release"]
    phases = durations(done)
    assert phases["checkpoint"] == pytest.approx(2.0)
    assert phases["total"] == pytest.approx(7.0)
    assert {"stop", "scheduling"} <= phases.keys()


def test_no_acknowledgement_in_time_aborts_and_the_job_keeps_running(tmp_path: Path) -> None:
    w = World(tmp_path, grace_s=10)
    w.start()
    assert w.cycle(5).state == SIGNALED
    row = w.cycle(6)
    assert row.state == ABORTED
    assert "no checkpoint acknowledgement" in (row.error or "")
    assert w.calls() == ["signal"]
    job = w.slurm.job(JOB)
    assert job.state is JobState.RUNNING and job.restart_count == 0


def test_an_old_acknowledgement_is_not_taken_for_a_new_one(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.ack()  # from an earlier request
    w.start()
    assert w.cycle().state == SIGNALED
    w.ack()
    assert w.cycle().state == "held"


def test_a_refused_update_releases_the_job_at_its_old_size(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.start()
    w.ack()
    w.cycle()
    w.slurm.settle()
    w.slurm.refuse_update = True
    assert w.cycle().state == "updated"
    row = w.cycle(2)
    assert row.state == RELEASED and row.payload["rolled_back"]
    assert w.slurm.held() == []
    # Only the start time was set: the request is the old one.
    assert w.slurm.updates == [(JOB, (StartSoon(1),))]
    w.slurm.schedule(w.now)
    done = w.cycle()
    assert done.state == ROLLED_BACK
    assert done.payload["running_gpus"] == 4


@pytest.mark.parametrize("reason", ["QOSMaxGRESPerJob", "BadConstraints"])
def test_a_new_size_that_never_runs_goes_back_to_the_old_one(tmp_path: Path, reason: str) -> None:
    """Slurm took the update (an operator's or coordinator's is not checked against QOS
    limits or node sizes) but the released job waits with a reason it never leaves."""
    w = World(tmp_path)
    w.start()
    w.ack()
    w.cycle()
    w.slurm.settle()
    w.cycle()
    assert w.cycle(2).state == RELEASED
    w.slurm.put(replace(w.slurm.job(JOB), reason=reason))
    row = w.cycle()
    assert row.state == RELEASED and row.payload["rolled_back"]
    assert reason in (row.error or "")
    assert w.slurm.updates[-1] == (JOB, (SetGpus(4), StartSoon(1)))
    assert w.slurm.held() == []
    w.slurm.put(replace(w.slurm.job(JOB), reason=""))
    w.slurm.schedule(w.now)
    done = w.cycle()
    assert done.state == ROLLED_BACK and done.payload["running_gpus"] == 4


def test_a_pending_job_waiting_for_resources_is_not_rolled_back(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.start()
    w.ack()
    w.cycle()
    w.slurm.settle()
    w.cycle()
    w.cycle(2)
    w.slurm.put(replace(w.slurm.job(JOB), reason="Resources"))
    row = w.cycle()
    assert row.state == RELEASED and not row.payload.get("rolled_back")
    assert w.slurm.updates == [(JOB, (SetGpus(2), StartSoon(1)))]


def _released_pending(w: World) -> TransactionRow:
    """A shrink taken as far as RELEASED, the job then pending behind others."""
    w.start()
    w.ack()
    w.cycle()
    w.slurm.settle()
    w.cycle()
    row = w.cycle(2)
    assert row.state == RELEASED
    w.slurm.put(replace(w.slurm.job(JOB), reason="Priority"))
    return row


def test_a_released_job_still_pending_after_the_bound_is_closed_as_overtaken(
    tmp_path: Path,
) -> None:
    """Others took the GPUs it was released for: the transaction does not hold the job
    (every other change to it is refused while one is open) for hours."""
    w = World(tmp_path)
    released = _released_pending(w)
    bound = ResizeSettings().overtaken_after
    assert released.deadline == w.now + bound
    w.now += bound - timedelta(seconds=2)
    assert w.cycle().state == RELEASED  # one second before the bound: still in flight
    row = w.cycle()
    assert row.state == OVERTAKEN and OVERTAKEN in CLOSED
    assert "overtaken: still pending 600 s after the release at 2 GPUs (Priority)" in (
        row.error or ""
    )
    assert row.payload["t"]["closed"] == w.now.isoformat()
    assert w.executor.open() == []
    # Nothing more is asked of Slurm: the job keeps the request the resize gave it.
    assert w.calls() == ["signal", "requeuehold", "update", "release"]
    job = w.slurm.job(JOB)
    assert job.state is JobState.PENDING and job.gpus.gpus == 2
    # The job may be resized again: a new transaction starts once it runs.
    w.slurm.schedule(w.now)
    w.cycle()
    assert w.slurm.job(JOB).state is JobState.RUNNING
    assert w.start(to=3).state == SIGNALED


def test_a_released_job_that_starts_within_the_bound_is_not_overtaken(tmp_path: Path) -> None:
    w = World(tmp_path, grace_s=60)
    w.executor = ResizeExecutor(
        w.slurm, w.store, ResizeSettings(overtaken_after=timedelta(seconds=30))
    )
    _released_pending(w)
    assert w.cycle(29).state == RELEASED
    w.slurm.put(replace(w.slurm.job(JOB), reason=""))
    w.slurm.schedule(w.now)
    assert w.cycle().state == RUNNING


def test_a_row_released_before_rows_had_a_deadline_is_overtaken_from_its_release(
    tmp_path: Path,
) -> None:
    """A store written by an older daemon: RELEASED without a deadline."""
    w = World(tmp_path)
    row = _released_pending(w)
    store = MemoryTransactions()
    legacy = store.create(
        row.job_id,
        "resize",
        RELEASED,
        at=row.updated_at,
        deadline=None,
        payload=row.payload,
        open_states=(),
    )
    assert legacy is not None and legacy.deadline is None
    executor = ResizeExecutor(w.slurm, store)
    w.now += ResizeSettings().overtaken_after - timedelta(seconds=1)
    executor.advance(w.snapshot(), w.now)
    assert store.recent(["resize"], limit=1)[0].state == RELEASED
    w.now += timedelta(seconds=1)
    executor.advance(w.snapshot(), w.now)
    assert store.recent(["resize"], limit=1)[0].state == OVERTAKEN


def test_a_job_that_did_not_opt_in_is_never_signalled(tmp_path: Path) -> None:
    w = World(tmp_path)
    job = w.slurm.job(JOB)
    action = resize_action("malleable", job, 4, 2, "x")
    with pytest.raises(ResizeError, match="not malleable"):
        w.executor.start(action, job, None, at=w.now, to_gpus=2)
    assert w.slurm.log == []
    assert w.store.recent(["resize"]) == []


def test_sizes_outside_the_range_and_second_resizes_are_refused(tmp_path: Path) -> None:
    w = World(tmp_path)
    with pytest.raises(ResizeError, match="outside"):
        w.start(to=1)
    w.start()
    with pytest.raises(ResizeError, match="in flight"):
        w.start(to=3)
    assert w.calls() == ["signal"]


def test_an_acknowledgement_seen_too_late_is_not_followed_by_a_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path, grace_s=20)
    w.start()
    w.ack()

    def down(job_id: object, *, hold: bool = False) -> None:
        raise SlurmUnavailableError("slurmctld did not answer")

    # The ack is seen, but slurmctld is away until the job has given up waiting (half
    # the grace): requeuing then would lose the steps it trained since.
    monkeypatch.setattr(w.slurm, "requeue", down)
    assert w.cycle().state == "checkpointed"
    monkeypatch.undo()
    row = w.cycle(11)
    assert row.state == ABORTED and "too long ago" in (row.error or "")
    assert w.calls() == ["signal"]
    assert w.slurm.job(JOB).state is JobState.RUNNING


@pytest.mark.parametrize("killed_after", ["signal", "requeuehold", "update", "release"])
def test_a_daemon_killed_after_any_slurm_call_ends_with_the_job_running_once_resized(
    tmp_path: Path, killed_after: str
) -> None:
    w = World(tmp_path)
    w.slurm.kill_after = killed_after
    w.slurm.on_signal["42"] = w.ack  # the job checkpoints promptly
    try:
        w.start()
        for _ in range(6):
            w.cycle()
            w.slurm.settle()
        pytest.fail("the daemon was not killed")
    except Killed:
        pass
    # A new daemon on the same database.
    w.executor = ResizeExecutor(w.slurm, w.store)
    w.executor.recover(w.now)
    for _ in range(6):
        w.cycle()
        w.slurm.settle()
        w.slurm.schedule(w.now)
    row = w.row()
    job = w.slurm.job(JOB)
    assert row.state in CLOSED
    assert job.state is JobState.RUNNING and job.reason != HELD
    assert w.calls().count("requeuehold") <= 1
    assert job.restart_count <= 1
    if killed_after == "signal":
        assert row.state == ABORTED and job.restart_count == 0 and job.gpus.gpus == 4
    else:
        assert row.state == RUNNING and job.restart_count == 1 and job.gpus.gpus == 2
        # The absolute count may be applied twice (harmless); never another size.
        assert {u[1][0] for u in w.slurm.updates} == {SetGpus(2)}
    assert len(w.store.in_states(["resize"], ["planned", "signaled", "held", "updated"])) == 0


def test_a_job_that_ends_while_held_is_released_and_the_transaction_closed(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    w.start()
    w.ack()
    w.cycle()
    w.slurm.cancel(JOB)
    row = w.cycle()
    assert row.state == "ended"


def test_the_resize_intent_follows_the_request_style() -> None:
    one = gpu_job(1)
    assert resize_intent(one, 2) == SetGpus(2)
    per_job = replace(one, gpus=GpuRequest(gpus=4, per_job=4))
    assert resize_intent(per_job, 3) == SetGpus(3, per_node=False)
    two_nodes = replace(one, node_count=2, gpus=GpuRequest(gpus=8, per_node=4))
    assert resize_intent(two_nodes, 4) == SetNodes(1)
    with pytest.raises(ResizeError, match="whole number of nodes"):
        resize_intent(two_nodes, 6)
    shards = replace(one, gpus=GpuRequest(gpus=1, per_node=1, shards=4))
    with pytest.raises(ResizeError):
        resize_intent(shards, 2)


@pytest.mark.parametrize(
    ("release", "gres"), [("22.05.8", "gres:gpu:2"), ("23.11.1", "gres/gpu:2")]
)
def test_the_payload_keeps_both_updates_spelt_for_the_decisions_release(
    tmp_path: Path, release: str, gres: str
) -> None:
    w = World(tmp_path)
    job = w.slurm.job(JOB)
    action = resize_action("malleable", job, 4, 2, "a 2-GPU job waits")
    row = w.executor.start(action, job, w.spec, at=w.now, slurm_version=release, to_gpus=2)
    assert row.payload["fields"] == {"TresPerNode": gres}
    assert row.payload["old_fields"] == {"TresPerNode": gres.replace("2", "4")}


def test_settings_without_fast_start_leave_slurms_begin_time_alone(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.executor = ResizeExecutor(w.slurm, w.store, ResizeSettings(fast_start=False))
    w.start()
    w.ack()
    w.cycle()
    w.slurm.settle()
    w.cycle()
    assert w.slurm.updates == [(JOB, (SetGpus(2),))]


def test_the_time_limit_for_the_new_size_goes_in_the_same_update(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.slurm.put(replace(w.slurm.job(JOB), time_limit=timedelta(hours=2)))
    row = w.start(intents=(SetTimeLimit(3 * 3600 + 42 * 60),))
    assert row.payload["old_fields"]["TimeLimit"] == "02:00:00"
    w.ack()
    w.cycle()
    w.slurm.settle()
    assert w.cycle().state == "updated"
    assert w.slurm.updates == [(JOB, (SetGpus(2), SetTimeLimit(3 * 3600 + 42 * 60), StartSoon(1)))]
    assert w.slurm.job(JOB).time_limit == timedelta(hours=3, minutes=42)


def test_a_refused_time_limit_does_not_cost_the_resize(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.slurm.max_time = timedelta(hours=3)
    w.start(intents=(SetTimeLimit(3 * 3600 + 42 * 60),))
    w.ack()
    w.cycle()
    w.slurm.settle()
    row = w.cycle()
    assert row.state == "updated" and not row.payload.get("rolled_back")
    assert "exceeds some limit" in row.payload["time_limit_refused"]
    assert w.slurm.updates == [(JOB, (SetGpus(2), StartSoon(1)))]
    w.cycle(2)
    w.slurm.schedule(w.now)
    assert w.cycle().payload["running_gpus"] == 2


def test_a_hold_the_user_sets_after_the_release_is_left_alone(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.start()
    w.ack()
    w.cycle()
    w.slurm.settle()
    w.cycle()
    assert w.cycle(2).state == RELEASED
    # The user holds their pending job (scontrol hold) before it starts.
    w.slurm.put(replace(w.slurm.job(JOB), reason=USER_HELD))
    row = w.cycle()
    assert row.state in CLOSED and "left held" in (row.error or "")
    assert w.slurm.job(JOB).reason == USER_HELD
    assert w.calls().count("release") == 1  # ours, before the user's hold; never theirs
    w.cycle()
    assert w.slurm.job(JOB).reason == USER_HELD


def test_journal_writes_commit_with_synchronous_full(tmp_path: Path) -> None:
    """A power cut must not lose the row saying a job is requeued held (SQLite: the WAL
    is synced at each journal commit); other writes keep synchronous=NORMAL."""
    w = World(tmp_path)
    seen: list[str] = []

    @event.listens_for(w.store.engine, "connect")
    def _trace(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        dbapi_conn.set_trace_callback(seen.append)

    w.store.engine.dispose()  # new connections, traced
    w.start()
    writes = [i for i, s in enumerate(seen) if s.lstrip().upper().startswith(("INSERT", "UPDATE"))]
    assert writes, seen
    for i in writes:
        pragmas = [s for s in seen[:i] if "synchronous" in s.lower()]
        assert pragmas and pragmas[-1].replace(" ", "").lower() == "pragmasynchronous=full", seen
    assert seen[-1].replace(" ", "").lower() == "pragmasynchronous=normal"
    with w.store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL again


def test_a_preemption_is_the_same_transaction_at_the_same_size_with_its_nice(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    job = w.slurm.job(JOB)
    action = preempt_action("las", job, 4, "queue 2: a queue-0 job waits", intents=(SetNice(200),))
    row = w.executor.start(action, job, w.spec, at=w.now, slurm_version="22.05.8", to_gpus=4)
    assert row.state == SIGNALED
    w.ack()
    assert w.cycle().state == "held"
    w.slurm.settle()
    assert w.cycle().state == "updated"
    assert w.slurm.updates == [(JOB, (SetGpus(4), SetNice(200), StartSoon(1)))]
    assert w.cycle(2).state == RELEASED
    w.slurm.schedule(w.now)
    done = w.cycle()
    assert done.state == RUNNING and done.payload["running_gpus"] == 4
    assert w.calls() == ["signal", "requeuehold", "update", "release"]
    # a plain resize to the size it has is still refused
    plain = msgspec.structs.replace(action, intents=(Resize(4, 4),))
    with pytest.raises(ResizeError, match="already has"):
        w.executor.start(plain, job, w.spec, at=w.now, slurm_version="22.05.8", to_gpus=4)


def test_a_type_aware_resize_puts_the_named_gpu_type_in_the_update(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.start(gpu_type="p100")
    w.ack()
    w.cycle()
    w.slurm.settle()
    assert w.cycle().state == "updated"
    assert w.slurm.updates == [(JOB, (SetGpus(2, "p100"), StartSoon(1)))]


def test_a_multinode_job_shrunk_to_one_node_grows_back_by_node_count() -> None:
    one_node = replace(gpu_job(1), node_count=1, gpus=GpuRequest(gpus=2, per_node=2))
    assert resize_intent(one_node, 4) == SetGpus(4)  # a single-node job stays on one node
    assert resize_intent(one_node, 4, by_nodes=True) == SetNodes(2)
    with pytest.raises(ResizeError, match="whole number of nodes"):
        resize_intent(one_node, 3, by_nodes=True)
    store = MemoryTransactions()
    executor = ResizeExecutor(ResizeSlurm([one_node]), store)
    assert not executor._resized_by_nodes(1)  # no history: per-node changes
    fields = {"NumNodes": "1", "StartTime": "now+1"}
    store.create(
        1, "resize", "running", at=T0, deadline=None, payload={"fields": fields}, open_states=()
    )
    assert executor._resized_by_nodes(1)  # its last resize changed the node count
    store.create(
        1,
        "resize",
        "running",
        at=T0,
        deadline=None,
        payload={"fields": {"TresPerNode": "gres:gpu:4"}},
        open_states=(),
    )
    assert not executor._resized_by_nodes(1)  # the newest one counts


def _two_node_world(tmp_path: Path, settings: ResizeSettings | None = None) -> World:
    w = World(tmp_path)
    job = replace(
        gpu_job(JOB),
        node_count=2,
        nodes=("gpu1", "gpu2"),
        gpus=GpuRequest(gpus=4, per_node=2, sources=("tres_per_node",)),
        gpu_allocations=(NodeGpuAllocation("gpu1", (0, 1)), NodeGpuAllocation("gpu2", (0, 1))),
    )
    w.slurm.put(job)
    if settings is not None:
        w.executor = ResizeExecutor(w.slurm, w.store, settings)
    return w


def test_a_multinode_shrink_by_node_count_keeps_the_job_running(tmp_path: Path) -> None:
    w = _two_node_world(tmp_path)
    assert w.start(2).state == SIGNALED
    w.ack()
    row = w.cycle()
    # No requeue: NumNodes=1 on the running job, then TERM to its steps (the workers hold
    # after their checkpoint; the batch launcher starts the command again on gpu1).
    assert row.state == "updated" and row.payload["in_place"] is True
    assert w.calls() == ["signal", "update", "signal_steps"]
    assert w.slurm.log[-1] == ("signal_steps", "42", "TERM")
    assert w.slurm.updates == [(JOB, (SetNodes(1),))]
    job = w.slurm.job(JOB)
    assert (job.state, job.node_count, job.restart_count) == (JobState.RUNNING, 1, 0)
    done = w.cycle()
    assert done.state == RUNNING and done.payload["running_gpus"] == 2 and done.error is None
    assert w.calls() == ["signal", "update", "signal_steps"]  # nothing held, nothing released
    assert {"checkpoint", "in_place", "total"} <= durations(done).keys()
    assert "stop" not in durations(done)


def test_without_shrink_in_place_a_multinode_shrink_is_requeued(tmp_path: Path) -> None:
    w = _two_node_world(tmp_path, ResizeSettings(shrink_in_place=False))
    w.start(2)
    w.ack()
    assert w.cycle().state == "held"
    assert w.calls() == ["signal", "requeuehold"]


def test_a_refused_shrink_in_place_takes_the_requeue_path(tmp_path: Path) -> None:
    w = _two_node_world(tmp_path)
    w.start(2)
    w.ack()
    w.slurm.refuse_update = True
    row = w.cycle()
    assert row.state == "held" and "in_place_refused" in row.payload
    assert w.calls() == ["signal", "requeuehold"]  # the refused update is not logged

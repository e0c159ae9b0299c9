"""The observe cycle against the in-memory fake: transitions, requeues, outages, restarts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurmgpu.daemon.observer import Observer
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.slurm.client import SlurmClient, SlurmParseError, SlurmUnavailableError
from slurmgpu.store import JobStore, open_store
from tests.fakes import FakeSlurm

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=30)
        return self.now


def gpu_job(job_id: int, state: JobState = JobState.PENDING, **kw: object) -> Job:
    base = Job(
        job_id=job_id,
        name=f"j{job_id}",
        user="alice",
        state=state,
        submit_time=T0,
        time_limit=timedelta(hours=1),
        gpus=GpuRequest(gpus=2, per_node=2, sources=("tres_per_node",)),
        requeue=True,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def running(job: Job) -> Job:
    return replace(
        job,
        state=JobState.RUNNING,
        start_time=T0 + timedelta(minutes=1),
        nodes=("gpu1",),
        gpu_allocations=(NodeGpuAllocation("gpu1", (0, 1)),),
    )


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return open_store(f"sqlite:///{tmp_path / 'state.db'}")


def test_fake_implements_the_slurm_client_protocol() -> None:
    assert isinstance(FakeSlurm(), SlurmClient)


def test_lifecycle_is_recorded_as_ordered_transitions(store: JobStore) -> None:
    slurm = FakeSlurm([gpu_job(1)], [Node("gpu1", "idle", gpus=4, shards=16)])
    obs = Observer(slurm, store, clock=Clock())
    assert obs.cycle().new == 1
    slurm.set_jobs([running(gpu_job(1))])
    obs.cycle()
    done = replace(
        running(gpu_job(1)), state=JobState.COMPLETED, end_time=T0 + timedelta(minutes=5)
    )
    slurm.set_jobs([done])
    obs.cycle()
    kinds = [(e["kind"], e["from_state"], e["to_state"]) for e in store.events(1)]
    assert kinds == [
        ("submitted", None, "PENDING"),
        ("state", "PENDING", "RUNNING"),
        ("state", "RUNNING", "COMPLETED"),
    ]
    (stored,) = store.jobs(job_ids=[1])
    assert stored.job == done
    assert stored.job.gpu_allocations[0].gpu_indices == (0, 1)


def test_a_cycle_makes_exactly_one_job_and_one_node_listing(store: JobStore) -> None:
    slurm = FakeSlurm([gpu_job(i) for i in range(1, 51)])
    Observer(slurm, store, clock=Clock()).cycle()
    assert slurm.calls == ["jobs", "nodes"]


def test_requeue_is_an_event_of_the_same_job_not_a_new_job(store: JobStore) -> None:
    slurm = FakeSlurm([running(gpu_job(7))])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.requeue(7)
    result = obs.cycle()
    assert result.new == 0
    assert [e["kind"] for e in store.events(7)] == ["submitted", "requeue"]
    (stored,) = store.jobs(job_ids=[7])
    assert stored.job.restart_count == 1
    assert store.count_jobs() == 1


def test_unchanged_jobs_write_nothing(store: JobStore) -> None:
    slurm = FakeSlurm([gpu_job(1), gpu_job(2)])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    second = obs.cycle()
    assert (second.new, second.changed, second.transitions) == (0, 0, 0)


@pytest.mark.parametrize(
    "error", [SlurmUnavailableError("connection refused"), SlurmParseError("bad JSON at $.jobs")]
)
def test_slurm_failure_skips_the_cycle_and_keeps_every_job(
    store: JobStore, error: Exception
) -> None:
    slurm = FakeSlurm([running(gpu_job(1)), gpu_job(2)])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.fail_with = error  # type: ignore[assignment]
    for _ in range(5):
        result = obs.cycle()
        assert not result.ok
        assert str(error) in result.error
    slurm.fail_with = None
    assert obs.cycle().ok
    assert all(not s.gone for s in store.jobs())
    assert [e["kind"] for e in store.events(1)] == ["submitted"]


def test_finished_job_that_ages_out_is_gone_but_kept(store: JobStore) -> None:
    done = replace(
        running(gpu_job(3)), state=JobState.COMPLETED, end_time=T0 + timedelta(minutes=9)
    )
    slurm = FakeSlurm([done])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    (stored,) = store.jobs(job_ids=[3])
    assert stored.gone
    assert stored.job.state is JobState.COMPLETED


def test_running_job_missing_from_one_listing_is_not_declared_vanished(store: JobStore) -> None:
    slurm = FakeSlurm([running(gpu_job(4))])
    obs = Observer(slurm, store, clock=Clock(), vanish_after_cycles=3)
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    obs.cycle()
    slurm.set_jobs([running(gpu_job(4))])
    obs.cycle()
    assert [e["kind"] for e in store.events(4)] == ["submitted"]
    slurm.set_jobs([])
    for _ in range(3):
        obs.cycle()
    assert [e["kind"] for e in store.events(4)] == ["submitted", "vanished"]


def test_restarted_observer_continues_from_the_store(store: JobStore) -> None:
    slurm = FakeSlurm([gpu_job(5)])
    Observer(slurm, store, clock=Clock()).cycle()
    slurm.set_jobs([running(gpu_job(5))])
    again = Observer(slurm, store, clock=Clock())
    result = again.cycle()
    assert (result.new, result.changed) == (0, 1)
    assert [e["kind"] for e in store.events(5)] == ["submitted", "state"]


def test_reused_job_id_gets_a_new_row(store: JobStore) -> None:
    old = replace(gpu_job(9), state=JobState.COMPLETED)
    slurm = FakeSlurm([old])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    slurm.set_jobs([gpu_job(9, submit_time=T0 + timedelta(days=1))])
    obs.cycle()
    rows = store.jobs(job_ids=[9])
    assert len(rows) == 2
    assert {r.job.state for r in rows} == {JobState.COMPLETED, JobState.PENDING}


def test_nodes_and_their_gpus_are_stored(store: JobStore) -> None:
    nodes = [Node(f"gpu{i}", "idle", cpus=8, gpus=4, shards=16) for i in (1, 2)]
    obs = Observer(FakeSlurm([], nodes), store, clock=Clock())
    obs.cycle()
    assert set(store.known_nodes()) == {"gpu1", "gpu2"}
    assert store.known_nodes()["gpu1"] == nodes[0]

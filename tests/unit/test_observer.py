"""The observe cycle against the in-memory fake: transitions, requeues, outages, restarts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from slurmgpu.daemon.observer import Observer
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.slurm.client import SlurmClient, SlurmParseError, SlurmUnavailableError
from slurmgpu.store import JobStore
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


def test_an_unchanged_job_is_the_snapshots_object_of_the_last_cycle(store: JobStore) -> None:
    """Policies that keep a verdict per job know an unchanged one by identity."""
    obs = Observer(FakeSlurm([]), store, clock=Clock())
    first = [gpu_job(1), gpu_job(2), gpu_job(3)]
    snap = obs.apply(first, [], T0).snapshot
    assert snap is not None and snap.jobs == tuple(first)
    # The next listing is parsed anew: equal objects, one job changed, one new.
    again = [replace(first[0]), running(first[1]), replace(first[2]), gpu_job(4)]
    assert again[0] is not first[0] and again[0] == first[0]
    result = obs.apply(again, [], T0 + timedelta(seconds=30))
    snap = result.snapshot
    assert snap is not None and (result.new, result.changed) == (1, 1)
    assert snap.jobs == tuple(again)  # the same values, in the listing's order
    assert snap.jobs[0] is first[0] and snap.jobs[2] is first[2]  # unchanged: kept
    assert snap.jobs[1] is again[1] and snap.jobs[3] is again[3]  # changed, new


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


# --------------------------------------------------------------------------- sacct


def _finished(job: Job, state: JobState, end: datetime, exit_code: int | None) -> Job:
    """What sacct reports for ``job``: fewer details, the real end."""
    return Job(
        job_id=job.job_id,
        name=job.name,
        user=job.user,
        state=state,
        submit_time=job.submit_time,
        start_time=job.start_time,
        end_time=end,
        reason="NonZeroExitCode" if exit_code else "",
        exit_code=exit_code,
        gpus=GpuRequest(gpus=2, sources=("tres_alloc_str",)),
        nodes=job.nodes,
    )


def _vanish(obs: Observer, slurm: FakeSlurm) -> None:
    slurm.set_jobs([])
    for _ in range(obs.vanish_after_cycles):
        obs.cycle()


def test_vanished_job_known_to_sacct_gets_its_real_end(store: JobStore) -> None:
    job = running(gpu_job(11))
    end = T0 + timedelta(minutes=3)
    slurm = FakeSlurm([job], accounting={11: _finished(job, JobState.FAILED, end, 3)})
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    result = obs.cycle()
    assert (result.vanished, result.gone, result.ended) == (0, 1, (11,))
    assert slurm.sacct_queries == [[11]]
    kinds = [(e["kind"], e["from_state"], e["to_state"]) for e in store.events(11)]
    assert kinds == [
        ("submitted", None, "RUNNING"),
        ("state", "RUNNING", "FAILED"),
        ("gone", "FAILED", None),
    ]
    (stored,) = store.jobs(job_ids=[11])
    assert stored.gone
    # sacct's end; what only the controller knew (GPU indices, request) is kept
    assert stored.job == replace(
        job, state=JobState.FAILED, end_time=end, exit_code=3, reason="NonZeroExitCode"
    )
    assert Observer(slurm, store, clock=Clock())._jobs == {}  # not active after a restart


def test_jobs_sacct_does_not_know_still_vanish(store: JobStore) -> None:
    known, unknown, pending = running(gpu_job(12)), running(gpu_job(13)), gpu_job(14)
    end = T0 + timedelta(minutes=2)
    slurm = FakeSlurm(
        [known, unknown, pending],
        # 14 is still pending in accounting: not finished, so it vanishes
        accounting={12: _finished(known, JobState.COMPLETED, end, 0), 14: pending},
    )
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    _vanish(obs, slurm)
    assert slurm.sacct_queries == [[12, 13, 14]]
    assert [e["kind"] for e in store.events(12)] == ["submitted", "state", "gone"]
    assert [e["kind"] for e in store.events(13)] == ["submitted", "vanished"]
    assert [e["kind"] for e in store.events(14)] == ["submitted", "vanished"]
    assert all(s.gone for s in store.jobs())


@pytest.mark.parametrize(
    "error",
    [
        SlurmUnavailableError("sacct: Problem talking to the database: Connection refused"),
        SlurmParseError("sacct --json: not valid JSON"),
        RuntimeError("a bug in the decoder"),
    ],
)
def test_failed_sacct_lookup_behaves_as_without_accounting(
    store: JobStore, error: Exception
) -> None:
    job = running(gpu_job(15))
    slurm = FakeSlurm([job], accounting={15: _finished(job, JobState.COMPLETED, T0, 0)})
    slurm.accounting_fail_with = error
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    result = obs.cycle()
    assert result.ok and result.vanished == 1
    assert [e["kind"] for e in store.events(15)] == ["submitted", "vanished"]
    (stored,) = store.jobs(job_ids=[15])
    assert stored.gone and stored.job == job


def test_accounting_disabled_or_absent_changes_nothing(store: JobStore) -> None:
    class NoAccounting:
        """A client without the optional capability (like the simulator)."""

        def __init__(self, inner: FakeSlurm) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            if name == "finished_jobs":
                raise AttributeError(name)
            return getattr(self.inner, name)

    for jid, client in ((16, None), (17, "absent")):
        job = running(gpu_job(jid))
        fake = FakeSlurm([job])  # accounting=None: sacct answers "disabled" → []
        slurm: object = fake if client is None else NoAccounting(fake)
        obs = Observer(slurm, store, clock=Clock())  # type: ignore[arg-type]
        obs.cycle()
        _vanish(obs, fake)
        assert [e["kind"] for e in store.events(jid)] == ["submitted", "vanished"]
        assert fake.sacct_queries == ([[jid]] if client is None else [])


def test_sacct_record_of_an_older_job_with_the_same_id_is_ignored(store: JobStore) -> None:
    job = running(gpu_job(18))
    old = replace(_finished(job, JobState.COMPLETED, T0, 0), submit_time=T0 - timedelta(days=30))
    slurm = FakeSlurm([job], accounting={18: old})
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    _vanish(obs, slurm)
    assert [e["kind"] for e in store.events(18)] == ["submitted", "vanished"]


def test_finished_jobs_are_not_asked_about_when_nothing_vanished(store: JobStore) -> None:
    job = running(gpu_job(19))
    slurm = FakeSlurm([job], accounting={})
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.set_jobs([replace(job, state=JobState.COMPLETED, end_time=T0)])
    obs.cycle()
    slurm.set_jobs([])
    obs.cycle()
    assert "finished_jobs" not in slurm.calls
    assert [e["kind"] for e in store.events(19)] == ["submitted", "state", "gone"]


def test_pending_job_cancelled_unseen_loses_its_projected_start(store: JobStore) -> None:
    projected = T0 + timedelta(hours=1)
    job = gpu_job(20, start_time=projected, end_time=projected + timedelta(hours=1))
    acct = replace(job, state=JobState.CANCELLED, start_time=None, end_time=T0 + timedelta(1))
    slurm = FakeSlurm([job], accounting={20: acct})
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    _vanish(obs, slurm)
    (stored,) = store.jobs(job_ids=[20])
    assert stored.job.state is JobState.CANCELLED
    assert (stored.job.start_time, stored.job.end_time) == (None, T0 + timedelta(1))


def test_restarted_observer_knows_the_stored_nodes_before_its_first_cycle(store: JobStore) -> None:
    nodes = [Node("gpu1", "idle", gpus=4), Node("gpu2", "idle", gpus=4)]
    Observer(FakeSlurm([running(gpu_job(1))], nodes), store, clock=Clock()).cycle()
    again = Observer(FakeSlurm(), store, clock=Clock())
    assert again.latest is not None
    assert {n.name for n in again.latest.nodes} == {"gpu1", "gpu2"}
    assert [j.job_id for j in again.latest.jobs] == [1]


def test_finished_job_keeps_the_gpu_indices_it_ran_on(store: JobStore) -> None:
    slurm = FakeSlurm([running(gpu_job(8))])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    # squeue lists a finished job without gres_detail: its allocation looks empty.
    done = replace(gpu_job(8), state=JobState.COMPLETED, start_time=T0, end_time=T0)
    slurm.set_jobs([done])
    obs.cycle()
    (stored,) = store.jobs(job_ids=[8])
    assert stored.job.state is JobState.COMPLETED
    assert stored.job.gpu_allocations == (NodeGpuAllocation("gpu1", (0, 1)),)
    assert stored.job.nodes == ("gpu1",)

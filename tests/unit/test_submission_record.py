"""The daemon records a job's submission from Slurm's view of it (store/submission_record.py):
once per job (an array once), from the comment as first seen, whoever submitted it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from slurmgpu.daemon.observer import Observer
from slurmgpu.model import GpuRequest, Job, JobState
from slurmgpu.store import JobStore
from slurmgpu.store.submission_record import submission_row
from slurmgpu.tokens import ckpt_tokens
from tests.fakes import FakeSlurm

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=30)
        return self.now


MALLEABLE = " ".join(["sgpu:malleable=1:4", *ckpt_tokens("USR1", 300, "/home/bob/run/.e")])


def bobs(job_id: int, comment: str, **kw: object) -> Job:
    job = Job(
        job_id=job_id,
        name=f"j{job_id}",
        user="bob",
        uid=2001,
        state=JobState.PENDING,
        submit_time=T0,
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
        work_dir="/home/bob/run",
        comment=comment,
    )
    return replace(job, **kw)  # type: ignore[arg-type]


def test_a_users_malleable_job_is_recorded_with_what_its_comment_asks(store: JobStore) -> None:
    Observer(FakeSlurm([bobs(7, f"nightly {MALLEABLE}")]), store, clock=Clock()).cycle()
    (row,) = store.submissions(7)
    assert (row["uid"], row["user"], row["cwd"], row["argv"]) == (2001, "bob", "/home/bob/run", [])
    assert row["submitted_at"] == T0
    assert (row["malleable_min"], row["malleable_max"]) == (1, 4)
    assert (row["checkpoint_signal"], row["checkpoint_grace_s"]) == ("USR1", 300)
    assert row["hints"] == {"source": "slurm", "elastic_dir": "/home/bob/run/.e", "pool": False}


def test_hints_of_the_other_tokens(store: JobStore) -> None:
    comment = "sgpu:rightsize sgpu:shareable sgpu:gpu-mem=8192"
    Observer(FakeSlurm([bobs(8, comment)]), store, clock=Clock()).cycle()
    (row,) = store.submissions(8)
    assert row["hints"] == {
        "source": "slurm",
        "rightsize": True,
        "shareable": True,
        "gpu_mem_mib": 8192,
    }
    assert row["malleable_min"] is None and row["checkpoint_signal"] is None


def test_jobs_that_ask_nothing_are_not_recorded(store: JobStore) -> None:
    jobs = [
        bobs(1, ""),
        bobs(2, "a comment of the user's own"),
        bobs(3, "sgpu:separated"),  # slurmgpu's own mark, not the user's request
        bobs(4, "sgpu:malleable=4:1 sgpu:ckpt=KILL:9"),  # malformed: asks nothing
        replace(bobs(5, MALLEABLE), uid=None),  # whose job Slurm did not say
    ]
    Observer(FakeSlurm(jobs), store, clock=Clock()).cycle()
    assert [store.submissions(j) for j in range(1, 6)] == [[]] * 5


def test_an_array_is_one_submission_under_the_arrays_id(store: JobStore) -> None:
    pool = "sgpu:pool=1:8"
    tasks = [bobs(100 + i, pool, array_job_id=100, array_task_id=i) for i in range(3)]
    slurm = FakeSlurm(tasks[:2])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.set_jobs(tasks)  # a later task starts: still the same submission
    obs.cycle()
    (row,) = store.submissions(100)
    assert row["hints"]["pool"] is True and row["malleable_max"] == 8
    assert store.submissions(101) == [] and store.submissions(102) == []


def test_the_record_is_the_job_as_first_seen(store: JobStore) -> None:
    slurm = FakeSlurm([bobs(9, MALLEABLE)])
    obs = Observer(slurm, store, clock=Clock())
    obs.cycle()
    slurm.set_jobs([bobs(9, "sgpu:malleable=1:64")])  # the owner edits the comment
    obs.cycle()
    Observer(slurm, store, clock=Clock()).cycle()  # and a restarted daemon
    (row,) = store.submissions(9)
    assert row["malleable_max"] == 4


def test_a_record_already_made_is_not_doubled(store: JobStore) -> None:
    store.record_submission(
        11, at=T0 + timedelta(seconds=1), uid=2001, user="bob", cwd="/x", argv=["--wrap", "y"]
    )
    Observer(FakeSlurm([bobs(11, MALLEABLE)]), store, clock=Clock()).cycle()
    (row,) = store.submissions(11)
    assert row["argv"] == ["--wrap", "y"]


def test_a_reused_job_id_gets_a_record_of_its_own(store: JobStore) -> None:
    # slurmctld lost its state and numbers jobs from 1 again: an old record is not this job's
    long_ago = T0 - timedelta(days=2)
    store.record_submission(12, at=long_ago, uid=3003, user="carol", cwd="/c", argv=[])
    Observer(FakeSlurm([bobs(12, MALLEABLE)]), store, clock=Clock()).cycle()
    old, new = store.submissions(12)
    assert (old["user"], new["user"]) == ("carol", "bob")


def test_a_job_without_a_submit_time_is_recorded_at_the_cycle() -> None:
    row = submission_row(replace(bobs(13, MALLEABLE), submit_time=None), "c1", T0)
    assert row is not None and row["submitted_at"] == T0 and row["cluster"] == "c1"


def test_recorded_alike_on_sqlite_and_postgresql(store_url: str) -> None:
    from slurmgpu.store import open_store

    store = open_store(store_url)
    try:
        slurm = FakeSlurm([bobs(21, MALLEABLE), bobs(22, "sgpu:shareable")])
        obs = Observer(slurm, store, clock=Clock())
        obs.cycle()
        obs.cycle()
        (row,) = store.submissions(21)
        assert (row["uid"], row["submitted_at"], row["argv"]) == (2001, T0, [])
        assert row["checkpoint_grace_s"] == 300
        assert [r["hints"] for r in store.submissions(22)] == [
            {"source": "slurm", "shareable": True}
        ]
    finally:
        store.engine.dispose()

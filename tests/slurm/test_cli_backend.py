"""CliSlurmClient against a real Slurm cluster (the session ``slurm_cluster``), no mocks."""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

from slurmgpu.intent import SetComment, SetTimeLimit
from slurmgpu.model import Job, JobState
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.client import SlurmClient, SlurmCommandError, SlurmUnavailableError
from tests import polling

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "plain root jobs, and sacct without accounting (the site lab has slurmdbd)"

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from slurmgpu.lab.cluster import LabCluster

R = TypeVar("R")
_WAIT_S = 40.0


def wait_for(probe: Callable[[], R | None], what: str, timeout: float = _WAIT_S) -> R:
    """``tests.polling.wait_for`` with this module's argument order: any value but None."""
    return polling.wait_for(what, probe, timeout, until_not_none=True)


@pytest.fixture
def client(slurm_cluster: LabCluster, tmp_path: Path) -> Iterator[CliSlurmClient]:
    """A client reading SLURM_CONF from the environment; cancels the jobs it submitted.

    Jobs are submitted from ``tmp_path`` so their ``slurm-N.out`` files land there.
    """
    c = _TrackingClient(timeout_s=20, workdir=str(tmp_path))
    yield c
    for job_id in c.submitted:
        with contextlib.suppress(SlurmCommandError, SlurmUnavailableError):
            c.cancel(job_id)


class _TrackingClient(CliSlurmClient):
    """Remembers what it submitted so the fixture can clean up."""

    def __init__(self, *, timeout_s: float, workdir: str) -> None:
        super().__init__(timeout_s=timeout_s)
        self.workdir = workdir
        self.submitted: list[int] = []

    def submit(
        self,
        sbatch_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> int:
        job_id = super().submit(sbatch_args, env=env, cwd=cwd or self.workdir, stdin=stdin)
        self.submitted.append(job_id)
        return job_id


def find(client: CliSlurmClient, job_id: int) -> Job | None:
    return next((j for j in client.jobs() if j.job_id == job_id), None)


def until(client: CliSlurmClient, job_id: int, ok: Callable[[Job], bool], what: str) -> Job:
    def probe() -> Job | None:
        job = find(client, job_id)
        return job if job is not None and ok(job) else None

    return wait_for(probe, f"job {job_id} {what}")


def test_is_a_slurm_client(client: CliSlurmClient) -> None:
    assert isinstance(client, SlurmClient)
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", client.version())
    nodes = client.nodes()
    assert len(nodes) == 4
    assert all(n.gpus == 4 for n in nodes)


def test_gpu_job_shows_its_two_gpus(client: CliSlurmClient) -> None:
    job_id = client.submit(["-J", "sgpu-two", "--gres=gpu:2", "--wrap", "sleep 300"])
    job = until(client, job_id, lambda j: j.state is JobState.RUNNING, "running")
    assert job.gpus.gpus == 2 and job.gpus.per_node == 2
    assert "tres_per_node" in job.gpus.sources
    assert len(job.nodes) == 1 and job.node_count == 1
    (alloc,) = job.gpu_allocations
    assert alloc.node == job.nodes[0]
    assert len(alloc.gpu_indices) == 2 and len(set(alloc.gpu_indices)) == 2
    assert job.allocated_gpus == 2
    node = next(n for n in client.nodes() if n.name == job.nodes[0])
    assert node.gpus_used >= 2


def test_pending_job_hold_release_update(client: CliSlurmClient) -> None:
    job_id = client.submit(
        ["-J", "sgpu-later", "--begin=now+1hour", "-t", "30", "--wrap", "sleep 300"]
    )
    job = until(client, job_id, lambda j: j.state is JobState.PENDING, "pending")
    assert job.time_limit == timedelta(minutes=30)
    assert job.priority is not None and job.priority > 0  # squeue's, for queue order

    client.hold(job_id)
    held = until(client, job_id, lambda j: j.reason.startswith("JobHeld"), "held")
    assert held.priority == 0  # a held job's priority is 0: Slurm never starts it
    client.release(job_id)
    until(client, job_id, lambda j: not j.reason.startswith("JobHeld"), "released")

    client.set_time_limit(job_id, timedelta(minutes=7))
    client.update_job(job_id, (SetComment("set by sgpu tests"),))
    job = until(client, job_id, lambda j: j.time_limit == timedelta(minutes=7), "limit 7 min")
    assert job.comment == "set by sgpu tests"

    with pytest.raises(SlurmCommandError):
        client.requeue(job_id)  # a pending job cannot be requeued


def test_requeue_and_cancel(client: CliSlurmClient) -> None:
    plain = client.submit(["-J", "sgpu-rq", "--wrap", "sleep 300"])
    held = client.submit(["-J", "sgpu-rqh", "--wrap", "sleep 300"])
    for job_id in (plain, held):
        until(client, job_id, lambda j: j.state is JobState.RUNNING, "running")

    client.requeue(plain)
    job = until(client, plain, lambda j: j.restart_count == 1, "requeued")
    assert job.state in (JobState.PENDING, JobState.RUNNING)

    client.requeue(held, hold=True)
    job = until(
        client,
        held,
        lambda j: j.state is JobState.PENDING and j.restart_count == 1 and not j.state_flags,
        "requeued and held",
    )
    assert "held" in job.reason.lower()

    client.cancel(plain)
    until(client, plain, lambda j: j.state is JobState.CANCELLED, "cancelled")
    client.cancel(plain)  # cancelling a finished job again is not an error


def test_signal_and_array_throttle(client: CliSlurmClient) -> None:
    job_id = client.submit(["-J", "sgpu-sig", "--wrap", "sleep 300"])
    until(client, job_id, lambda j: j.state is JobState.RUNNING, "running")
    client.signal(job_id, "CONT", batch_only=True)
    client.signal(job_id, "SIGCONT")

    array_id = client.submit(["-J", "sgpu-arr", "--array=0-7%1", "--wrap", "sleep 300"])
    meta = until(client, array_id, lambda j: j.array_task_spec is not None, "array meta record")
    assert meta.array_job_id == array_id and meta.array_max_tasks == 1
    client.set_array_throttle(array_id, 2)
    meta = until(client, array_id, lambda j: j.array_max_tasks == 2, "throttle 2")
    assert meta.array_task_spec is not None and meta.array_task_spec.endswith("%2")
    client.set_array_throttle(array_id, 0)
    until(client, array_id, lambda j: j.array_max_tasks is None, "unthrottled")


@pytest.mark.parametrize(
    "action",
    [
        lambda c: c.hold(999999),
        lambda c: c.release(999999),
        lambda c: c.cancel(999999),
        lambda c: c.signal(999999, "USR1"),
        lambda c: c.update_job(999999, (SetTimeLimit(300),)),
        lambda c: c.set_time_limit(999999, timedelta(minutes=5)),
        lambda c: c.requeue(999999),
        lambda c: c.cancel("not-a-job"),
        lambda c: c.submit(["--no-such-option"]),
    ],
)
def test_refused_commands(
    client: CliSlurmClient, action: Callable[[CliSlurmClient], object]
) -> None:
    with pytest.raises(SlurmCommandError) as info:
        action(client)
    message = str(info.value)
    assert message and "\n" not in message


def test_unreachable_controller(slurm_cluster: LabCluster, tmp_path: Path) -> None:
    text = Path(slurm_cluster.env()["SLURM_CONF"]).read_text()
    bad = re.sub(r"(?m)^SlurmctldPort=\d+", "SlurmctldPort=9", text)
    assert bad != text
    conf = tmp_path / "slurm.conf"
    conf.write_text(bad)
    c = CliSlurmClient(slurm_conf=str(conf), timeout_s=4)
    with pytest.raises(SlurmUnavailableError):
        c.jobs()
    with pytest.raises(SlurmUnavailableError):
        c.hold(1)


def test_finished_jobs_without_accounting_is_empty(
    client: CliSlurmClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The lab cluster has AccountingStorageType=accounting_storage/none: the real sacct
    says so on stderr and finished_jobs answers [] instead of raising."""
    job_id = client.submit(["-J", "sgpu-acct", "--wrap", "true"])
    with caplog.at_level("DEBUG", logger="slurmgpu.slurm"):
        assert client.finished_jobs([job_id, job_id + 1000]) == []
    assert "Slurm accounting storage is disabled" in caplog.text

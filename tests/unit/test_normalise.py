"""Golden-file tests: recorded Slurm 22.05 and written 24.11 JSON → exact model values.

Also: malformed documents, Slurm's ``errors`` arrays, the pyslurm record conversion (over
a stand-in ``pyslurm`` module) and the backend choice.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.slurm.backend import choose_backend, major_minor, select_backend
from slurmgpu.slurm.cli import CliSlurmClient, decode_sinfo, decode_squeue
from slurmgpu.slurm.client import (
    SlurmClient,
    SlurmCommandError,
    SlurmError,
    SlurmParseError,
    SlurmUnavailableError,
)
from slurmgpu.slurm.jsonformat import data_parser_version
from slurmgpu.slurm.pyslurm import PySlurmClient

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
G2205 = GOLDEN / "slurm-22.05"
G2411 = GOLDEN / "slurm-24.11"
T = datetime.fromtimestamp(1796217365, UTC)
YEAR = timedelta(days=365)


def _by_id(jobs: list[Job]) -> dict[int, Job]:
    out = {j.job_id: j for j in jobs}
    assert len(out) == len(jobs), "job ids are unique"
    return out


def _check(job: Job, **expected: Any) -> None:
    for name, value in expected.items():
        assert getattr(job, name) == value, f"job {job.job_id}.{name}"


def _alloc(
    node: str, gpus: tuple[int, ...] = (), shards: tuple[int, ...] = (), n: int = 0
) -> NodeGpuAllocation:
    return NodeGpuAllocation(node=node, gpu_indices=gpus, shard_indices=shards, shards=n)


# --------------------------------------------------------------------------- 22.05 squeue


@pytest.fixture(scope="module")
def jobs_2205() -> dict[int, Job]:
    jobs, release = decode_squeue((G2205 / "squeue.json").read_bytes())
    assert release == "22.05.8"
    return _by_id(jobs)


def test_2205_job_1_in_full(jobs_2205: dict[int, Job]) -> None:
    assert jobs_2205[1] == Job(
        job_id=1,
        name="twogpu",
        user="root",
        state=JobState.RUNNING,
        uid=0,
        account="",
        partition="gpu",
        qos="",
        state_flags=frozenset(),
        reason="",
        array_job_id=None,
        array_task_id=None,
        array_task_spec=None,
        array_max_tasks=None,
        submit_time=T,
        eligible_time=T,
        start_time=T,
        end_time=datetime.fromtimestamp(1827753365, UTC),  # projection: start + 1 year
        time_limit=None,
        cpus=1,
        memory_mib=256,
        node_count=1,
        tasks=1,
        gpus=GpuRequest(gpus=2, per_node=2, sources=("tres_per_node",)),
        nodes=("gpu1",),
        gpu_allocations=(_alloc("gpu1", (0, 1)),),
        restart_count=0,
        requeue=True,
        comment="hello",
        admin_comment="",
        work_dir="/tmp/lab",
        command="/tmp/job.sh",
        exit_code=0,
        batch=True,
    )
    assert jobs_2205[1].allocated_gpus == 2


def test_2205_every_job(jobs_2205: dict[int, Job]) -> None:
    assert sorted(jobs_2205) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # --gpus-per-node=1
    _check(
        jobs_2205[2],
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
        gpu_allocations=(_alloc("gpu1", (2,)),),
    )
    # --gres=shard:2, on GPU 3
    _check(
        jobs_2205[3],
        gpus=GpuRequest(shards=2, shards_per_node=2, sources=("tres_per_node",)),
        gpu_allocations=(_alloc("gpu1", shards=(3,), n=2),),
    )
    assert (jobs_2205[3].allocated_gpus, jobs_2205[3].allocated_shards) == (0, 2)
    assert jobs_2205[3].gpus.wants_gpu
    # --gpus=3
    _check(
        jobs_2205[4],
        gpus=GpuRequest(gpus=3, per_job=3, sources=("tres_per_job",)),
        nodes=("gpu2",),
        gpu_allocations=(_alloc("gpu2", (0, 1, 2)),),
        time_limit=timedelta(minutes=60),
        end_time=T + timedelta(minutes=60),
    )
    # --gpus-per-task=1 -n2
    _check(
        jobs_2205[5],
        gpus=GpuRequest(gpus=2, per_task=1, sources=("tres_per_task",)),
        tasks=2,
        cpus=2,
        memory_mib=512,
        gpu_allocations=(_alloc("gpu3", (0, 1)),),
    )
    # array tasks 6_0 and 6_1
    _check(
        jobs_2205[9],
        array_job_id=6,
        array_task_id=0,
        array_task_spec=None,
        array_max_tasks=2,
        display_id="6_0",
        gpu_allocations=(_alloc("gpu1", (3,)),),
    )
    _check(
        jobs_2205[10],
        array_job_id=6,
        array_task_id=1,
        display_id="6_1",
        gpu_allocations=(_alloc("gpu3", (2,)),),
    )
    # the pending meta-record of the array: tasks 2-5, at most 2 running
    _check(
        jobs_2205[6],
        state=JobState.PENDING,
        reason="JobArrayTaskLimit",
        array_job_id=6,
        array_task_id=None,
        array_task_spec="2-5%2",
        array_max_tasks=2,
        display_id="6_[2-5%2]",
        start_time=None,
        end_time=None,
        exit_code=None,
        nodes=(),
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
    )
    # pending multi-node: 4 GPUs per node x 2 nodes
    _check(
        jobs_2205[7],
        state=JobState.PENDING,
        reason="Resources",
        node_count=2,
        gpus=GpuRequest(gpus=8, per_node=4, sources=("tres_per_node",)),
        time_limit=timedelta(days=2),
        memory_mib=512,
        nodes=(),
        gpu_allocations=(),
        start_time=None,
        exit_code=None,
    )
    _check(
        jobs_2205[8],
        reason="Priority",
        gpus=GpuRequest(gpus=8, per_node=4, sources=("tres_per_node",)),
    )
    for jid in (1, 2, 3, 4, 5, 9, 10):
        _check(jobs_2205[jid], state=JobState.RUNNING, reason="", start_time=T, exit_code=0)


@pytest.fixture(scope="module")
def finished_2205() -> dict[int, Job]:
    return _by_id(decode_squeue((G2205 / "squeue_completed.json").read_bytes())[0])


def test_2205_finished_failed_cancelled_held(finished_2205: dict[int, Job]) -> None:
    jobs = finished_2205
    _check(jobs[1], state=JobState.COMPLETED, gpu_allocations=(), nodes=("gpu1",), exit_code=0)
    _check(
        jobs[7],
        state=JobState.RUNNING,
        nodes=("gpu2", "gpu3"),
        gpu_allocations=(_alloc("gpu2", (0, 1, 2, 3)), _alloc("gpu3", (0, 1, 2, 3))),
    )
    assert jobs[7].allocated_gpus == 8
    _check(jobs[14], state=JobState.COMPLETED, exit_code=0)
    _check(jobs[15], state=JobState.FAILED, reason="NonZeroExitCode", exit_code=3)
    _check(jobs[16], state=JobState.CANCELLED, exit_code=128 + 15)  # SIGTERM
    _check(
        jobs[17],
        state=JobState.PENDING,
        reason="JobHeldUser",
        time_limit=timedelta(days=1, hours=2, minutes=4),
    )
    # --gpus-per-socket=1 --sockets-per-node=1
    _check(
        jobs[18],
        gpus=GpuRequest(gpus=1, sources=("tres_per_socket",)),
        gpu_allocations=(_alloc("gpu4", (0,)),),
    )
    _check(jobs[19], state=JobState.PENDING, restart_count=1, reason="JobHeldUser")
    # --mem=512M: memory_per_node
    _check(jobs[20], memory_mib=512, gpus=GpuRequest())
    # requeued once, running again
    _check(jobs[13], state=JobState.RUNNING, restart_count=1)
    assert jobs[6].display_id == "6_[4-5%2]"


def test_2205_requeue_in_progress() -> None:
    jobs = _by_id(decode_squeue((G2205 / "squeue_requeued.json").read_bytes())[0])
    # 22.05 prints "COMPLETING" alone while the requeued/cancelled job's steps end.
    _check(jobs[13], state=JobState.RUNNING, state_flags=frozenset({"COMPLETING"}), restart_count=1)
    _check(jobs[16], state=JobState.RUNNING, state_flags=frozenset({"COMPLETING"}))
    _check(
        jobs[19],
        state=JobState.RUNNING,
        state_flags=frozenset({"COMPLETING"}),
        reason="JobHeldUser",
    )
    after = _by_id(decode_squeue((G2205 / "squeue_after_requeue.json").read_bytes())[0])
    _check(after[13], state=JobState.PENDING, reason="BeginTime", restart_count=1, nodes=())
    _check(after[16], state=JobState.CANCELLED)


def test_2205_unreachable_controller() -> None:
    with pytest.raises(SlurmUnavailableError, match="slurm_load_jobs"):
        decode_squeue((G2205 / "squeue_unreachable.json").read_bytes())
    with pytest.raises(SlurmUnavailableError, match="Unspecified error"):
        decode_sinfo((G2205 / "sinfo_unreachable.json").read_bytes())


# --------------------------------------------------------------------------- 22.05 sinfo


def test_2205_nodes() -> None:
    nodes = {n.name: n for n in decode_sinfo((G2205 / "sinfo.json").read_bytes())}
    assert list(nodes) == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert nodes["gpu1"] == Node(
        name="gpu1",
        state="mixed",
        state_flags=frozenset(),
        cpus=8,
        cpus_allocated=4,
        memory_mib=4000,
        memory_allocated_mib=1024,
        gpus=4,
        gpu_type=None,
        shards=16,
        gpus_used=4,
        gpu_indices_used=(),  # 22.05 prints "gpu:4" without indices here
        shards_used=1,
        shard_gpus_used=(3,),  # 22.05 names the GPUs holding shards, no count
        partitions=("gpu",),
        reason="",
        address="127.0.0.1",
    )
    assert (nodes["gpu2"].gpus_used, nodes["gpu3"].cpus_allocated) == (3, 3)
    assert nodes["gpu4"].state == "idle" and nodes["gpu4"].available
    busy = {n.name: n for n in decode_sinfo((G2205 / "sinfo_busy.json").read_bytes())}
    assert busy["gpu1"].gpus_used == 2 and busy["gpu1"].memory_allocated_mib == 1280


# --------------------------------------------------------------------------- 24.11


@pytest.fixture(scope="module")
def jobs_2411() -> dict[int, Job]:
    data = (G2411 / "squeue.json").read_bytes()
    assert data_parser_version(data) == "v0.0.42"
    jobs, release = decode_squeue(data)
    assert release == "24.11.5"
    return _by_id(jobs)


def test_2411_job_1_in_full(jobs_2411: dict[int, Job]) -> None:
    assert jobs_2411[1] == Job(
        job_id=1,
        name="twogpu",
        user="root",
        state=JobState.RUNNING,
        uid=0,
        partition="gpu",
        qos="normal",
        submit_time=T,
        eligible_time=T,
        start_time=T,
        end_time=T + YEAR,
        time_limit=None,  # {"set": true, "infinite": true}
        cpus=1,
        memory_mib=256,
        node_count=1,
        tasks=1,
        gpus=GpuRequest(gpus=2, per_node=2, gpu_type="a100", sources=("tres_per_node",)),
        nodes=("gpu1",),
        gpu_allocations=(_alloc("gpu1", (0, 1)),),
        requeue=True,
        comment="hello",
        work_dir="/tmp/lab",
        command="/tmp/job.sh",
        exit_code=0,
        batch=True,
    )


def test_2411_same_scenario_as_2205(jobs_2205: dict[int, Job], jobs_2411: dict[int, Job]) -> None:
    """Everything the two versions share normalises to the same values."""
    fields = (
        "name", "state", "state_flags", "reason", "array_job_id", "array_task_id",
        "array_task_spec", "array_max_tasks", "submit_time", "start_time", "time_limit",
        "cpus", "memory_mib", "node_count", "tasks", "nodes", "gpu_allocations",
        "restart_count", "requeue", "exit_code", "batch",
    )  # fmt: skip
    for jid, old in jobs_2205.items():
        new = jobs_2411[jid]
        for f in fields:
            assert getattr(new, f) == getattr(old, f), f"job {jid}.{f}"
        assert (new.gpus.gpus, new.gpus.per_node, new.gpus.per_job, new.gpus.per_task) == (
            old.gpus.gpus,
            old.gpus.per_node,
            old.gpus.per_job,
            old.gpus.per_task,
        ), f"job {jid}.gpus"
        assert (new.gpus.shards, new.gpus.sources) == (old.gpus.shards, old.gpus.sources)


def test_2411_extra_jobs(jobs_2411: dict[int, Job]) -> None:
    jobs = jobs_2411
    _check(jobs[11], state=JobState.COMPLETED, exit_code=0, end_time=T - timedelta(seconds=60))
    _check(jobs[12], state=JobState.CANCELLED, exit_code=143)  # signal 15
    _check(jobs[13], state=JobState.FAILED, exit_code=3, reason="NonZeroExitCode")
    _check(
        jobs[14],
        state=JobState.PENDING,
        state_flags=frozenset({"REQUEUED"}),
        restart_count=1,
        reason="BeginTime",
        exit_code=None,
    )
    _check(
        jobs[15],
        gpus=GpuRequest(gpus=1, sources=("tres_per_socket",)),
        gpu_allocations=(_alloc("gpu4", (0,)),),
    )
    _check(jobs[16], reason="JobHeldUser", time_limit=timedelta(minutes=1564))


def test_2411_sinfo_records() -> None:
    nodes = {n.name: n for n in decode_sinfo((G2411 / "sinfo.json").read_bytes())}
    assert list(nodes) == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert nodes["gpu1"] == Node(
        name="gpu1",
        state="mixed",
        cpus=8,
        cpus_allocated=4,
        memory_mib=4000,
        memory_allocated_mib=1024,
        gpus=4,
        gpu_type="a100",
        shards=16,
        gpus_used=4,
        gpu_indices_used=(0, 1, 2, 3),
        shards_used=2,
        shard_gpus_used=(3,),
        shards_used_by_gpu=((3, 2),),
        gpu_types=(("a100", 4),),
        partitions=("gpu",),
        address="127.0.0.1",
    )
    _check_node(
        nodes["gpu4"],
        state="mixed",
        state_flags=frozenset({"PLANNED"}),
        gpus_used=1,
        gpu_indices_used=(0,),
    )


def test_2411_scontrol_nodes() -> None:
    nodes = {n.name: n for n in decode_sinfo((G2411 / "scontrol_nodes.json").read_bytes())}
    _check_node(
        nodes["gpu2"],
        state="mixed",
        gpus_used=3,
        gpu_indices_used=(0, 1, 2),
        cpus_allocated=1,
        memory_allocated_mib=256,
        partitions=("gpu",),
    )
    gpu4 = nodes["gpu4"]
    _check_node(
        gpu4,
        state="idle",
        state_flags=frozenset({"DRAIN"}),
        reason="bad fan",
        gpus_used=0,
        gpu_indices_used=(),
    )
    assert not gpu4.available


def test_sinfo_node_in_two_partitions_is_merged() -> None:
    doc = json.loads((G2411 / "sinfo.json").read_text())
    extra = json.loads(json.dumps(doc["sinfo"][0]))
    extra["partition"]["name"] = "debug"
    doc["sinfo"].append(extra)
    nodes = decode_sinfo(json.dumps(doc))
    assert [n.name for n in nodes] == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert nodes[0].partitions == ("gpu", "debug")


def _check_node(node: Node, **expected: Any) -> None:
    for name, value in expected.items():
        assert getattr(node, name) == value, f"node {node.name}.{name}"


# --------------------------------------------------------------------------- shapes


def _doc() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((G2205 / "squeue.json").read_text())
    return data


def test_truncated_json() -> None:
    data = (G2205 / "squeue.json").read_bytes()
    with pytest.raises(SlurmParseError, match="not valid JSON") as info:
        decode_squeue(data[: len(data) // 2])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "path", "lost"),
    [
        (lambda d: d["jobs"][3].update(job_id="four"), "$.jobs[3]", 4),
        (lambda d: d["jobs"][0].update(gres_detail="gpu:2(IDX:0-1)"), "$.jobs[0]", 1),
        (lambda d: d["jobs"][2].update(time_limit="60"), "$.jobs[2]", 3),
        (lambda d: d["jobs"][1].pop("job_id"), "$.jobs[1]", 2),
    ],
)
def test_record_of_wrong_shape_is_skipped_rest_kept(
    mutate: Any, path: str, lost: int, caplog: pytest.LogCaptureFixture
) -> None:
    """One job record of a wrong shape costs that job, never the listing (issue 22)."""
    doc = _doc()
    mutate(doc)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs = _by_id(decode_squeue(json.dumps(doc).encode())[0])
    assert lost not in jobs and len(jobs) == 9
    assert "1 record(s) skipped" in caplog.text and path in caplog.text


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.update(jobs={"1": {}}), "$.jobs"),
        (lambda d: d.update(meta=[]), "$.meta"),
    ],
)
def test_wrong_document_shapes(mutate: Any, path: str) -> None:
    doc = _doc()
    mutate(doc)
    with pytest.raises(SlurmParseError) as info:
        decode_squeue(json.dumps(doc).encode())
    assert f"`{path}`" in str(info.value)
    assert "\n" not in str(info.value)


def test_not_an_object() -> None:
    with pytest.raises(SlurmParseError, match="Expected `object`, got `array`"):
        decode_squeue(b"[]")
    with pytest.raises(SlurmParseError, match="no 'jobs' list"):
        decode_squeue(b'{"meta": {}, "errors": []}')
    with pytest.raises(SlurmParseError, match="neither"):
        decode_sinfo(b'{"errors": []}')


def test_unknown_plugin_version_with_compatible_shape_is_read() -> None:
    doc = _doc()
    doc["meta"]["plugin"] = {"type": "", "name": "", "data_parser": "data_parser/v0.0.99"}
    jobs, _ = decode_squeue(json.dumps(doc))
    assert _by_id(jobs)[7].gpus.gpus == 8
    assert data_parser_version(json.dumps(doc)) == "v0.0.99"


def test_unknown_plugin_version_with_other_shape_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    doc = _doc()
    doc["meta"]["plugin"] = {"data_parser": "data_parser/v0.0.99"}
    doc["jobs"][0]["job_id"] = {"id": 1}
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs, _ = decode_squeue(json.dumps(doc))
    assert len(jobs) == 9
    assert "$.jobs[0].job_id (data_parser v0.0.99 is newer" in caplog.text


def test_empty_listing() -> None:
    doc = _doc()
    doc["jobs"] = []
    assert decode_squeue(json.dumps(doc)) == ([], "22.05.8")


@pytest.mark.parametrize(
    ("errors", "exc"),
    [
        ([{"error": "Protocol authentication error", "error_number": 1007}], SlurmUnavailableError),
        ([{"description": "munge decode failed", "error_number": 6003}], SlurmUnavailableError),
        (["Unable to contact slurm controller (connect failure)"], SlurmUnavailableError),
        ([{"error": "Access/permission denied", "error_number": 2002}], SlurmCommandError),
    ],
)
def test_slurm_errors(errors: list[Any], exc: type[SlurmError]) -> None:
    doc = {"meta": {}, "errors": errors, "jobs": []}
    with pytest.raises(exc) as info:
        decode_squeue(json.dumps(doc))
    assert type(info.value) is exc
    assert str(info.value).startswith("squeue: ")


def test_errors_with_jobs_are_not_fatal() -> None:
    doc = _doc()
    doc["errors"] = [{"error": "something minor", "error_number": 9}]
    assert len(decode_squeue(json.dumps(doc))[0]) == 10


def test_bad_values_are_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    doc = _doc()
    doc["jobs"][0]["gres_detail"] = ["gpu:2(IDX:zz)"]
    doc["jobs"][1]["job_state"] = "RUNNING_IN_THE_FUTURE"
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs = _by_id(decode_squeue(json.dumps(doc))[0])
    # the bad IDX detail is left out; the node and the job's GPU request are kept
    assert [a.gpu_indices for a in jobs[1].gpu_allocations] == [()]
    assert jobs[1].gpus.gpus == 2
    assert jobs[2].state is JobState.UNKNOWN
    assert "2 value(s) did not parse" in caplog.text


def test_bench_style_document() -> None:
    """The benchmark's synthetic jobs: plain node lists, ``job_resources: {}``."""
    doc = _doc()
    job = dict(
        doc["jobs"][0],
        job_id=1000,
        nodes="gpu00001,gpu00042",
        gres_detail=["gpu:4(IDX:0-3)", "gpu:4(IDX:0-3)"],
        node_count=2,
        tres_per_node="gres:gpu:4",
    )
    pending = dict(doc["jobs"][6], job_id=1001, job_resources={})
    doc["jobs"] = [job, pending]
    jobs = _by_id(decode_squeue(json.dumps(doc))[0])
    assert jobs[1000].nodes == ("gpu00001", "gpu00042")
    assert jobs[1000].allocated_gpus == 8 and jobs[1000].gpus.gpus == 8
    assert jobs[1001].state is JobState.PENDING


# --------------------------------------------------------------------------- pyslurm records


class _RPCError(Exception):
    errno = 1


class _FakeJob:
    """Stands in for a ``pyslurm.Job`` (pyslurm 25.11 attribute names)."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def get_resource_layout_per_node(self) -> dict[str, Any]:
        layout: dict[str, Any] = self.__dict__.get("_layout", {})
        return layout


class _Collection:
    def __init__(self, items: list[Any], error: Exception | None = None) -> None:
        self.items = items
        self.error = error

    def load(self) -> _Collection:
        if self.error is not None:
            raise self.error
        return self

    def values(self) -> list[Any]:
        return self.items


def _fake_pyslurm(jobs: list[Any], nodes: list[Any], error: Exception | None = None) -> Any:
    mod = types.ModuleType("pyslurm")
    mod.__dict__.update(
        __version__="22.05.8",
        RPCError=_RPCError,
        Jobs=_Collection(jobs, error),
        Nodes=_Collection(nodes, error),
    )
    return mod


def test_pyslurm_records_normalise_like_json(jobs_2205: dict[int, Job]) -> None:
    t = 1796217365
    job = _FakeJob(
        id=1, name="twogpu", user_name="root", user_id=0, account=None, partition="gpu",
        qos=None, state="RUNNING", state_reason="None", array_id=None, array_task_id=None,
        array_tasks_parallel=None, array_tasks_waiting=None, submit_time=t, eligible_time=t,
        start_time=t, end_time=1827753365, time_limit=None, cpus=1, num_nodes=1, ntasks=1,
        memory_per_cpu=256, memory_per_node=None, gres_per_node={"gpu": 2},
        allocated_nodes="gpu1", requeue_count=0, is_requeueable=True, comment="hello",
        admin_comment=None, working_directory="/tmp/lab", command="/tmp/job.sh",
        exit_code=0, exit_code_signal=0, is_batch_job=True,
        _layout={"gpu1": {"cpu_ids": "0", "gres": {"gpu": {"count": 2, "indexes": "0-1"}},
                          "memory": 256}},
    )  # fmt: skip
    meta = _FakeJob(
        id=6, name="arr", user_name="root", user_id=0, state="PENDING",
        state_reason="JobArrayTaskLimit", array_id=6, array_task_id=None,
        array_tasks_parallel=2, array_tasks_waiting="2-5", cpus=1, num_nodes=1, ntasks=1,
        gres_per_node={"gpu": 1}, allocated_nodes=None, exit_code=0, exit_code_signal=0,
    )  # fmt: skip
    node = _FakeJob(
        name="gpu1", state="MIXED+PLANNED", total_cpus=8, allocated_cpus=4, real_memory=4000,
        allocated_memory=1024, configured_gres={"gpu": 4, "shard": 16},
        allocated_gres={"gpu": {"count": 4, "indexes": "0-3"}}, partitions=["gpu"],
        reason=None, address="127.0.0.1",
    )  # fmt: skip
    client = PySlurmClient(module=_fake_pyslurm([job, meta], [node]))
    assert isinstance(client, SlurmClient)
    got = _by_id(client.jobs())
    assert got[1] == jobs_2205[1]
    _check(
        got[6],
        array_task_spec="2-5%2",
        array_max_tasks=2,
        display_id="6_[2-5%2]",
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
        exit_code=None,
    )
    (n,) = client.nodes()
    _check_node(
        n,
        state="mixed",
        state_flags=frozenset({"PLANNED"}),
        gpus=4,
        shards=16,
        gpus_used=4,
        gpu_indices_used=(0, 1, 2, 3),
        memory_allocated_mib=1024,
    )


def test_pyslurm_rpc_errors() -> None:
    down = PySlurmClient(
        module=_fake_pyslurm([], [], _RPCError("Unable to contact slurm controller"))
    )
    with pytest.raises(SlurmUnavailableError):
        down.jobs()
    refused = PySlurmClient(module=_fake_pyslurm([], [], _RPCError("Access/permission denied")))
    with pytest.raises(SlurmCommandError, match="permission denied"):
        refused.nodes()


# --------------------------------------------------------------------------- backend choice


@pytest.mark.parametrize(
    ("prefer", "pyslurm_v", "slurm_v", "chosen"),
    [
        ("auto", None, "22.05.8", "cli"),
        ("auto", "22.05.3", "22.05.8", "pyslurm"),
        ("auto", "25.11.0", "25.11.2", "pyslurm"),
        ("auto", "25.11.0", "22.05.8", "cli"),
        ("auto", "22.05.3", None, "cli"),  # cannot tell what Slurm runs: play safe
        ("cli", "22.05.3", "22.05.8", "cli"),
        ("pyslurm", "22.05.3", "22.05.8", "pyslurm"),
        ("pyslurm", "25.11.0", "22.05.8", "pyslurm"),  # forced: used, with a warning
    ],
)
def test_choose_backend(prefer: str, pyslurm_v: str | None, slurm_v: str | None,
                        chosen: str) -> None:  # fmt: skip
    assert choose_backend(prefer, pyslurm_v, slurm_v) == chosen


def test_choose_backend_errors() -> None:
    with pytest.raises(SlurmError, match="pyslurm is not installed"):
        choose_backend("pyslurm", None, "22.05.8")
    with pytest.raises(ValueError, match="unknown Slurm backend"):
        choose_backend("slurmrestd", None, None)


def test_major_minor() -> None:
    assert major_minor("slurm-wlm 22.05.8") == (22, 5)
    assert major_minor("25.11") == (25, 11)
    assert major_minor("") is None and major_minor("unknown") is None


def _never() -> str | None:
    raise AssertionError("not expected to be asked")


def test_select_backend_with_injected_probes() -> None:
    sentinel = CliSlurmClient(timeout_s=7)  # any SlurmClient stands for the pyslurm one
    picked = select_backend(
        "auto",
        pyslurm_version=lambda: "22.05.3",
        slurm_version=lambda: "22.05.8",
        pyslurm_factory=lambda: sentinel,
    )
    assert picked is sentinel
    cli = select_backend(
        "auto",
        timeout_s=12,
        pyslurm_version=lambda: "25.11.0",
        slurm_version=lambda: "22.05.8",
        pyslurm_factory=lambda: sentinel,
    )
    assert isinstance(cli, CliSlurmClient) and cli is not sentinel and cli.timeout_s == 12
    # no pyslurm: Slurm's version is not even asked for
    assert isinstance(
        select_backend("auto", pyslurm_version=lambda: None, slurm_version=_never), CliSlurmClient
    )
    assert isinstance(
        select_backend("cli", pyslurm_version=_never, slurm_version=_never), CliSlurmClient
    )
    with pytest.raises(SlurmError, match="pyslurm"):
        select_backend("pyslurm", pyslurm_version=lambda: None, slurm_version=lambda: "22.05.8")


def test_select_backend_pyslurm_forced_here() -> None:
    if importlib.util.find_spec("pyslurm") is not None:
        pytest.skip("pyslurm is installed here")
    with pytest.raises(SlurmError, match="pyslurm is not installed"):
        select_backend("pyslurm", slurm_version=lambda: "22.05.8")


# --------------------------------------------------------------------------- MIG slices


@pytest.mark.parametrize(
    ("release", "tres_per_node"),
    [("22.05", "gres:gpu:1g.10gb:1"), ("24.11", "gres/gpu:1g.10gb:1")],
)
def test_a_mig_slice_job_is_one_typed_gpu_on_the_slices_index(
    release: str, tres_per_node: str
) -> None:
    """A real squeue record with its GRES rewritten as a MIG slice job would print it
    (hand-written: no golden file from a MIG node yet)."""
    data: dict[str, Any] = json.loads((GOLDEN / f"slurm-{release}" / "squeue.json").read_text())
    record = data["jobs"][0]
    record.update(tres_per_node=tres_per_node, gres_detail=["gpu:1g.10gb:1(IDX:2)"])
    data["jobs"] = [record]
    (job,), _ = decode_squeue(json.dumps(data).encode())
    assert (job.gpus.gpus, job.gpus.gpu_type) == (1, "1g.10gb")
    assert [a.gpu_indices for a in job.gpu_allocations] == [(2,)]


@pytest.mark.parametrize(
    ("golden", "minimum"),
    [("22.05", 40), ("24.11", {"set": True, "infinite": False, "number": 40})],
)
def test_a_jobs_time_min_is_read(golden: str, minimum: object) -> None:
    """``--time-min`` (``time_minimum``, minutes; 0: none): rightsizing never goes below
    it, as Slurm refuses such a limit."""
    directory = G2205 if golden == "22.05" else G2411
    data = json.loads((directory / "squeue.json").read_bytes())
    first = data["jobs"][0]
    assert first["time_minimum"] in (0, {"set": True, "infinite": False, "number": 0})
    plain = decode_squeue(json.dumps(data).encode())[0][0]
    first["time_minimum"] = minimum
    jobs, _ = decode_squeue(json.dumps(data).encode())
    assert plain.time_min is None
    assert jobs[0].job_id == first["job_id"] and jobs[0].time_min == timedelta(minutes=40)

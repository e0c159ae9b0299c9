"""``sacct --json``: recorded 22.05 and written 24.11 golden files → exact model values.

Also: malformed documents, Slurm's ``errors``, and ``CliSlurmClient.finished_jobs`` over a
stand-in ``sacct`` (accounting disabled, slurmdbd down, chunking, filtering).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.model import GpuRequest, Job, JobState
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.client import (
    AccountingClient,
    SlurmClient,
    SlurmCommandError,
    SlurmParseError,
    SlurmUnavailableError,
)
from slurmgpu.slurm.sacct import decode_sacct
from tests.fakes import FakeSlurm

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
G2205 = GOLDEN / "slurm-22.05"
G2411 = GOLDEN / "slurm-24.11"
SUBMIT = datetime.fromtimestamp(1796220659, UTC)
START = datetime.fromtimestamp(1796220660, UTC)


def _at(seconds_after_submit: int) -> datetime:
    return SUBMIT + timedelta(seconds=seconds_after_submit)


def _by_id(jobs: list[Job]) -> dict[int, Job]:
    out = {j.job_id: j for j in jobs}
    assert len(out) == len(jobs), "one job per id"
    return out


@pytest.fixture(scope="module", params=["22.05", "24.11"])
def sacct(request: pytest.FixtureRequest) -> tuple[str, dict[int, Job]]:
    folder = G2205 if request.param == "22.05" else G2411
    jobs, release = decode_sacct((folder / "sacct.json").read_bytes())
    assert release == ("22.05.8" if request.param == "22.05" else "24.11.5")
    return request.param, _by_id(jobs)


def test_completed_gpu_job_in_full(sacct: tuple[str, dict[int, Job]]) -> None:
    _, jobs = sacct
    assert jobs[1] == Job(
        job_id=1,
        name="train",
        user="root",
        state=JobState.COMPLETED,
        account="root",
        partition="gpu",
        qos="normal",
        submit_time=SUBMIT,
        eligible_time=SUBMIT,
        start_time=START,
        end_time=_at(4),
        time_limit=timedelta(minutes=10),
        cpus=2,
        memory_mib=512,
        node_count=1,
        gpus=GpuRequest(gpus=2, sources=("tres_alloc_str",)),
        nodes=("gpu1",),
        work_dir="/tmp/sgpu-acct",
        exit_code=0,
    )


def test_every_end_state(sacct: tuple[str, dict[int, Job]]) -> None:
    version, jobs = sacct
    states = {jid: job.state for jid, job in jobs.items()}
    assert states == {
        1: JobState.COMPLETED,
        2: JobState.FAILED,
        3: JobState.CANCELLED,
        4: JobState.COMPLETED,
        5: JobState.TIMEOUT,
        6: JobState.COMPLETED,
        7: JobState.FAILED,
        8: JobState.CANCELLED,
        9: JobState.RUNNING,
        10: JobState.COMPLETED,
    }
    # 22.05 dumps every normal exit as SUCCESS/0: a FAILED job's code is unknown there.
    assert jobs[2].exit_code == (None if version == "22.05" else 3)
    assert jobs[7].exit_code == 128 + 9  # killed by SIGKILL: signals come through
    assert jobs[5].end_time == _at(77) and jobs[5].time_limit == timedelta(minutes=1)


def test_requeued_job_is_its_newest_run(sacct: tuple[str, dict[int, Job]]) -> None:
    _, jobs = sacct
    job = jobs[6]
    assert job.state is JobState.COMPLETED
    assert job.restart_count == 1
    assert job.submit_time == _at(8)
    assert (job.start_time, job.end_time) == (_at(47), _at(72))
    assert job.reason == "BeginTime"
    assert job.gpus == GpuRequest(gpus=1, sources=("tres_alloc_str",))


def test_array_tasks_and_never_started_job(sacct: tuple[str, dict[int, Job]]) -> None:
    _, jobs = sacct
    assert (jobs[4].array_job_id, jobs[4].array_task_id) == (4, 1)
    assert (jobs[10].array_job_id, jobs[10].array_task_id) == (4, 0)
    assert jobs[1].array_job_id is None and jobs[1].array_task_id is None
    never = jobs[8]
    assert never.start_time is None and never.nodes == () and never.end_time == _at(8)
    assert never.gpus == GpuRequest(gpus=1, sources=("tres_req_str",))  # nothing allocated
    assert never.cpus == 1  # required.CPUs
    assert jobs[9].gpus == GpuRequest(shards=4, sources=("tres_alloc_str",))
    assert jobs[9].end_time is None


def test_both_versions_agree_apart_from_exit_codes() -> None:
    old = _by_id(decode_sacct((G2205 / "sacct.json").read_bytes())[0])
    new = _by_id(decode_sacct((G2411 / "sacct.json").read_bytes())[0])
    assert set(old) == set(new)
    for jid, job in old.items():
        assert replace(job, exit_code=None) == replace(new[jid], exit_code=None), jid


def test_nothing_found_is_an_empty_answer() -> None:
    assert decode_sacct((G2205 / "sacct_nothing_found.json").read_bytes()) == ([], "22.05.8")
    assert decode_sacct(b'{"jobs": [], "errors": [], "warnings": []}') == ([], "")


@pytest.mark.parametrize(
    ("errors", "exc"),
    [
        ([{"error": "Unable to connect to database", "error_number": 7000}], SlurmUnavailableError),
        (["slurm_persist_conn_open: failed to open persistent connection"], SlurmUnavailableError),
        ([{"error": "Access/permission denied", "error_number": 2002}], SlurmCommandError),
    ],
)
def test_slurm_errors(errors: list[Any], exc: type[Exception]) -> None:
    with pytest.raises(exc) as info:
        decode_sacct(json.dumps({"meta": {}, "errors": errors, "jobs": []}))
    assert type(info.value) is exc
    assert str(info.value).startswith("sacct: ")


def _num(v: Any) -> int:
    return int(v["number"]) if isinstance(v, dict) else int(v)


def _doc(folder: Path = G2205) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "sacct.json").read_text())
    return data


def test_truncated_json_is_a_clear_parse_error() -> None:
    data = (G2205 / "sacct.json").read_bytes()
    with pytest.raises(SlurmParseError, match=r"^sacct --json: not valid JSON") as info:
        decode_sacct(data[: len(data) // 3])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("folder", "mutate", "path"),
    [
        (G2205, lambda d: d["jobs"][3].update(job_id="four"), "$.jobs[3].job_id"),
        (G2205, lambda d: d["jobs"][1]["time"].update(end="soon"), "$.jobs[1].time.end"),
        (G2205, lambda d: d["jobs"][0]["state"].update(current=3), "$.jobs[0].state.current"),
        (G2205, lambda d: d["jobs"][2].update(tres={"allocated": "cpu=1"}), "$.jobs[2].tres"),
        (G2205, lambda d: d["jobs"][1].pop("job_id"), "$.jobs[1]"),
        (G2411, lambda d: d["jobs"][0]["time"].update(limit=[10]), "$.jobs[0].time.limit"),
        (G2411, lambda d: d["jobs"][4].update(job_id={"id": 5}), "$.jobs[4].job_id"),
    ],
)
def test_record_of_wrong_shape_is_skipped_and_named(
    folder: Path, mutate: Any, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One bad record costs that job only; the warning names its path (issue 22)."""
    bad = int(path.split("[")[1].split("]")[0])
    orig = _doc(folder)
    others = {_num(r["job_id"]) for k, r in enumerate(orig["jobs"]) if k != bad}
    doc = _doc(folder)
    mutate(doc)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs = decode_sacct(json.dumps(doc).encode())[0]
    assert {j.job_id for j in jobs} >= others
    assert "1 record(s) skipped" in caplog.text
    assert path in caplog.text
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1


def test_wrong_document_shape_is_a_parse_error() -> None:
    doc = _doc()
    doc["jobs"] = {"1": {}}
    with pytest.raises(SlurmParseError) as info:
        decode_sacct(json.dumps(doc).encode())
    message = str(info.value)
    assert message.startswith("sacct --json: unexpected shape") and "$.jobs" in message
    assert "\n" not in message


def test_not_a_sacct_document() -> None:
    with pytest.raises(SlurmParseError, match="Expected `object`, got `array`"):
        decode_sacct(b"[]")
    with pytest.raises(SlurmParseError, match="no 'jobs' list"):
        decode_sacct(b'{"meta": {}, "errors": []}')
    with pytest.raises(SlurmParseError, match="not valid JSON"):
        decode_sacct(b"Slurm accounting storage is disabled")


def test_bad_values_are_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    doc = _doc()
    doc["jobs"][1]["nodes"] = "gpu[1-"
    doc["jobs"][2]["state"]["current"] = "FINISHED_IN_THE_FUTURE"
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs = _by_id(decode_sacct(json.dumps(doc))[0])
    assert jobs[1].nodes == () and jobs[1].state is JobState.COMPLETED
    assert jobs[2].state is JobState.UNKNOWN
    assert "2 value(s) did not parse" in caplog.text


# --------------------------------------------------------------------------- the CLI call


def _fake_sacct(tmp_path: Path, body: str) -> CliSlurmClient:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "sacct"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "argv"}\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return CliSlurmClient(bin_dir=str(bin_dir), timeout_s=10)


def test_cli_client_is_an_accounting_client_and_the_fake_too() -> None:
    assert isinstance(CliSlurmClient(), AccountingClient)
    assert isinstance(FakeSlurm(), AccountingClient)
    assert isinstance(FakeSlurm(), SlurmClient)


def test_finished_jobs_runs_one_sacct_and_keeps_finished_wanted_jobs(tmp_path: Path) -> None:
    client = _fake_sacct(tmp_path, f"cat {G2205 / 'sacct.json'}")
    jobs = client.finished_jobs([1, 2, 9, 4, 999, 1])
    assert [j.job_id for j in jobs] == [1, 2, 4]  # 9 is still running; 10 was not asked
    assert (tmp_path / "argv").read_text() == "--json --allusers -X -j 1,2,9,4,999\n"
    assert client.version() == "22.05.8"  # learnt from meta, no sinfo call


def test_finished_jobs_chunks_long_lists(tmp_path: Path) -> None:
    client = _fake_sacct(tmp_path, f"cat {G2411 / 'sacct.json'}")
    jobs = client.finished_jobs(list(range(1, 451)))
    calls = (tmp_path / "argv").read_text().splitlines()
    assert len(calls) == 3
    assert calls[0].endswith(",".join(map(str, range(1, 201))))
    assert sorted(j.job_id for j in jobs) == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert client.finished_jobs([]) == []


def test_accounting_disabled_is_no_jobs_and_a_debug_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = _fake_sacct(tmp_path, "echo 'Slurm accounting storage is disabled' >&2; exit 1")
    with caplog.at_level(logging.DEBUG, logger="slurmgpu.slurm"):
        assert client.finished_jobs([1, 2]) == []
    assert "Slurm accounting storage is disabled" in caplog.text


def test_slurmdbd_down_is_unavailable(tmp_path: Path) -> None:
    client = _fake_sacct(
        tmp_path,
        "echo 'sacct: error: slurm_persist_conn_open_without_init: failed to open persistent"
        " connection to host:127.0.0.1:16819: Connection refused' >&2; exit 1",
    )
    with pytest.raises(SlurmUnavailableError, match="persistent connection"):
        client.finished_jobs([1])


def test_garbage_from_sacct_is_a_parse_error(tmp_path: Path) -> None:
    client = _fake_sacct(tmp_path, "echo '{\"jobs\": 3}'")
    with pytest.raises(SlurmParseError, match=r"\$\.jobs"):
        client.finished_jobs([1])


def test_invalid_job_ids_are_refused_before_running_sacct(tmp_path: Path) -> None:
    client = _fake_sacct(tmp_path, "exit 0")
    for bad in ([0], [-3], [True], ["1;rm"]):
        with pytest.raises(SlurmCommandError, match="invalid job id"):
            client.finished_jobs(bad)  # type: ignore[arg-type]
    assert not os.path.exists(tmp_path / "argv")

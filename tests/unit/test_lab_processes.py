"""tests/lab_processes.py: a job's processes are its lab's, not every process that
carries the same job id (issue 36, item 7: a second lab on the machine has its own job 1).

A decoy carries ``SLURM_JOB_ID`` of the job but another lab's ``SLURM_CONF``: a lookup by
job id alone (what test_malleable_torch_real.py did) takes it for the job's, and then
"no process of the job left" never holds and "nothing of the first run is left" fails;
the lab's lookup leaves it out."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.lab_processes import job_processes

JOB = 4711


def _by_job_id_only(job_id: int) -> list[psutil.Process]:
    """The lookup test_malleable_torch_real.py used before: SLURM_JOB_ID alone."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SLURM_JOB_ID") == str(job_id) and p.status() != "zombie":
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, **env}
    )


def test_a_decoy_with_the_same_job_id_from_another_lab_is_not_the_jobs(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    ours, other = tmp_path / "lab" / "etc" / "slurm.conf", tmp_path / "lab2" / "etc" / "slurm.conf"
    job = _sleeper({"SLURM_JOB_ID": str(JOB), "SLURM_CONF": str(ours)})
    decoy = _sleeper({"SLURM_JOB_ID": str(JOB), "SLURM_CONF": str(other)})
    other_job = _sleeper({"SLURM_JOB_ID": str(JOB + 1), "SLURM_CONF": str(ours)})
    started += [job, decoy, other_job]

    by_id = {p.pid for p in _by_job_id_only(JOB)}
    mine = {p.pid for p in job_processes(JOB, ours)}

    assert {job.pid, decoy.pid} <= by_id  # the old lookup is fooled by the decoy
    assert mine == {job.pid}  # the lab's lookup is not, nor takes its other job
    assert {p.pid for p in job_processes(JOB, other)} == {decoy.pid}


def test_a_finished_process_of_the_job_is_not_listed(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    conf = tmp_path / "lab" / "etc" / "slurm.conf"
    job = _sleeper({"SLURM_JOB_ID": str(JOB), "SLURM_CONF": str(conf)})
    started.append(job)
    assert [p.pid for p in job_processes(JOB, conf)] == [job.pid]
    job.kill()
    job.wait(timeout=10)
    assert job_processes(JOB, conf) == []

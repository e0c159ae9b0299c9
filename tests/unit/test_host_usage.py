"""Per-job host usage measured on real processes (and real cgroup-like files)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmgpu.telemetry.host import HostUsageSampler, JobHostUsage

DEADLINE_S = 30.0


@pytest.fixture
def spawn() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


BUSY = "while True: pass"
IDLE = "import time; time.sleep(120)"


def _row(rows: list[JobHostUsage], job_id: int) -> JobHostUsage | None:
    return next((r for r in rows if r.job_id == job_id), None)


def test_a_busy_process_cpu_is_measured_and_charged_to_its_job(
    spawn: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    busy, idle = spawn(BUSY), spawn(IDLE)
    sampler = HostUsageSampler()
    pid_to_job: dict[int, int | None] = {busy.pid: 77, idle.pid: 78}
    first = sampler.sample(pid_to_job, {77: 2, 78: 1})
    busy_row = _row(first, 77)
    assert busy_row is not None and busy_row.cpu_pct is None  # no baseline yet

    deadline = time.monotonic() + DEADLINE_S
    while True:
        rows = sampler.sample(pid_to_job, {77: 2, 78: 1})
        busy_row = _row(rows, 77)
        assert busy_row is not None
        if busy_row.cpu_pct is not None and busy_row.cpu_pct > 0:
            break
        assert time.monotonic() < deadline, "the busy child never showed CPU use"
        time.sleep(0.1)
    assert busy_row.processes == 1 and busy_row.pids == (busy.pid,)
    assert busy_row.allocated_cpus == 2
    assert busy_row.cpu_efficiency_pct == pytest.approx(busy_row.cpu_pct / 2)
    assert busy_row.rss_mib > 0
    assert busy_row.cgroup_memory_mib is None  # not in a Slurm cgroup
    idle_row = _row(rows, 78)
    assert idle_row is not None and idle_row.cpu_pct is not None


def test_vanished_and_unattributed_processes_do_not_raise(
    spawn: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    gone, stays, stray = spawn(IDLE), spawn(IDLE), spawn(IDLE)
    sampler = HostUsageSampler()
    pid_to_job: dict[int, int | None] = {gone.pid: 5, stays.pid: 6, stray.pid: None}
    assert {r.job_id for r in sampler.sample(pid_to_job)} == {5, 6}
    gone.kill()
    gone.wait()
    rows = sampler.sample(pid_to_job)
    assert [r.job_id for r in rows] == [6]
    assert sampler.sample({2**22 + 12345: 9}) == []  # a pid that never existed


def test_zombie_processes_are_skipped(spawn: Callable[[str], subprocess.Popen[bytes]]) -> None:
    child = spawn("pass")
    deadline = time.monotonic() + DEADLINE_S
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert HostUsageSampler().sample({child.pid: 3}) == []


def _fake_proc_cgroup(proc_root: Path, pid: int, text: str) -> None:
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "cgroup").write_text(text)


def test_cgroup_v2_memory_is_read_when_the_job_cgroup_exists(
    tmp_path: Path, spawn: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    proc = spawn(IDLE)
    proc_root, cgroup_root = tmp_path / "proc", tmp_path / "cgroup"
    _fake_proc_cgroup(
        proc_root, proc.pid, "0::/system.slice/slurmstepd.scope/job_31/step_0/user/task_0\n"
    )
    job_dir = cgroup_root / "system.slice" / "slurmstepd.scope" / "job_31"
    job_dir.mkdir(parents=True)
    (job_dir / "memory.current").write_text(f"{300 * 1024 * 1024}\n")
    sampler = HostUsageSampler(proc_root=proc_root, cgroup_root=cgroup_root)
    (row,) = sampler.sample({proc.pid: 31})
    assert row.cgroup_memory_mib == 300
    assert row.cgroup_path == "/system.slice/slurmstepd.scope/job_31"


def test_cgroup_v1_memory_is_read_from_the_memory_hierarchy(
    tmp_path: Path, spawn: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    proc = spawn(IDLE)
    proc_root, cgroup_root = tmp_path / "proc", tmp_path / "cgroup"
    _fake_proc_cgroup(
        proc_root,
        proc.pid,
        "5:cpuset:/slurm_gpu1/uid_1000/job_32/step_0\n"
        "4:memory:/slurm_gpu1/uid_1000/job_32/step_0/task_0\n",
    )
    job_dir = cgroup_root / "memory" / "slurm_gpu1" / "uid_1000" / "job_32"
    job_dir.mkdir(parents=True)
    (job_dir / "memory.usage_in_bytes").write_text(f"{2 * 1024**3}\n")
    (row,) = HostUsageSampler(proc_root=proc_root, cgroup_root=cgroup_root).sample({proc.pid: 32})
    assert row.cgroup_memory_mib == 2048


def test_missing_cgroup_directory_leaves_cgroup_memory_unknown(
    tmp_path: Path, spawn: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    proc = spawn(IDLE)
    proc_root = tmp_path / "proc"
    _fake_proc_cgroup(proc_root, proc.pid, "0::/system.slice/slurmstepd.scope/job_33/step_0\n")
    sampler = HostUsageSampler(proc_root=proc_root, cgroup_root=tmp_path / "nothing")
    (row,) = sampler.sample({proc.pid: 33})
    assert (row.cgroup_memory_mib, row.cgroup_path) == (None, None)


def test_io_wait_is_reported_only_when_the_kernel_counts_it(
    spawn: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    from slurmgpu.telemetry.host import delay_accounting_on

    sysctl = tmp_path / "sys" / "kernel" / "task_delayacct"
    assert delay_accounting_on(tmp_path) is False  # no such file: off
    sysctl.parent.mkdir(parents=True)
    sysctl.write_text("1\n")
    assert delay_accounting_on(tmp_path) is True
    sysctl.write_text("0\n")
    assert delay_accounting_on(tmp_path) is False

    proc = spawn(IDLE)
    rows = {}
    for counted in (False, True):
        sampler = HostUsageSampler(iowait=counted)
        sampler.sample({proc.pid: 5}, {5: 1})  # the baseline
        time.sleep(0.05)
        rows[counted] = _row(sampler.sample({proc.pid: 5}, {5: 1}), 5)
    off, on = rows[False], rows[True]
    assert off is not None and off.cpu_pct is not None and off.iowait_pct is None  # unknown
    assert on is not None and on.iowait_pct is not None and on.iowait_pct >= 0.0

"""Process → job, probe index → Slurm index, and per-job GPU usage rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmgpu.agent.sampler import allocations
from slurmgpu.model import NodeGpuAllocation
from slurmgpu.telemetry.attribution import (
    JobGpuUsage,
    attribute,
    job_for_pid,
    job_id_from_cgroup,
    job_id_from_environ,
    map_probe_to_slurm_indices,
    normalize_pci_bus_id,
    scan_job_pids,
    slurm_cgroup,
)
from slurmgpu.telemetry.gresconf import minors_by_index, parse_gres_conf
from slurmgpu.telemetry.probe import GpuDeviceSample, GpuProcessSample
from slurmgpu.wire import NodeJob, NodeJobs

# -- cgroup and environ parsing -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "job_id"),
    [
        # cgroup v1 (one line per hierarchy), single slurmd
        (
            "12:memory:/slurm/uid_1000/job_123/step_0/task_0\n"
            "11:cpuset:/slurm/uid_1000/job_123/step_0\n"
            "1:name=systemd:/system.slice/slurmd.service\n",
            123,
        ),
        # v1 with several slurmd per host (--enable-multiple-slurmd): /slurm_<node>
        ("4:devices:/slurm_gpu1/uid_1000/job_124/step_batch/task_0\n", 124),
        # v2, single slurmd
        ("0::/system.slice/slurmstepd.scope/job_125/step_0/user/task_0\n", 125),
        # v2, several slurmd: <node>_slurmstepd.scope
        ("0::/system.slice/gpu1_slurmstepd.scope/job_126/step_extern/user/task_special\n", 126),
        # v2 seen from a container whose cgroup is nested under the host's
        ("0::/docker/3f2a/system.slice/slurmstepd.scope/job_127/step_0/user/task_0", 127),
        # the job directory itself (a process adopted at job level)
        ("0::/system.slice/slurmstepd.scope/job_128", 128),
        # an array task's directory carries its raw job id (SLURM_JOB_ID), e.g. 1000_2 = 1002
        ("0::/system.slice/slurmstepd.scope/job_1002/step_batch/user/task_0", 1002),
    ],
)
def test_job_id_is_read_from_slurm_cgroup_layouts(text: str, job_id: int) -> None:
    assert job_id_from_cgroup(text) == job_id


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/slurmstepd.scope/system\n",  # slurmstepd's waiting area, no job
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/user.slice/job_456\n",  # job_N outside a Slurm hierarchy
        "4:memory:/uid_1000/job_7/step_0\n",  # v1 without the slurm root
        "0::/system.slice/slurmstepd.scope/job_0/step_0\n",  # job ids start at 1
        "0::/system.slice/slurmstepd.scope/job_4294967296/step_0\n",  # beyond uint32
        "0::/system.slice/slurmstepd.scope/job_12x/step_0\n",
        "",
        "random garbage",
    ],
)
def test_non_job_cgroups_give_none(text: str) -> None:
    assert job_id_from_cgroup(text) is None


def test_v1_prefers_the_memory_hierarchy_and_reports_the_step() -> None:
    text = (
        "3:cpuset:/slurm_gpu2/uid_0/job_9/step_interactive\n"
        "4:memory:/slurm_gpu2/uid_0/job_9/step_interactive/task_0\n"
    )
    cg = slurm_cgroup(text)
    assert cg is not None
    assert (cg.job_id, cg.version, cg.job_path, cg.step) == (
        9,
        1,
        "/slurm_gpu2/uid_0/job_9",
        "interactive",
    )


def test_v2_job_path_and_step() -> None:
    cg = slurm_cgroup("0::/system.slice/slurmstepd.scope/job_55/step_3/user/task_1\n")
    assert cg is not None
    assert (cg.version, cg.job_path, cg.step) == (2, "/system.slice/slurmstepd.scope/job_55", "3")


_SEGMENT = st.text(alphabet="abcjob_slurmstepd.scope0123456789-", max_size=12)


@given(st.text(max_size=300))
def test_cgroup_parser_never_raises_on_garbage(text: str) -> None:
    found = job_id_from_cgroup(text)
    assert found is None or 0 < found < 2**32


@given(st.lists(_SEGMENT, max_size=8), st.integers(min_value=0, max_value=9))
def test_cgroup_parser_never_raises_on_path_like_garbage(parts: list[str], hierarchy: int) -> None:
    text = f"{hierarchy}:{'' if hierarchy == 0 else 'memory'}:/" + "/".join(parts)
    found = job_id_from_cgroup(text)
    assert found is None or 0 < found < 2**32


@given(st.integers(min_value=1, max_value=2**32 - 1), st.lists(st.text(max_size=40), max_size=5))
def test_slurm_line_is_found_among_other_lines(job_id: int, noise: list[str]) -> None:
    lines = [n.replace("\n", " ") for n in noise]
    lines.insert(len(lines) // 2, f"0::/system.slice/slurmstepd.scope/job_{job_id}/step_0")
    assert job_id_from_cgroup("\n".join(lines)) == job_id


@pytest.mark.parametrize(
    ("data", "job_id"),
    [
        (b"HOME=/root\0SLURM_JOB_ID=77\0PATH=/bin\0", 77),
        (b"SLURM_JOB_ID=78", 78),  # no trailing NUL
        (b"SLURM_JOBID=79\0", 79),  # the older name
        (b"SLURM_JOBID=1\0SLURM_JOB_ID=80\0", 80),  # the current name wins
        (b"SLURM_ARRAY_JOB_ID=1000\0SLURM_JOB_ID=1002\0", 1002),  # array: the raw id
        (b"SLURM_ARRAY_JOB_ID=1000\0", None),
        (b"SLURM_JOB_ID=abc\0", None),
        (b"SLURM_JOB_ID=\0", None),
        (b"XSLURM_JOB_ID=5\0", None),
        (b"", None),
        (b"\xff\xfe\0SLURM_JOB_ID=\xff\0", None),
    ],
)
def test_job_id_from_environ(data: bytes, job_id: int | None) -> None:
    assert job_id_from_environ(data) == job_id


@given(st.binary(max_size=300))
def test_environ_parser_never_raises_on_garbage(data: bytes) -> None:
    found = job_id_from_environ(data)
    assert found is None or 0 < found < 2**32


@given(st.binary(max_size=80), st.integers(min_value=1, max_value=2**32 - 1))
def test_environ_value_is_found_after_any_prefix(prefix: bytes, job_id: int) -> None:
    data = prefix + b"\0SLURM_JOB_ID=" + str(job_id).encode() + b"\0"
    if b"SLURM_JOB_ID=" in prefix:
        return  # the first definition wins, as in a real environ
    assert job_id_from_environ(data) == job_id


# -- job_for_pid with real files and a real process -----------------------------------


def _fake_proc(root: Path, pid: int, cgroup: str | None, environ: bytes | None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    if cgroup is not None:
        (d / "cgroup").write_text(cgroup)
    if environ is not None:
        (d / "environ").write_bytes(environ)


def test_job_for_pid_prefers_the_cgroup_over_the_environment(tmp_path: Path) -> None:
    _fake_proc(
        tmp_path,
        100,
        "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n",
        b"SLURM_JOB_ID=6\0",  # inherited from elsewhere: the cgroup is authoritative
    )
    assert job_for_pid(100, tmp_path) == 5


def test_job_for_pid_falls_back_to_the_environment(tmp_path: Path) -> None:
    # proctrack/linuxproc (the lab cluster): no Slurm cgroup at all
    _fake_proc(tmp_path, 101, "0::/user.slice\n", b"SLURM_JOB_ID=6\0")
    assert job_for_pid(101, tmp_path) == 6


def test_job_for_pid_is_none_for_gone_or_unreadable_processes(tmp_path: Path) -> None:
    assert job_for_pid(999, tmp_path) is None
    _fake_proc(tmp_path, 102, None, None)
    (tmp_path / "102" / "environ").mkdir()  # unreadable as a file
    assert job_for_pid(102, tmp_path) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read every environ")
def test_job_for_pid_is_none_when_environ_is_not_ours() -> None:
    # pid 1 belongs to root: its environ raises PermissionError for other users
    from_cgroup = job_id_from_cgroup(Path("/proc/1/cgroup").read_text())
    assert job_for_pid(1) == from_cgroup


def test_job_for_pid_reads_a_real_process_environment(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_JOB_ID"] = "4242"
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, stdin=subprocess.DEVNULL
    )
    try:
        # A test runner inside a Slurm job puts the child in that job's cgroup, which wins.
        own_cgroup_job = job_id_from_cgroup(Path("/proc/self/cgroup").read_text())
        expected = own_cgroup_job if own_cgroup_job is not None else 4242
        assert job_for_pid(child.pid) == expected
        assert scan_job_pids().get(child.pid) == expected
    finally:
        child.kill()
        child.wait()
    assert job_for_pid(child.pid) is None  # reaped: /proc/PID is gone


# -- probe index → Slurm index --------------------------------------------------------


def _dev(index: int, minor: int | None = None, pci: str | None = None) -> GpuDeviceSample:
    return GpuDeviceSample(index=index, minor_number=minor, pci_bus_id=pci)


def test_indices_map_by_minor_when_the_nvml_ordinal_is_not_the_minor() -> None:
    # NVML enumerates by PCI order; the driver numbered /dev/nvidiaN differently.
    devices = [_dev(0, minor=2), _dev(1, minor=3), _dev(2, minor=0), _dev(3, minor=1)]
    gres = parse_gres_conf("NodeName=gpu1 Name=gpu File=/dev/nvidia[0-3]", "gpu1")
    index_map = map_probe_to_slurm_indices(devices, minors_by_index(gres), None)
    assert dict(index_map) == {0: 2, 1: 3, 2: 0, 3: 1}
    assert {index_map.method(p) for p in index_map} == {"minor"}
    assert index_map.guessed == frozenset()


def test_indices_map_by_pci_bus_id_whatever_its_spelling() -> None:
    devices = [_dev(0, pci="00000000:3B:00.0"), _dev(1, pci="00000000:17:00.0")]
    pci_by_slurm = {0: "0000:17:00.0", 1: "0000:3b:00.0"}  # sysfs spelling
    index_map = map_probe_to_slurm_indices(devices, None, pci_by_slurm)
    assert dict(index_map) == {0: 1, 1: 0}
    assert index_map.method(0) == "pci"


def test_minor_wins_over_pci_and_pci_covers_devices_without_a_minor() -> None:
    devices = [_dev(0, minor=1, pci="00000000:17:00.0"), _dev(1, minor=None, pci="0000:3b:00.0")]
    index_map = map_probe_to_slurm_indices(devices, {0: 1}, {0: "0000:17:00.0", 1: "0000:3b:00.0"})
    assert dict(index_map) == {0: 0, 1: 1}
    assert (index_map.method(0), index_map.method(1)) == ("minor", "pci")


def test_identity_is_the_flagged_fallback_when_nothing_can_be_compared() -> None:
    devices = [_dev(0, minor=5), _dev(1, minor=4)]
    index_map = map_probe_to_slurm_indices(devices, None, None)
    assert dict(index_map) == {0: 0, 1: 1}
    assert index_map.guessed == frozenset({0, 1})


def test_a_gpu_slurm_does_not_manage_stays_unmapped() -> None:
    # a display GPU with minor 7 that gres.conf does not list
    devices = [_dev(0, minor=0), _dev(1, minor=7)]
    index_map = map_probe_to_slurm_indices(devices, {0: 0}, None)
    assert dict(index_map) == {0: 0}
    assert index_map.unmapped == (1,)


def test_two_devices_claiming_one_slurm_index_keep_the_first() -> None:
    devices = [_dev(0, minor=0), _dev(1, minor=0)]
    index_map = map_probe_to_slurm_indices(devices, {0: 0}, None)
    assert dict(index_map) == {0: 0}
    assert index_map.unmapped == (1,)


def test_pci_bus_ids_normalise() -> None:
    assert normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("3b:00.1") == "0000:3b:00.1"
    assert normalize_pci_bus_id("not a bus id") is None


# -- attribution ----------------------------------------------------------------------


def _gpu(
    index: int,
    *,
    util: float,
    used: int,
    procs: tuple[GpuProcessSample, ...] = (),
    error: str | None = None,
) -> GpuDeviceSample:
    return GpuDeviceSample(
        index=index,
        minor_number=index,
        util_pct=util,
        memory_used_mib=used,
        memory_total_mib=81920,
        processes=procs,
        error=error,
    )


def _rows_by_job(rows: list[JobGpuUsage]) -> dict[int | None, JobGpuUsage]:
    return {r.job_id: r for r in rows}


def test_allocated_gpu_with_no_process_is_reported_idle() -> None:
    devices = [_gpu(0, util=0, used=0), _gpu(1, util=0, used=0)]
    jobs = [(10, NodeGpuAllocation(node="gpu1", gpu_indices=(1,)))]
    rows = attribute(devices, jobs, {}, {0: 0, 1: 1})
    assert rows == [
        JobGpuUsage(
            job_id=10,
            slurm_index=1,
            util_pct=0.0,
            memory_used_mib=0,
            memory_total_mib=81920,
            processes=0,
            shared=False,
            source="idle",
            allocated=True,
            device_util_pct=0,
            probe_index=1,
        )
    ]


def test_gpu_used_by_one_job_reports_device_util_and_memory() -> None:
    procs = (GpuProcessSample(pid=500, used_memory_mib=29000, sm_util_pct=60.0),)
    devices = [_gpu(0, util=85, used=30000, procs=procs)]
    jobs = [(11, NodeGpuAllocation(node="gpu1", gpu_indices=(0,)))]
    (row,) = attribute(devices, jobs, {500: 11}, {0: 0})
    assert (row.job_id, row.slurm_index, row.source, row.shared) == (11, 0, "device", False)
    assert (row.util_pct, row.memory_used_mib, row.processes) == (85, 30000, 1)


def test_usage_follows_the_minor_mapping_not_the_nvml_ordinal() -> None:
    # probe index 0 is /dev/nvidia1 = Slurm GPU 1, which job 12 holds; jobstats would
    # have charged job 13 (Slurm GPU 0) with it.
    busy = GpuDeviceSample(
        index=0,
        minor_number=1,
        util_pct=90,
        memory_used_mib=100,
        processes=(GpuProcessSample(pid=42, used_memory_mib=100, sm_util_pct=90.0),),
    )
    idle = GpuDeviceSample(index=1, minor_number=0, util_pct=0, memory_used_mib=0)
    index_map = map_probe_to_slurm_indices([busy, idle], {0: 0, 1: 1}, None)
    jobs = [
        (12, NodeGpuAllocation(node="gpu1", gpu_indices=(1,))),
        (13, NodeGpuAllocation(node="gpu1", gpu_indices=(0,))),
    ]
    rows = _rows_by_job(attribute([busy, idle], jobs, {42: 12}, index_map))
    assert (rows[12].slurm_index, rows[12].util_pct, rows[12].source) == (1, 90, "device")
    assert (rows[13].slurm_index, rows[13].util_pct, rows[13].source) == (0, 0.0, "idle")


def test_two_shard_jobs_on_one_gpu_each_get_their_own_util_and_memory() -> None:
    procs = (
        GpuProcessSample(pid=600, used_memory_mib=4000, sm_util_pct=30.0),
        GpuProcessSample(pid=601, used_memory_mib=2000, sm_util_pct=10.0),
        GpuProcessSample(pid=700, used_memory_mib=8000, sm_util_pct=25.0),
    )
    devices = [_gpu(0, util=70, used=14500, procs=procs)]
    jobs = [
        (20, NodeGpuAllocation(node="gpu1", shard_indices=(0,), shards=4)),
        (21, NodeGpuAllocation(node="gpu1", shard_indices=(0,), shards=4)),
    ]
    rows = _rows_by_job(attribute(devices, jobs, {600: 20, 601: 20, 700: 21}, {0: 0}))
    assert set(rows) == {20, 21}
    a, b = rows[20], rows[21]
    assert (a.util_pct, a.memory_used_mib, a.processes, a.source) == (40.0, 6000, 2, "process")
    assert (b.util_pct, b.memory_used_mib, b.processes, b.source) == (25.0, 8000, 1, "process")
    assert a.shared and b.shared
    assert a.device_util_pct == b.device_util_pct == 70


def test_a_shard_job_without_a_process_is_idle_beside_a_busy_one() -> None:
    procs = (GpuProcessSample(pid=700, used_memory_mib=8000, sm_util_pct=55.0),)
    devices = [_gpu(0, util=55, used=8000, procs=procs)]
    jobs = [
        (20, NodeGpuAllocation(node="gpu1", shard_indices=(0,), shards=1)),
        (21, NodeGpuAllocation(node="gpu1", shard_indices=(0,), shards=1)),
    ]
    rows = _rows_by_job(attribute(devices, jobs, {700: 21}, {0: 0}))
    assert (rows[20].source, rows[20].util_pct, rows[20].shared) == ("idle", 0.0, True)
    assert (rows[21].source, rows[21].util_pct, rows[21].memory_used_mib) == ("process", 55.0, 8000)


def test_a_process_of_no_job_is_reported_unattributed() -> None:
    stray = GpuProcessSample(pid=900, used_memory_mib=1200, sm_util_pct=15.0)
    mine = GpuProcessSample(pid=901, used_memory_mib=3000, sm_util_pct=40.0)
    devices = [
        _gpu(0, util=15, used=1200, procs=(stray,)),  # a free GPU someone uses outside Slurm
        _gpu(1, util=55, used=4200, procs=(mine, GpuProcessSample(902, 1200, 15.0))),
    ]
    jobs = [(30, NodeGpuAllocation(node="gpu1", gpu_indices=(1,)))]
    rows = attribute(devices, jobs, {901: 30, 902: None}, {0: 0, 1: 1})
    summary = [(r.slurm_index, r.job_id, r.source, r.util_pct, r.memory_used_mib) for r in rows]
    assert summary == [
        (0, None, "device", 15, 1200),
        (1, 30, "process", 40.0, 3000),
        (1, None, "process", 15.0, 1200),
    ]
    assert not rows[0].allocated and rows[1].allocated


def test_unknown_per_process_util_stays_unknown_on_a_shared_gpu() -> None:
    procs = (GpuProcessSample(600, 4000, None), GpuProcessSample(700, 1000, None))
    devices = [_gpu(0, util=80, used=5000, procs=procs)]
    jobs = [
        (20, NodeGpuAllocation(node="gpu1", shard_indices=(0,))),
        (21, NodeGpuAllocation(node="gpu1", shard_indices=(0,))),
    ]
    rows = _rows_by_job(attribute(devices, jobs, {600: 20, 700: 21}, {0: 0}))
    assert rows[20].util_pct is None and rows[20].memory_used_mib == 4000


def test_a_lost_or_missing_gpu_is_an_error_row_never_idle() -> None:
    devices = [_gpu(0, util=0, used=0, error="gpu lost")]
    jobs = [
        (40, NodeGpuAllocation(node="gpu1", gpu_indices=(0,))),
        (41, NodeGpuAllocation(node="gpu1", gpu_indices=(3,))),  # the probe saw no GPU 3
    ]
    rows = _rows_by_job(attribute(devices, jobs, {}, {0: 0}))
    assert (rows[40].source, rows[40].util_pct) == ("error", None)
    assert (rows[41].source, rows[41].slurm_index, rows[41].probe_index) == ("error", 3, None)


def test_identity_guess_is_carried_into_the_rows() -> None:
    devices = [_gpu(0, util=0, used=0)]
    index_map = map_probe_to_slurm_indices(
        [GpuDeviceSample(index=0)], None, None
    )  # nothing to compare
    (row,) = attribute(
        devices, [(50, NodeGpuAllocation(node="n", gpu_indices=(0,)))], {}, index_map
    )
    assert row.index_guessed


def test_free_gpu_without_processes_gives_no_row() -> None:
    assert attribute([_gpu(0, util=0, used=0)], [], {}, {0: 0}) == []


def test_mps_clients_each_get_their_memory_and_no_util_of_the_device() -> None:
    # Two MPS jobs on Slurm GPU 0: NVML lists both processes with memory, no SM share.
    procs = (
        GpuProcessSample(pid=600, used_memory_mib=6144, sm_util_pct=None),
        GpuProcessSample(pid=601, used_memory_mib=3072, sm_util_pct=None),
    )
    devices = [_gpu(0, util=30, used=9216, procs=procs)]
    jobs = [
        (20, NodeGpuAllocation(node="gpu3", mps_indices=(0,), mps=50)),
        (21, NodeGpuAllocation(node="gpu3", mps_indices=(0,), mps=50)),
    ]
    rows = _rows_by_job(attribute(devices, jobs, {600: 20, 601: 21}, {0: 0}))
    assert sorted(j for j in rows if j is not None) == [20, 21]
    for job_id, memory in ((20, 6144), (21, 3072)):
        row = rows[job_id]
        assert (row.slurm_index, row.shared, row.allocated) == (0, True, True)
        assert row.memory_used_mib == memory and row.util_pct is None  # never the device's 30


def test_an_mps_client_alone_on_its_gpu_gets_the_device_util() -> None:
    # Job 21 holds a share but has no process yet: job 20's are the only ones on the GPU.
    procs = (GpuProcessSample(pid=600, used_memory_mib=6144, sm_util_pct=None),)
    devices = [_gpu(0, util=30, used=6144, procs=procs)]
    jobs = [
        (20, NodeGpuAllocation(node="gpu3", mps_indices=(0,), mps=50)),
        (21, NodeGpuAllocation(node="gpu3", mps_indices=(0,), mps=50)),
    ]
    rows = _rows_by_job(attribute(devices, jobs, {600: 20}, {0: 0}))
    assert (rows[20].util_pct, rows[20].source, rows[20].shared) == (30, "process", True)
    assert (rows[21].util_pct, rows[21].source) == (0.0, "idle")


def test_mps_clients_of_an_idle_gpu_are_idle_and_of_a_busy_one_unknown() -> None:
    procs = (
        GpuProcessSample(pid=600, used_memory_mib=6144, sm_util_pct=None),
        GpuProcessSample(pid=601, used_memory_mib=3072, sm_util_pct=None),
        GpuProcessSample(pid=602, used_memory_mib=100, sm_util_pct=None),  # no job's
    )
    jobs = [
        (20, NodeGpuAllocation(node="gpu3", mps_indices=(0,), mps=50)),
        (21, NodeGpuAllocation(node="gpu3", mps_indices=(0,), mps=50)),
    ]
    pids = {600: 20, 601: 21}
    idle = _rows_by_job(attribute([_gpu(0, util=0, used=9316, procs=procs)], jobs, pids, {0: 0}))
    assert idle[20].util_pct == idle[21].util_pct == 0.0
    # One job's processes beside a process of no job: whose the 30 % is, is unknown.
    busy = _rows_by_job(
        attribute([_gpu(0, util=30, used=6244, procs=procs[::2])], jobs, pids, {0: 0})
    )
    assert busy[20].util_pct is None and busy[None].util_pct is None


def test_the_agent_reads_mps_gpus_from_the_daemon() -> None:
    listed = NodeJobs(
        node="gpu3",
        jobs=[
            NodeJob(job_id=20, gpu_indices=[], shard_indices=[], shards=0, cpus=1, mps_indices=[0])
        ],
    )
    ((job_id, alloc),) = allocations(listed)
    assert (job_id, alloc.mps_indices) == (20, (0,))
    older = msgspec.json.decode(
        b'{"node":"gpu1","jobs":[{"job_id":1,"gpu_indices":[0],"shard_indices":[],"shards":0,"cpus":1}]}',
        type=NodeJobs,
    )
    assert older.jobs[0].mps_indices == []  # a daemon from before sends none

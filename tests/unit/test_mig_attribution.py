"""MIG instances as Slurm GPUs: split per instance, mapped, and sampled per slice."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.agent.sampler import NodeSampler
from slurmgpu.telemetry.attribution import MIG_PROBE_STRIDE, split_mig_devices
from slurmgpu.telemetry.gresconf import minors_by_index, read_gres_conf
from slurmgpu.telemetry.host import HostUsageSampler
from slurmgpu.telemetry.probe import GpuDeviceSample, GpuMigInstanceSample, GpuProcessSample
from slurmgpu.telemetry.simgpu import LoadDeclaration, SimulatedGpuProbe, write_declaration
from slurmgpu.wire import NodeJob, NodeJobs

NODE = "gpu1"
JOB, OTHER = 987_700, 987_701
GRES = """\
NodeName=gpu1 Name=gpu Type=h100 File=/dev/tty0
NodeName=gpu1 Name=gpu Type=3g.40gb MultipleFiles=/dev/tty1,/dev/tty11
NodeName=gpu1 Name=gpu Type=1g.10gb MultipleFiles=/dev/tty1,/dev/tty12
"""


def _mig(index: int, gi: int, util: float | None, pid: int | None = None) -> GpuMigInstanceSample:
    return GpuMigInstanceSample(
        index=index,
        uuid=f"MIG-{gi}",
        gpu_instance_id=gi,
        compute_instance_id=0,
        memory_used_mib=100 * gi,
        memory_total_mib=10240,
        processes=(GpuProcessSample(pid=pid, used_memory_mib=50),) if pid else (),
        profile="1g.10gb",
        util_pct=util,
    )


def test_instances_replace_their_parent_and_map_in_gpu_instance_order() -> None:
    whole = GpuDeviceSample(index=0, minor_number=0, util_pct=30.0)
    parent = GpuDeviceSample(
        index=1,
        minor_number=1,
        util_pct=None,
        power_w=300.0,
        mig_instances=(_mig(0, 9, 40.0, pid=77), _mig(1, 2, None)),
    )
    devices, mig_map = split_mig_devices([whole, parent], {0: 0, 1: 1, 2: 1})
    assert [d.index for d in devices] == [0, 2 * MIG_PROBE_STRIDE + 1, 2 * MIG_PROBE_STRIDE]
    slices = {d.uuid: d for d in devices[1:]}
    # gpu instance 2 comes first: Slurm index 1; gpu instance 9: Slurm index 2
    assert dict(mig_map) == {2 * MIG_PROBE_STRIDE + 1: 1, 2 * MIG_PROBE_STRIDE: 2}
    assert mig_map.guessed == frozenset(mig_map)  # not proven against a real MIG node
    assert (slices["MIG-9"].util_pct, slices["MIG-2"].util_pct) == (40.0, None)
    assert [p.pid for p in slices["MIG-9"].processes] == [77]
    # NVML measures the board only: each 1g.10gb slice is given 1/7 of its power and
    # of its energy counter (the split rule of slurmgpu/gpushare.py)
    assert slices["MIG-9"].power_w == pytest.approx(300.0 / 7, abs=1e-3)
    assert slices["MIG-2"].energy_mj is None  # the board has no counter here


def test_a_boards_energy_counter_is_split_by_compute_slices() -> None:
    def mig(index: int, profile: str | None) -> GpuMigInstanceSample:
        return GpuMigInstanceSample(
            index=index,
            uuid=f"MIG-{'abc'[index]}",
            gpu_instance_id=index + 1,
            compute_instance_id=0,
            memory_used_mib=0,
            memory_total_mib=None,
            profile=profile,
        )

    three, one, odd = mig(0, "3g.40gb"), mig(1, "1g.10gb"), mig(2, None)
    parent = GpuDeviceSample(
        index=0, minor_number=0, power_w=140.0, energy_mj=7_000_000, mig_instances=(three, one, odd)
    )
    devices, _ = split_mig_devices([parent], {0: 0, 1: 0, 2: 0})
    by_uuid = {d.uuid: d for d in devices}
    assert (by_uuid["MIG-a"].power_w, by_uuid["MIG-a"].energy_mj) == (60.0, 3_000_000)
    assert (by_uuid["MIG-b"].power_w, by_uuid["MIG-b"].energy_mj) == (20.0, 1_000_000)
    assert (by_uuid["MIG-c"].power_w, by_uuid["MIG-c"].energy_mj) == (None, None)


def test_instances_stay_unmapped_when_slurm_lists_a_different_count() -> None:
    parent = GpuDeviceSample(index=0, minor_number=1, mig_instances=(_mig(0, 1, 5.0),))
    devices, mig_map = split_mig_devices([parent], {0: 1, 1: 1})
    assert len(mig_map) == 0 and mig_map.unmapped == (MIG_PROBE_STRIDE,)
    assert [d.index for d in devices] == [MIG_PROBE_STRIDE]


def test_devices_without_mig_or_in_error_pass_through() -> None:
    plain = GpuDeviceSample(index=0, minor_number=0)
    lost = GpuDeviceSample(index=1, minor_number=1, error="gpu lost")
    devices, mig_map = split_mig_devices([plain, lost], {0: 0, 1: 1})
    assert devices == [plain, lost] and len(mig_map) == 0


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_agent_samples_each_mig_slice_as_its_own_slurm_gpu(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text(GRES)
    state = tmp_path / "simgpu"
    write_declaration(
        state,
        NODE,
        LoadDeclaration(
            pid=sleeper.pid,
            device=2,
            util_pct=35.0,
            memory_mib=3000,
            job_id=JOB,
            updated_at=time.time(),
        ),
    )
    sampler = NodeSampler(
        NODE,
        SimulatedGpuProbe(NODE, conf, None, state),
        HostUsageSampler(),
        slurm_minors_by_index=minors_by_index(read_gres_conf(conf, NODE)),
        scan_pids=lambda _root: {sleeper.pid: JOB},
    )
    jobs = NodeJobs(
        node=NODE,
        jobs=[
            NodeJob(job_id=JOB, gpu_indices=[2], shard_indices=[], shards=0, cpus=1),
            NodeJob(job_id=OTHER, gpu_indices=[1], shard_indices=[], shards=0, cpus=1),
        ],
    )
    gpu, _ = sampler.sample(jobs, time.time())
    rows = {(s.gpu_index, s.job_id): s for s in gpu}
    assert set(rows) == {(0, None), (1, OTHER), (2, JOB)}
    busy, idle = rows[(2, JOB)], rows[(1, OTHER)]
    assert (busy.source, busy.util_pct, busy.memory_used_mib) == ("device", 35.0, 3000.0)
    assert busy.memory_total_mib == 10240.0  # the slice's memory, not the GPU's
    assert (idle.source, idle.util_pct, idle.memory_total_mib) == ("idle", 0.0, 40960.0)
    # One meter per board: the 1g.10gb slice gets 1/7 of it, the 3g.40gb one 3/7.
    assert busy.power_w is not None and idle.power_w is not None
    assert idle.power_w == pytest.approx(3 * busy.power_w, abs=0.01)
    assert busy.energy_mj is not None and idle.energy_mj is not None
    assert len({s.sample_uid for s in gpu}) == 3

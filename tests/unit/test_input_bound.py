"""The input-bound diagnosis: GPUs that work, but little, while the CPUs are saturated or
the processes wait on storage; told apart from idle GPUs and from plain low utilisation."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from slurmgpu.report.eff import job_efficiency
from slurmgpu.report.eff_advice import gpu_diagnosis, notes
from slurmgpu.report.eff_json import to_json
from slurmgpu.store.usage_query import HostUsage
from tests.unit.eff_records import ended, gpu, host, kinds, make_job, one


def _io(node: str, cpu_pct: float, cpus: int, iowait: float | None) -> HostUsage:
    return replace(host(node, cpu_pct, cpus), mean_iowait_pct=iowait)


def test_busy_cpus_and_a_starved_gpu_are_input_bound_with_loader_advice() -> None:
    job = make_job(gpus={"gpu1": (0,)}, cpus=4)
    eff = job_efficiency(job, [gpu(0, 12.0)], [host("gpu1", 380.0, 4)], ended(job))
    found = notes(eff)
    note = one(found, "input-bound")
    assert note.severity == "warn"
    assert "GPU utilisation was 12%" in note.text and "4 CPU cores were 95% busy" in note.text
    assert "num_workers" in note.text and "-c" in note.text
    assert "gpu-util" not in kinds(found) and "cpu" not in kinds(found)
    assert gpu_diagnosis(found) == "input-bound"
    assert to_json(eff, found)["gpu"]["diagnosis"] == "input-bound"


def test_processes_waiting_on_storage_are_input_bound_with_local_copy_advice() -> None:
    job = make_job(gpus={"gpu1": (0,)}, cpus=4)
    usage = [_io("gpu1", 120.0, 4, 65.0)]  # CPUs 30 % busy, 0.65 of a process waiting
    found = notes(job_efficiency(job, [gpu(0, 9.0)], usage, ended(job)))
    note = one(found, "input-bound")
    assert "waiting on storage 65% of the time" in note.text
    assert "$TMPDIR" in note.text and "CPU cores" not in note.text


def test_low_util_with_quiet_cpus_and_storage_stays_a_gpu_util_note() -> None:
    job = make_job(gpus={"gpu1": (0,)}, cpus=4)
    for iowait in (5.0, None):  # little I/O wait, or the kernel does not count it
        found = notes(
            job_efficiency(job, [gpu(0, 10.0)], [_io("gpu1", 120.0, 4, iowait)], ended(job))
        )
        assert "input-bound" not in kinds(found)
        assert one(found, "gpu-util").severity == "warn"
        assert gpu_diagnosis(found) == "low-util"


def test_idle_gpus_are_idle_not_input_bound_whatever_the_cpus_do() -> None:
    job = make_job(gpus={"gpu1": (0,)}, cpus=4, elapsed=timedelta(hours=3))
    never = gpu(0, 0.0, never_busy=True)
    found = notes(job_efficiency(job, [never], [host("gpu1", 390.0, 4)], ended(job)))
    assert "input-bound" not in kinds(found)
    assert gpu_diagnosis(found) == "idle"


def test_well_used_gpus_with_busy_cpus_are_fine() -> None:
    job = make_job(gpus={"gpu1": (0,)}, cpus=4)
    found = notes(job_efficiency(job, [gpu(0, 85.0)], [_io("gpu1", 390.0, 4, 80.0)], ended(job)))
    assert "input-bound" not in kinds(found) and gpu_diagnosis(found) == "ok"

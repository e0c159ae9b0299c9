"""What a job really uses: GPU probes (NVML, simulated), process → job attribution, host usage.

The seam is ``GpuProbe``; ``NvmlProbe`` is the real implementation and ``SimulatedGpuProbe``
the one the lab cluster's fake GPUs use. ``attribute`` turns device samples into per-job rows.
"""

from __future__ import annotations

from slurmgpu.telemetry.attribution import (
    GpuIndexMap,
    JobGpuUsage,
    attribute,
    job_for_pid,
    job_id_from_cgroup,
    job_id_from_environ,
    map_probe_to_slurm_indices,
)
from slurmgpu.telemetry.host import HostUsageSampler, JobHostUsage
from slurmgpu.telemetry.nvml import NvmlProbe
from slurmgpu.telemetry.probe import (
    GpuDeviceSample,
    GpuMigInstanceSample,
    GpuProbe,
    GpuProcessSample,
    ProbeUnavailableError,
)
from slurmgpu.telemetry.simgpu import SimulatedGpuProbe

__all__ = [
    "GpuDeviceSample",
    "GpuIndexMap",
    "GpuMigInstanceSample",
    "GpuProbe",
    "GpuProcessSample",
    "HostUsageSampler",
    "JobGpuUsage",
    "JobHostUsage",
    "NvmlProbe",
    "ProbeUnavailableError",
    "SimulatedGpuProbe",
    "attribute",
    "job_for_pid",
    "job_id_from_cgroup",
    "job_id_from_environ",
    "map_probe_to_slurm_indices",
]

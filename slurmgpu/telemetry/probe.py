"""What a GPU probe reports: one frozen sample per device, and the ``GpuProbe`` seam.

A probe reports devices in *its own* order (``index``: the NVML ordinal for ``NvmlProbe``).
That order is not Slurm's device index; ``attribution.map_probe_to_slurm_indices`` maps one
to the other by device minor number or PCI bus id. An error on one device is carried in
that device's sample (``error``), never raised, so one bad GPU cannot hide the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class ProbeUnavailableError(RuntimeError):
    """The probe cannot run on this machine; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class GpuProcessSample:
    """One process with a context on a GPU.

    ``used_memory_mib`` is None when the driver does not say (some MIG and permission
    cases). ``sm_util_pct`` is the process's share of SM time over the probe's last
    window; None when the device cannot report per-process utilization.
    """

    pid: int
    used_memory_mib: int | None
    sm_util_pct: float | None = None


@dataclass(frozen=True, slots=True)
class GpuMigInstanceSample:
    """One MIG device (a GPU instance + compute instance) inside a MIG-enabled GPU.

    ``profile`` is the MIG profile as Slurm types it (``1g.10gb``, ``3g.40gb+me``), read
    off the MIG device's name; None when the name does not carry one. Under MIG NVML has
    no duty-cycle utilization, per device or per process: ``util_pct`` is GPM's SM
    utilization (percent of the instance's SMs busy) and ``sm_occupancy_pct`` GPM's SM
    occupancy over the window since the previous sample, both None ("unknown", never 0)
    where GPM is unsupported (before Hopper) and on a probe's first sample.
    """

    index: int  # MIG device index within its parent (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    processes: tuple[GpuProcessSample, ...] = ()
    error: str | None = None
    profile: str | None = None
    util_pct: float | None = None
    sm_occupancy_pct: float | None = None


@dataclass(frozen=True, slots=True)
class GpuDeviceSample:
    """One physical GPU at one instant; any field the device cannot report is None.

    ``util_pct`` is the fraction of the last sample period in which a kernel ran (NVML's
    "GPU utilization", the duty cycle jobstats uses). ``memory_used_mib`` is device memory
    in use, all processes together. ``energy_mj`` never decreases while the driver
    stays loaded; a smaller value than before means the driver was reloaded.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    minor_number: int | None = None
    util_pct: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    power_w: float | None = None
    temperature_c: int | None = None
    processes: tuple[GpuProcessSample, ...] = ()
    # NVML's total-energy counter (mJ since the driver was loaded, Volta and newer);
    # None when the device has none: energy is then integrated from power_w.
    energy_mj: int | None = None
    mig_instances: tuple[GpuMigInstanceSample, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class GpuProbe(Protocol):
    """The GPU seam: the node agent calls ``sample()`` each cycle and ``close()`` once."""

    name: str

    def sample(self) -> list[GpuDeviceSample]:
        """Return one sample per device, in the probe's own device order."""
        ...

    def close(self) -> None:
        """Release what the probe holds (NVML handle, files); safe to call twice."""
        ...

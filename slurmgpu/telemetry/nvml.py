"""``NvmlProbe``: per-device and per-process GPU usage from NVML (nvidia-ml-py).

The NVML module is injectable (``NvmlProbe(nvml=...)``): production passes nothing and
gets ``pynvml``; unit tests pass a fake module with the same function names, return types
and ``pynvml.NVMLError`` subclasses. ``NvmlApi`` lists exactly what the probe calls.

Error policy: an NVML error on one field (``NVMLError_NotSupported`` for power on some
boards, ``NoPermission`` for processes, ...) leaves that field None; a GPU that fell off
the bus (``NVMLError_GpuIsLost``) or needs a reset yields a sample with ``error`` set and
whatever identity fields were read before. Only a failure of the whole library (count of
devices unreadable) raises ``ProbeUnavailableError`` from ``sample()``.

Per-process SM utilization comes from ``nvmlDeviceGetProcessUtilization(handle,
lastSeenTimeStamp)``: the driver returns samples newer than the timestamp (CPU time in
microseconds), one per process that had non-zero utilization, or raises
``NVMLError_NotFound`` when there is none. The probe keeps the newest timestamp per device
between calls, so each call covers the window since the previous one, and a running
process with no sample in that window is reported at 0 %.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from slurmgpu.telemetry.probe import (
    GpuDeviceSample,
    GpuMigInstanceSample,
    GpuProcessSample,
    ProbeUnavailableError,
)

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_NVML_SUCCESS = 0


class NvmlApi(Protocol):
    """The part of ``pynvml`` the probe uses (names and shapes as in nvidia-ml-py 12/13).

    Return values are ctypes structures or friendly objects: ``nvmlDeviceGetUtilizationRates``
    has ``.gpu``/``.memory`` (percent), ``nvmlDeviceGetMemoryInfo`` ``.used``/``.total``
    (bytes), ``nvmlDeviceGetPciInfo`` ``.busId``, the running-process lists objects with
    ``.pid``/``.usedGpuMemory`` (bytes or None), ``nvmlDeviceGetProcessUtilization``
    samples with ``.pid``/``.smUtil``/``.timeStamp``; ``nvmlDeviceGetMigMode`` returns
    ``[current, pending]``.
    """

    NVMLError: type[Exception]
    NVML_ERROR_NOT_FOUND: int
    NVML_ERROR_GPU_IS_LOST: int
    NVML_ERROR_RESET_REQUIRED: int
    NVML_ERROR_UNINITIALIZED: int
    NVML_ERROR_DRIVER_NOT_LOADED: int
    NVML_ERROR_LIBRARY_NOT_FOUND: int
    NVML_ERROR_NO_PERMISSION: int
    NVML_TEMPERATURE_GPU: int
    NVML_DEVICE_MIG_ENABLE: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> Any: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> Sequence[Any]: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> Sequence[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int: ...


class _DeviceGone(Exception):
    """Raised inside one device's sampling when the device itself is unusable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _import_pynvml() -> NvmlApi:
    try:
        import pynvml
    except ImportError:
        raise ProbeUnavailableError(
            "nvidia-ml-py is not installed: pip install 'slurmgpu[nvml]' "
            "(or use the simulated probe on machines without GPUs)"
        ) from None
    module: NvmlApi = pynvml
    return module


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _mib(num_bytes: object) -> int | None:
    if isinstance(num_bytes, int) and not isinstance(num_bytes, bool) and num_bytes >= 0:
        return num_bytes // _MIB
    return None


class NvmlProbe:
    """A ``GpuProbe`` over NVML; one instance holds one ``nvmlInit`` until ``close()``.

    Needs a GPU and the driver::

    >>> probe = NvmlProbe()  # doctest: +SKIP
    >>> [d.util_pct for d in probe.sample()]  # doctest: +SKIP
    [97.0, 0.0]
    """

    name = "nvml"

    def __init__(self, *, nvml: NvmlApi | None = None) -> None:
        api = nvml if nvml is not None else _import_pynvml()
        try:
            api.nvmlInit()
        except api.NVMLError as exc:
            raise ProbeUnavailableError(self._init_message(api, exc)) from None
        self._nvml = api
        self._open = True
        # Newest per-process utilization timestamp seen, per device (uuid, else ordinal).
        self._last_seen_us: dict[str, int] = {}

    @staticmethod
    def _init_message(api: NvmlApi, exc: BaseException) -> str:
        code = _code(exc)
        if code == api.NVML_ERROR_LIBRARY_NOT_FOUND:
            return (
                "NVML library libnvidia-ml.so.1 not found: install the NVIDIA driver, "
                "or use the simulated probe on machines without GPUs"
            )
        if code == api.NVML_ERROR_DRIVER_NOT_LOADED:
            return "NVIDIA driver is not loaded: check that `nvidia-smi` works on this node"
        if code == api.NVML_ERROR_NO_PERMISSION:
            return "no permission to open NVML: run the agent as root or fix /dev/nvidia* modes"
        return f"NVML failed to start ({exc}): check that `nvidia-smi` works on this node"

    def __enter__(self) -> NvmlProbe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    def sample(self) -> list[GpuDeviceSample]:
        if not self._open:
            raise ProbeUnavailableError("NvmlProbe.sample() called after close()")
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as exc:
            raise ProbeUnavailableError(f"NVML cannot count GPUs ({exc})") from None
        return [self._sample_device(i) for i in range(count)]

    # -- one device ------------------------------------------------------------------

    def _gone_reason(self, exc: BaseException) -> str | None:
        """Why the whole device is unusable, or None when only one field failed."""
        n = self._nvml
        code = _code(exc)
        if code == n.NVML_ERROR_GPU_IS_LOST:
            return "gpu lost"
        if code == n.NVML_ERROR_RESET_REQUIRED:
            return "gpu requires reset"
        if code in (n.NVML_ERROR_UNINITIALIZED, n.NVML_ERROR_DRIVER_NOT_LOADED):
            return f"nvml: {exc}"
        return None

    def _get(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML getter: its value, None on a field error, _DeviceGone if lost."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            reason = self._gone_reason(exc)
            if reason is not None:
                raise _DeviceGone(reason) from None
            log.debug("%s: %s", getattr(fn, "__name__", fn), exc)
            return None

    def _sample_device(self, index: int) -> GpuDeviceSample:
        n = self._nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
        except n.NVMLError as exc:
            return GpuDeviceSample(index=index, error=self._gone_reason(exc) or f"nvml: {exc}")
        uuid: str | None = None
        name: str | None = None
        pci_bus_id: str | None = None
        minor: int | None = None
        try:
            uuid = _text(self._get(n.nvmlDeviceGetUUID, handle))
            name = _text(self._get(n.nvmlDeviceGetName, handle))
            pci = self._get(n.nvmlDeviceGetPciInfo, handle)
            pci_bus_id = _text(getattr(pci, "busId", None)) if pci is not None else None
            minor_raw = self._get(n.nvmlDeviceGetMinorNumber, handle)
            minor = int(minor_raw) if minor_raw is not None else None

            util = self._get(n.nvmlDeviceGetUtilizationRates, handle)
            util_pct = float(util.gpu) if util is not None else None
            mem = self._get(n.nvmlDeviceGetMemoryInfo, handle)
            mem_used = _mib(mem.used) if mem is not None else None
            mem_total = _mib(mem.total) if mem is not None else None
            power_mw = self._get(n.nvmlDeviceGetPowerUsage, handle)
            power_w = power_mw / 1000.0 if power_mw is not None else None
            # mJ since the driver was loaded; NotSupported before Volta (then None).
            energy = self._get(n.nvmlDeviceGetTotalEnergyConsumption, handle)
            energy_mj = int(energy) if energy is not None else None
            temp = self._get(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU)
            temperature_c = int(temp) if temp is not None else None

            processes = self._processes(handle, uuid or f"ordinal:{index}")
            mig = self._mig_instances(handle)
        except _DeviceGone as gone:
            return GpuDeviceSample(
                index=index,
                uuid=uuid,
                name=name,
                pci_bus_id=pci_bus_id,
                minor_number=minor,
                error=gone.reason,
            )
        return GpuDeviceSample(
            index=index,
            uuid=uuid,
            name=name,
            pci_bus_id=pci_bus_id,
            minor_number=minor,
            util_pct=util_pct,
            memory_used_mib=mem_used,
            memory_total_mib=mem_total,
            power_w=power_w,
            temperature_c=temperature_c,
            processes=processes,
            energy_mj=energy_mj,
            mig_instances=mig,
        )

    def _running_processes(self, handle: Any) -> dict[int, int | None]:
        """pid → used memory (MiB) over compute, MPS-client and graphics process lists."""
        n = self._nvml
        memory_by_pid: dict[int, int | None] = {}
        getters = (
            n.nvmlDeviceGetComputeRunningProcesses,
            n.nvmlDeviceGetMPSComputeRunningProcesses,
            n.nvmlDeviceGetGraphicsRunningProcesses,
        )
        for getter in getters:
            for proc in self._get(getter, handle) or ():
                pid = int(proc.pid)
                used = _mib(getattr(proc, "usedGpuMemory", None))
                known = memory_by_pid.get(pid)
                # A "C+G" process is in two lists with the same memory: keep one value.
                memory_by_pid[pid] = used if known is None else max(known, used or 0)
        return memory_by_pid

    def _process_sm_util(self, handle: Any, key: str) -> dict[int, float] | None:
        """pid → SM util % since the previous call; None when the device cannot say."""
        n = self._nvml
        last = self._last_seen_us.get(key, 0)
        try:
            samples = n.nvmlDeviceGetProcessUtilization(handle, last)
        except n.NVMLError as exc:
            # NotFound: no process had non-zero utilization in the window. pynvml also
            # raises NVMLError(NVML_SUCCESS) when the driver answers "0 samples" at once.
            if _code(exc) in (n.NVML_ERROR_NOT_FOUND, _NVML_SUCCESS):
                return {}
            reason = self._gone_reason(exc)
            if reason is not None:
                raise _DeviceGone(reason) from None
            log.debug("nvmlDeviceGetProcessUtilization: %s", exc)
            return None
        newest: dict[int, tuple[int, float]] = {}
        for s in samples:
            ts = int(s.timeStamp)
            if ts <= last:
                continue
            pid = int(s.pid)
            if pid not in newest or ts > newest[pid][0]:
                newest[pid] = (ts, min(100.0, max(0.0, float(s.smUtil))))
        if newest:
            self._last_seen_us[key] = max(ts for ts, _ in newest.values())
        return {pid: util for pid, (_, util) in newest.items()}

    def _processes(self, handle: Any, key: str) -> tuple[GpuProcessSample, ...]:
        memory_by_pid = self._running_processes(handle)
        sm_by_pid = self._process_sm_util(handle, key)
        return tuple(
            GpuProcessSample(
                pid=pid,
                used_memory_mib=memory_by_pid[pid],
                sm_util_pct=None if sm_by_pid is None else sm_by_pid.get(pid, 0.0),
            )
            for pid in sorted(memory_by_pid)
        )

    def _mig_instances(self, handle: Any) -> tuple[GpuMigInstanceSample, ...]:
        n = self._nvml
        mode = self._get(n.nvmlDeviceGetMigMode, handle)
        if not mode or int(mode[0]) != n.NVML_DEVICE_MIG_ENABLE:
            return ()
        count = self._get(n.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        instances: list[GpuMigInstanceSample] = []
        for mig_index in range(int(count)):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
            except n.NVMLError as exc:
                if _code(exc) == n.NVML_ERROR_NOT_FOUND:
                    continue  # slot without a MIG device
                reason = self._gone_reason(exc)
                if reason is not None:
                    raise _DeviceGone(reason) from None
                instances.append(
                    GpuMigInstanceSample(
                        index=mig_index,
                        uuid=None,
                        gpu_instance_id=None,
                        compute_instance_id=None,
                        memory_used_mib=None,
                        memory_total_mib=None,
                        error=f"nvml: {exc}",
                    )
                )
                continue
            mem = self._get(n.nvmlDeviceGetMemoryInfo, mig)
            procs = self._get(n.nvmlDeviceGetComputeRunningProcesses, mig) or ()
            gi = self._get(n.nvmlDeviceGetGpuInstanceId, mig)
            ci = self._get(n.nvmlDeviceGetComputeInstanceId, mig)
            instances.append(
                GpuMigInstanceSample(
                    index=mig_index,
                    uuid=_text(self._get(n.nvmlDeviceGetUUID, mig)),
                    gpu_instance_id=int(gi) if gi is not None else None,
                    compute_instance_id=int(ci) if ci is not None else None,
                    memory_used_mib=_mib(mem.used) if mem is not None else None,
                    memory_total_mib=_mib(mem.total) if mem is not None else None,
                    processes=tuple(
                        GpuProcessSample(
                            pid=int(p.pid),
                            used_memory_mib=_mib(getattr(p, "usedGpuMemory", None)),
                            sm_util_pct=None,  # NVML has no per-process util inside MIG
                        )
                        for p in procs
                    ),
                )
            )
        return tuple(instances)

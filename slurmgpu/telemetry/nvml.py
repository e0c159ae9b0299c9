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

Under MIG the driver has neither device nor per-process utilization. Where the board
supports GPM (``nvmlGpmQueryDeviceSupport``: Hopper and newer) the probe takes one GPM
sample per GPU instance each call (``nvmlGpmMigSampleGet``) and reads SM utilization and
SM occupancy over the window between that sample and the previous call's
(``nvmlGpmMetricsGet``); elsewhere, and on the first call, they are None (unknown).
"""

from __future__ import annotations

import logging
import math
import re
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
# The name NVML gives a MIG device: "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
_MIG_PROFILE = re.compile(r"\bMIG (\d+g\.\d+gb(?:\+\w+)?)")


class NvmlApi(Protocol):
    """The part of ``pynvml`` the probe uses (names and shapes as in nvidia-ml-py 12/13).

    Return values are ctypes structures or friendly objects: ``nvmlDeviceGetUtilizationRates``
    has ``.gpu``/``.memory`` (percent), ``nvmlDeviceGetMemoryInfo`` ``.used``/``.total``
    (bytes), ``nvmlDeviceGetPciInfo`` ``.busId``, the running-process lists objects with
    ``.pid``/``.usedGpuMemory`` (bytes or None), ``nvmlDeviceGetProcessUtilization``
    samples with ``.pid``/``.smUtil``/``.timeStamp``; ``nvmlDeviceGetMigMode`` returns
    ``[current, pending]``. GPM: ``nvmlGpmQueryDeviceSupport`` returns a structure with
    ``.isSupportedDevice``; samples are opaque pointers from ``nvmlGpmSampleAlloc``; the
    probe fills a ``c_nvmlGpmMetricsGet_t`` and reads each ``metrics[i]`` (``.metricId``,
    ``.nvmlReturn``, ``.value``) after ``nvmlGpmMetricsGet``.
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
    NVML_GPM_METRICS_GET_VERSION: int
    NVML_GPM_METRIC_SM_UTIL: int
    NVML_GPM_METRIC_SM_OCCUPANCY: int
    c_nvmlGpmMetricsGet_t: Callable[[], Any]

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
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, sample: Any) -> None: ...
    def nvmlGpmMigSampleGet(self, handle: Any, gpuInstanceId: int, sample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any: ...


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
        # GPM support per device, and the previous GPM sample per (device, GPU instance).
        self._gpm_supported: dict[str, bool] = {}
        self._gpm_previous: dict[tuple[str, int], Any] = {}

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
        for sample in self._gpm_previous.values():
            self._free_gpm(sample)
        self._gpm_previous.clear()
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
            mig = self._mig_instances(handle, uuid or f"ordinal:{index}")
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

    def _mig_instances(self, handle: Any, key: str) -> tuple[GpuMigInstanceSample, ...]:
        n = self._nvml
        mode = self._get(n.nvmlDeviceGetMigMode, handle)
        if not mode or int(mode[0]) != n.NVML_DEVICE_MIG_ENABLE:
            self._drop_gpm(key, keep=set())
            return ()
        count = self._get(n.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        gpm = self._gpm_support(handle, key)
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
            name = _text(self._get(n.nvmlDeviceGetName, mig))
            profile = _MIG_PROFILE.search(name) if name else None
            sm_util, occupancy = (
                self._gpm_window(handle, key, int(gi)) if gpm and gi is not None else (None, None)
            )
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
                    profile=profile.group(1) if profile else None,
                    util_pct=sm_util,
                    sm_occupancy_pct=occupancy,
                )
            )
        live = {m.gpu_instance_id for m in instances if m.gpu_instance_id is not None}
        self._drop_gpm(key, keep=live)
        return tuple(instances)

    # -- GPM (MIG utilization) -----------------------------------------------------------

    def _gpm_support(self, handle: Any, key: str) -> bool:
        """Whether the device answers GPM queries; asked once per device."""
        known = self._gpm_supported.get(key)
        if known is not None:
            return known
        support = self._get(self._nvml.nvmlGpmQueryDeviceSupport, handle)
        supported = bool(getattr(support, "isSupportedDevice", 0)) if support else False
        self._gpm_supported[key] = supported
        return supported

    def _free_gpm(self, sample: Any) -> None:
        try:
            self._nvml.nvmlGpmSampleFree(sample)
        except self._nvml.NVMLError as exc:
            log.debug("nvmlGpmSampleFree: %s", exc)

    def _drop_gpm(self, key: str, keep: set[int]) -> None:
        """Free the kept GPM samples of GPU instances of ``key`` that no longer exist."""
        for slot in [s for s in self._gpm_previous if s[0] == key and s[1] not in keep]:
            self._free_gpm(self._gpm_previous.pop(slot))

    def _gpm_window(self, handle: Any, key: str, gpu_instance_id: int) -> tuple[float | None, ...]:
        """(SM util %, SM occupancy %) of one GPU instance since the previous call.

        (None, None) on the first call for the instance, or when GPM fails for it.
        """
        n = self._nvml
        unknown: tuple[float | None, ...] = (None, None)
        try:
            sample = n.nvmlGpmSampleAlloc()
        except n.NVMLError as exc:
            log.debug("nvmlGpmSampleAlloc: %s", exc)
            return unknown
        try:
            n.nvmlGpmMigSampleGet(handle, gpu_instance_id, sample)
        except n.NVMLError as exc:
            self._free_gpm(sample)
            reason = self._gone_reason(exc)
            if reason is not None:
                raise _DeviceGone(reason) from None
            log.debug("nvmlGpmMigSampleGet(%d): %s", gpu_instance_id, exc)
            return unknown
        previous = self._gpm_previous.pop((key, gpu_instance_id), None)
        self._gpm_previous[(key, gpu_instance_id)] = sample
        if previous is None:
            return unknown
        wanted = (n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY)
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = previous
        request.sample2 = sample
        for i, metric_id in enumerate(wanted):
            request.metrics[i].metricId = metric_id
        try:
            answer = n.nvmlGpmMetricsGet(request)
        except n.NVMLError as exc:
            log.debug("nvmlGpmMetricsGet(%d): %s", gpu_instance_id, exc)
            return unknown
        finally:
            self._free_gpm(previous)
        values: list[float | None] = []
        for i in range(len(wanted)):
            metric = answer.metrics[i]
            value = float(metric.value)
            ok = int(metric.nvmlReturn) == _NVML_SUCCESS and math.isfinite(value)
            values.append(min(100.0, max(0.0, value)) if ok else None)
        return tuple(values)

"""NvmlProbe against a faithful fake of the pynvml module.

The fake implements the same function names with the same return types as nvidia-ml-py
(it returns pynvml's own ctypes structures and friendly objects) and raises pynvml's own
``NVMLError`` subclasses, built the way pynvml builds them: ``NVMLError(code)`` maps the
code to ``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``, …
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from slurmgpu.telemetry.nvml import NvmlProbe
from slurmgpu.telemetry.probe import GpuProbe, ProbeUnavailableError

GIB = 1024**3
MIB = 1024**2


def _error(code: int) -> Exception:
    exc: Exception = pynvml.NVMLError(code)
    return exc


@dataclass
class FakeMig:
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    used_bytes: int
    total_bytes: int
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    profile: str = "1g.10gb"
    # GPM counters the test advances between samples: SM cycles busy and elapsed.
    sm_busy_cycles: int = 0
    sm_elapsed_cycles: int = 0
    occupancy_pct: float = 0.0


@dataclass
class FakeGpu:
    uuid: str
    minor: int
    bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    util_gpu: int = 0
    util_memory: int = 0
    used_bytes: int = 0
    total_bytes: int = 80 * GIB
    power_mw: int | None = 70_000  # None: NVMLError_NotSupported
    energy_mj: int | None = 123_456_789  # None: NotSupported (pre-Volta boards)
    temperature_c: int = 35
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    util_samples: list[tuple[int, int, int]] = field(default_factory=list)  # pid, ts_us, sm
    process_util_supported: bool = True
    lost: bool = False  # every call raises NVMLError_GpuIsLost
    lost_at_handle: bool = False
    mig_mode: tuple[int, int] | None = None  # None: MIG not supported by the board
    migs: dict[int, FakeMig] = field(default_factory=dict)
    max_migs: int = 7
    gpm_supported: bool = False  # GPM (nvmlGpm*) answers on Hopper and newer


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


class FakeNvml:
    """The pynvml functions NvmlProbe calls, over in-memory GPUs."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
    NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
    NVML_GPM_METRIC_SM_OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.count_error: int | None = None
        self.init_calls = 0
        self.shutdown_calls = 0
        self.util_timestamps: list[tuple[str, int]] = []
        # GPM samples: address → (gpu instance id, busy, elapsed, occupancy) once filled.
        self.gpm_samples: dict[int, tuple[int, int, int, float] | None] = {}
        self._gpm_keep: list[Any] = []  # keeps the sample buffers alive

    def _live(self, handle: _Handle) -> FakeGpu:
        if self.init_calls <= self.shutdown_calls:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle.gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle.gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _error(self.init_error)
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error is not None:
            raise _error(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost_at_handle:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _Handle(self.gpus[index])

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        gpu = self._live(handle)
        return handle.mig.uuid if handle.mig else gpu.uuid  # pynvml decodes to str

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        gpu = self._live(handle)
        return f"{gpu.name} MIG {handle.mig.profile}" if handle.mig else gpu.name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._live(handle)
        info = pynvml.nvmlPciInfo_t()
        domain, bus, rest = gpu.bus_id.split(":")
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = gpu.bus_id[4:].encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
        return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._live(handle).minor

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._live(handle)
        if gpu.mig_mode is not None and gpu.mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # as on a MIG-enabled A100/H100
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._live(handle)
        used, total = (
            (handle.mig.used_bytes, handle.mig.total_bytes)
            if handle.mig
            else (gpu.used_bytes, gpu.total_bytes)
        )
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._live(handle)
        if gpu.power_mw is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._live(handle)
        if gpu.energy_mj is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.energy_mj

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._live(handle).temperature_c

    @staticmethod
    def _process_objects(processes: list[tuple[int, int | None]]) -> list[Any]:
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0, "computeInstanceId": 0}
            )
            for pid, used in processes
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._live(handle)
        return self._process_objects(handle.mig.processes if handle.mig else gpu.processes)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._live(handle)
        return []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        self._live(handle)
        return []

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        gpu = self._live(handle)
        self.util_timestamps.append((gpu.uuid, timeStamp))
        if not gpu.process_util_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        fresh = [s for s in gpu.util_samples if s[1] > timeStamp]
        if not fresh:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)  # no sample since timeStamp
        return [
            pynvml.c_nvmlProcessUtilizationSample_t(
                pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0
            )
            for pid, ts, sm in fresh
        ]

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._live(handle)
        if gpu.mig_mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return self._live(handle).max_migs

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._live(handle)
        if index not in gpu.migs:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(gpu, gpu.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        self._live(handle)
        assert handle.mig is not None
        return int(handle.mig.gpu_instance_id)

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        self._live(handle)
        assert handle.mig is not None
        return int(handle.mig.compute_instance_id)

    # -- GPM, as nvidia-ml-py: opaque sample pointers and a c_nvmlGpmMetricsGet_t --

    @staticmethod
    def _address(sample: Any) -> int:
        address = ctypes.cast(sample, ctypes.c_void_p).value
        assert address is not None
        return address

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._live(handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        sample = ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        self._gpm_keep.append(sample)
        self.gpm_samples[self._address(sample)] = None
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        del self.gpm_samples[self._address(sample)]  # KeyError: a double free

    def nvmlGpmMigSampleGet(self, handle: Any, gpuInstanceId: int, sample: Any) -> Any:
        gpu = self._live(handle)
        if not gpu.gpm_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mig = next((m for m in gpu.migs.values() if m.gpu_instance_id == gpuInstanceId), None)
        if mig is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        address = self._address(sample)
        assert address in self.gpm_samples, "sample not allocated (or freed)"
        self.gpm_samples[address] = (
            gpuInstanceId,
            mig.sm_busy_cycles,
            mig.sm_elapsed_cycles,
            mig.occupancy_pct,
        )
        return sample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        assert metricsGet.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        first = self.gpm_samples[self._address(metricsGet.sample1)]
        second = self.gpm_samples[self._address(metricsGet.sample2)]
        assert first is not None and second is not None and first[0] == second[0]
        elapsed = second[2] - first[2]
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL and elapsed > 0:
                metric.value = 100.0 * (second[1] - first[1]) / elapsed
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            elif metric.metricId == pynvml.NVML_GPM_METRIC_SM_OCCUPANCY and elapsed > 0:
                metric.value = second[3]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return metricsGet


def _two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid="GPU-aaaa",
            minor=1,  # the NVML ordinal 0 is /dev/nvidia1 on this board
            bus_id="00000000:17:00.0",
            util_gpu=97,
            util_memory=40,
            used_bytes=30 * GIB,
            power_mw=412_345,
            temperature_c=71,
            processes=[(4242, 29 * GIB)],
            util_samples=[(4242, 1_000_000, 95)],
        ),
        FakeGpu(uuid="GPU-bbbb", minor=0, bus_id="00000000:3B:00.0"),
    ]


def test_fake_raises_pynvml_error_subclasses() -> None:
    assert isinstance(_error(pynvml.NVML_ERROR_NOT_SUPPORTED), pynvml.NVMLError_NotSupported)
    assert isinstance(_error(pynvml.NVML_ERROR_GPU_IS_LOST), pynvml.NVMLError_GpuIsLost)


def test_samples_every_field_of_healthy_devices() -> None:
    probe = NvmlProbe(nvml=FakeNvml(_two_gpus()))
    assert isinstance(probe, GpuProbe)
    busy, idle = probe.sample()
    assert (busy.index, busy.uuid, busy.name) == (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3")
    assert (busy.pci_bus_id, busy.minor_number) == ("00000000:17:00.0", 1)
    assert (busy.util_pct, busy.memory_used_mib, busy.memory_total_mib) == (97.0, 30720, 81920)
    assert (busy.power_w, busy.temperature_c, busy.error) == (412.345, 71, None)
    assert busy.energy_mj == 123_456_789
    assert [(p.pid, p.used_memory_mib, p.sm_util_pct) for p in busy.processes] == [
        (4242, 29 * 1024, 95.0)
    ]
    assert busy.mig_instances == ()
    assert (idle.index, idle.minor_number, idle.util_pct, idle.processes) == (1, 0, 0.0, ())


def test_unsupported_power_reading_leaves_only_power_empty() -> None:
    gpus = _two_gpus()
    gpus[0].power_mw = None
    busy, _ = NvmlProbe(nvml=FakeNvml(gpus)).sample()
    assert busy.power_w is None
    assert (busy.util_pct, busy.temperature_c, busy.error) == (97.0, 71, None)


def test_a_board_without_an_energy_counter_leaves_only_energy_empty() -> None:
    gpus = _two_gpus()
    gpus[0].energy_mj = None  # Pascal and older: NVMLError_NotSupported
    busy, other = NvmlProbe(nvml=FakeNvml(gpus)).sample()
    assert busy.energy_mj is None and busy.power_w == 412.345 and busy.error is None
    assert other.energy_mj == 123_456_789


def test_a_lost_gpu_is_an_error_sample_and_the_others_still_report() -> None:
    gpus = _two_gpus()
    gpus[1].lost = True
    busy, lost = NvmlProbe(nvml=FakeNvml(gpus)).sample()
    assert busy.error is None and busy.util_pct == 97.0
    assert (lost.index, lost.error, lost.util_pct, lost.uuid) == (1, "gpu lost", None, None)


def test_a_gpu_lost_before_its_handle_is_an_error_sample() -> None:
    gpus = _two_gpus()
    gpus[0].lost_at_handle = True
    lost, ok = NvmlProbe(nvml=FakeNvml(gpus)).sample()
    assert (lost.index, lost.error) == (0, "gpu lost")
    assert ok.error is None


def test_process_util_uses_the_last_seen_timestamp_between_calls() -> None:
    gpus = _two_gpus()
    gpus[0].util_samples = [(4242, 1_000_000, 80), (4242, 1_500_000, 90), (77, 1_200_000, 5)]
    gpus[0].processes = [(4242, 20 * GIB), (77, GIB)]
    fake = FakeNvml(gpus)
    probe = NvmlProbe(nvml=fake)

    first = probe.sample()[0]
    # the newest sample of a pid wins
    assert {p.pid: p.sm_util_pct for p in first.processes} == {77: 5.0, 4242: 90.0}

    # nothing new: NVML answers NotFound, and running processes had 0 % in the window
    second = probe.sample()[0]
    assert {p.pid: p.sm_util_pct for p in second.processes} == {77: 0.0, 4242: 0.0}

    gpus[0].util_samples.append((4242, 2_000_000, 33))
    third = probe.sample()[0]
    assert {p.pid: p.sm_util_pct for p in third.processes} == {77: 0.0, 4242: 33.0}

    asked = [ts for uuid, ts in fake.util_timestamps if uuid == "GPU-aaaa"]
    assert asked == [0, 1_500_000, 1_500_000]


def test_unsupported_process_util_is_unknown_not_zero() -> None:
    gpus = _two_gpus()
    gpus[0].process_util_supported = False
    busy, _ = NvmlProbe(nvml=FakeNvml(gpus)).sample()
    assert [(p.pid, p.sm_util_pct) for p in busy.processes] == [(4242, None)]


def test_process_memory_the_driver_does_not_report_is_none() -> None:
    gpus = _two_gpus()
    gpus[0].processes = [(4242, None)]
    busy, _ = NvmlProbe(nvml=FakeNvml(gpus)).sample()
    assert busy.processes[0].used_memory_mib is None


def test_mig_instances_are_listed_when_mig_mode_is_on() -> None:
    gpu = FakeGpu(
        uuid="GPU-cccc",
        minor=0,
        bus_id="00000000:17:00.0",
        mig_mode=(pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE),
        migs={
            0: FakeMig("MIG-1111", 1, 0, 5 * GIB, 10 * GIB, processes=[(900, 4 * GIB)]),
            2: FakeMig("MIG-2222", 2, 0, 0, 10 * GIB),
        },
    )
    (sample,) = NvmlProbe(nvml=FakeNvml([gpu])).sample()
    assert sample.util_pct is None  # NotSupported on a MIG-enabled GPU
    assert [
        (m.index, m.uuid, m.gpu_instance_id, m.compute_instance_id, m.memory_used_mib)
        for m in sample.mig_instances
    ] == [(0, "MIG-1111", 1, 0, 5120), (2, "MIG-2222", 2, 0, 0)]
    assert [(p.pid, p.used_memory_mib) for p in sample.mig_instances[0].processes] == [(900, 4096)]


def _mig_gpu(*, gpm: bool) -> FakeGpu:
    return FakeGpu(
        uuid="GPU-eeee",
        minor=0,
        bus_id="00000000:17:00.0",
        mig_mode=(pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE),
        gpm_supported=gpm,
        migs={
            0: FakeMig("MIG-1111", 3, 0, 0, 40 * GIB, profile="3g.40gb"),
            1: FakeMig("MIG-2222", 9, 0, 0, 10 * GIB, profile="1g.10gb+me"),
        },
    )


def test_mig_instances_carry_their_profile_from_the_mig_device_name() -> None:
    (sample,) = NvmlProbe(nvml=FakeNvml([_mig_gpu(gpm=False)])).sample()
    assert [(m.profile, m.memory_total_mib) for m in sample.mig_instances] == [
        ("3g.40gb", 40960),
        ("1g.10gb+me", 10240),
    ]


def test_mig_utilization_is_unknown_without_gpm_never_zero() -> None:
    fake = FakeNvml([_mig_gpu(gpm=False)])
    probe = NvmlProbe(nvml=fake)
    for _ in range(2):
        (sample,) = probe.sample()
        assert [(m.util_pct, m.sm_occupancy_pct) for m in sample.mig_instances] == [
            (None, None),
            (None, None),
        ]
    assert fake.gpm_samples == {}  # nothing allocated on a board without GPM


def test_mig_utilization_comes_from_gpm_over_the_window_between_samples() -> None:
    gpu = _mig_gpu(gpm=True)
    fake = FakeNvml([gpu])
    probe = NvmlProbe(nvml=fake)
    (first,) = probe.sample()
    # One sample is no window: unknown, not 0.
    assert [m.util_pct for m in first.mig_instances] == [None, None]
    big, small = gpu.migs[0], gpu.migs[1]
    big.sm_busy_cycles, big.sm_elapsed_cycles, big.occupancy_pct = 750, 1000, 41.5
    small.sm_elapsed_cycles = 1000  # idle: a measured 0
    (second,) = probe.sample()
    assert [(m.util_pct, m.sm_occupancy_pct) for m in second.mig_instances] == [
        (75.0, 41.5),
        (0.0, 0.0),
    ]
    big.sm_busy_cycles, big.sm_elapsed_cycles = 850, 2000  # the next window only
    (third,) = probe.sample()
    assert third.mig_instances[0].util_pct == 10.0
    assert len(fake.gpm_samples) == 2  # one kept sample per GPU instance, the rest freed
    probe.close()
    assert fake.gpm_samples == {}


def test_a_destroyed_mig_instance_frees_its_gpm_sample() -> None:
    gpu = _mig_gpu(gpm=True)
    fake = FakeNvml([gpu])
    probe = NvmlProbe(nvml=fake)
    probe.sample()
    del gpu.migs[1]
    (sample,) = probe.sample()
    assert [m.gpu_instance_id for m in sample.mig_instances] == [3]
    assert len(fake.gpm_samples) == 1


@pytest.mark.parametrize("mode", [None, (0, 0), (0, 1)])
def test_no_mig_instances_when_mig_is_off_or_unsupported(mode: tuple[int, int] | None) -> None:
    gpu = FakeGpu(uuid="GPU-dddd", minor=0, bus_id="00000000:17:00.0", mig_mode=mode)
    (sample,) = NvmlProbe(nvml=FakeNvml([gpu])).sample()
    assert sample.mig_instances == () and sample.error is None


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_unusable_nvml_raises_one_clear_line(code: int, words: str) -> None:
    with pytest.raises(ProbeUnavailableError, match=words) as info:
        NvmlProbe(nvml=FakeNvml([], init_error=code))
    assert "\n" not in str(info.value)


def test_real_pynvml_without_a_driver_raises_probe_unavailable() -> None:
    try:
        probe = NvmlProbe()
    except ProbeUnavailableError as exc:
        assert "\n" not in str(exc)
        return
    probe.close()
    pytest.skip("this machine has a working NVIDIA driver")


def test_missing_nvidia_ml_py_raises_probe_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what an absent package looks like
    with pytest.raises(ProbeUnavailableError, match=r"slurmgpu\[nvml\]"):
        NvmlProbe()


def test_close_shuts_nvml_down_once_and_sampling_after_close_fails() -> None:
    fake = FakeNvml(_two_gpus())
    with NvmlProbe(nvml=fake) as probe:
        probe.sample()
    probe.close()
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)
    with pytest.raises(ProbeUnavailableError):
        probe.sample()


def test_unreadable_device_count_raises_probe_unavailable() -> None:
    fake = FakeNvml(_two_gpus())
    probe = NvmlProbe(nvml=fake)
    fake.count_error = pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(ProbeUnavailableError, match="cannot count GPUs"):
        probe.sample()

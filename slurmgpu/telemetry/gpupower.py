"""Power of a simulated GPU: idle and busy draw per GPU model, and an NVML-like energy counter.

The lab cluster's GPUs are simulated (``telemetry.simgpu``); to show real-looking energy
their power follows a linear model between the board's idle draw and its draw under a
full training load::

    power_w = idle_w + (busy_w - idle_w) * util_pct / 100

Figures per model (``GPU_POWER``):

- ``tdp_w``: the vendor's board power limit (NVIDIA data sheets: V100 SXM2 300 W, T4 70 W,
  A100 SXM4 400 W, L40S 350 W, H100 SXM 700 W, H200 SXM 700 W).
- ``idle_w``: H200 measured on a real board, 78-84 W idle (docs/gpu-facts.md, driver
  580); the others are the usual idle draw of the board with a CUDA context (a context
  holds the GPU in a higher clock state: +26-50 W over bare idle on HBM parts, arXiv
  2605.23918), scaled to the same share of TDP as the H200's 81 W / 700 W ≈ 12 %, and
  rounded: T4 keeps its well-known ~10 W.
- ``busy_w``: the draw under a dense training load. The H200 drew 500-650 W under a bf16
  matrix-product load at 100 % NVML utilisation (gpu-facts.md), about 0.82 of TDP; the
  others use the same 0.82 x TDP. A larger bf16 product (8192x8192) drew 692 W on the
  same board (bench/gpu_check_energy.py): a pure dense kernel reaches TDP, a training job
  with its data loading and communication sits between. NVML's "utilisation" is a duty
  cycle, not a power share, so this is a model, not a measurement of those boards.

``EnergyCounter`` is what NVML's ``nvmlDeviceGetTotalEnergyConsumption`` gives on Volta
and newer: mJ since the driver was loaded, never decreasing. The simulated counter
integrates the modelled power between readings: the interval up to a reading counts at
that reading's power, as NVML's utilisation describes the window before the reading (so
an interval's energy and its busy/idle state agree).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MODEL", "GPU_POWER", "EnergyCounter", "GpuPowerModel", "power_model"]


@dataclass(frozen=True, slots=True)
class GpuPowerModel:
    """Idle and full-load board power of one GPU model, in watts."""

    name: str
    tdp_w: float
    idle_w: float
    busy_w: float

    def power_w(self, util_pct: float) -> float:
        """Board power at ``util_pct`` (clamped to 0-100).

        >>> GPU_POWER["h200"].power_w(0.0), GPU_POWER["h200"].power_w(100.0)
        (81.0, 575.0)
        """
        share = max(0.0, min(100.0, util_pct)) / 100.0
        return self.idle_w + (self.busy_w - self.idle_w) * share


_BUSY_SHARE = 0.82  # H200: 575 W (mid of 500-650 W measured) / 700 W TDP


def _model(name: str, tdp_w: float, idle_w: float) -> GpuPowerModel:
    return GpuPowerModel(name, tdp_w, idle_w, round(tdp_w * _BUSY_SHARE))


GPU_POWER: dict[str, GpuPowerModel] = {
    m.name: m
    for m in (
        GpuPowerModel("h200", 700.0, 81.0, 575.0),
        _model("h100", 700.0, 81.0),
        _model("a100", 400.0, 50.0),
        _model("l40s", 350.0, 42.0),
        _model("v100", 300.0, 38.0),
        _model("t4", 70.0, 10.0),
    )
}
DEFAULT_MODEL = "a100"  # the simulated probe's 80 GiB default memory is an A100/H100's


def power_model(gpu_type: str | None) -> GpuPowerModel:
    """The power model of a gres type (``a100``, ``A100-SXM4-80GB``, ``h200``…); unknown
    or no type: the default model.

    >>> power_model("A100-SXM4-80GB").name, power_model("tesla_v100").name, power_model(None).name
    ('a100', 'v100', 'a100')
    """
    key = (gpu_type or "").lower()
    for name in sorted(GPU_POWER, key=len, reverse=True):
        if name in key:
            return GPU_POWER[name]
    return GPU_POWER[DEFAULT_MODEL]


class EnergyCounter:
    """A monotonically increasing total-energy counter in mJ, fed with power readings.

    >>> c = EnergyCounter(start_mj=1000)
    >>> c.read(100.0, at=10.0), c.read(200.0, at=12.0), c.read(50.0, at=13.0)
    (1000, 401000, 451000)
    >>> c.read(50.0, at=12.5)  # a clock step backwards adds nothing
    451000
    """

    def __init__(
        self, start_mj: int = 0, *, last_at: float | None = None, last_power_w: float | None = None
    ) -> None:
        self.total_mj = max(0, int(start_mj))
        self.last_at = last_at
        self.last_power_w = last_power_w

    def read(self, power_w: float, *, at: float) -> int:
        """Advance to ``at``, the time since the previous reading at ``power_w``, and
        return the counter in mJ."""
        if self.last_at is not None and at > self.last_at:
            self.total_mj += round(power_w * (at - self.last_at) * 1000.0)
        if self.last_at is None or at >= self.last_at:
            self.last_at = at
        self.last_power_w = power_w
        return self.total_mj

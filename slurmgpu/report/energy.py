"""A job's GPU energy: per-GPU measurements (``store.usage_query.GpuEnergy``) made job figures.

Pure functions. The store measures each GPU between the job's first and last sample of
it; the job ran a little longer (up to one agent interval before its first sample and
after its last), so :func:`job_energy` adds that head and tail (at most two typical
sample intervals together) at the power of the first and the last sample, and says how
much it added (``extrapolated_j``).

``method`` says how the measured part was obtained: ``counter`` (NVML's total-energy
counter, Volta and newer: a measurement), ``power`` (trapezoid of power samples: an
estimate, which lags a changing load: on an H200 it was within 0.1-1 % of the counter
at a steady draw sampled every 0.1-1 s, 4 % off at 10 s intervals, and 44-52 % high over
the 6 s after a load stopped; bench/gpu_check_energy.py) or ``mixed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from slurmgpu.model import Job, JobState
from slurmgpu.store.usage_query import GpuEnergy

EnergyMethod = Literal["counter", "power", "mixed"]
J_PER_KWH = 3.6e6

METHOD_TEXT: Mapping[str, str] = {
    "counter": "NVML energy counter",
    "power": "estimated from power samples",
    "mixed": "NVML energy counter, partly estimated from power samples",
}


@dataclass(frozen=True, slots=True)
class JobEnergy:
    """The energy a job's GPUs used, and the part used while they were idle."""

    energy_j: float
    idle_energy_j: float
    method: EnergyMethod
    extrapolated_j: float = 0.0
    gpus: int = 0

    @property
    def kwh(self) -> float:
        return self.energy_j / J_PER_KWH

    @property
    def idle_pct(self) -> float:
        return 100.0 * self.idle_energy_j / self.energy_j if self.energy_j > 0 else 0.0

    @property
    def method_text(self) -> str:
        return METHOD_TEXT[self.method]


def format_energy(joules: float) -> str:
    """Energy in the unit that reads best.

    >>> format_energy(41.2 * 3.6e6), format_energy(5400.0), format_energy(12.0)
    ('41.2 kWh', '1.50 Wh', '12 J')
    """
    if joules >= J_PER_KWH / 10:
        return f"{joules / J_PER_KWH:.1f} kWh"
    if joules >= 360.0:
        return f"{joules / 3600.0:.2f} Wh"
    return f"{joules:.0f} J"


def _elapsed_s(job: Job, now: datetime) -> float | None:
    if job.start_time is None or job.state is JobState.PENDING:
        return None
    end = job.end_time if job.state.is_terminal and job.end_time is not None else now
    return max((end - job.start_time) / timedelta(seconds=1), 0.0)


def job_energy(job: Job | None, gpus: Sequence[GpuEnergy], now: datetime) -> JobEnergy | None:
    """Return the job's GPU energy, or None when no interval of any GPU was measured.

    Without ``job`` (its start and end unknown) only the sampled part is counted.

    >>> from datetime import UTC
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> job = Job(job_id=1, name="x", user="u", state=JobState.COMPLETED,
    ...           start_time=t0, end_time=t0 + timedelta(seconds=100))
    >>> g = GpuEnergy("n1", 0, 10, 9000.0, 3000.0, 9, 0, 90.0, 100.0,
    ...               t0 + timedelta(seconds=5), t0 + timedelta(seconds=95))
    >>> e = job_energy(job, [g], t0)
    >>> round(e.energy_j), round(e.idle_energy_j), e.method, round(e.extrapolated_j)
    (10000, 3333, 'counter', 1000)
    """
    counted = [g for g in gpus if g.counter_intervals + g.power_intervals > 0]
    if not counted:
        return None
    elapsed = _elapsed_s(job, now) if job is not None else None
    total = idle = extra = 0.0
    for g in counted:
        total += g.energy_j
        idle += g.idle_energy_j
        span = (g.last_at - g.first_at) / timedelta(seconds=1)
        if elapsed is None or g.mean_power_w is None or g.samples < 2 or span <= 0:
            continue
        typical = span / (g.samples - 1)
        missing = min(max(elapsed - span, 0.0), 2.0 * typical)
        # Half before the first sample at its power, half after the last at its power
        # (the head and the tail are what the agent's interval hides at either end).
        head = g.first_power_w if g.first_power_w is not None else g.mean_power_w
        tail = g.last_power_w if g.last_power_w is not None else g.mean_power_w
        add = (head + tail) / 2.0 * missing
        extra += add
        if g.energy_j > 0:
            idle += add * g.idle_energy_j / g.energy_j
    by_counter = sum(g.counter_intervals for g in counted)
    by_power = sum(g.power_intervals for g in counted)
    method: EnergyMethod = "counter" if by_power == 0 else "power" if by_counter == 0 else "mixed"
    return JobEnergy(total + extra, idle, method, extra, len(counted))


def energy_to_json(energy: JobEnergy | None) -> dict[str, Any] | None:
    """The stable JSON of a job's energy (also the end-of-job summary's ``energy``)."""
    if energy is None:
        return None
    return {
        "energy_j": round(energy.energy_j, 1),
        "idle_energy_j": round(energy.idle_energy_j, 1),
        "kwh": round(energy.kwh, 4),
        "idle_pct": round(energy.idle_pct, 1),
        "method": energy.method,
        "extrapolated_j": round(energy.extrapolated_j, 1),
        "gpus": energy.gpus,
    }


def energy_from_json(data: object) -> JobEnergy | None:
    """Read back :func:`energy_to_json` (from a stored summary); None when unusable.

    >>> energy_from_json(energy_to_json(JobEnergy(7200.0, 3600.0, "power", 0.0, 1)))
    JobEnergy(energy_j=7200.0, idle_energy_j=3600.0, method='power', extrapolated_j=0.0, gpus=1)
    >>> energy_from_json({"energy_j": "x"}) is None
    True
    """
    if not isinstance(data, Mapping):
        return None
    total, idle, method = data.get("energy_j"), data.get("idle_energy_j"), data.get("method")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (total, idle)):
        return None
    if method not in METHOD_TEXT:
        return None
    extra = data.get("extrapolated_j")
    gpus = data.get("gpus")
    assert isinstance(total, int | float) and isinstance(idle, int | float)
    return JobEnergy(
        float(total),
        float(idle),
        method,  # type: ignore[arg-type]
        float(extra) if isinstance(extra, int | float) else 0.0,
        gpus if isinstance(gpus, int) else 0,
    )


def energy_sentence(energy: JobEnergy, *, running: bool = False) -> str:
    """The advice line: "this job used 41.0 kWh, 60 % of it while the GPUs were idle".

    >>> energy_sentence(JobEnergy(41 * 3.6e6, 0.6 * 41 * 3.6e6, "counter"))[:60]
    'this job used 41.0 kWh of GPU energy, 60 % of it while the G'
    """
    verb = "has used" if running else "used"
    return (
        f"this job {verb} {format_energy(energy.energy_j)} of GPU energy, "
        f"{energy.idle_pct:.0f} % of it while the GPUs were idle ({energy.method_text})"
    )

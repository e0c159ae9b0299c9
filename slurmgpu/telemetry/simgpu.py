"""``SimulatedGpuProbe``: fake GPUs for the lab cluster, driven by what load programs declare.

The lab cluster's GPUs are character devices (``File=/dev/tty[0-3]`` in gres.conf), so no
driver can measure them. Instead a load program (``sgpu fakeload``) running inside a job
*declares* what it would use: one JSON file per (pid, Slurm device index) under
``state_dir/<node>/``::

    {"pid": 4242, "device": 1, "util_pct": 80.0, "memory_mib": 10240,
     "job_id": 17, "updated_at": 1718000000.5, "interval_s": 5.0}

The probe reads the declarations, drops those whose pid is gone (or a zombie) and those not
refreshed within ``stale_factor`` times their ``interval_s``, and reports per device: util =
min(100, sum of the processes' declared util), memory = sum of declared memory (not capped:
a real GPU would refuse the allocation, the simulation shows the overcommit), one process
entry per pid with ``sm_util_pct`` = its declared util. Probe index i is Slurm index i, and
its minor number is the number in gres.conf's i-th ``File=`` name.

Power follows the device's GPU model (gres type, else ``gpu_model``): idle draw plus a
share of the full-load draw proportional to util (``telemetry.gpupower``, with sources).
Each device has an NVML-like total-energy counter (mJ, never decreasing) integrating that
power; it is kept in ``state_dir/<node>/.energy.json`` so an agent restart continues it
(the time the agent was down counted at the first new reading's power, as a real
counter keeps counting).

MIG: a gres.conf GPU line whose ``Type=`` is a MIG profile (``1g.10gb``, ``3g.40gb+me``)
is one MIG instance of the physical GPU named by its (first) device file, as Slurm's
AutoDetect writes them (``MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21``).
The probe then reports, as NVML does on a MIG-enabled board, one device per physical GPU
(sample index: the Slurm index of its first instance) with ``util_pct`` None and one
``mig_instances`` entry per line: memory total from the profile, memory and util (GPM's
SM utilization, which the simulation always has) summed over the declarations on that
Slurm index, and processes without per-process utilization. Declarations on a MIG
instance name its Slurm index as ``device``, like any other.

MPS: a GPU that gres.conf also lists under ``Name=mps`` serves MPS clients. NVML reports
their memory but no per-process SM share, so the simulation reports their processes with
``sm_util_pct`` None; the device's util is known.

Writers replace files atomically (temp file + rename in the same directory), so a reader
never sees half a declaration.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from slurmgpu.telemetry.gpupower import EnergyCounter, GpuPowerModel, power_model
from slurmgpu.telemetry.gresconf import (
    GresConfError,
    GresGpuDevice,
    mps_minors,
    parse_gres_conf,
)
from slurmgpu.telemetry.probe import (
    GpuDeviceSample,
    GpuMigInstanceSample,
    GpuProcessSample,
    ProbeUnavailableError,
)

log = logging.getLogger(__name__)

ENV_STATE_DIR = "SGPU_SIMGPU_DIR"
DEFAULT_STATE_DIR = Path("/var/tmp/slurmgpu-simgpu")  # noqa: S108 - shared by design, sticky
DEFAULT_INTERVAL_S = 5.0
_SHARED_DIR_MODE = 0o1777  # like /tmp: every job user may declare, none may remove others'
# A MIG profile as Slurm types it: compute slices "g." memory "gb", optional "+me" etc.
_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(?:\+\w+)?$")


def mig_profile_memory_mib(profile: str | None) -> int | None:
    """The memory of a MIG profile in MiB (``1g.10gb`` → 10240); None if not a profile."""
    m = _MIG_PROFILE.match(profile or "")
    return int(m.group(2)) * 1024 if m else None


def default_state_dir() -> Path:
    """Return ``$SGPU_SIMGPU_DIR`` or ``/var/tmp/slurmgpu-simgpu``."""
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else DEFAULT_STATE_DIR


@dataclass(frozen=True, slots=True)
class LoadDeclaration:
    """What one process says it uses on one (simulated) GPU, as of ``updated_at``."""

    pid: int
    device: int  # Slurm device index on the node
    util_pct: float
    memory_mib: int
    job_id: int | None
    updated_at: float  # epoch seconds
    interval_s: float = DEFAULT_INTERVAL_S  # how often the writer refreshes

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: object) -> LoadDeclaration | None:
        """Return the declaration in ``data`` (parsed JSON), or None when it is malformed."""
        if not isinstance(data, Mapping):
            return None
        pid, device = data.get("pid"), data.get("device")
        util, memory = data.get("util_pct"), data.get("memory_mib")
        job_id, updated = data.get("job_id"), data.get("updated_at")
        interval = data.get("interval_s", DEFAULT_INTERVAL_S)
        if not (_is_int(pid) and _is_int(device) and _is_number(util) and _is_number(memory)):
            return None
        if not (_is_number(updated) and _is_number(interval)):
            return None
        if job_id is not None and not _is_int(job_id):
            return None
        assert isinstance(pid, int) and isinstance(device, int)
        assert isinstance(util, int | float) and isinstance(memory, int | float)
        assert isinstance(updated, int | float) and isinstance(interval, int | float)
        if pid <= 0 or device < 0 or not all(map(math.isfinite, (util, memory, updated))):
            return None
        return cls(
            pid=pid,
            device=device,
            util_pct=max(0.0, min(100.0, float(util))),
            memory_mib=max(0, int(memory)),
            job_id=job_id if isinstance(job_id, int) else None,
            updated_at=float(updated),
            interval_s=float(interval) if interval > 0 else DEFAULT_INTERVAL_S,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def node_dir(state_dir: Path, node: str) -> Path:
    """Return the declaration directory of ``node`` under ``state_dir``."""
    if not node or "/" in node or node in {".", ".."}:
        raise ValueError(f"{node!r} is not a node name")
    return state_dir / node


def declaration_path(state_dir: Path, node: str, pid: int, device: int) -> Path:
    return node_dir(state_dir, node) / f"{pid}-{device}.json"


def _ensure_shared_dir(path: Path) -> None:
    for directory in (path.parent, path):
        if directory.is_dir():
            continue
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):
            directory.chmod(_SHARED_DIR_MODE)


def write_declaration(state_dir: Path, node: str, declaration: LoadDeclaration) -> Path:
    """Write (or replace) one declaration atomically; return its path."""
    target = declaration_path(state_dir, node, declaration.pid, declaration.device)
    _ensure_shared_dir(target.parent)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            os.fchmod(tmp.fileno(), 0o644)  # the probe may run as another user
            tmp.write(declaration.to_json())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    return target


def remove_declaration(state_dir: Path, node: str, pid: int, device: int) -> None:
    """Remove one declaration if it exists."""
    with contextlib.suppress(FileNotFoundError):
        declaration_path(state_dir, node, pid, device).unlink()


def read_declarations(state_dir: Path, node: str) -> list[tuple[Path, LoadDeclaration]]:
    """Return every well-formed declaration of ``node`` (live or not) with its file."""
    directory = node_dir(state_dir, node)
    try:
        entries = sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[Path, LoadDeclaration]] = []
    for path in entries:
        if path.name.startswith(".") or path.suffix != ".json":
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # removed between listing and reading, or not ours
        declaration = LoadDeclaration.from_mapping(data)
        if declaration is None:
            log.debug("ignoring malformed declaration %s", path)
            continue
        found.append((path, declaration))
    return found


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a running process (zombies count as dead)."""
    try:
        status: str = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return status != psutil.STATUS_ZOMBIE


class SimulatedGpuProbe:
    """A ``GpuProbe`` over simulated devices (see the module docstring).

    Devices come from ``gres_conf`` (the node's ``Name=gpu`` lines); when there is none,
    or it lists no GPU for ``node``, from ``devices`` (a count, minors 0..N-1).

    >>> probe = SimulatedGpuProbe("gpu1", None, 2, Path("/tmp/sim"))  # doctest: +SKIP
    >>> [d.util_pct for d in probe.sample()]  # doctest: +SKIP
    [0.0, 0.0]
    """

    name = "simgpu"

    def __init__(
        self,
        node: str,
        gres_conf: Path | None,
        devices: int | None,
        state_dir: Path,
        memory_total_mib: int = 81920,
        *,
        stale_factor: float = 3.0,
        clock: Callable[[], float] = time.time,
        gpu_model: str | None = None,
    ) -> None:
        if gres_conf is None and devices is None:
            raise ValueError("SimulatedGpuProbe needs a gres.conf or a device count")
        node_dir(state_dir, node)  # validates the name
        self.node = node
        self.state_dir = state_dir
        self.memory_total_mib = memory_total_mib
        self.stale_factor = stale_factor
        self._clock = clock
        gres: list[GresGpuDevice] = []
        mps: set[int] = set()
        if gres_conf is not None:
            try:
                text = gres_conf.read_text()
                gres = parse_gres_conf(text, node)
                mps = mps_minors(text, node)
            except OSError as exc:
                raise ProbeUnavailableError(
                    f"cannot read {gres_conf}: {exc.strerror or exc}"
                ) from None
            except GresConfError as exc:
                raise ProbeUnavailableError(f"{gres_conf}: {exc}") from None
        if not gres and devices is not None:
            gres = [GresGpuDevice(index=i, path=None, minor=i) for i in range(devices)]
        self.devices: tuple[GresGpuDevice, ...] = tuple(gres)
        self.mps_minors = frozenset(mps)
        # Physical GPUs: a plain gres line, or the MIG lines that share a device minor.
        units: list[list[GresGpuDevice]] = []
        parent_of_minor: dict[int, list[GresGpuDevice]] = {}
        for device in self.devices:
            if mig_profile_memory_mib(device.gpu_type) is not None and device.minor is not None:
                known = parent_of_minor.get(device.minor)
                if known is not None:
                    known.append(device)
                    continue
                parent_of_minor[device.minor] = [device]
                units.append(parent_of_minor[device.minor])
            else:
                units.append([device])
        self._units: tuple[tuple[GresGpuDevice, ...], ...] = tuple(tuple(u) for u in units)
        self.power_models: tuple[GpuPowerModel, ...] = tuple(
            power_model(gpu_model if _is_mig(u[0]) else (u[0].gpu_type or gpu_model))
            for u in self._units
        )
        self._counters = self._load_counters()

    # -- energy counters ---------------------------------------------------------------

    def _energy_path(self) -> Path:
        return node_dir(self.state_dir, self.node) / ".energy.json"

    def _load_counters(self) -> dict[int, EnergyCounter]:
        """The counters saved by an earlier probe of this node; fresh ones where none."""
        saved: object = None
        with contextlib.suppress(OSError, UnicodeDecodeError, ValueError):
            saved = json.loads(self._energy_path().read_text(encoding="utf-8"))
        counters: dict[int, EnergyCounter] = {}
        for device in self.devices:
            entry = saved.get(str(device.index)) if isinstance(saved, dict) else None
            if isinstance(entry, dict) and all(
                _is_number(entry.get(k)) for k in ("mj", "at", "power_w")
            ):
                counters[device.index] = EnergyCounter(
                    int(entry["mj"]),
                    last_at=float(entry["at"]),
                    last_power_w=float(entry["power_w"]),
                )
            else:
                counters[device.index] = EnergyCounter()
        return counters

    def _save_counters(self) -> None:
        data = {
            str(index): {"mj": c.total_mj, "at": c.last_at, "power_w": c.last_power_w}
            for index, c in self._counters.items()
            if c.last_at is not None
        }
        target = self._energy_path()
        try:
            _ensure_shared_dir(target.parent)
            fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as tmp:
                tmp.write(json.dumps(data, sort_keys=True))
            os.replace(tmp_name, target)
        except OSError as exc:  # energy continuity is best effort; sampling goes on
            log.debug("cannot save simulated energy counters to %s: %s", target, exc)

    def close(self) -> None:
        """Nothing to release: the probe holds no file open between samples."""

    def live_declarations(self) -> list[LoadDeclaration]:
        """Return the declarations of live, fresh processes on this node's devices.

        Files of processes that are gone are removed (best effort), so a load program
        killed with SIGKILL does not leave litter behind.
        """
        now = self._clock()
        live: list[LoadDeclaration] = []
        for path, declaration in read_declarations(self.state_dir, self.node):
            if not 0 <= declaration.device < len(self.devices):
                continue
            if not pid_alive(declaration.pid):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if now - declaration.updated_at > self.stale_factor * declaration.interval_s:
                continue  # the writer stopped refreshing (hung, or the pid was reused)
            live.append(declaration)
        return live

    def sample(self) -> list[GpuDeviceSample]:
        by_device: dict[int, list[LoadDeclaration]] = {}
        for declaration in self.live_declarations():
            by_device.setdefault(declaration.device, []).append(declaration)
        now = self._clock()
        samples = [
            self._mig_sample(unit, model, by_device, now)
            if _is_mig(unit[0])
            else self._device_sample(unit[0], model, by_device.get(unit[0].index, []), now)
            for unit, model in zip(self._units, self.power_models, strict=True)
        ]
        self._save_counters()
        return samples

    def _device_sample(
        self,
        device: GresGpuDevice,
        model: GpuPowerModel,
        declarations: list[LoadDeclaration],
        now: float,
    ) -> GpuDeviceSample:
        declarations.sort(key=lambda d: d.pid)
        util = min(100.0, sum(d.util_pct for d in declarations))
        ident = device.minor if device.minor is not None else device.index
        mps = device.minor is not None and device.minor in self.mps_minors
        kind = device.gpu_type or model.name
        power_w = round(model.power_w(util), 1)
        counter = self._counters.setdefault(device.index, EnergyCounter())
        energy_mj = counter.read(power_w, at=now)
        return GpuDeviceSample(
            index=device.index,
            uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'slurmgpu-sim:{self.node}:{ident}')}",
            name=f"Simulated {kind}",
            pci_bus_id=f"00000000:{(0x10 + ident) % 0x100:02X}:00.0",
            minor_number=device.minor,
            util_pct=util,
            memory_used_mib=sum(d.memory_mib for d in declarations),
            memory_total_mib=self.memory_total_mib,
            power_w=power_w,
            energy_mj=energy_mj,
            temperature_c=int(30 + util / 2),  # plausible, clearly synthetic
            processes=tuple(
                GpuProcessSample(
                    pid=d.pid,
                    used_memory_mib=d.memory_mib,
                    sm_util_pct=None if mps else d.util_pct,  # no per-client share under MPS
                )
                for d in declarations
            ),
        )

    def _mig_sample(
        self,
        unit: tuple[GresGpuDevice, ...],
        model: GpuPowerModel,
        by_device: Mapping[int, list[LoadDeclaration]],
        now: float,
    ) -> GpuDeviceSample:
        """One MIG-enabled physical GPU: device util unknown, usage per instance."""
        first = unit[0]
        assert first.minor is not None
        instances: list[GpuMigInstanceSample] = []
        for position, device in enumerate(unit):
            declarations = sorted(by_device.get(device.index, []), key=lambda d: d.pid)
            instances.append(
                GpuMigInstanceSample(
                    index=position,
                    uuid=f"MIG-{self._uuid(f'{first.minor}:{device.index}')}",
                    gpu_instance_id=position + 1,
                    compute_instance_id=0,
                    memory_used_mib=sum(d.memory_mib for d in declarations),
                    memory_total_mib=mig_profile_memory_mib(device.gpu_type),
                    processes=tuple(
                        GpuProcessSample(pid=d.pid, used_memory_mib=d.memory_mib)
                        for d in declarations
                    ),
                    profile=device.gpu_type,
                    util_pct=min(100.0, sum(d.util_pct for d in declarations)),
                    sm_occupancy_pct=None,  # the simulation has no warps to count
                )
            )
        # Power follows the share of the GPU's SMs busy: each instance's util weighted by
        # its compute slices (out of 7 on A100/H100).
        busy = sum((m.util_pct or 0.0) * _slices(m.profile) / 7.0 for m in instances)
        power_w = round(model.power_w(min(100.0, busy)), 1)
        counter = self._counters.setdefault(first.index, EnergyCounter())
        return GpuDeviceSample(
            index=first.index,
            uuid=f"GPU-{self._uuid(str(first.minor))}",
            name=f"Simulated {model.name} (MIG)",
            pci_bus_id=f"00000000:{(0x10 + first.minor) % 0x100:02X}:00.0",
            minor_number=first.minor,
            util_pct=None,  # NVML: NotSupported on a MIG-enabled GPU
            memory_used_mib=sum(m.memory_used_mib or 0 for m in instances),
            memory_total_mib=self.memory_total_mib,
            power_w=power_w,
            energy_mj=counter.read(power_w, at=now),
            temperature_c=int(30 + busy / 2),
            mig_instances=tuple(instances),
        )

    def _uuid(self, ident: str) -> uuidlib.UUID:
        return uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"slurmgpu-sim:{self.node}:{ident}")


def _is_mig(device: GresGpuDevice) -> bool:
    return device.minor is not None and mig_profile_memory_mib(device.gpu_type) is not None


def _slices(profile: str | None) -> int:
    m = _MIG_PROFILE.match(profile or "")
    return int(m.group(1)) if m else 0

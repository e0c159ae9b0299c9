"""Which job a process belongs to, which Slurm GPU a probed device is, and who used what.

Three mistakes the reporting tools users know make, and how this module avoids them:

- *Index mismatch.* jobstats keys GPUs by NVML ordinal, but Slurm's device index follows
  gres.conf's device files (``/dev/nvidiaN``), and NVML's ordinal is not N on every board.
  ``map_probe_to_slurm_indices`` matches by device minor number first, then PCI bus id, and
  falls back to identity only when neither is known, flagging each guess.
- *Allocated but unused.* A GPU allocated to a job with no process on it is reported as an
  idle row (``source="idle"``, util 0), not left out.
- *Sharing.* On a GPU shared by several jobs (``gres/shard``, MPS) each job gets the sum of
  its own processes' SM utilization and memory, never the device totals. Under MPS a
  client's SM share is unknown to NVML: the job gets the device's util only when its
  processes are the only ones on the GPU (or the device is idle), else unknown (None).

Process → job: the Slurm cgroup in ``/proc/PID/cgroup`` (authoritative), else
``SLURM_JOB_ID`` in ``/proc/PID/environ`` (the only source under ``proctrack/linuxproc``).
Cgroup layouts (Slurm's cgroup/v1 and cgroup/v2 plugins; ``<node>_`` / ``_<node>`` forms are
what slurmd built with --enable-multiple-slurmd uses)::

    v1: N:memory:/slurm/uid_1000/job_123/step_0/task_0
        N:memory:/slurm_gpu1/uid_1000/job_123/step_batch/task_0
    v2: 0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0
        0::/system.slice/gpu1_slurmstepd.scope/job_123/step_extern/user/task_special

An array task's directory carries its own raw job id (``SLURM_JOB_ID``), not the array's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slurmgpu.gpushare import mig_gpu_fraction
from slurmgpu.model import NodeGpuAllocation
from slurmgpu.telemetry.probe import GpuDeviceSample, GpuProcessSample

log = logging.getLogger(__name__)

_MAX_JOB_ID = 2**32 - 1  # Slurm job ids are uint32
_V1_JOB = re.compile(r"(?:^|/)slurm(?:_[^/]+)?/uid_\d+/job_(\d{1,10})(?=/|$)")
_V2_JOB = re.compile(r"(?:^|/)(?:[^/]+_)?slurmstepd\.scope/job_(\d{1,10})(?=/|$)")
_STEP = re.compile(r"/step_([A-Za-z0-9_]+?)(?=/|$)")
_PCI = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])")


# -- process → job -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmCgroup:
    """The Slurm job cgroup a process is in.

    ``job_path`` is the job directory relative to the cgroup mount: for v2 the unified
    path, for v1 the path in the memory hierarchy when there is one (else the first
    hierarchy that names the job). ``step`` is ``"0"``, ``"batch"``, ``"extern"``, … or None.
    """

    job_id: int
    version: Literal[1, 2]
    job_path: str
    step: str | None = None


def _valid_job_id(digits: str) -> int | None:
    value = int(digits)
    return value if 0 < value <= _MAX_JOB_ID else None


def slurm_cgroup(text: str) -> SlurmCgroup | None:
    """Return the Slurm job cgroup in the text of ``/proc/PID/cgroup``, or None."""
    first_v1: SlurmCgroup | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        v2 = hierarchy == "0" and controllers == ""
        m = (_V2_JOB if v2 else _V1_JOB).search(path)
        if m is None:
            continue
        job_id = _valid_job_id(m.group(1))
        if job_id is None:
            continue
        step_m = _STEP.match(path, m.end())
        found = SlurmCgroup(
            job_id=job_id,
            version=2 if v2 else 1,
            job_path=path[: m.end()],
            step=step_m.group(1) if step_m else None,
        )
        if v2 or "memory" in controllers.split(","):
            return found
        first_v1 = first_v1 or found
    return first_v1


def job_id_from_cgroup(text: str) -> int | None:
    """Return the Slurm job id in the text of ``/proc/PID/cgroup`` (v1 or v2), or None.

    >>> job_id_from_cgroup("0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0")
    123
    >>> job_id_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope") is None
    True
    """
    found = slurm_cgroup(text)
    return found.job_id if found is not None else None


def job_id_from_environ(data: bytes) -> int | None:
    """Return ``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``) from ``/proc/PID/environ``.

    >>> job_id_from_environ(b"HOME=/root\\0SLURM_JOB_ID=42\\0")
    42
    """
    values: dict[bytes, bytes] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in (b"SLURM_JOB_ID", b"SLURM_JOBID"):
            values.setdefault(key, value)
    for key in (b"SLURM_JOB_ID", b"SLURM_JOBID"):
        value = values.get(key, b"").strip()
        if value.isdigit() and len(value) <= 10:
            job_id = _valid_job_id(value.decode("ascii"))
            if job_id is not None:
                return job_id
    return None


def job_for_pid(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """Return the job ``pid`` runs in: its Slurm cgroup, else its environment; None if neither.

    A process that is gone or unreadable (another user's environ without root) gives None.
    """
    base = proc_root / str(pid)
    try:
        found = job_id_from_cgroup((base / "cgroup").read_text(errors="replace"))
    except OSError:
        found = None
    if found is not None:
        return found
    try:
        return job_id_from_environ((base / "environ").read_bytes())
    except OSError:
        return None


def cgroup_of_pid(pid: int, proc_root: Path = Path("/proc")) -> SlurmCgroup | None:
    """Return the Slurm job cgroup of ``pid``, or None (not in one, gone, unreadable)."""
    try:
        return slurm_cgroup((proc_root / str(pid) / "cgroup").read_text(errors="replace"))
    except OSError:
        return None


def scan_job_pids(proc_root: Path = Path("/proc")) -> dict[int, int]:
    """Return pid → job id for every process on this host that belongs to a Slurm job."""
    found: dict[int, int] = {}
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        job_id = job_for_pid(int(entry.name), proc_root)
        if job_id is not None:
            found[int(entry.name)] = job_id
    return found


# -- probe index → Slurm index --------------------------------------------------------

MapMethod = Literal["minor", "pci", "identity"]


def normalize_pci_bus_id(text: str) -> str | None:
    """Return ``dddd:bb:dd.f`` (lower-case hex) for NVML's or sysfs's spelling, or None.

    >>> normalize_pci_bus_id("00000000:17:00.0"), normalize_pci_bus_id("0000:17:00.0")
    ('0000:17:00.0', '0000:17:00.0')
    """
    m = _PCI.fullmatch(text.strip())
    if m is None:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


class GpuIndexMap(Mapping[int, int]):
    """Probe index → Slurm device index, remembering how each pair was decided.

    ``guessed`` holds the probe indices mapped by identity (no minor or PCI information):
    exactly the jobstats assumption, right on many machines and wrong on some, so reports
    should say so. ``unmapped`` holds probed devices that are not Slurm GPUs (or whose
    index another device already claimed).
    """

    def __init__(
        self, pairs: Mapping[int, tuple[int, MapMethod]], unmapped: Sequence[int] = ()
    ) -> None:
        self._pairs = dict(pairs)
        self.unmapped: tuple[int, ...] = tuple(unmapped)

    def __getitem__(self, probe_index: int) -> int:
        return self._pairs[probe_index][0]

    def __iter__(self) -> Iterator[int]:
        return iter(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def __repr__(self) -> str:
        inner = ", ".join(f"{p}: {s} ({m})" for p, (s, m) in sorted(self._pairs.items()))
        return f"GpuIndexMap({{{inner}}})"

    def method(self, probe_index: int) -> MapMethod:
        return self._pairs[probe_index][1]

    @property
    def guessed(self) -> frozenset[int]:
        return frozenset(p for p, (_, m) in self._pairs.items() if m == "identity")

    def joined(self, other: GpuIndexMap) -> GpuIndexMap:
        """This map and ``other`` (probe indices of the two must not overlap)."""
        return GpuIndexMap({**self._pairs, **other._pairs}, (*self.unmapped, *other.unmapped))


def map_probe_to_slurm_indices(
    devices: Sequence[GpuDeviceSample],
    slurm_minors_by_index: Mapping[int, int] | None,
    pci_by_index: Mapping[int, str] | None,
) -> GpuIndexMap:
    """Map each probed device to its Slurm index: by minor number, then PCI bus id.

    ``slurm_minors_by_index`` comes from gres.conf (``gresconf.minors_by_index``);
    ``pci_by_index`` from wherever the site knows it (e.g. ``nvidia-smi`` at boot). A device
    whose minor or bus id is known but not in Slurm's list is not a Slurm GPU (a display
    card, say) and stays unmapped. Identity is used only when neither can be compared.
    """
    minor_to_slurm = {minor: idx for idx, minor in (slurm_minors_by_index or {}).items()}
    pci_to_slurm: dict[str, int] = {}
    for idx, slurm_bus_id in (pci_by_index or {}).items():
        normalized = normalize_pci_bus_id(slurm_bus_id)
        if normalized is not None:
            pci_to_slurm[normalized] = idx
    pairs: dict[int, tuple[int, MapMethod]] = {}
    taken: set[int] = set()
    unmapped: list[int] = []
    undecided: list[GpuDeviceSample] = []

    def claim(device: GpuDeviceSample, slurm_index: int, method: MapMethod) -> None:
        if slurm_index in taken:
            log.warning(
                "GPU %s (probe index %d) and another device both look like Slurm GPU %d",
                device.uuid,
                device.index,
                slurm_index,
            )
            unmapped.append(device.index)
            return
        taken.add(slurm_index)
        pairs[device.index] = (slurm_index, method)

    for device in devices:
        comparable = False
        if minor_to_slurm and device.minor_number is not None:
            comparable = True
            if device.minor_number in minor_to_slurm:
                claim(device, minor_to_slurm[device.minor_number], "minor")
                continue
        bus_id = normalize_pci_bus_id(device.pci_bus_id) if device.pci_bus_id else None
        if pci_to_slurm and bus_id is not None:
            comparable = True
            if bus_id in pci_to_slurm:
                claim(device, pci_to_slurm[bus_id], "pci")
                continue
        if comparable:
            unmapped.append(device.index)
        else:
            undecided.append(device)
    for device in undecided:
        claim(device, device.index, "identity")
    return GpuIndexMap(pairs, sorted(unmapped))


# -- MIG instances as Slurm GPUs ---------------------------------------------------

# Probe indices of MIG instances: (parent probe index + 1) * MIG_PROBE_STRIDE + MIG index,
# far above any real ordinal so they never collide with a physical device.
MIG_PROBE_STRIDE = 1 << 16


def split_mig_devices(
    devices: Sequence[GpuDeviceSample], slurm_minors_by_index: Mapping[int, int] | None
) -> tuple[list[GpuDeviceSample], GpuIndexMap]:
    """Replace each MIG-enabled device by one device per MIG instance, mapped to Slurm.

    Slurm makes each MIG instance a GPU of its own (``gpu:1g.10gb``), whose gres.conf line
    names the parent's device file first, so the parent's minor number appears once per
    instance in ``slurm_minors_by_index``. The instances (ordered by GPU instance id) are
    paired with those Slurm indices in index order. That order is not proven to be
    Slurm's (no golden file from a real MIG node yet), so the pairs are marked guessed
    (method ``"identity"``), as reports already say for any unproven mapping. When the
    counts differ, the instances stay unmapped. An instance's util is GPM's SM
    utilization (None when unknown). NVML measures power and energy per board only: each
    instance is given the board's power and energy counter times its compute fraction
    (``gpushare.mig_gpu_fraction``: 1/7 for ``1g.10gb``), so a board's slices add up to
    the board and the energy rule's counter deltas split the same way; None where the
    profile is unknown.

    Returns the new device list (devices without MIG unchanged) and the instances' map.
    """
    slurm_by_minor: dict[int, list[int]] = {}
    for idx, minor in sorted((slurm_minors_by_index or {}).items()):
        slurm_by_minor.setdefault(minor, []).append(idx)
    out: list[GpuDeviceSample] = []
    pairs: dict[int, tuple[int, MapMethod]] = {}
    unmapped: list[int] = []
    for device in devices:
        if not device.ok or not device.mig_instances:
            out.append(device)
            continue
        instances = sorted(
            device.mig_instances,
            key=lambda m: (m.gpu_instance_id is None, m.gpu_instance_id or 0, m.index),
        )
        parent_minor = device.minor_number
        targets = slurm_by_minor.get(parent_minor, []) if parent_minor is not None else []
        if len(targets) != len(instances):
            log.debug(
                "GPU %s has %d MIG instances and %d Slurm GPUs: instances unmapped",
                device.uuid,
                len(instances),
                len(targets),
            )
        for position, mig in enumerate(instances):
            probe_index = (device.index + 1) * MIG_PROBE_STRIDE + mig.index
            share = mig_gpu_fraction(mig.profile)
            out.append(
                GpuDeviceSample(
                    index=probe_index,
                    uuid=mig.uuid,
                    name=f"{device.name or 'GPU'} MIG {mig.profile or '?'}",
                    util_pct=mig.util_pct,
                    memory_used_mib=mig.memory_used_mib,
                    memory_total_mib=mig.memory_total_mib,
                    # the board's power and energy counter, split by compute slices
                    power_w=_scaled(device.power_w, share),
                    energy_mj=_scaled_mj(device.energy_mj, share),
                    processes=mig.processes,
                    error=mig.error,
                )
            )
            if len(targets) == len(instances):
                pairs[probe_index] = (targets[position], "identity")
            else:
                unmapped.append(probe_index)
    return out, GpuIndexMap(pairs, unmapped)


def _scaled(value: float | None, share: float | None) -> float | None:
    return None if value is None or share is None else round(value * share, 3)


def _scaled_mj(value: int | None, share: float | None) -> int | None:
    return None if value is None or share is None else int(value * share)


# -- who used what --------------------------------------------------------------------

UsageSource = Literal["process", "device", "idle", "error"]


@dataclass(frozen=True, slots=True)
class JobGpuUsage:
    """One job's use of one GPU at one sample (``job_id`` None: processes of no job).

    ``source`` says where the numbers come from: ``"device"`` (the job was alone on the
    GPU: device util and memory), ``"process"`` (shared GPU: the sum of the job's own
    processes), ``"idle"`` (allocated, no process of the job on it: util 0) or ``"error"``
    (allocated, but the device could not be read or was not seen: util None, which must
    not be read as idle). ``device_util_pct`` is the whole device's util, so an idle row on
    a busy device (a process the agent could not attribute) stands out.
    """

    job_id: int | None
    slurm_index: int | None
    util_pct: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    processes: int
    shared: bool
    source: UsageSource
    allocated: bool = True
    device_util_pct: float | None = None
    probe_index: int | None = None
    index_guessed: bool = False


def _sum_known(values: Sequence[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    if values and not known:
        return None
    return float(sum(known))


def _allocated_by_index(
    jobs_on_node: Sequence[tuple[int, NodeGpuAllocation]],
) -> dict[int, set[int]]:
    by_index: dict[int, set[int]] = {}
    for job_id, alloc in jobs_on_node:
        for idx in (*alloc.gpu_indices, *alloc.shard_indices, *alloc.mps_indices):
            by_index.setdefault(idx, set()).add(job_id)
    return by_index


def _device_rows(
    device: GpuDeviceSample,
    slurm_index: int | None,
    allocated: set[int],
    pid_to_job: Mapping[int, int | None],
    guessed: bool,
) -> list[JobGpuUsage]:
    def row(
        job_id: int | None,
        util_pct: float | None,
        memory_used_mib: int | None,
        processes: int,
        shared: bool,
        source: UsageSource,
    ) -> JobGpuUsage:
        return JobGpuUsage(
            job_id=job_id,
            slurm_index=slurm_index,
            util_pct=util_pct,
            memory_used_mib=memory_used_mib,
            memory_total_mib=device.memory_total_mib,
            processes=processes,
            shared=shared,
            source=source,
            allocated=job_id is not None and job_id in allocated,
            device_util_pct=device.util_pct,
            probe_index=device.index,
            index_guessed=guessed,
        )

    if device.error is not None:
        return [row(j, None, None, 0, len(allocated) > 1, "error") for j in sorted(allocated)]
    procs_by_job: dict[int | None, list[GpuProcessSample]] = {}
    for proc in device.processes:
        procs_by_job.setdefault(pid_to_job.get(proc.pid), []).append(proc)
    parties: set[int | None] = {*allocated, *procs_by_job}
    shared = len(parties) > 1
    # Under MPS NVML gives no client's SM share; the device's util is still one job's
    # when that job's processes are the only ones on it, and an idle device is idle for
    # every client. Otherwise a client's util stays unknown (never 0).
    alone = len(procs_by_job) == 1
    rows: list[JobGpuUsage] = []
    for job_id in parties:
        procs = procs_by_job.get(job_id, [])
        if not procs:
            rows.append(row(job_id, 0.0, 0, 0, shared, "idle"))
        elif not shared:
            rows.append(
                row(job_id, device.util_pct, device.memory_used_mib, len(procs), False, "device")
            )
        else:
            util = _sum_known([p.sm_util_pct for p in procs])
            if util is None and device.util_pct is not None and (alone or device.util_pct <= 0):
                util = device.util_pct
            memory = _sum_known([p.used_memory_mib for p in procs])
            rows.append(
                row(
                    job_id,
                    min(100.0, util) if util is not None else None,
                    int(memory) if memory is not None else None,
                    len(procs),
                    True,
                    "process",
                )
            )
    return rows


def attribute(
    devices: Sequence[GpuDeviceSample],
    jobs_on_node: Sequence[tuple[int, NodeGpuAllocation]],
    pid_to_job: Mapping[int, int | None],
    index_map: Mapping[int, int],
) -> list[JobGpuUsage]:
    """Return one row per (job, GPU) on this node: every allocated GPU, and every GPU
    with processes (those of no known job under ``job_id=None``).

    ``jobs_on_node`` pairs each running job with its allocation on this node (Slurm
    indices of whole GPUs and of the GPUs its shards are on); ``pid_to_job`` maps GPU
    process ids to jobs (``job_for_pid``); ``index_map`` is probe index → Slurm index
    (``map_probe_to_slurm_indices``). A GPU allocated to a job that the probe did not
    report at all gets an ``"error"`` row.
    """
    allocated_at = _allocated_by_index(jobs_on_node)
    guessed = index_map.guessed if isinstance(index_map, GpuIndexMap) else frozenset()
    rows: list[JobGpuUsage] = []
    seen: set[int] = set()
    for device in devices:
        slurm_index = index_map.get(device.index)
        allocated = allocated_at.get(slurm_index, set()) if slurm_index is not None else set()
        if slurm_index is not None:
            seen.add(slurm_index)
        rows.extend(
            _device_rows(device, slurm_index, allocated, pid_to_job, device.index in guessed)
        )
    for slurm_index in sorted(set(allocated_at) - seen):
        jobs = allocated_at[slurm_index]
        rows.extend(
            JobGpuUsage(
                job_id=job_id,
                slurm_index=slurm_index,
                util_pct=None,
                memory_used_mib=None,
                memory_total_mib=None,
                processes=0,
                shared=len(jobs) > 1,
                source="error",
            )
            for job_id in sorted(jobs)
        )
    rows.sort(
        key=lambda r: (
            r.slurm_index is None,
            r.slurm_index or 0,
            r.probe_index if r.probe_index is not None else -1,
            r.job_id is None,
            r.job_id or 0,
        )
    )
    return rows

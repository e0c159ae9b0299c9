"""Per-job CPU and memory on this host, from psutil and the job's cgroup.

CPU is measured as a rate between two ``sample()`` calls: the sampler keeps each process's
cumulative CPU time (user + system) and the monotonic time it read it, and reports the
difference over the elapsed time. That is non-blocking (unlike psutil's
``cpu_percent(interval=…)``) and exact over the agent's own sampling period. A process seen
for the first time has no baseline yet and contributes no CPU; a job none of whose processes
has a baseline reports ``cpu_pct=None``. Processes are keyed by (pid, start time), so a
recycled pid does not inherit another process's CPU time.

I/O wait is measured the same way from each process's ``delayacct_blkio_ticks`` (psutil's
``cpu_times().iowait``: time blocked waiting for block I/O), in percent of one process's
wall time (100 = one process always waiting). The kernel counts it only with delay
accounting on (``kernel.task_delayacct = 1``, or ``delayacct`` on the kernel command
line); otherwise it is 0 for everyone, so the sampler reports None (unknown) instead.

Memory: the sum of the processes' RSS and shared resident pages (psutil ``memory_info()``,
the same numbers as ``/proc/PID/statm``), and, when the job's cgroup directory exists, the
cgroup's own charge (``memory.current`` on cgroup v2, ``memory.usage_in_bytes`` on v1),
which counts pages once however many processes share them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from slurmgpu.telemetry.attribution import SlurmCgroup, cgroup_of_pid

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class JobHostUsage:
    """One job's host usage at one sample.

    ``cpu_pct`` is in percent of one core (250 = two and a half cores busy);
    ``cpu_efficiency_pct`` is that over the allocated cores (100 = every allocated core
    busy), None when the allocation is not known.
    """

    job_id: int
    processes: int
    cpu_pct: float | None
    allocated_cpus: int | None
    cpu_efficiency_pct: float | None
    rss_mib: int
    shared_mib: int
    cgroup_memory_mib: int | None = None
    cgroup_path: str | None = None
    pids: tuple[int, ...] = field(default=(), repr=False)
    iowait_pct: float | None = None  # None: delay accounting off, or no baseline yet


@dataclass
class _JobTotals:
    pids: list[int] = field(default_factory=list)
    cpu_pct: float = 0.0
    iowait_pct: float = 0.0
    measured: bool = False
    rss_bytes: int = 0
    shared_bytes: int = 0
    cgroup: SlurmCgroup | None = None


def delay_accounting_on(proc_root: Path = Path("/proc")) -> bool:
    """True when the kernel counts per-task block I/O delays (``kernel.task_delayacct``)."""
    try:
        return (proc_root / "sys/kernel/task_delayacct").read_text().strip() == "1"
    except OSError:
        return False


def read_cgroup_memory_bytes(cgroup: SlurmCgroup, cgroup_root: Path) -> int | None:
    """Return the memory charged to the job's cgroup, or None when it cannot be read."""
    relative = cgroup.job_path.lstrip("/")
    if cgroup.version == 2:
        path = cgroup_root / relative / "memory.current"
    else:
        path = cgroup_root / "memory" / relative / "memory.usage_in_bytes"
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class HostUsageSampler:
    """Measures per-job CPU and memory; keep one instance for the agent's lifetime.

    ``proc_root`` is where ``/proc/PID/cgroup`` is read (psutil always reads the real
    ``/proc``); ``cgroup_root`` is the cgroup mount.
    """

    def __init__(
        self,
        *,
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        clock: Callable[[], float] = time.monotonic,
        iowait: bool | None = None,
    ) -> None:
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self._clock = clock
        # None: ask the kernel once per sample whether it counts I/O delays.
        self._iowait = iowait
        # (pid, create_time) → (cumulative CPU seconds, clock reading, I/O wait seconds)
        self._cpu_seen: dict[tuple[int, float], tuple[float, float, float]] = {}

    def sample(
        self,
        pid_to_job: Mapping[int, int | None],
        allocated_cpus: Mapping[int, int] | None = None,
    ) -> list[JobHostUsage]:
        """Return one row per job with at least one live process in ``pid_to_job``.

        Processes that vanish or turn unreadable while being read are skipped.
        """
        totals: dict[int, _JobTotals] = {}
        seen_now: dict[tuple[int, float], tuple[float, float, float]] = {}
        iowait_known = self._iowait if self._iowait is not None else delay_accounting_on()
        for pid, job_id in pid_to_job.items():
            if job_id is None:
                continue
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue  # exited, waiting to be reaped: uses nothing any more
                    created = proc.create_time()
                    times = proc.cpu_times()
                    memory = proc.memory_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            now = self._clock()
            cpu_s = float(times.user + times.system)
            io_s = float(getattr(times, "iowait", 0.0))
            key = (pid, created)
            seen_now[key] = (cpu_s, now, io_s)
            job = totals.setdefault(job_id, _JobTotals())
            job.pids.append(pid)
            job.rss_bytes += int(memory.rss)
            job.shared_bytes += int(getattr(memory, "shared", 0))
            previous = self._cpu_seen.get(key)
            if previous is not None and now > previous[1]:
                job.cpu_pct += max(0.0, cpu_s - previous[0]) / (now - previous[1]) * 100.0
                job.iowait_pct += max(0.0, io_s - previous[2]) / (now - previous[1]) * 100.0
                job.measured = True
            if job.cgroup is None:
                job.cgroup = cgroup_of_pid(pid, self.proc_root)
        self._cpu_seen = seen_now  # forget processes that are gone
        return [
            self._usage(job_id, job, (allocated_cpus or {}).get(job_id), iowait_known)
            for job_id, job in sorted(totals.items())
        ]

    def _usage(
        self, job_id: int, job: _JobTotals, cpus: int | None, iowait_known: bool
    ) -> JobHostUsage:
        cpu_pct = job.cpu_pct if job.measured else None
        efficiency = cpu_pct / cpus if cpu_pct is not None and cpus else None
        cgroup_bytes = None
        cgroup_path = None
        if job.cgroup is not None and job.cgroup.job_id == job_id:
            cgroup_bytes = read_cgroup_memory_bytes(job.cgroup, self.cgroup_root)
            cgroup_path = job.cgroup.job_path if cgroup_bytes is not None else None
        return JobHostUsage(
            job_id=job_id,
            processes=len(job.pids),
            cpu_pct=cpu_pct,
            allocated_cpus=cpus,
            cpu_efficiency_pct=efficiency,
            rss_mib=job.rss_bytes // _MIB,
            shared_mib=job.shared_bytes // _MIB,
            cgroup_memory_mib=cgroup_bytes // _MIB if cgroup_bytes is not None else None,
            cgroup_path=cgroup_path,
            pids=tuple(sorted(job.pids)),
            iowait_pct=job.iowait_pct if job.measured and iowait_known else None,
        )

"""``NodeSampler``: one cycle's GPU and host samples of every job on this node, in wire form.

Each cycle: probe the GPUs, map the probe's device order to Slurm's device indices
(by minor number from gres.conf, then PCI bus id, identity as the last resort), find the
job of every process (``scan_job_pids``: the Slurm cgroup, else ``SLURM_JOB_ID``), and
attribute device use to jobs (``telemetry.attribute``). A GPU that no job holds and no
process uses still gets one row (``job_id`` None, ``source="device"``), so the daemon sees
the power and temperature of idle hardware too. Host samples (CPU, memory) are made for
the jobs in the daemon's list for this node, one per job, also when none of its processes
is found (then only ``cpus_allocated`` is set).

Sample ids are ``<node>:<run>:<seq>:<gpu index or "h">:<job id or "-">``: ``run`` is fixed
for one agent process (its start time and a random part), ``seq`` counts cycles, so an id is
unique across restarts and the same batch resent after a lost reply carries the same ids,
which the daemon ignores the second time.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from slurmgpu.model import NodeGpuAllocation
from slurmgpu.telemetry.attribution import (
    MIG_PROBE_STRIDE,
    JobGpuUsage,
    attribute,
    job_for_pid,
    map_probe_to_slurm_indices,
    scan_job_pids,
    split_mig_devices,
)
from slurmgpu.telemetry.host import HostUsageSampler
from slurmgpu.telemetry.probe import GpuDeviceSample, GpuProbe, ProbeUnavailableError
from slurmgpu.wire import GpuSampleIn, HostSampleIn, NodeJobs

log = logging.getLogger(__name__)

_MAX_UID = 128


def new_run_id(now: float | None = None) -> str:
    """Return an id for one agent process: start time (hex seconds) and 32 random bits."""
    start = int(time.time() if now is None else now)
    return f"{start:x}{secrets.token_hex(4)}"


def sample_uid(node: str, run_id: str, seq: int, gpu_index: int | None, job_id: int | None) -> str:
    """Return the id of one sample; hashed to stay within the wire's 128 characters.

    >>> sample_uid("gpu1", "r", 7, 0, 42), sample_uid("gpu1", "r", 7, None, 42)
    ('gpu1:r:7:0:42', 'gpu1:r:7:h:42')
    """
    gpu = "h" if gpu_index is None else str(gpu_index)
    job = "-" if job_id is None else str(job_id)
    uid = f"{node}:{run_id}:{seq}:{gpu}:{job}"
    if len(uid) <= _MAX_UID:
        return uid
    return f"{node[:40]}:{hashlib.sha256(uid.encode()).hexdigest()}"


def allocations(jobs: NodeJobs) -> list[tuple[int, NodeGpuAllocation]]:
    """Return (job id, allocation) for each job the daemon says runs on this node."""
    return [
        (
            job.job_id,
            NodeGpuAllocation(
                node=jobs.node,
                gpu_indices=tuple(job.gpu_indices),
                shard_indices=tuple(job.shard_indices),
                shards=job.shards,
                mps_indices=tuple(job.mps_indices),
            ),
        )
        for job in jobs.jobs
    ]


class NodeSampler:
    """Turns probe readings and /proc into this node's samples; keep one per agent process.

    ``slurm_minors_by_index`` (gres.conf: Slurm index → device minor) and ``pci_by_index``
    are how probed devices are matched to Slurm's indices; without either, the probe's
    order is taken as Slurm's (the jobstats assumption).

    >>> sampler = NodeSampler("gpu1", probe, HostUsageSampler())  # doctest: +SKIP
    >>> gpu, host = sampler.sample(NodeJobs(node="gpu1", jobs=[]), time.time())  # doctest: +SKIP
    """

    def __init__(
        self,
        node: str,
        probe: GpuProbe,
        host: HostUsageSampler,
        *,
        slurm_minors_by_index: Mapping[int, int] | None = None,
        pci_by_index: Mapping[int, str] | None = None,
        proc_root: Path = Path("/proc"),
        run_id: str | None = None,
        scan_pids: Callable[[Path], dict[int, int]] = scan_job_pids,
    ) -> None:
        self.node = node
        self.probe = probe
        self.host = host
        self.slurm_minors_by_index = dict(slurm_minors_by_index or {})
        self.pci_by_index = dict(pci_by_index or {})
        self.proc_root = proc_root
        self.run_id = run_id if run_id is not None else new_run_id()
        self.seq = 0
        self._scan_pids = scan_pids
        self._probe_error: str | None = None
        self._unmapped_warned: set[int] = set()

    def _probe(self) -> list[GpuDeviceSample]:
        try:
            devices = self.probe.sample()
        except ProbeUnavailableError as exc:
            # Allocated GPUs then get "error" rows: unknown is not idle.
            if str(exc) != self._probe_error:
                log.warning("GPU probe %s failed: %s", self.probe.name, exc)
                self._probe_error = str(exc)
            return []
        if self._probe_error is not None:
            log.info("GPU probe %s works again", self.probe.name)
            self._probe_error = None
        return devices

    def sample(self, jobs: NodeJobs, now: float) -> tuple[list[GpuSampleIn], list[HostSampleIn]]:
        """Return this cycle's GPU samples (one per job and GPU) and host samples (per job)."""
        self.seq += 1
        # A MIG instance is a Slurm GPU of its own: one device per instance from here on.
        devices, mig_map = split_mig_devices(self._probe(), self.slurm_minors_by_index)
        slices = {*mig_map, *mig_map.unmapped}
        physical = [d for d in devices if d.index not in slices]
        mig_slurm = set(mig_map.values())
        minors = {i: m for i, m in self.slurm_minors_by_index.items() if i not in mig_slurm}
        index_map = map_probe_to_slurm_indices(
            physical, minors or None, self.pci_by_index or None
        ).joined(mig_map)
        for probe_index in set(index_map.unmapped) - self._unmapped_warned:
            if probe_index in mig_map.unmapped:
                parent, mig = divmod(probe_index, MIG_PROBE_STRIDE)
                log.info(
                    "MIG instance %d of probed GPU %d matches no Slurm GPU of %s (gres.conf "
                    "lists another number of MIG lines for it); ignored",
                    mig,
                    parent - 1,
                    self.node,
                )
            else:
                log.info("probed GPU %d is not a Slurm GPU of %s; ignored", probe_index, self.node)
            self._unmapped_warned.add(probe_index)

        job_pids: dict[int, int | None] = dict(self._scan_pids(self.proc_root))
        for device in devices:
            for proc in device.processes:
                if proc.pid not in job_pids:  # started after the scan, or not in a job
                    job_pids[proc.pid] = job_for_pid(proc.pid, self.proc_root)

        allocated = allocations(jobs)
        rows = attribute(devices, allocated, job_pids, index_map)
        by_probe_index = {d.index: d for d in devices}
        gpu = [
            self._gpu_sample(row, by_probe_index, now)
            for row in rows
            if row.slurm_index is not None
        ]
        covered = {row.slurm_index for row in rows}
        for device in devices:
            slurm_index = index_map.get(device.index)
            if slurm_index is not None and slurm_index not in covered:
                gpu.append(self._free_device_sample(device, slurm_index, now))
        gpu.sort(key=lambda s: (s.gpu_index, s.job_id is None, s.job_id or 0))

        # Host usage only for the jobs the daemon lists here: on a host running several
        # slurmd (the lab cluster) /proc also shows the other nodes' jobs.
        cpus = {job.job_id: job.cpus for job in jobs.jobs}
        host_pids = {pid: job for pid, job in job_pids.items() if job in cpus}
        host = [
            HostSampleIn(
                sample_uid=sample_uid(self.node, self.run_id, self.seq, None, usage.job_id),
                at=now,
                job_id=usage.job_id,
                cpu_pct=usage.cpu_pct,
                cpus_allocated=usage.allocated_cpus,
                rss_mib=float(usage.rss_mib),
                cgroup_memory_mib=(
                    float(usage.cgroup_memory_mib) if usage.cgroup_memory_mib is not None else None
                ),
                iowait_pct=usage.iowait_pct,
            )
            for usage in self.host.sample(host_pids, cpus)
        ]
        seen = {h.job_id for h in host}
        host.extend(
            # A running job with no process here (yet, or any more): allocated, unmeasured.
            HostSampleIn(
                sample_uid=sample_uid(self.node, self.run_id, self.seq, None, job.job_id),
                at=now,
                job_id=job.job_id,
                cpus_allocated=job.cpus,
            )
            for job in jobs.jobs
            if job.job_id not in seen
        )
        host.sort(key=lambda h: h.job_id)
        return gpu, host

    def _gpu_sample(
        self, row: JobGpuUsage, devices: Mapping[int, GpuDeviceSample], now: float
    ) -> GpuSampleIn:
        assert row.slurm_index is not None
        device = devices.get(row.probe_index) if row.probe_index is not None else None
        ok = device is not None and device.ok
        return GpuSampleIn(
            sample_uid=sample_uid(self.node, self.run_id, self.seq, row.slurm_index, row.job_id),
            at=now,
            gpu_index=row.slurm_index,
            job_id=row.job_id,
            util_pct=row.util_pct,
            memory_used_mib=float(row.memory_used_mib) if row.memory_used_mib is not None else None,
            memory_total_mib=(
                float(row.memory_total_mib) if row.memory_total_mib is not None else None
            ),
            power_w=device.power_w if ok and device is not None else None,
            temperature_c=(
                float(device.temperature_c)
                if ok and device is not None and device.temperature_c is not None
                else None
            ),
            processes=row.processes,
            shared=row.shared,
            source=row.source,
            energy_mj=device.energy_mj if ok and device is not None else None,
        )

    def _free_device_sample(
        self, device: GpuDeviceSample, slurm_index: int, now: float
    ) -> GpuSampleIn:
        return GpuSampleIn(
            sample_uid=sample_uid(self.node, self.run_id, self.seq, slurm_index, None),
            at=now,
            gpu_index=slurm_index,
            job_id=None,
            util_pct=device.util_pct if device.ok else None,
            memory_used_mib=(
                float(device.memory_used_mib) if device.memory_used_mib is not None else None
            ),
            memory_total_mib=(
                float(device.memory_total_mib) if device.memory_total_mib is not None else None
            ),
            power_w=device.power_w,
            temperature_c=float(device.temperature_c) if device.temperature_c is not None else None,
            processes=0,
            source="device" if device.ok else "error",
            energy_mj=device.energy_mj if device.ok else None,
        )

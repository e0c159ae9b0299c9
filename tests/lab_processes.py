"""Which processes belong to a job of *this* lab cluster.

A job id alone says nothing on a machine with two labs: every lab numbers its jobs from
1, so another session's lab (another engineer's, another xdist worker's, a chroot
release lab) has its own job 1 whose processes carry ``SLURM_JOB_ID=1`` too (issue 36,
item 7). A job's processes carry their lab's ``SLURM_CONF`` as well (the submitting
environment is exported, and slurmd sets it), and that path is under the lab's own root:
the pair names one job of one lab. The lab runs ``proctrack/linuxproc`` without
cgroups, so there is no job cgroup to read instead.
"""

from __future__ import annotations

from pathlib import Path

import psutil

__all__ = ["job_processes"]


def job_processes(job_id: int, slurm_conf: str | Path) -> list[psutil.Process]:
    """The live processes (zombies left out) of job ``job_id`` of the lab whose
    slurm.conf is ``slurm_conf``: both ``SLURM_JOB_ID`` and ``SLURM_CONF`` in their
    environment match."""
    want = {"SLURM_JOB_ID": str(job_id), "SLURM_CONF": str(slurm_conf)}
    found = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if all(env.get(k) == v for k, v in want.items()) and p.status() != "zombie":
                found.append(p)
        except psutil.Error:
            continue
    return found

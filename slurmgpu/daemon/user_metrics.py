"""Per-user GPU series for ``/metrics``: who holds GPUs now, and who leaves them idle.

``sgpu_user_gpus_allocated{user}``: whole GPUs the user's running jobs hold (the jobs'
allocations; a job whose listing names no GPU index, as Slurm 22.05 lists some, counts
what it asked for); ``sgpu_user_gpus_idle{user}``: of those, the ones no agent saw busy
in the last 2 minutes (the same window and threshold as ``sgpu_gpus_idle``). Shard jobs
share GPUs and are left out (``sgpu_shards_*`` count them by partition).

Bounded: each user is a series in Prometheus, and a site with thousands of users would
make thousands. The ``limit`` users with the most idle GPUs (then the most allocated,
then by name) get their own series; the rest are summed into ``user="(other)"``, which is
always exported (0 when nobody is left over), so a query's ``sum`` stays the cluster's.
``limit`` is ``daemon.metrics_max_users`` (docs/metrics.md says why 20 by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from slurmgpu.model import Job, JobState

__all__ = ["OTHER", "user_families", "user_gpus"]

OTHER = "(other)"


def user_gpus(jobs: Iterable[Job], busy_by_job: Mapping[int, int]) -> dict[str, tuple[int, int]]:
    """``user → (GPUs allocated, GPUs idle)`` over the running jobs holding whole GPUs;
    ``busy_by_job``: how many of a job's GPUs an agent saw busy recently."""
    out: dict[str, tuple[int, int]] = {}
    for job in jobs:
        if job.state is not JobState.RUNNING:
            continue
        held = job.allocated_gpus or job.gpus.gpus
        if held <= 0:
            continue
        used = min(busy_by_job.get(job.job_id, 0), held)
        allocated, idle = out.get(job.user, (0, 0))
        out[job.user] = (allocated + held, idle + held - used)
    return out


def user_families(per_user: Mapping[str, tuple[int, int]], limit: int) -> Iterator[Metric]:
    """The two gauges, ``limit`` users named and the rest in ``(other)``."""
    allocated = GaugeMetricFamily(
        "sgpu_user_gpus_allocated",
        f"Whole GPUs held by a user's running jobs; the users past the first {limit} "
        f"(most idle GPUs first) are summed in user={OTHER!r}.",
        labels=["user"],
    )
    idle = GaugeMetricFamily(
        "sgpu_user_gpus_idle",
        "Of a user's allocated GPUs, those not busy in the last 2 minutes of agent samples "
        f"(users past the first {limit}: user={OTHER!r}).",
        labels=["user"],
    )
    ranked = sorted(per_user.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
    rest_alloc = rest_idle = 0
    for i, (user, (n_alloc, n_idle)) in enumerate(ranked):
        if i < limit and user != OTHER:
            allocated.add_metric([user], n_alloc)
            idle.add_metric([user], n_idle)
        else:
            rest_alloc += n_alloc
            rest_idle += n_idle
    allocated.add_metric([OTHER], rest_alloc)
    idle.add_metric([OTHER], rest_idle)
    yield allocated
    yield idle

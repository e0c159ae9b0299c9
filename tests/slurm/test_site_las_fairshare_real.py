"""LAS ordering through ``Nice`` against the site's fair share, on the site-profile lab
(``priority/multifactor``, fair share the heaviest weight; slurmgpu/lab/cluster/site.py).

The rule (docs/policies.md, "With fair share"): *LAS decides between queues, fair share
inside a queue.* A heavy user (much usage, a low fair-share factor) submits first, a
light user second; both want the same whole node, held by a third user's job. The
``Nice`` of each is what LAS sets for its queue (``q x nice_step``), set by the daemon's
own user (coordinator, no AdminLevel) through slurmgpu's Slurm client. ``sprio`` shows
the factors; once the node frees up, the job Slurm starts is the rule's:

- both in queue 0, and both in queue 1: the light user's (fair share inside a queue;
  in queue 1 only because the profile's partition weight keeps every priority above
  the nice: Slurm floors a priority at 1, and two floored jobs go in submit order);
- the heavy user's in queue 1, the light user's in queue 0: the light user's;
- the light user's in queue 1 (its job has attained more), the heavy user's in queue 0:
  the heavy user's -- the only way a heavy user passes a light one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from slurmgpu.lab.cluster import LabCluster, site
from slurmgpu.policy.settings import AttainedServiceSettings
from tests.polling import wait_for
from tests.slurm.site_users import (
    as_user,
    cancel_all,
    job_fields,
    sbatch_as,
    shared_dir,
    user_env,
    user_python,
)

pytestmark = [pytest.mark.slow, pytest.mark.release]

HEAVY = "sgpu-u1"  # physics
LIGHT = "sgpu-u4"  # biology
BLOCKER = "sgpu-u7"  # chemistry
NODE = "gpu14"
NICE_STEP = AttainedServiceSettings().nice_step

_SET_NICE = (
    "import sys\n"
    "from slurmgpu.intent import SetNice\n"
    "from slurmgpu.slurm.cli import CliSlurmClient\n"
    "CliSlurmClient(timeout_s=20).update_job(int(sys.argv[1]), [SetNice(int(sys.argv[2]))])\n"
)


@dataclass(frozen=True)
class Factors:
    """One pending job's line of ``sprio`` (weighted values)."""

    priority: int
    fairshare: int
    nice: int


def sprio(*job_ids: int) -> dict[int, Factors]:
    proc = subprocess.run(
        # every pending job, filtered here: 24.11's sprio takes one id after -j, no list
        ["sprio", "-h", "-o", "%i %Y %F %N"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[int, Factors] = {}
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4:
            job, priority, fairshare, nice = (int(float(f)) for f in fields)
            if job in job_ids:
                out[job] = Factors(priority, fairshare, nice)
    return out


@pytest.fixture
def lab(site_cluster: LabCluster) -> Iterator[list[str]]:
    with shared_dir("sgpu-site-las-") as work:
        python = user_python(site_cluster, work)
        try:
            yield python
        finally:
            cancel_all()


def _pending_on(user: str) -> int:
    return sbatch_as(user, "-w", NODE, "--gres=gpu:4", "-t", "5", "--wrap", "sleep 600")


def _set_nice(python: list[str], job: int, nice: int) -> None:
    proc = as_user(site.DAEMON_USER, *python, "-c", _SET_NICE, str(job), str(nice), env=user_env())
    assert proc.returncode == 0, f"Nice={nice} on {job} as {site.DAEMON_USER}: {proc.stderr}"


def _started(heavy: int, light: int) -> int | None:
    running = [j for j in (heavy, light) if job_fields(j).get("JobState") == "RUNNING"]
    return running[0] if running else None


def _burn_heavy_users_share() -> None:
    """Usage for HEAVY's account: 8 whole nodes for a few seconds (normal QOS)."""
    job = sbatch_as(HEAVY, "-N", "8", "--exclusive", "-t", "2", "--wrap", "sleep 8")
    wait_for(
        "the heavy user's big job to end",
        lambda: job_fields(job).get("JobState") in (None, "COMPLETED"),
        timeout_s=120,
    )


@pytest.mark.parametrize(
    ("heavy_queue", "light_queue", "first"),
    [(0, 0, LIGHT), (1, 0, LIGHT), (1, 1, LIGHT), (0, 1, HEAVY)],
    ids=["same-queue-0", "heavy-worse-queue", "same-queue-1", "light-worse-queue"],
)
def test_las_decides_between_queues_and_fair_share_inside_one(
    lab: list[str], heavy_queue: int, light_queue: int, first: str
) -> None:
    python = lab
    blocker = sbatch_as(BLOCKER, "-w", NODE, "--gres=gpu:4", "-t", "5", "--wrap", "sleep 600")
    wait_for("the blocker running", lambda: job_fields(blocker).get("JobState") == "RUNNING")
    heavy = _pending_on(HEAVY)  # submitted first: age and job id favour it
    light = _pending_on(LIGHT)

    def fair_share_apart() -> dict[int, Factors] | None:
        f = sprio(heavy, light)
        return f if len(f) == 2 and f[heavy].fairshare < f[light].fairshare else None

    wait_for("both jobs in sprio", lambda: len(sprio(heavy, light)) == 2)
    # Slurm recomputes fair share every PriorityCalcPeriod (1 min in the profile).
    if not fair_share_apart():
        _burn_heavy_users_share()
        wait_for("the heavy user's fair share below the light one's", fair_share_apart, 200)

    nices = {heavy: heavy_queue * NICE_STEP, light: light_queue * NICE_STEP}
    for job, nice in nices.items():
        _set_nice(python, job, nice)

    def niced() -> dict[int, Factors] | None:
        f = sprio(heavy, light)
        return f if {j: x.nice for j, x in f.items()} == nices else None

    factors = wait_for("sprio to show the queues' nice", niced)
    assert factors[heavy].fairshare < factors[light].fairshare, factors
    expect, other = (heavy, light) if first == HEAVY else (light, heavy)
    assert factors[expect].priority > factors[other].priority, factors
    assert factors[other].priority > 1, f"a priority floored at 1 loses fair share: {factors}"

    subprocess.run(["scancel", str(blocker)], capture_output=True, timeout=30, check=True)
    started = wait_for("one of the two to start", lambda: _started(heavy, light), timeout_s=60)
    assert started == expect, (
        f"{'heavy' if started == heavy else 'light'} user's job started first: {factors}"
    )
    assert job_fields(other).get("JobState") == "PENDING"

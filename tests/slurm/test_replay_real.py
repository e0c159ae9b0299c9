"""A small Pollux trace slice replayed through a real site lab under the daemon (issue 33
item 5): the CI-sized version of bench/replay_real.py.

A 4-node lab with the site profile (slurmdbd + MariaDB, 3 accounts, 8 Unix users,
fairshare, QOS preemption; 16 fake GPUs: the profile's 16 nodes and 16 node agents are
more than this tier's shared 2-core machines run in a few minutes), the daemon with the
``malleable`` set enforcing (pacing compressed with the trace), and the first jobs of
Pollux workload 1 compressed 60x, each submitted at its time as its trace user with
``sgpu submit --malleable`` and running the stand-in slurmgpu.lab.replayload on
slurmgpu.elastic. The bound is loose and honest: every job submitted and completed
(none lost, none cut off by the replay's own deadline), each one's stand-in did all its
work, no job ran faster than its profile allows on its largest size, every resize the
daemon began is closed, the figures are recorded, and no process logged a traceback.

On a Slurm chroot (``SGPU_TEST_SLURM_ROOT``: 24.11, 26.05) the users' commands and jobs
run inside the chroot with a copy of the system Python (tests/slurm/site_users.py), as
the bench does. The simulator then runs the same jobs (sim.replayplan: the stand-in's
costs and the lab's fair share, times the compression) and its average JCT must be
within a loose factor of the replay's: a check that the two have not drifted apart, not
the fidelity table (bench/replay_real.py, docs/simulator.md).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slurmgpu.cycle.resize import CLOSED
from slurmgpu.lab.cluster import LabCluster, LabClusterError, ensure_packages, site
from slurmgpu.lab.replay import (
    ReplayLabError,
    first_calculation_s,
    replay_on_lab,
    site_python,
    toml_text,
)
from slurmgpu.sim import metrics
from slurmgpu.sim.costs import cost_set
from slurmgpu.sim.fairshare import FairShareConfig, parse_fairshare
from slurmgpu.sim.loaders import load_pollux
from slurmgpu.sim.profiles import load_profiles
from slurmgpu.sim.replayplan import (
    ReplayJob,
    outcomes,
    plan_replay,
    policy_sections,
    render,
    replay_options,
    replayed_trace,
    summarise,
)
from slurmgpu.sim.run import ClusterShape, simulate
from slurmgpu.sim.workload import TraceJob, elastic_batch
from tests.slurm.site_users import chroot_argv, chroot_user_env, user_python
from tests.tier_guard import skip_missing

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "pollux"
TRACE = DATA / "workloads" / "workload-1.csv"
COMPRESSION = 60.0
FIRST = 30  # of the trace; the jobs over MAX_RUN_S at their size are left out
MAX_RUN_S = 120.0
REPLAY_TIMEOUT_S = 480.0
# simulator / real average JCT: a loose bound (per-run noise is ~15 %; the bench's
# table holds the simulator to +-10 % on a 63-job slice)
SIM_RATIO = (0.6, 1.5)

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_OFFSET = 10 * int(_WORKER[2:]) if _WORKER[2:].isdigit() else 0
CTLD_PORT = int(os.environ.get("SGPU_TEST_REPLAY_CTLD_PORT", "7120")) + _OFFSET
SLURMD_PORT_BASE = int(os.environ.get("SGPU_TEST_REPLAY_SLURMD_PORT_BASE", "17620")) + _OFFSET


@pytest.fixture(scope="module")
def replay_lab(request: pytest.FixtureRequest) -> Iterator[LabCluster]:
    if os.geteuid() != 0:
        skip_missing("slurm", "the site lab needs root (it starts slurmd and adds Unix users)")
    if not TRACE.is_file():
        skip_missing("slurm", f"no Pollux trace at {TRACE} (shared/data, ATTRIBUTION.md)")
    slurm_root = os.environ.get("SGPU_TEST_SLURM_ROOT") or None
    try:
        if slurm_root is None:
            ensure_packages()
    except LabClusterError as exc:
        skip_missing("slurm", f"Slurm packages are missing and cannot be installed: {exc}")
    root = Path(tempfile.mkdtemp(prefix="sgpu-replay-", dir="/tmp"))
    root.chmod(0o755)
    lab = LabCluster(
        root,
        nodes=4,
        ctld_port=CTLD_PORT,
        slurmd_port_base=SLURMD_PORT_BASE,
        slurm_root=slurm_root,
        profile="site",
    )
    try:
        elapsed = lab.up(timeout_s=180.0)
        print(f"\nreplay lab: 4 site nodes idle after {elapsed:.1f} s", file=sys.stderr)
        lab.share(ROOT, Path(sys.prefix), Path(sys.base_prefix))
        yield lab
    finally:
        lab.down(cancel_jobs=True)
        if request.session.testsfailed or os.environ.get("SGPU_KEEP_LAB"):
            print(f"\nreplay lab: kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def runuser(user: str) -> list[str]:
    """How this test becomes a site user (root dropping to them; slurmgpu never does)."""
    return ["runuser", "-u", user, "--"]


def planned(policy_set: str) -> tuple[list[TraceJob], list[ReplayJob]]:
    trace = load_pollux(TRACE.read_text(), str(TRACE), load_profiles(DATA / "profiles"))
    if policy_set == "malleable":
        trace = elastic_batch(trace)  # as the simulator runs the set
    return trace, plan_replay(
        trace,
        compression=COMPRESSION,
        users=[u.name for u in site.USERS],
        first=FIRST,
        max_run_s=MAX_RUN_S,
    )


# ``release``: scripts/test.sh runs it on 26.05 (sid's chroot) in its release stage, and
# on 22.05 in the slurm tier. Earlier, with the jobs as root in the chroot, one run of four
# on 26.05 failed (24 of 29 jobs FAILED seconds after submission, cause not found); as the
# site users it passed on 26.05 (2026-12-07, 190 s); the fixture keeps a failed lab.
@pytest.mark.release
def test_a_small_pollux_replay_through_the_site_lab_finishes_every_job(
    replay_lab: LabCluster,
) -> None:
    lab = replay_lab
    chroot = os.environ.get("SGPU_TEST_SLURM_ROOT") or None
    work = lab.root / "replay-malleable"  # inside the lab root: seen in a chroot too
    extra_env: dict[str, str] = {}
    if chroot is None:
        try:
            python = site_python()
        except ReplayLabError as exc:
            pytest.skip(f"the site users cannot run slurmgpu: {exc}")
        as_user = runuser
    else:
        shared = lab.root / "users-python"
        shared.mkdir()
        python = user_python(lab, shared)  # skips, saying why, where it cannot
        extra_env = chroot_user_env()
        as_user = chroot_argv
    trace, jobs = planned("malleable")
    assert 20 <= len(jobs) <= 40, len(jobs)
    observed = replay_on_lab(
        jobs,
        work=work,
        nodes=lab.node_names,
        gres_conf=lab.etc_dir / "gres.conf",
        lab_env=lab.env(),
        policy_toml=toml_text(policy_sections("malleable", COMPRESSION)),
        python=python,
        checkout=ROOT,
        timeout_s=REPLAY_TIMEOUT_S,
        bin_dir=lab.bin_dir,
        as_user=as_user,
        user_env_extra=extra_env,
        progress=lambda line: print(f"replay: {line}", file=sys.stderr),
    )
    rows = outcomes(observed)
    summary = summarise(rows)
    print("\n" + render(rows, summary), file=sys.stderr)

    # every job submitted, as its user, and completed: none lost, none cut off
    assert [o.state for o in rows] == ["COMPLETED"] * len(jobs), render(rows, summary)
    assert summary.finished == len(jobs)
    for job, o in zip(jobs, rows, strict=True):
        assert o.job_id is not None and o.submitted_s is not None
        assert o.started_s is not None and o.ended_s is not None
        # Slurm keeps whole seconds: a job that starts within the second it was
        # submitted in shows a start up to 1 s before its (sub-second) submission
        assert o.submitted_s <= o.started_s + 1.0 and o.started_s <= o.ended_s
        log = [
            json.loads(line) for line in (work / f"job-{job.index}.jsonl").read_text().splitlines()
        ]
        done = [r for r in log if r.get("event") == "done"]
        assert len(done) == 1 and done[0]["done"] == pytest.approx(job.work), log
        starts = [r for r in log if r.get("event") == "start"]
        assert len(starts) == o.restarts + 1, (log, o)
        # no faster than its profile on its largest size (less one step's rounding)
        fastest = job.work / max(job.rates)
        assert o.jct_s is not None and o.jct_s >= fastest - 0.5, (job, o)
        # GPU time integrates Slurm's start and end, whole seconds each: up to 2 s a GPU
        # over the JCT the replay's clock saw (a 4-GPU run: 347.4 GPU-s in an 85.5 s JCT)
        assert 0 < o.gpu_hours * 3600 <= (o.jct_s + 2.0) * job.max_gpus, (job, o)
    # every resize the daemon began is closed, and each done one has its phases
    for seen in observed:
        for tx in seen.transactions:
            assert tx.state in CLOSED, (seen.job_id, tx)
            if tx.state == "running":
                assert tx.phases.get("total", 0) > 0, tx
    for name in ("daemon.log", *(f"agent-{n}.log" for n in lab.node_names)):
        assert "Traceback" not in (work / name).read_text(), name
    assert summary.avg_jct_s > 0 and summary.makespan_s >= summary.p99_jct_s > 0
    # every job as its site user
    assert [o.user for o in rows] == [j.user for j in jobs]

    # the simulator on the same jobs, with the stand-in's costs and the lab's fair share
    replayed = replayed_trace(trace, jobs, COMPRESSION)
    fairshare = lab_fairshare()
    ctld_log = (lab.root / "log" / "slurmctld.log").read_text(errors="replace")
    first = first_calculation_s(ctld_log, fairshare.calc_period_s)
    if first is not None:  # the lab's fair-share calculations, in trace time
        t0 = min(j.submit_s for j in replayed)
        fairshare = replace(fairshare, first_calc_s=t0 + first * COMPRESSION)
    options = replay_options(cost_set("replay-stand-in"), COMPRESSION, fairshare)
    run = simulate(replayed, ClusterShape(4, 4), "malleable", options)
    sim_avg = metrics.summarise(run).avg_jct_s / COMPRESSION
    ratio = sim_avg / summary.avg_jct_s
    print(
        f"simulator / real avg JCT: {sim_avg:.1f} / {summary.avg_jct_s:.1f} s = {ratio:.2f}",
        file=sys.stderr,
    )
    assert SIM_RATIO[0] <= ratio <= SIM_RATIO[1], (sim_avg, summary.avg_jct_s)


def lab_fairshare() -> FairShareConfig:
    """The site lab's priority, as bench/replay_real.py gives it to the simulator."""
    return parse_fairshare(site.fairshare_toml(), "the site lab")

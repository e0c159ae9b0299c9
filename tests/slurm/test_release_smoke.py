"""The smoke set run on every Slurm release in CI (marker ``release``).

On the host's Slurm (Debian 12: 22.05) with the rest of tests/slurm, and on the Slurm of
a Debian chroot (``SGPU_TEST_SLURM_ROOT``: trixie's 24.11, sid's 26.05; scripts/test.sh
runs ``pytest -m release`` once per chroot). ``SGPU_TEST_SLURM_RELEASE`` (``24.11``)
makes the first test check that the daemons really are that release.

Each test drives real daemons through slurmgpu's own Slurm client:

- submit and observe: a job's request, allocation and its node's usage;
- shards and whole GPUs on one node: per-node and per-job usage right, and the same
  through every data_parser version this Slurm has (26.05 prints ``-/4`` there);
- rightsize update: the intents the rightsize policy proposes (``SetGpus``,
  ``SetTimeLimit``) rendered by ``slurmgpu.slurm.update`` in this release's spelling
  (``TresPerNode=gres:gpu:1`` on 22.05, ``gres/gpu:1`` later) and applied to a held job,
  which then runs at that size; ``actuate.confirm`` reads them back off the listing;
- malleable resize (signal, ack, requeue-hold, update, release) by the daemon's own
  MalleableActuator (tests/slurm/resize_driver.py) with a job named in invalid UTF-8
  present all along: the listing is still read and the resize completes (issue 22);
- accounting path: ``sacct`` through ``finished_jobs``: with slurmdbd + MariaDB
  (``SGPU_TEST_SLURM_ACCOUNTING=1``, chroot labs) a completed and a failed job with their
  exit codes, GPUs and shards, also through a data_parser the release lacks (sacct exits
  0 with nothing); without (the host's lab) Slurm says accounting is disabled, which must
  read as "nothing known", not as an error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from slurmgpu.actuate.confirm import check
from slurmgpu.intent import SetGpus, SetTimeLimit
from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import Job, JobState
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.jsonformat import KNOWN_DATA_PARSERS, data_parser_version
from tests.polling import wait_for
from tests.slurm.harness import listed_job, running_job

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the smoke set's mixed plan on the 4-node lab's gpu1-gpu4, every release"

pytestmark = pytest.mark.release

ROOT = Path(__file__).resolve().parents[2]
BAD_NAME = os.fsdecode(b"bad\xff\xfename")  # raw bytes in argv; any user can do this


def _drain(client: CliSlurmClient) -> None:
    subprocess.run(["scancel", "--user", "root"], check=False, timeout=30)
    wait_for(
        "the cluster to drain",
        lambda: not [j for j in client.jobs() if not j.state.is_terminal],
        timeout_s=60,
    )


@pytest.fixture
def slurm(slurm_cluster: LabCluster) -> Iterator[CliSlurmClient]:
    """The client, on an empty cluster (per-node counts are asserted exactly)."""
    client = CliSlurmClient(timeout_s=20)  # PATH has the chroot's wrappers first, if any
    _drain(client)
    try:
        yield client
    finally:
        _drain(client)


def _sbatch(slurm: CliSlurmClient, *args: str) -> int:
    return slurm.submit(["-o", "/dev/null", *args])


def _v22(slurm: CliSlurmClient) -> bool:
    return slurm.version().startswith("22.")


def _data_parsers() -> list[str | None]:
    """The data_parser versions this Slurm has (``squeue --json=list``); 22.05 has one
    and no ``--json=`` argument: ``[None]``, its plain ``--json``."""
    proc = subprocess.run(
        ["squeue", "--json=list"], capture_output=True, text=True, timeout=20, check=False
    )
    found: list[str | None] = sorted(set(re.findall(r"v0\.0\.\d+", proc.stdout + proc.stderr)))
    return found or [None]


def test_submit_and_observe(slurm: CliSlurmClient) -> None:
    release = os.environ.get("SGPU_TEST_SLURM_RELEASE")
    version = slurm.version()
    if release:
        assert version.startswith(release + "."), f"daemons are {version}, not {release}"
    listing = subprocess.run(["squeue", "--json"], capture_output=True, timeout=20, check=True)
    assert data_parser_version(listing.stdout) in KNOWN_DATA_PARSERS

    job_id = _sbatch(slurm, "--gres=gpu:1", "-w", "gpu3", "-t", "10", "--wrap", "sleep 300")
    job = wait_for("the job running", lambda: running_job(job_id, slurm=slurm))
    assert job.gpus.gpus == 1 and job.gpus.per_node == 1
    assert job.time_limit == timedelta(minutes=10)
    assert [(a.node, len(a.gpu_indices)) for a in job.gpu_allocations] == [("gpu3", 1)]
    gpu3 = next(n for n in slurm.nodes() if n.name == "gpu3")
    assert (gpu3.gpus, gpu3.gpus_used, gpu3.shards) == (4, 1, 16)
    # 22.05's sinfo prints "gpu:1" with no IDX; later releases name the GPU
    assert gpu3.gpu_indices_used == (() if _v22(slurm) else job.gpu_allocations[0].gpu_indices)


def test_shards_and_whole_gpus_on_one_node(slurm: CliSlurmClient) -> None:
    whole = _sbatch(slurm, "--gres=gpu:2", "-w", "gpu1", "--wrap", "sleep 300")
    two = _sbatch(slurm, "--gres=shard:2", "-w", "gpu1", "--wrap", "sleep 300")
    three = _sbatch(slurm, "--gres=shard:3", "-w", "gpu1", "--wrap", "sleep 300")
    wait_for(
        "all three running", lambda: all(running_job(j, slurm=slurm) for j in (whole, two, three))
    )

    for parser in _data_parsers():
        client = CliSlurmClient(timeout_s=20, data_parser=parser)
        jobs = {j.job_id: j for j in client.jobs()}
        node = next(n for n in client.nodes() if n.name == "gpu1")
        assert client.data_parser == parser, f"{parser} was not used"
        where = f"data_parser {parser or 'default'}"
        assert (node.gpus, node.shards) == (4, 16), where
        assert node.gpus_used == 2, where  # 26.05: "gpu:2(IDX:0-1),shard:5(-/4,-/4,2/4,3/4)"
        (a_whole,) = jobs[whole].gpu_allocations
        (a_two,) = jobs[two].gpu_allocations
        (a_three,) = jobs[three].gpu_allocations
        assert len(a_whole.gpu_indices) == 2, where
        assert node.gpu_indices_used == (() if _v22(slurm) else a_whole.gpu_indices), where
        assert (a_two.shards, a_three.shards) == (2, 3), where
        assert (jobs[two].gpus.shards, jobs[three].gpus.shards) == (2, 3), where
        # the shards sit on GPUs the whole-GPU job does not hold
        shard_gpus = set(a_two.shard_indices) | set(a_three.shard_indices)
        assert shard_gpus and not shard_gpus & set(a_whole.gpu_indices), where
        if _v22(slurm):
            # 22.05 prints "shard:(null):2(IDX:2-3)" for 2 + 3 shards: the GPUs that hold
            # shards, not the shards (a known 22.05 limit, docs/slurm.md)
            assert node.shards_used == len(shard_gpus) == 2, where
        else:
            assert node.shards_used == 5, where


def test_rightsize_update_applies_in_this_release(slurm: CliSlurmClient) -> None:
    version = slurm.version()
    job_id = _sbatch(slurm, "-H", "--gres=gpu:2", "-t", "60", "--wrap", "sleep 300")
    held = wait_for("the held job listed", lambda: listed_job(job_id, slurm))
    assert held.priority == 0, held  # this release's squeue priority, read (0: held)
    intents = (SetGpus(1), SetTimeLimit(30 * 60))  # what the rightsize policy proposes
    assert version  # update_job spells the intents for this release
    slurm.update_job(job_id, intents)
    job = listed_job(job_id, slurm)
    assert job is not None and job.gpus.gpus == 1, job
    assert job.time_limit == timedelta(minutes=30)
    # and confirm reads each intent back off this release's listing
    assert [check(i, job) for i in intents] == [
        ("TresPerNode", True, "TresPerNode gpu 1"),
        ("TimeLimit", True, "TimeLimit 00:30:00"),
    ]
    slurm.release(job_id)
    ran = wait_for("the job running at 1 GPU", lambda: running_job(job_id, 1, slurm))
    assert ran.gpus.gpus == 1
    assert ran.priority is not None and ran.priority > 0, ran  # released: ranked again


# A malleable job in plain sh: on the checkpoint signal it writes the acknowledgement
# the resize waits for (slurmgpu.elastic's ack.json) and runs on until requeued.
ACKING_JOB = r"""
acks=0
ack() {
  acks=$((acks + 1))
  d="$STATE/$SLURM_JOB_ID"; mkdir -p "$d"
  printf '{"version": 1, "job_id": %s, "acks": %s, "restart_count": %s, "step": 1, "at": %s}' \
    "$SLURM_JOB_ID" "$((acks + ${SLURM_RESTART_COUNT:-0} * 100))" \
    "${SLURM_RESTART_COUNT:-0}" "$(date +%s)" > "$d/ack.tmp"
  mv "$d/ack.tmp" "$d/ack.json"
}
trap ack USR2
while true; do sleep 1; done
"""


def test_malleable_resize_completes_beside_an_invalid_utf8_job_name(
    slurm: CliSlurmClient, slurm_cluster: LabCluster
) -> None:
    tmp = slurm_cluster.root / "smoke-malleable"  # inside the lab root: seen in a chroot too
    state = tmp / "state"
    state.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{tmp / 'state.db'}"
    config = tmp / "config.toml"
    config.write_text('[slurm]\ncommand_timeout = "20s"\n')
    env = {**os.environ, "SGPU_DB": db, "SGPU_CONFIG": str(config), "PYTHONPATH": str(ROOT)}

    def sgpu(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "slurmgpu", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, f"sgpu {' '.join(args)}: {proc.stderr.strip()}"
        return proc.stdout

    sgpu("db", "upgrade")
    bad = _sbatch(slurm, "-J", BAD_NAME, "--gres=gpu:1", "-w", "gpu4", "--wrap", "sleep 300")
    (tmp / "job.sh").write_text(f"#!/bin/sh\nSTATE={state}\n{ACKING_JOB}")
    out = sgpu(
        "submit", "--parsable", "-o", "/dev/null", "--malleable", "1:2",
        "--checkpoint-grace", "30s", "--elastic-dir", str(state),
        "--gres=gpu:2", "-w", "gpu2", "-J", "elastic", str(tmp / "job.sh"),
    )  # fmt: skip
    job_id = int(out.strip().split(";")[0])
    wait_for("the malleable job at 2 GPUs", lambda: running_job(job_id, 2, slurm))
    odd = listed_job(bad, slurm)
    assert odd is not None and odd.name == "bad\ufffd\ufffdname"  # listed, not dropped

    proc = subprocess.run(
        [sys.executable, "-m", "tests.slurm.resize_driver", "--db", db, "--start",
         f"{job_id}:2:1"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "nothing in flight" in said, said
    resized = wait_for("the malleable job at 1 GPU", lambda: running_job(job_id, 1, slurm))
    assert resized.restart_count == 1
    assert resized.gpus.gpus == 1
    assert running_job(bad, 1, slurm) is not None  # the other job untouched


def test_accounting_path(slurm: CliSlurmClient) -> None:
    ok = _sbatch(slurm, "--gres=gpu:1", "--wrap", "true")
    failed = _sbatch(slurm, "--gres=shard:2", "--wrap", "exit 3")

    def over(job_id: int) -> bool:
        job = listed_job(job_id, slurm)
        return job is not None and job.state.is_terminal

    wait_for("both jobs over", lambda: over(ok) and over(failed))
    proc = subprocess.run(
        ["sacct", "--json", "-X", "-j", str(ok)],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if "accounting storage is disabled" in proc.stderr.lower():
        # a lab without slurmdbd (the host's 22.05): nothing known, not an error
        assert slurm.finished_jobs([ok, failed]) == []
        return
    # slurmdbd + MariaDB (chroot labs): what accounting knows, through the default
    # data_parser and through one this release lacks (sacct then exits 0 and prints
    # nothing: the client must fall back, not read "no jobs")
    for parser in (None, "v0.0.39"):
        client = CliSlurmClient(timeout_s=20, data_parser=parser)

        def known(c: CliSlurmClient = client) -> list[Job] | None:
            got = c.finished_jobs([ok, failed])
            return got if len(got) == 2 else None

        done = wait_for("accounting to know both jobs", known)
        by_id = {j.job_id: j for j in done}
        assert (by_id[ok].state, by_id[ok].exit_code) == (JobState.COMPLETED, 0)
        assert (by_id[failed].state, by_id[failed].exit_code) == (JobState.FAILED, 3)
        assert (by_id[ok].gpus.gpus, by_id[failed].gpus.shards) == (1, 2)
        assert client.data_parser is None

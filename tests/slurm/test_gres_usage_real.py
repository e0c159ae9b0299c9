"""Node usage that holds when Slurm's does not (issue 32 item 4), on real daemons.

Two whole-GPU jobs and two shard:3 jobs run on gpu1; slurmctld is restarted under that
load. Slurm then forgets the running jobs' shards in the node's ``gres_used`` (22.05:
``shard:(null):…(IDX:…)`` loses a GPU; 24.11/26.05: ``0/4``) and starts a new shard:2 job
on a GPU whose shards are taken: 5 of its 4 shards. The daemon must keep the jobs'
allocations' figure, count the disagreement and the over-full GPU in ``/metrics`` and
warn once per node and cause.
"""

from __future__ import annotations

import logging
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurmgpu.config import Settings
from slurmgpu.daemon.app import Daemon
from slurmgpu.daemon.lease import DaemonLease
from slurmgpu.lab.cluster import LabCluster
from slurmgpu.model import Job, JobState, Node
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.store import open_store
from tests.polling import wait_for

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "restarts slurmctld under load: the site lab is the session's, shared"

# on every release: scripts/test.sh runs it in each release stage too
pytestmark = [pytest.mark.slurm, pytest.mark.release]


def _sbatch(*args: str) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", "-w", "gpu1", "-o", "/dev/null", *args, "--wrap", "sleep 600"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return int(out.strip().split(";")[0])


def _running(client: CliSlurmClient, ids: list[int]) -> dict[int, Job] | None:
    jobs = {j.job_id: j for j in client.jobs() if j.job_id in ids}
    ok = len(jobs) == len(ids) and all(
        j.state is JobState.RUNNING and j.gpu_allocations for j in jobs.values()
    )
    return jobs if ok else None


def _registered(client: CliSlurmClient) -> bool:
    gpu1 = next((n for n in client.nodes() if n.name == "gpu1"), None)
    return gpu1 is not None and gpu1.available and gpu1.shards == 16


def _scrape(app: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(app.metrics.exposition().decode())
        for s in fam.samples
    }


def _gpu1(app: Daemon) -> Node:
    snap = app.observer.latest
    assert snap is not None
    return next(n for n in snap.nodes if n.name == "gpu1")


def test_a_slurmctld_restart_under_shard_load_keeps_the_allocations_figure(
    slurm_cluster: LabCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = CliSlurmClient()
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    lease = DaemonLease(store.engine, ttl=timedelta(seconds=120))
    lease.acquire()
    app = Daemon(
        Settings().with_database(url), store, client, lease, poll=timedelta(seconds=1),
        policies=False,
    )  # fmt: skip
    caplog.set_level(logging.INFO, logger="slurmgpu.daemon")
    ids = [_sbatch("--gres=gpu:1"), _sbatch("--gres=gpu:1")]
    ids += [_sbatch("--gres=shard:3"), _sbatch("--gres=shard:3")]
    try:
        wait_for("the mixed load to run on gpu1", lambda: _running(client, ids), timeout_s=60)
        for _ in range(3):
            assert app.run_once().ok
        before = _gpu1(app)
        assert (before.gpus_used, before.shards_used) == (2, 6)
        assert app.observer.gres.open_by_kind() == {"gpus": 0, "shards": 0, "shard_overcommit": 0}

        slurm_cluster.stop_ctld()
        slurm_cluster.start_ctld()
        wait_for("gpu1 to register its shards again", lambda: _registered(client), timeout_s=60)
        ids.append(_sbatch("--gres=shard:2"))
        jobs = wait_for("the new shard job to run", lambda: _running(client, ids), timeout_s=60)
        (new_gpu,) = jobs[ids[-1]].gpu_allocations[0].shard_indices

        def flagged() -> bool:
            assert app.run_once().ok
            return app.observer.gres.open_by_kind()["shards"] >= 1

        wait_for("the daemon to flag the forgotten shards", flagged, timeout_s=60)
        for _ in range(3):
            assert app.run_once().ok
        after = _gpu1(app)
        # What the running jobs hold: 2 whole GPUs, 3 + 3 + 2 shards on GPUs 2 and 3.
        assert (after.gpus_used, after.gpu_indices_used) == (2, (0, 1))
        assert (after.shards_used, after.shard_gpus_used) == (8, (2, 3))
        m = _scrape(app)
        assert m[("sgpu_node_gres_disagreements_total", (("kind", "shards"),))] >= 1
        assert m[("sgpu_node_gres_disagreeing", (("kind", "shards"),))] == 1
        part = _gpu1(app).partitions[0]
        assert m[("sgpu_shards_allocated", (("partition", part),))] >= 8
        assert m[("sgpu_gpus_allocated", (("partition", part),))] >= 4
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        shard_lines = [w for w in warnings if "gpu1" in w and "shard usage" in w]
        assert len(shard_lines) == 1, warnings
        if new_gpu in (2, 3):  # a GPU with 3 of its 4 shards taken: Slurm over-filled it
            assert m[("sgpu_node_gres_disagreements_total", (("kind", "shard_overcommit"),))] == 1
            assert any(f"GPU {new_gpu} holds more shards than it has" in w for w in warnings)
    finally:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True, timeout=60, check=False)
        lease.release()
        store.engine.dispose()

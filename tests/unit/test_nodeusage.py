"""A node's usage from its running jobs' allocations, checked against Slurm's gres_used
(issue 32 item 4): Slurm forgets running shard jobs' shards across a slurmctld restart.

The "after restart" strings are what the lab's real daemons printed: 22.05 (host)
``gpu:2,shard:(null):1(IDX:2)`` once a new shard:2 job started on GPU 2 beside a running
shard:3 one (GPU 3's shard:3 job forgotten); 26.05 ``shard:0(-/4,-/4,0/4,0/4)`` with
three shard jobs still running.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurmgpu.daemon.gres_watch import GresUsageWatch
from slurmgpu.daemon.metrics import DaemonMetrics
from slurmgpu.daemon.observer import Observer
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.nodeusage import UsageFinding, reconcile
from slurmgpu.slurm.jsonformat import decode_sinfo, decode_squeue
from slurmgpu.store import JobStore, open_store
from tests.fakes import FakeSlurm

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _job(job_id: int, *, gpus: tuple[int, ...] = (), shard_gpu: int | None = None, shards: int = 0,
         state: JobState = JobState.RUNNING, flags: frozenset[str] = frozenset(),
         node: str = "gpu1") -> Job:  # fmt: skip
    alloc = NodeGpuAllocation(
        node,
        gpu_indices=gpus,
        shard_indices=() if shard_gpu is None else (shard_gpu,),
        shards=shards,
    )
    return Job(
        job_id=job_id,
        name="j",
        user="alice",
        state=state,
        state_flags=flags,
        nodes=(node,),
        node_count=1,
        gpus=GpuRequest(gpus=len(gpus), shards=shards),
        gpu_allocations=(alloc,),
        start_time=datetime.now(UTC) - timedelta(minutes=3),
    )


def _node(used: str) -> Node:
    doc = json.loads((GOLDEN / "slurm-26.05" / "mixed_sinfo.json").read_text())
    (rec,) = [r for r in doc["sinfo"] if r["nodes"]["nodes"] == ["gpu1"]][:1]
    rec["gres"]["used"] = used
    doc["sinfo"] = [rec]
    (node,) = decode_sinfo(json.dumps(doc))
    return node


LOAD = [
    _job(1, gpus=(0,)),
    _job(2, gpus=(1,)),
    _job(3, shard_gpu=2, shards=3),
    _job(4, shard_gpu=3, shards=3),
]


@pytest.mark.parametrize("release", ["slurm-22.05", "slurm-24.11", "slurm-26.05"])
def test_the_golden_captures_agree_and_keep_their_figures(release: str) -> None:
    jobs, _ = decode_squeue((GOLDEN / release / "mixed_squeue.json").read_bytes())
    nodes = decode_sinfo((GOLDEN / release / "mixed_sinfo.json").read_bytes())
    fixed, findings = reconcile(nodes, jobs)
    assert findings == []
    gpu1 = next(n for n in fixed if n.name == "gpu1")
    assert (gpu1.gpus_used, gpu1.gpu_indices_used) == (2, (0, 1))
    # 22.05's gres_used counts the GPUs holding shards (2); the jobs hold 5 shards.
    assert (gpu1.shards_used, gpu1.shard_gpus_used) == (5, (2, 3))
    assert gpu1.shards_used_by_gpu == ((2, 2), (3, 3))


def test_26_05_after_a_restart_keeps_the_allocations_figure() -> None:
    node = _node("gpu:2(IDX:0-1),shard:0(-/4,-/4,0/4,0/4)")
    assert node.shards_used == 0  # what Slurm says, and sgpu stored before
    (fixed,), findings = reconcile([node], LOAD)
    assert (fixed.shards_used, fixed.shard_gpus_used) == (6, (2, 3))
    assert fixed.gpu_indices_used == (0, 1)
    assert [(f.node, f.kind) for f in findings] == [("gpu1", "shards")]


def test_22_05_after_a_restart_flags_the_forgotten_shards_and_the_overfull_gpu() -> None:
    # 22.05 sinfo as printed then: GPU 2 holds shard:3 + the new shard:2, GPU 3 forgotten.
    node = replace(
        _node("gpu:2(IDX:0-1)"),
        gpu_indices_used=(),
        shards_used=1,
        shard_gpus_used=(2,),
        shards_used_by_gpu=(),
    )
    jobs = [*LOAD, _job(5, shard_gpu=2, shards=2)]
    (fixed,), findings = reconcile([node], jobs)
    assert fixed.shards_used == 8
    assert fixed.shards_used_by_gpu == ((2, 5), (3, 3))
    assert {(f.kind, f.gpu) for f in findings} == {("shards", None), ("shard_overcommit", 2)}


def test_whole_gpus_slurm_forgot_are_flagged() -> None:
    node = _node("gpu:1(IDX:0),shard:6(-/4,0/4,3/4,3/4)")
    (fixed,), findings = reconcile([node], LOAD)
    assert fixed.gpu_indices_used == (0, 1)
    assert [f.kind for f in findings] == ["gpus"]


def test_a_node_whose_allocations_are_not_all_known_keeps_slurms_figure() -> None:
    node = _node("gpu:2(IDX:0-1),shard:6(-/4,-/4,3/4,3/4)")
    no_detail = replace(_job(9, gpus=(0,)), gpu_allocations=())
    completing = _job(8, shard_gpu=2, shards=1, flags=frozenset({"COMPLETING"}))
    for extra in (no_detail, completing):
        (kept,), findings = reconcile([node], [_job(1, gpus=(0,)), extra])
        assert kept is node and findings == []


def test_pending_and_finished_jobs_hold_nothing() -> None:
    node = _node("gpu:2(IDX:0-1),shard:6(-/4,-/4,3/4,3/4)")
    done = [replace(j, state=JobState.COMPLETED) for j in LOAD]
    (fixed,), findings = reconcile([node], done)
    assert (fixed.gpus_used, fixed.shards_used) == (0, 0)
    assert {f.kind for f in findings} == {"gpus", "shards"}


def test_the_watch_warns_once_per_node_and_cause_and_once_when_it_agrees(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = GresUsageWatch()
    lost = UsageFinding("gpu1", "shards", "0 shards", "6 shards")
    over = UsageFinding("gpu1", "shard_overcommit", "4", "5 shards", gpu=2)
    caplog.set_level(logging.INFO, logger="slurmgpu.daemon")
    watch.observe([lost])  # one listing: maybe a job started between squeue and sinfo
    assert watch.started["shards"] == 0 and not caplog.records
    for _ in range(5):
        watch.observe([lost, over])
    assert watch.started == {"gpus": 0, "shards": 1, "shard_overcommit": 1}
    assert watch.open_by_kind() == {"gpus": 0, "shards": 1, "shard_overcommit": 1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert any("GPU 2 holds more shards than it has" in w for w in warnings)
    caplog.clear()
    for _ in range(3):
        watch.observe([])
    infos = [r.getMessage() for r in caplog.records]
    assert len(infos) == 2 and all("again" in m for m in infos)
    assert watch.open_by_kind() == {"gpus": 0, "shards": 0, "shard_overcommit": 0}
    watch.observe([lost])
    watch.observe([lost])
    assert watch.started["shards"] == 2


def _scrape(metrics: DaemonMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(metrics.exposition().decode())
        for s in fam.samples
    }


def test_metrics_have_shard_series_and_count_gpus_holding_shards(store: JobStore) -> None:
    node = replace(_node("gpu:2(IDX:0-1),shard:0(-/4,-/4,0/4,0/4)"), partitions=("gpu",))
    observer = Observer(FakeSlurm([*LOAD, _job(5, shard_gpu=2, shards=2)], [node]), store)
    metrics = DaemonMetrics(store.engine, store.cluster, snapshot=lambda: observer.latest)
    assert observer.cycle().ok
    m = _scrape(metrics)
    part = (("partition", "gpu"),)
    assert m[("sgpu_gpus", part)] == 4
    assert m[("sgpu_gpus_allocated", part)] == 4  # 2 whole + 2 holding shards
    assert m[("sgpu_gpus_shared", part)] == 2
    assert m[("sgpu_shards", part)] == 16
    assert m[("sgpu_shards_allocated", part)] == 8  # Slurm said 0
    assert m[("sgpu_shards_used", part)] == 0  # no agent samples
    snap = observer.latest
    assert isinstance(snap, ClusterSnapshot)
    assert snap.nodes[0].shards_used == 8
    # The store keeps the allocations' figure too (a restarted daemon starts from it).
    assert store.known_nodes()["gpu1"].shards_used == 8


def test_the_daemon_exports_the_disagreements(tmp_path: Path) -> None:
    from slurmgpu.config import Settings
    from slurmgpu.daemon.app import Daemon as App
    from slurmgpu.daemon.lease import DaemonLease

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    lease = DaemonLease(store.engine, ttl=timedelta(seconds=60))
    lease.acquire()
    node = _node("gpu:2(IDX:0-1),shard:0(-/4,-/4,0/4,0/4)")
    jobs = [*LOAD, _job(5, shard_gpu=2, shards=2)]
    app = App(Settings().with_database(url), store, FakeSlurm(jobs, [node]), lease,
              poll=timedelta(seconds=30))  # fmt: skip
    for _ in range(3):
        app.run_once()
    m = _scrape(app.metrics)
    assert m[("sgpu_node_gres_disagreements_total", (("kind", "shards"),))] == 1
    assert m[("sgpu_node_gres_disagreements_total", (("kind", "shard_overcommit"),))] == 1
    assert m[("sgpu_node_gres_disagreements_total", (("kind", "gpus"),))] == 0
    assert m[("sgpu_node_gres_disagreeing", (("kind", "shards"),))] == 1

"""The daemon's /metrics over real HTTP, parsed with prometheus-client's own parser.

A real observer (on FakeSlurm, the SlurmClient protocol's fake) runs loop cycles, two of
them failing the way Slurm fails; agents' samples come in over the API with real HMAC
credentials; decisions and transactions are in the store. Every figure the scrape shows
is checked against what was set up.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert

from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.loop import DaemonLoop
from slurmgpu.daemon.metrics import DaemonMetrics, error_kind
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.daemon.observer import Observer
from slurmgpu.daemon.user_metrics import OTHER, user_families, user_gpus
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.slurm.client import SlurmParseError, SlurmUnavailableError
from slurmgpu.slurm.jsonformat import decode_sinfo, decode_squeue
from slurmgpu.store import open_store, schema
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, SampleBatch, encode, hmac_header, node_token
from tests.fakes import FakeSlurm
from tests.polling import wait_for
from tests.unit.policy_builders import pending_job

SECRET = b"m" * 64


def _job(job_id: int, node: str, gpus: tuple[int, ...]) -> Job:
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=JobState.RUNNING,
        cpus=4,
        node_count=1,
        nodes=(node,),
        gpu_allocations=(NodeGpuAllocation(node, gpus),),
        start_time=datetime.now(UTC) - timedelta(minutes=5),
    )


NODES = [
    Node(
        "gpu1",
        "mixed",
        gpus=4,
        gpus_used=2,
        gpu_indices_used=(0, 1),
        partitions=("gpu",),
        address="127.0.0.1",
    ),
    Node(
        "gpu2",
        "mixed",
        gpus=4,
        gpus_used=1,
        gpu_indices_used=(3,),
        partitions=("gpu", "debug"),
        address="127.0.0.1",
    ),
]


@dataclass
class Daemon:
    url: str
    slurm: FakeSlurm
    loop: DaemonLoop
    service: IngestService


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    slurm = FakeSlurm([_job(42, "gpu1", (0, 1)), _job(43, "gpu2", (3,))], NODES)
    observer = Observer(slurm, store)
    metrics = DaemonMetrics(store.engine, store.cluster, snapshot=lambda: observer.latest)
    loop = DaemonLoop(
        observer,
        interval=timedelta(seconds=1),
        max_backoff=timedelta(seconds=2),
        metrics=metrics,
    )
    directory = NodeDirectory(lambda: observer.latest)
    auth = Authenticator(site_secret=SECRET, allow_munge=False, node_addresses=directory.addresses)
    service = IngestService(UsageStore(store.engine), auth, directory, metrics=metrics.exposition)
    metrics.watch_ingest(lambda: (service.accepted, service.rejected))
    metrics.watch_agents(lambda: dict(service.last_seen))  # as daemon/app.py does
    server = ApiServer(service, "127.0.0.1", 0)
    server.export_metrics(metrics.registry)  # as cli/daemon.py does
    server.start()
    now = datetime.now(UTC)
    with store.engine.begin() as conn:
        conn.execute(
            insert(schema.actions),
            [
                {
                    "at": now,
                    "job_id": 42,
                    "policy": "idle_gpu",
                    "kind": "warn",
                    "mode": "advise",
                    "taken": False,
                    "outcome": "skipped",
                },
                {
                    "at": now,
                    "job_id": 43,
                    "policy": "idle_gpu",
                    "kind": "warn",
                    "mode": "advise",
                    "taken": False,
                    "outcome": "skipped",
                },
                {
                    "at": now,
                    "job_id": 42,
                    "policy": "rightsize",
                    "kind": "update",
                    "mode": "enforce",
                    "taken": True,
                    "outcome": "done",
                },
            ],
        )
        conn.execute(
            insert(schema.transactions),
            [
                {
                    "job_id": 42,
                    "kind": "resize",
                    "state": state,
                    "created_at": now,
                    "updated_at": now,
                }
                for state in ("running", "planned", "planned")
            ],
        )
    try:
        yield Daemon(f"http://127.0.0.1:{server.address[1]}", slurm, loop, service)
    finally:
        server.stop()
        store.engine.dispose()


def _post(d: Daemon, node: str, samples: list[GpuSampleIn]) -> int:
    body = encode(SampleBatch(node=node, gpu=samples))
    req = urllib.request.Request(d.url + "/v1/samples", data=body, method="POST")
    req.add_header("Authorization", hmac_header(node_token(SECRET, node), node, body))
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


def _scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(d.url + "/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _sample(uid: str, index: int, job_id: int, util: float) -> GpuSampleIn:
    return GpuSampleIn(
        sample_uid=uid,
        at=time.time(),
        gpu_index=index,
        job_id=job_id,
        util_pct=util,
        processes=1,
    )


def test_scrape_shows_gpus_cycles_errors_ingest_actions_and_transactions(d: Daemon) -> None:
    d.loop.run_once()
    d.loop.run_once()
    d.slurm.fail_with = SlurmUnavailableError("slurmctld not responding")
    d.loop.run_once()
    d.slurm.fail_with = SlurmParseError("squeue printed garbage")
    d.loop.run_once()
    d.slurm.fail_with = None
    assert _post(d, "gpu1", [_sample("a", 0, 42, 80.0), _sample("b", 1, 42, 0.0)]) == 200
    assert _post(d, "gpu2", [_sample("c", 3, 43, 50.0)]) == 200

    # The POSTs' replies reach the client a moment before their server threads leave the
    # connection count; scrape until only this scrape is being served.
    def served_alone() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        scraped = _scrape(d)
        return scraped if scraped[("sgpu_api_connections", ())] == 1 else None

    m = wait_for("the POSTs' connections to close", served_alone, timeout_s=30)

    def value(name: str, **labels: str) -> float:
        return m[(name, tuple(sorted(labels.items())))]

    assert value("sgpu_gpus", partition="gpu") == 8  # gpu1 + gpu2
    assert value("sgpu_gpus", partition="debug") == 4
    assert value("sgpu_gpus_allocated", partition="gpu") == 3
    assert value("sgpu_gpus_allocated", partition="debug") == 1
    assert value("sgpu_gpus_used", partition="gpu") == 2  # gpu1:0 and gpu2:3 busy
    assert value("sgpu_gpus_used", partition="debug") == 1
    assert value("sgpu_gpus_idle", partition="gpu") == 1  # gpu1:1 allocated, 0 %
    assert value("sgpu_gpus_idle", partition="debug") == 0
    assert value("sgpu_cycles_total", outcome="ok") == 2
    assert value("sgpu_cycles_total", outcome="failed") == 2
    assert value("sgpu_slurm_errors_total", kind="unavailable") == 1
    assert value("sgpu_slurm_errors_total", kind="parse") == 1
    assert value("sgpu_slurm_errors_total", kind="slurm") == 0
    assert value("sgpu_cycle_duration_seconds_count") == 4
    assert value("sgpu_cycle_duration_seconds_sum") > 0
    assert value("sgpu_last_cycle_timestamp_seconds") == pytest.approx(time.time(), abs=60)
    assert value("sgpu_samples_ingested_total") == 3
    assert value("sgpu_ingest_rejected_total") == 0
    assert (
        value(
            "sgpu_actions_total", policy="idle_gpu", kind="warn", mode="advise", outcome="skipped"
        )
        == 2
    )
    assert (
        value(
            "sgpu_actions_total", policy="rightsize", kind="update", mode="enforce", outcome="done"
        )
        == 1
    )
    assert value("sgpu_transactions", kind="resize", state="planned") == 2
    assert value("sgpu_transactions", kind="resize", state="running") == 1
    assert value("sgpu_store_up") == 1
    assert value("sgpu_api_connections") == 1  # this scrape
    assert value("sgpu_api_connections_limit") == 32
    assert value("sgpu_api_timeout_seconds", kind="request") == 30
    assert value("sgpu_api_overloaded_total") == 0
    # alice's two jobs hold 3 GPUs; gpu1:1 is idle. Nobody is left over for "(other)".
    assert value("sgpu_user_gpus_allocated", user="alice") == 3
    assert value("sgpu_user_gpus_idle", user="alice") == 1
    assert value("sgpu_user_gpus_allocated", user="(other)") == 0
    assert value("sgpu_user_gpus_idle", user="(other)") == 0
    for node in ("gpu1", "gpu2"):  # both agents posted just now
        seen = value("sgpu_agent_last_seen_timestamp_seconds", node=node)
        assert seen == pytest.approx(time.time(), abs=60)


def test_ingest_counter_follows_new_samples_and_rejections(d: Daemon) -> None:
    d.loop.run_once()
    assert _post(d, "gpu1", [_sample("x", 0, 42, 10.0)]) == 200
    before = _scrape(d)[("sgpu_samples_ingested_total", ())]
    assert _post(d, "gpu1", [_sample("y", 0, 42, 10.0), _sample("x", 0, 42, 10.0)]) == 200
    body = encode(SampleBatch(node="gpu1", gpu=[_sample("z", 0, 42, 10.0)]))
    req = urllib.request.Request(d.url + "/v1/samples", data=body, method="POST")
    req.add_header("Authorization", hmac_header(node_token(b"w" * 64, "gpu1"), "gpu1", body))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 401
    after = _scrape(d)
    assert after[("sgpu_samples_ingested_total", ())] == before + 1  # the resent one is a dup
    assert after[("sgpu_ingest_rejected_total", ())] == 1


def test_before_the_first_cycle_gpu_gauges_are_absent_not_zero(d: Daemon) -> None:
    m = _scrape(d)
    assert not any(name == "sgpu_gpus" for name, _ in m)
    assert m[("sgpu_cycles_total", (("outcome", "ok"),))] == 0


@pytest.fixture
def d(daemon: Daemon) -> Daemon:
    return daemon


def test_no_agent_has_a_last_seen_time_until_it_posts(d: Daemon) -> None:
    d.loop.run_once()
    assert not [k for k in _scrape(d) if k[0] == "sgpu_agent_last_seen_timestamp_seconds"]
    assert _post(d, "gpu2", [_sample("z", 3, 43, 50.0)]) == 200
    seen = [k for k in _scrape(d) if k[0] == "sgpu_agent_last_seen_timestamp_seconds"]
    assert seen == [("sgpu_agent_last_seen_timestamp_seconds", (("node", "gpu2"),))]


def _running(job_id: int, user: str, gpus: int, *, indices: bool = True, shards: int = 0) -> Job:
    return Job(
        job_id=job_id,
        name="j",
        user=user,
        state=JobState.RUNNING,
        gpus=GpuRequest(gpus=gpus, shards=shards),
        gpu_allocations=(NodeGpuAllocation("n1", tuple(range(gpus)) if indices else ()),),
    )


def test_user_series_count_whole_gpus_of_running_jobs_by_user() -> None:
    jobs = [
        _running(1, "ann", 4),
        _running(2, "ann", 2, indices=False),  # 22.05 names no index: the asked-for count
        _running(3, "bob", 0, shards=2),  # shards share a GPU: not in the user series
        Job(job_id=4, name="p", user="bob", state=JobState.PENDING, gpus=GpuRequest(gpus=8)),
    ]
    # job 1 keeps 3 of its 4 GPUs busy, job 2 none; a stray busy count is capped
    assert user_gpus(jobs, {1: 3, 2: 0, 3: 1}) == {"ann": (6, 3)}
    assert user_gpus([_running(5, "cy", 1)], {5: 7}) == {"cy": (1, 0)}


def test_user_series_are_bounded_and_the_rest_is_summed_as_other() -> None:
    per_user = {f"u{i:02d}": (4, i % 5) for i in range(30)}
    allocated, idle = user_families(per_user, 3)
    got_idle = {s.labels["user"]: s.value for s in idle.samples}
    got_alloc = {s.labels["user"]: s.value for s in allocated.samples}
    # the three with the most idle GPUs (4 each: u04, u09, u14 first by name), then "(other)"
    assert list(got_idle) == ["u04", "u09", "u14", OTHER]
    assert set(got_alloc) == set(got_idle)
    assert sum(got_idle.values()) == sum(i for _, i in per_user.values())
    assert sum(got_alloc.values()) == 4 * 30 and got_alloc[OTHER] == 4 * 27
    none, _ = user_families({"solo": (1, 1)}, 0)  # 0: every user in "(other)"
    assert {s.labels["user"]: s.value for s in none.samples} == {OTHER: 1}


def test_error_kinds_follow_the_observers_wording() -> None:
    assert error_kind("slurm unavailable: timeout") == "unavailable"
    assert error_kind("slurm output not understood: bad JSON") == "parse"
    assert error_kind("slurm error: squeue exited 1") == "slurm"
    assert error_kind("database is locked") == "store"


def test_scrape_shows_each_gpus_power_and_energy_counter(d: Daemon) -> None:
    d.loop.run_once()
    now = time.time()
    samples = [
        GpuSampleIn(
            sample_uid=f"p{i}", at=now - 30 + 10 * i, gpu_index=0, job_id=42, util_pct=90.0,
            power_w=power, energy_mj=5_000_000 + 4_000_000 * i, processes=1,
        )
        for i, power in enumerate((380.0, 400.0, 420.0))
    ]  # fmt: skip
    # a board without a counter (pre-Volta): power only
    samples.append(
        GpuSampleIn(sample_uid="q", at=now, gpu_index=1, job_id=42, util_pct=0.0, power_w=30.0)
    )
    assert _post(d, "gpu1", samples) == 200
    m = _scrape(d)
    assert m[("sgpu_gpu_power_watts", (("gpu", "0"), ("node", "gpu1")))] == pytest.approx(400.0)
    assert m[("sgpu_gpu_power_watts", (("gpu", "1"), ("node", "gpu1")))] == pytest.approx(30.0)
    assert m[("sgpu_gpu_energy_joules_total", (("gpu", "0"), ("node", "gpu1")))] == 13_000.0
    assert ("sgpu_gpu_energy_joules_total", (("gpu", "1"), ("node", "gpu1"))) not in m


def test_what_the_slurm_decoders_left_out_is_in_metrics(tmp_path: Path) -> None:
    """A skipped squeue record, an unparsed GRES detail and the data_parser versions seen
    (issue 18/22) are exported, counted for the process."""
    golden = Path(__file__).resolve().parents[1] / "golden" / "slurm-26.05"
    metrics = DaemonMetrics(open_store(f"sqlite:///{tmp_path / 'm.db'}").engine, "lab")

    def values() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = metrics.exposition().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name.startswith("sgpu_slurm_")
        }

    before = values()
    doc = json.loads((golden / "mixed_squeue.json").read_bytes().decode("utf-8", "replace"))
    doc["jobs"][0]["job_id"] = "not a number"
    decode_squeue(json.dumps(doc))
    nodes = json.loads((golden / "mixed_sinfo.json").read_text())
    nodes["sinfo"][0]["gres"]["used"] = "gpu:2(IDX:0-1),shard:5(?/4,-/4,2/4,3/4)"
    decode_sinfo(json.dumps(nodes))
    after = values()
    skipped = ("sgpu_slurm_records_skipped_total", (("listing", "squeue"),))
    unparsed = ("sgpu_slurm_values_unparsed_total", (("listing", "sinfo"),))
    assert after[skipped] == before.get(skipped, 0) + 1
    assert after[unparsed] == before.get(unparsed, 0) + 1
    assert after[("sgpu_slurm_data_parser", (("known", "1"), ("version", "v0.0.45")))] == 1


def test_the_daemon_exports_how_many_pending_jobs_rightsizing_has_yet_to_judge(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``sgpu_rightsize_backlog_jobs`` as the daemon wires it (daemon/app.py): three new
    pending jobs, one judged a cycle (max_judged_per_cycle = 1); the log says once when
    jobs are left for later cycles and once when all are judged."""
    from dataclasses import replace

    from slurmgpu.config import Settings
    from slurmgpu.daemon.app import Daemon as App
    from slurmgpu.daemon.lease import DaemonLease

    url = f"sqlite:///{tmp_path / 's.db'}"
    settings = Settings().with_database(url)
    rightsize = replace(settings.policy.rightsize, max_judged_per_cycle=1)
    settings = replace(settings, policy=replace(settings.policy, rightsize=rightsize))
    store = open_store(url)
    waiting = [
        pending_job(50 + i, submit_time=datetime.now(UTC) - timedelta(minutes=i)) for i in range(3)
    ]
    lease = DaemonLease(store.engine, ttl=timedelta(seconds=60))
    lease.acquire()
    try:
        app = App(settings, store, FakeSlurm(waiting, NODES), lease, poll=timedelta(seconds=30))
        caplog.set_level(logging.INFO, logger="slurmgpu.daemon")
        seen = []
        for _ in range(4):
            app.run_once()
            text = app.metrics.exposition().decode()
            (family,) = [
                f
                for f in text_string_to_metric_families(text)
                if f.name == "sgpu_rightsize_backlog_jobs"
            ]
            assert family.type == "gauge"
            seen.append(family.samples[0].value)
        assert seen == [2, 1, 0, 0]
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rightsize")]
        assert said == [
            "rightsize: 2 pending jobs left to judge in the next cycles (at most 1 a cycle: "
            "policy.rightsize.max_judged_per_cycle)",
            "rightsize: every pending job judged",
        ]
    finally:
        lease.release()
        store.engine.dispose()


def test_a_gpu_whose_util_is_unknown_is_neither_used_nor_idle(d: Daemon) -> None:
    d.loop.run_once()
    # gpu1:1 runs a process of job 42 but no sample knows its util (a MIG slice, no GPM).
    unknown = GpuSampleIn(
        sample_uid="u", at=time.time(), gpu_index=1, job_id=42, util_pct=None, processes=1
    )
    assert _post(d, "gpu1", [_sample("a", 0, 42, 80.0), unknown]) == 200
    assert _post(d, "gpu2", [_sample("c", 3, 43, 50.0)]) == 200

    def served_alone() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        scraped = _scrape(d)
        return scraped if scraped[("sgpu_api_connections", ())] == 1 else None

    m = wait_for("the POSTs' connections to close", served_alone, timeout_s=30)
    gpu = (("partition", "gpu"),)
    assert m[("sgpu_gpus_allocated", gpu)] == 3
    assert m[("sgpu_gpus_used", gpu)] == 2
    assert m[("sgpu_gpus_util_unknown", gpu)] == 1
    assert m[("sgpu_gpus_idle", gpu)] == 0  # the unknown GPU is not read as idle
    whole = (("partition", "gpu"), ("sharing", "gpu"))
    assert m[("sgpu_gpu_equivalents_allocated", whole)] == 3
    assert m[("sgpu_gpu_equivalents_used", whole)] == 2
    assert m[("sgpu_gpu_equivalents_util_unknown", whole)] == 1
    assert m[("sgpu_gpu_equivalents_idle", whole)] == 0
    assert m[("sgpu_user_gpus_idle", (("user", "alice"),))] == 0

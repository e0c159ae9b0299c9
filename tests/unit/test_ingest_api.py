"""The daemon's ingest API over real HTTP on 127.0.0.1: auth, validation, idempotency."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.listen_address import parse_listen
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import (
    GpuSampleIn,
    SampleBatch,
    encode,
    hmac_header,
    munge_available,
    munge_header,
    node_token,
)
from tests.unit.ingest_payloads import SECRET, batch, snapshot


@dataclass
class Api:
    url: str
    usage: UsageStore
    service: IngestService

    def call(
        self, path: str, body: bytes | None, auth: str | None
    ) -> tuple[int, dict[str, object]]:
        req = urllib.request.Request(
            self.url + path, data=body, method="POST" if body is not None else "GET"
        )
        if auth:
            req.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    usage = UsageStore(store.engine)
    snap = snapshot()
    directory = NodeDirectory(lambda: snap)
    auth = Authenticator(site_secret=SECRET, allow_munge=True, node_addresses=directory.addresses)
    service = IngestService(usage, auth, directory)
    server = ApiServer(service, "127.0.0.1", 0)
    server.start()
    try:
        yield Api(f"http://127.0.0.1:{server.address[1]}", usage, service)
    finally:
        server.stop()


def signed(node: str, body: bytes) -> str:
    return hmac_header(node_token(SECRET, node), node, body)


def test_signed_batch_is_accepted_and_aggregated(api: Api) -> None:
    body = batch()
    status, reply = api.call("/v1/samples", body, signed("gpu1", body))
    assert (status, reply) == (200, {"accepted": 4, "duplicates": 0})
    (gpu,) = api.usage.gpu_usage(42)
    assert gpu.samples == 3
    assert gpu.mean_util_pct == pytest.approx(80.0)
    assert gpu.max_memory_mib == 1000.0
    (host,) = api.usage.host_usage(42)
    assert host.cpu_efficiency_pct == pytest.approx(37.5)


def test_resending_a_batch_stores_no_duplicates(api: Api) -> None:
    body = batch()
    api.call("/v1/samples", body, signed("gpu1", body))
    status, reply = api.call("/v1/samples", body, signed("gpu1", body))
    assert (status, reply) == (200, {"accepted": 0, "duplicates": 4})
    assert api.usage.count_samples() == 4


def test_unauthenticated_batch_is_rejected_and_logged(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="slurmgpu.api"):
        status, reply = api.call("/v1/samples", batch(), None)
    assert status == 401
    assert reply == {"error": "no Authorization header"}
    assert api.usage.count_samples() == 0
    assert any("rejected request from 127.0.0.1: 401" in r.message for r in caplog.records)


def test_body_changed_after_signing_is_rejected(api: Api) -> None:
    body = batch()
    header = signed("gpu1", body)
    forged = body.replace(b"80.0", b"99.0")
    status, reply = api.call("/v1/samples", forged, header)
    assert status == 401
    assert "body does not match the signed length and digest" in str(reply["error"])
    assert api.usage.count_samples() == 0


def test_a_node_cannot_report_for_another_node(api: Api) -> None:
    body = batch(node="gpu1")
    status, reply = api.call("/v1/samples", body, signed("gpu2", body))
    assert status == 403
    assert "not 'gpu1'" in str(reply["error"])
    assert api.usage.count_samples() == 0


def test_token_for_unknown_node_is_rejected(api: Api) -> None:
    body = batch(node="gpu9")
    status, _ = api.call("/v1/samples", body, signed("gpu9", body))
    assert status == 403


def test_stale_signature_is_rejected(api: Api) -> None:
    body = batch()
    old = hmac_header(node_token(SECRET, "gpu1"), "gpu1", body, now=time.time() - 3600)
    status, reply = api.call("/v1/samples", body, old)
    assert status == 401
    assert "clock skew or replay" in str(reply["error"])


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"node": "gpu1", "gpu": [{"sample_uid": "x"}]}',
        b'{"node": "gpu1", "gpu": [], "extra": 1}',
        b'{"node": "../etc", "gpu": []}',
        json.dumps(
            {
                "node": "gpu1",
                "gpu": [{"sample_uid": "x", "at": time.time(), "gpu_index": 0, "util_pct": -5}],
            }
        ).encode(),
        json.dumps(
            {"node": "gpu1", "gpu": [{"sample_uid": "x", "at": 12, "gpu_index": 0}]}
        ).encode(),
    ],
    ids=["not-json", "missing-fields", "unknown-field", "bad-node", "negative-util", "bad-time"],
)
def test_malformed_payloads_are_400_with_one_line_and_store_nothing(api: Api, body: bytes) -> None:
    status, reply = api.call("/v1/samples", body, signed("gpu1", body))
    assert status == 400
    assert "\n" not in str(reply["error"])
    assert api.usage.count_samples() == 0


def test_node_job_list_has_the_slurm_gpu_indices(api: Api) -> None:
    status, reply = api.call("/v1/nodes/gpu1/jobs", None, signed("gpu1", b""))
    assert status == 200
    assert reply == {
        "node": "gpu1",
        "jobs": [
            {
                "job_id": 42,
                "gpu_indices": [0, 1],
                "shard_indices": [],
                "shards": 0,
                "cpus": 4,
                "user": "alice",
                "mps_indices": [],
            }
        ],
    }
    status, _ = api.call("/v1/nodes/gpu1/jobs", None, signed("gpu2", b""))
    assert status == 403


@pytest.mark.skipif(
    not munge_available(), reason="munged is not running here (MUNGE auth untestable)"
)
def test_munge_credential_is_accepted_and_is_single_use(api: Api) -> None:
    body = batch()
    header = munge_header("gpu1", body)
    assert api.call("/v1/samples", body, header)[0] == 200
    status, reply = api.call("/v1/samples", body, header)
    assert status == 401
    assert "Replayed" in str(reply["error"]) or "rejected" in str(reply["error"])


@pytest.mark.skipif(
    not munge_available(), reason="munged is not running here (MUNGE auth untestable)"
)
def test_munge_credential_for_other_body_is_rejected(api: Api) -> None:
    header = munge_header("gpu1", batch(uid="a"))
    status, reply = api.call("/v1/samples", batch(uid="b"), header)
    assert status == 401
    assert "does not match" in str(reply["error"])


def test_trailing_idle_time_counts_from_the_last_busy_sample(store: JobStore) -> None:
    usage = UsageStore(store.engine)
    t0 = time.time() - 600
    samples = [
        GpuSampleIn(
            sample_uid=f"s{i}",
            at=t0 + 10 * i,
            gpu_index=1,
            job_id=7,
            util_pct=90.0 if i < 20 else 0.0,
            source="device",
        )
        for i in range(50)
    ]
    usage.ingest(SampleBatch(node="gpu1", gpu=samples))
    (g,) = usage.gpu_usage(7)
    assert g.trailing_idle == timedelta(seconds=(49 - 19) * 10)
    assert not g.never_busy
    assert g.mean_util_pct == pytest.approx(90.0 * 20 / 50)


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8787") == ("127.0.0.1", 8787)
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    with pytest.raises(ValueError, match="no port"):
        parse_listen("localhost")


def test_before_the_first_node_list_batches_get_503_so_agents_keep_them(store: JobStore) -> None:
    directory = NodeDirectory(lambda: None)
    auth = Authenticator(site_secret=SECRET, node_addresses=directory.addresses)
    service = IngestService(UsageStore(store.engine), auth, directory)
    body = batch()
    status, reply = service.post_samples("127.0.0.1", signed("gpu1", body), body)
    assert status == 503
    assert "retry" in reply.decode()
    assert service.get_node_jobs("127.0.0.1", signed("gpu1", b""), "gpu1")[0] == 503


def test_a_far_future_sample_is_refused_in_a_200_and_the_rest_stored(api: Api) -> None:
    # Issue 36: a sample stamped in 2096 was stored. It is refused now, the batch's other
    # samples stored, and the reply is a 200 that says so: the agent drops the batch as
    # sent (a 4xx would drop its honest samples, a 5xx have it resent for ever).
    good = msgspec.json.decode(batch(uid="f"), type=SampleBatch)
    future = [
        msgspec.structs.replace(good.gpu[0], sample_uid="f-ahead", at=time.time() + 3600),
        msgspec.structs.replace(good.gpu[0], sample_uid="f-2096", at=3_993_000_000.0),
    ]
    body = encode(msgspec.structs.replace(good, gpu=[*good.gpu, *future]))
    status, reply = api.call("/v1/samples", body, signed("gpu1", body))
    assert (status, reply) == (200, {"accepted": 4, "duplicates": 0, "refused": 2})
    assert [g.samples for g in api.usage.gpu_usage(42)] == [3]
    status, reply = api.call("/v1/samples", body, signed("gpu1", body))
    assert (status, reply) == (200, {"accepted": 0, "duplicates": 4, "refused": 2})
    assert api.usage.refused["stamped in the future"] == 4

"""Property tests for the agents' ingest API (wire.py payloads, daemon/api.py service).

Generated valid batches must be stored exactly (accepted + duplicates = samples sent);
damaged payloads, hostile headers and malformed HTTP must get a 4xx with a one-line
reason and must store nothing. The store's sample count is checked after every request,
so a partial write would show. Counts print at the end of the module.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.model import ClusterSnapshot, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.store import open_store
from slurmgpu.store.sample_ingest import SKEW_LIMIT_S
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import WireError, decode_batch, hmac_header, node_token
from tests.hypothesis_profiles import examples
from tests.unit.props_json import damaged_json
from tests.unit.props_tally import Tally, report

TALLY = Tally()
tally_report = report(TALLY)
SECRET = b"p" * 64
NODES = ("gpu1", "gpu2")
SETTINGS = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_uids = itertools.count()  # fresh sample uids, given out in test bodies only
NOW = time.time()  # strategies must not read the clock: hypothesis replays them


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IngestService]:
    path: Path = tmp_path_factory.mktemp("props-wire") / "s.db"
    store = open_store(f"sqlite:///{path}")
    job = Job(
        job_id=42,
        name="t",
        user="alice",
        state=JobState.RUNNING,
        nodes=("gpu1",),
        gpu_allocations=(NodeGpuAllocation("gpu1", (0, 1)),),
    )
    snap = ClusterSnapshot(
        taken_at=datetime.now(UTC),
        jobs=(job,),
        nodes=tuple(Node(n, "mixed", address="127.0.0.1") for n in NODES),
    )
    directory = NodeDirectory(lambda: snap)
    auth = Authenticator(site_secret=SECRET, allow_munge=False, node_addresses=directory.addresses)
    yield IngestService(UsageStore(store.engine), auth, directory)


def _gpu_sample(draw: st.DrawFn, now: float, i: int) -> dict[str, Any]:
    sample: dict[str, Any] = {
        "sample_uid": f"s{i}",
        "at": now - draw(st.floats(0, 3600)),
        "gpu_index": draw(st.integers(0, 1023)),
    }
    optional = {
        "job_id": st.integers(0, 2**62) | st.none(),
        "util_pct": st.floats(0, 100),
        "memory_used_mib": st.floats(0, 1e9),
        "memory_total_mib": st.floats(0, 1e9),
        "power_w": st.floats(0, 1e9),
        "temperature_c": st.floats(-100, 300),
        "processes": st.integers(0, 100_000),
        "shared": st.booleans(),
        "source": st.sampled_from(["process", "device", "idle", "error"]),
        "energy_mj": st.integers(0, 2**63 - 1),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            sample[key] = draw(strategy)
    return sample


@st.composite
def batches(draw: st.DrawFn) -> dict[str, Any]:
    now = NOW
    gpu = [_gpu_sample(draw, now, i) for i in range(draw(st.integers(0, 20)))]
    host = [
        {
            "sample_uid": f"h{i}",
            "at": now,
            "job_id": draw(st.integers(0, 2**62)),
            "cpu_pct": draw(st.floats(0, 1e9)),
            "cpus_allocated": draw(st.integers(0, 1_000_000)),
        }
        for i in range(draw(st.integers(0, 5)))
    ]
    return {
        "node": draw(st.sampled_from(NODES)),
        "gpu": gpu,
        "host": host,
        "agent": "props",
        "dropped": draw(st.integers(0, 2**62)),
    }


def _post(service: IngestService, body: bytes, node: str) -> tuple[int, dict[str, Any]]:
    header = hmac_header(node_token(SECRET, node), node, body)
    status, reply = service.post_samples("127.0.0.1", header, body)
    return status, json.loads(reply)


@given(batches())
@SETTINGS
def test_valid_batches_are_stored_exactly(service: IngestService, doc: dict[str, Any]) -> None:
    for sample in doc["gpu"] + doc["host"]:
        sample["sample_uid"] = f"v{next(_uids)}"  # new in this store, even on a replay
    body = json.dumps(doc).encode()
    before = service.usage.count_samples()
    status, reply = _post(service, body, doc["node"])
    assert status == 200, reply
    sent = len(doc["gpu"]) + len(doc["host"])
    assert reply["accepted"] + reply["duplicates"] == sent
    assert service.usage.count_samples() - before == reply["accepted"] == sent
    TALLY.accept("POST /v1/samples (valid)")
    status, reply = _post(service, body, doc["node"])  # the agent resends: idempotent
    assert status == 200 and reply["accepted"] == 0 and reply["duplicates"] == sent
    assert service.usage.count_samples() - before == sent


@given(batches().flatmap(lambda d: st.tuples(st.just(d["node"]), damaged_json(d))))
@SETTINGS
def test_damaged_payloads_are_refused_in_one_line_and_store_nothing(
    service: IngestService, case: tuple[str, bytes]
) -> None:
    node, body = case
    TALLY.run("decode_batch", lambda: decode_batch(body), WireError)
    before = service.usage.count_samples()
    status, reply = _post(service, body, node)
    after = service.usage.count_samples()
    if status == 200:
        TALLY.accept("POST /v1/samples (damaged)")
        assert after - before == reply["accepted"]
        return
    assert status in (400, 403), reply
    TALLY.refuse("POST /v1/samples (damaged)", ValueError(reply["error"]))
    assert after == before, "a refused batch must store nothing"


_NUMERIC = {
    "gpu": [
        "at",
        "gpu_index",
        "job_id",
        "util_pct",
        "memory_used_mib",
        "memory_total_mib",
        "power_w",
        "temperature_c",
        "processes",
        "energy_mj",
    ],
    "host": ["at", "job_id", "cpu_pct", "cpus_allocated", "rss_mib", "cgroup_memory_mib"],
}
_BOUNDARY = [
    0,
    -1,
    1e9,
    1e11,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    10**30,
    -1e308,
    1e308,
    5e-324,
    101,
    1024,
    100_001,
]


@given(st.sampled_from(["gpu", "host"]), st.data())
@SETTINGS
def test_boundary_numbers_in_every_numeric_field_are_stored_or_refused(
    service: IngestService, kind: str, data: st.DataObject
) -> None:
    field = data.draw(st.sampled_from(_NUMERIC[kind]))
    value = data.draw(st.sampled_from(_BOUNDARY))
    uid = data.draw(st.sampled_from([f"b{next(_uids)}", "\x00", "a\nb", "x" * 129, ""]))
    sample: dict[str, Any] = {"sample_uid": uid, "at": time.time(), "job_id": 42}
    if kind == "gpu":
        sample["gpu_index"] = 0
    sample[field] = value
    body = json.dumps({"node": "gpu1", kind: [sample]}).encode()
    before = service.usage.count_samples()
    status, reply = _post(service, body, "gpu1")
    stored = service.usage.count_samples() - before
    assert status in (200, 400), (field, value, reply)
    if status == 200 and reply.get("refused"):
        # Valid, but stamped over SKEW_LIMIT_S ahead of the daemon's clock: refused
        # alone, in a 200 (an agent would resend a 4xx/5xx batch for ever).
        TALLY.refuse("POST /v1/samples (boundary numbers)", ValueError("stamped in the future"))
        assert field == "at" and value > time.time() + SKEW_LIMIT_S and stored == 0
    elif status == 200:
        TALLY.accept("POST /v1/samples (boundary numbers)")
        assert stored == 1
    else:
        TALLY.refuse("POST /v1/samples (boundary numbers)", ValueError(reply["error"]))
        assert stored == 0


_header_text = st.one_of(
    st.text(max_size=200),
    st.builds(
        lambda n, t, s: f"Sgpu-HMAC node={n},ts={t},sig={s}",
        st.sampled_from([*NODES, "evil", "gpu1,ts=1", ""]),
        st.integers(-(10**13), 10**13),
        st.text("0123456789abcdef", max_size=70),
    ),
    st.builds(lambda c: f"Munge {c}", st.text(max_size=300)),
    st.sampled_from(["Munge ", "Sgpu-HMAC ", "Bearer x", "Basic YTpi"]),
)


@given(_header_text)
@SETTINGS
def test_hostile_authorization_headers_get_401_and_store_nothing(
    service: IngestService, header: str
) -> None:
    body = json.dumps(
        {
            "node": "gpu1",
            "gpu": [{"sample_uid": f"x{next(_uids)}", "at": time.time(), "gpu_index": 0}],
        }
    ).encode()
    before = service.usage.count_samples()
    status, reply = service.post_samples("127.0.0.1", header, body)
    assert status == 401, (header, reply)
    TALLY.refuse("POST /v1/samples (auth header)", ValueError(json.loads(reply)["error"]))
    status, reply = service.get_node_jobs("127.0.0.1", header, "gpu1")
    assert status == 401
    TALLY.refuse("GET /v1/nodes/N/jobs (auth header)", ValueError(json.loads(reply)["error"]))
    status, reply = service.get_jobs("127.0.0.1", header, None)
    assert status == 401
    TALLY.refuse("GET /v1/jobs (auth header)", ValueError(json.loads(reply)["error"]))
    assert service.usage.count_samples() == before


@given(st.sampled_from(NODES), st.sampled_from(NODES))
@settings(
    max_examples=examples(20),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_a_node_speaks_only_for_itself(service: IngestService, signer: str, claimed: str) -> None:
    body = json.dumps(
        {
            "node": claimed,
            "gpu": [{"sample_uid": f"n{next(_uids)}", "at": time.time(), "gpu_index": 0}],
        }
    ).encode()
    before = service.usage.count_samples()
    header = hmac_header(node_token(SECRET, signer), signer, body)
    status, _ = service.post_samples("127.0.0.1", header, body)
    assert status == (200 if signer == claimed else 403)
    assert service.usage.count_samples() - before == (1 if signer == claimed else 0)
    TALLY.accept("POST /v1/samples (node identity)")


# --------------------------------------------------------------------------- raw HTTP


@pytest.fixture(scope="module")
def server(service: IngestService) -> Iterator[tuple[str, int]]:
    api = ApiServer(service, "127.0.0.1", 0)
    api.start()
    try:
        yield api.address
    finally:
        api.stop()


def _raw(address: tuple[str, int], request: bytes) -> int | None:
    """Send raw bytes; return the HTTP status, or None when the server just closed."""
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    if not data:
        return None
    first = data.split(b"\r\n", 1)[0].split()
    return int(first[1]) if len(first) > 1 and first[1].isdigit() else None


_methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "G\x00T", ""])
_paths = st.one_of(
    st.sampled_from(
        [
            "/v1/samples",
            "/v1/jobs",
            "/v1/nodes/gpu1/jobs",
            "/healthz",
            "/",
            "/v1/nodes/../../etc/passwd/jobs",
            "/v1/jobs?user=root&user=x",
            "/v1/nodes/%00/jobs",
            "//v1//samples",
            "/v1/samples?" + "a" * 9000,
        ]
    ),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=80).map(
        lambda p: "/" + p
    ),
)
_lengths = st.one_of(
    st.none(),
    st.integers(-5, 10**10).map(str),
    st.sampled_from(["", "abc", "1e3", " 12", "99999999999999999999"]),
)


@given(_methods, _paths, _lengths, st.binary(max_size=300))
@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_malformed_http_requests_get_an_error_status_and_the_server_keeps_serving(
    service: IngestService,
    server: tuple[str, int],
    method: str,
    path: str,
    length: str | None,
    body: bytes,
) -> None:
    before = service.usage.count_samples()
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    status = _raw(server, head.encode("latin-1", "replace") + b"\r\n" + body)
    assert status is None or 200 <= status < 600
    assert status != 500, "a request must never crash the handler"
    assert service.usage.count_samples() == before
    TALLY.refuse("HTTP request (malformed)", ValueError(f"status {status}"))
    assert _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") == 200


def test_a_huge_bad_value_is_quoted_shortened_and_the_path_kept() -> None:
    # Found by a random draw of the damaged-payload test: an enum value of 5,000 digits
    # made a 5,059-character error.
    sample = {"sample_uid": "s0", "at": 1796362156.8, "gpu_index": 0, "source": "9" * 5000}
    body = json.dumps({"node": "gpu1", "gpu": [sample], "host": [], "agent": "p", "dropped": 0})
    with pytest.raises(WireError) as raised:
        decode_batch(body.encode())
    message = str(raised.value)
    assert len(message) < 200 and "\n" not in message
    assert "'" + "9" * 57 + "...'" in message and message.endswith("`$.gpu[0].source`")

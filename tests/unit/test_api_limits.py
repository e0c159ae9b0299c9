"""The ingest API under slow, oversized and hostile peers, over real sockets on 127.0.0.1.

Auth is checked before a body is read; a connection's reads are bounded per read and per
request; connections beyond the limit are answered 503 + Retry-After; MUNGE decodes are
capped; the limits and what they refused are in /metrics. No timing thresholds: each test
checks what the server answered, and that an authenticated agent is still served.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slurmgpu.daemon import api as api_module
from slurmgpu.daemon.api import (
    ApiLimits,
    ApiServer,
    AuthBusyError,
    Authenticator,
    IngestService,
    NodeDirectory,
)
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import MAX_BODY_BYTES, Caller, hmac_header, node_token
from tests.unit.test_ingest_api import SECRET, batch, snapshot


@dataclass
class Served:
    server: ApiServer
    port: int

    def post(self, body: bytes, auth: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request("POST", "/v1/samples", body=body, headers={"Authorization": auth})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def agent_post(self, uid: str = "a") -> int:
        body = batch("gpu1", uid=uid)
        return self.post(body, hmac_header(node_token(SECRET, "gpu1"), "gpu1", body))[0]

    def raw(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=20)


def _serve(tmp_path: Path, limits: ApiLimits) -> Generator[Served, None, None]:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    snap = snapshot()
    directory = NodeDirectory(lambda: snap)
    auth = Authenticator(site_secret=SECRET, allow_munge=True, node_addresses=directory.addresses)
    server = ApiServer(
        IngestService(UsageStore(store.engine), auth, directory), "127.0.0.1", 0, limits
    )
    server.start()
    try:
        yield Served(server, server.address[1])
    finally:
        server.stop()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    yield from _serve(
        tmp_path, ApiLimits(max_connections=3, idle_timeout_s=1.0, request_timeout_s=2.0)
    )


def _reply(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    until = time.monotonic() + 20
    while not cond():
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_an_unauthenticated_body_is_refused_before_it_is_read(served: Served) -> None:
    # Headers of an 8 MiB POST and not one byte of its body: the 401 comes anyway.
    s = served.raw()
    s.sendall(
        f"POST /v1/samples HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n".encode()
    )
    reply = _reply(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"Connection: close" in reply


def test_a_token_for_an_unknown_node_is_refused_before_the_body(served: Served) -> None:
    header = hmac_header(node_token(SECRET, "nosuch"), "nosuch", b"")
    s = served.raw()
    s.sendall(
        f"POST /v1/samples HTTP/1.1\r\nAuthorization: {header}\r\n"
        f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n".encode()
    )
    reply = _reply(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
    assert b"unknown node" in reply


def test_a_client_trickling_bytes_is_cut_off_and_agents_are_still_served(served: Served) -> None:
    s = served.raw()
    closed = False
    for byte in b"POST /v1/samples HTTP/1.1\r\nHost: slowloris\r\nX-Pad: " + b"a" * 200:
        try:
            s.sendall(bytes([byte]))
            time.sleep(0.05)  # each read is quick; the request as a whole is not
        except OSError:
            closed = True
            break
        if served.server.stats.timeouts:
            break
    _wait_for(lambda: served.server.stats.timeouts >= 1, "the request timeout")
    s.close()
    assert closed or served.server.stats.timeouts >= 1
    assert served.agent_post() == 200


def test_connections_beyond_the_limit_get_503_with_retry_after(served: Served) -> None:
    idle = [served.raw() for _ in range(3)]
    _wait_for(lambda: served.server.stats.active == 3, "three connections being served")
    s = served.raw()
    reply = _reply(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
    assert b"Retry-After: 5" in reply
    assert served.server.stats.overloaded == 1
    for c in idle:  # the idle ones time out (idle_timeout_s) or are closed here
        c.close()
    _wait_for(lambda: served.server.stats.active == 0, "the slots to free")
    assert served.agent_post() == 200


def test_munge_decodes_are_capped_and_the_overflow_is_told_to_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow_unmunge(header: str, *, timeout_s: float) -> tuple[Caller, str]:
        started.set()
        release.wait(20)
        return Caller(node="gpu1", method="munge", uid=0), "digest"

    monkeypatch.setattr(api_module, "decode_munge", slow_unmunge)
    auth = Authenticator(allow_munge=True, max_munge_decodes=1, munge_timeout_s=0.2)
    first = threading.Thread(target=auth.screen, args=("Munge MUNGE:" + "A" * 20,))
    first.start()
    assert started.wait(20)
    assert auth.munge_active == 1
    with pytest.raises(AuthBusyError):
        auth.screen("Munge MUNGE:" + "B" * 20)
    release.set()
    first.join(20)
    assert auth.munge_busy == 1 and auth.munge_active == 0


def test_limits_and_refusals_are_in_the_metrics(served: Served) -> None:
    registry = CollectorRegistry()
    served.server.export_metrics(registry)
    text = generate_latest(registry).decode()
    assert "sgpu_api_connections_limit 3.0" in text
    assert 'sgpu_api_timeout_seconds{kind="request"} 2.0' in text
    assert "sgpu_api_max_body_bytes 8.388608e+06" in text
    assert "sgpu_api_munge_decodes_limit 4.0" in text
    assert "sgpu_api_overloaded_total 0.0" in text


def test_one_address_cannot_take_every_connection_slot(tmp_path: Path) -> None:
    serving = _serve(tmp_path, ApiLimits(max_connections=4, max_per_peer=2, idle_timeout_s=5.0))
    served = next(serving)
    try:
        other = [
            socket.create_connection(("127.0.0.1", served.port), 20, ("127.0.0.2", 0))
            for _ in range(2)
        ]
        _wait_for(lambda: served.server.stats.active == 2, "two connections from 127.0.0.2")
        third = socket.create_connection(("127.0.0.1", served.port), 20, ("127.0.0.2", 0))
        reply = _reply(third)
        third.close()
        assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
        assert served.server.stats.peer_overloaded == 1
        assert served.agent_post() == 200  # from 127.0.0.1: a slot is still free for it
        for c in other:
            c.close()
    finally:
        serving.close()

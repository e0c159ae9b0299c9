"""The ingest API under slow, oversized and hostile peers, over real sockets on 127.0.0.1.

Auth is checked before a body is read; a connection's reads are bounded per read and per
request; connections beyond the limit are answered 503 + Retry-After; MUNGE decodes are
capped; the limits and what they refused are in /metrics. No timing thresholds: each test
checks what the server answered, and that an authenticated agent is still served.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slurmgpu.daemon import auth as auth_module
from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.api_limits import ApiLimits
from slurmgpu.daemon.auth import AuthBusyError, Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import MAX_BODY_BYTES, Caller, hmac_header, node_token
from tests.unit.ingest_payloads import SECRET, batch, snapshot


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

    def raw(self, source: str = "127.0.0.1") -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), 20, (source, 0))

    def exchange(self, request: bytes, source: str = "127.0.0.1") -> bytes:
        """Send ``request`` on a fresh connection from ``source``; all it was answered."""
        with self.raw(source) as s:
            s.sendall(request)
            return _reply(s)


@contextlib.contextmanager
def serving(tmp_path: Path, limits: ApiLimits) -> Iterator[Served]:
    """The API on a free port of 127.0.0.1 with ``limits``, stopped on leaving."""
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
    with serving(
        tmp_path, ApiLimits(max_connections=3, idle_timeout_s=1.0, request_timeout_s=2.0)
    ) as it:
        yield it


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
    reply = served.exchange(
        f"POST /v1/samples HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n".encode()
    )
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"Connection: close" in reply


def test_a_token_for_an_unknown_node_is_refused_before_the_body(served: Served) -> None:
    header = hmac_header(node_token(SECRET, "nosuch"), "nosuch", b"")
    reply = served.exchange(
        f"POST /v1/samples HTTP/1.1\r\nAuthorization: {header}\r\n"
        f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n".encode()
    )
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


def _held_post(port: int, source: str = "127.0.0.1", node: str = "gpu1") -> socket.socket:
    """An authenticated POST's headers, its body held back: a connection being served."""
    body = batch(node)
    header = hmac_header(node_token(SECRET, node), node, body)
    s = socket.create_connection(("127.0.0.1", port), 20, (source, 0))
    s.sendall(
        f"POST /v1/samples HTTP/1.1\r\nAuthorization: {header}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    return s


def test_connections_beyond_the_limit_get_503_with_retry_after(served: Served) -> None:
    held = [_held_post(served.port) for _ in range(3)]
    _wait_for(lambda: served.server.stats.active == 3, "three connections being served")
    with _held_post(served.port) as s:
        reply = _reply(s)
    assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
    assert b"Retry-After: 5" in reply
    assert served.server.stats.overloaded == 1
    for c in held:  # the held ones time out (idle_timeout_s) or are closed here
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

    monkeypatch.setattr(auth_module, "decode_munge", slow_unmunge)
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
    with serving(
        tmp_path, ApiLimits(max_connections=4, max_per_peer=2, idle_timeout_s=5.0)
    ) as served:
        other = [_held_post(served.port, "127.0.0.2", "gpu2") for _ in range(2)]
        _wait_for(lambda: served.server.stats.active == 2, "two connections from 127.0.0.2")
        with _held_post(served.port, "127.0.0.2", "gpu2") as third:
            reply = _reply(third)
        assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
        assert served.server.stats.peer_overloaded == 1
        assert served.agent_post() == 200  # from 127.0.0.1: a slot is still free for it
        for c in other:
            c.close()


# -- issue 36, finding 3: forged headers, log floods, slowloris from several addresses ----


@pytest.mark.parametrize("form", ["before issue 36", "now"])
def test_a_forged_token_header_claiming_a_large_body_is_refused_before_the_body(
    served: Served, form: str
) -> None:
    # A real node name, a current timestamp, a made-up signature, an 8 MiB body announced
    # and none sent: the header alone must be refused (the 401 comes without the body).
    now = int(time.time())
    forged = (
        f"Sgpu-HMAC node=gpu1,ts={now},sig={'0' * 64}"
        if form == "before issue 36"
        else f"Sgpu-HMAC node=gpu1,ts={now},nonce={'0' * 32},len={MAX_BODY_BYTES},"
        f"sha256={'0' * 64},sig={'0' * 64}"
    )
    reply = served.exchange(
        f"POST /v1/samples HTTP/1.1\r\nAuthorization: {forged}\r\n"
        f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n".encode()
    )
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert served.server.stats.timeouts == 0  # answered, not cut off waiting for the body


def test_a_signed_header_must_name_the_content_length_it_comes_with(served: Served) -> None:
    # A genuine header (captured) sent with a larger Content-Length: refused unread.
    body = batch("gpu1")
    header = hmac_header(node_token(SECRET, "gpu1"), "gpu1", body)
    reply = served.exchange(
        f"POST /v1/samples HTTP/1.1\r\nAuthorization: {header}\r\n"
        f"Content-Length: {MAX_BODY_BYTES}\r\n\r\n".encode()
    )
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"is not the Content-Length" in reply


def test_refusals_are_logged_once_per_peer_and_reason_and_counted_by_reason(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="slurmgpu.api"):
        for source in ("127.0.0.2", "127.0.0.3"):
            for _ in range(20):
                reply = served.exchange(
                    b"GET /v1/nodes/gpu1/jobs HTTP/1.1\r\nAuthorization: Bearer x\r\n\r\n", source
                )
                # (seen once on a loaded machine: something else than a 401; say what)
                assert reply.startswith(b"HTTP/1.1 401"), reply[:300]
    lines = [r.getMessage() for r in caplog.records if "rejected request" in r.getMessage()]
    assert len(lines) == 2, lines  # one per peer for this reason in the interval
    assert {line.split()[3] for line in lines} == {"127.0.0.2:", "127.0.0.3:"}
    registry = CollectorRegistry()
    served.server.export_metrics(registry)
    text = generate_latest(registry).decode()
    assert 'sgpu_api_rejected_total{reason="unauthenticated"} 40.0' in text
    assert "sgpu_api_rejection_log_lines_total 2.0" in text


def test_slow_headers_from_five_addresses_do_not_keep_agents_from_a_slot(tmp_path: Path) -> None:
    # Each address stays within its own connection share, but five of them together hold
    # more connections than there are slots: while they trickle their headers, agents
    # (whose headers come at once) must still be served.
    with serving(
        tmp_path, ApiLimits(max_connections=4, max_per_peer=2, idle_timeout_s=20.0)
    ) as served:
        slow: list[socket.socket] = []
        try:
            for i in range(5):
                for _ in range(2):
                    c = served.raw(f"127.0.0.{i + 2}")
                    c.sendall(b"POST /v1/samples HTTP/1.1\r\nHost: x\r\nX-Pad: a")
                    slow.append(c)
            stats = served.server.stats
            _wait_for(
                lambda: (
                    # (``pending``: no such stage before issue 36)
                    getattr(stats, "pending", 0)
                    + stats.active
                    + stats.overloaded
                    + stats.peer_overloaded
                    >= 10
                ),
                "ten slow connections taken in or refused",
            )
            assert served.agent_post("during") == 200
            assert served.server.stats.overloaded == 0
        finally:
            for c in slow:
                c.close()


def test_slow_headers_are_cut_off_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with serving(tmp_path, ApiLimits(header_timeout_s=0.5, max_pending_per_peer=2)) as served:
        with caplog.at_level(logging.WARNING, logger="slurmgpu.api"):
            slow = [served.raw("127.0.0.2") for _ in range(3)]
            for c in slow:
                c.sendall(b"POST /v1/samples HTTP/1.1\r\n")
            replies = [_reply(c) for c in slow]  # each ends: refused, or cut off
            for c in slow:
                c.close()
        assert sum(r.startswith(b"HTTP/1.1 503") for r in replies) == 1  # the third: over 2
        assert served.server.stats.pending_overloaded == 1
        assert served.server.service.rejections.counts.get("slow_headers") == 2
        messages = [r.getMessage() for r in caplog.records]
        assert sum("headers too slow" in m for m in messages) == 1  # two, logged once
        assert served.agent_post() == 200


def test_headers_past_the_size_limit_are_cut_off(tmp_path: Path) -> None:
    with serving(tmp_path, ApiLimits(max_header_bytes=1024)) as served:
        s = served.raw()
        with contextlib.suppress(OSError):
            s.sendall(
                b"POST /v1/samples HTTP/1.1\r\nX-Pad: " + b"a" * 900 + b"\r\nX-More: " + b"b" * 900
            )
        _reply(s)
        s.close()
        _wait_for(
            lambda: served.server.service.rejections.counts.get("headers_too_large") == 1,
            "the header limit",
        )
        assert served.agent_post() == 200


def test_the_accept_queue_holds_a_burst_of_connections(store: JobStore) -> None:
    # With socketserver's backlog of 5, a burst of attackers' connections filled the
    # accept queue and an agent's SYN was dropped, to be resent by TCP a second later.
    # The server is not accepting here: every connection of the burst must still be
    # queued by the kernel (its handshake completes), not dropped.
    snap = snapshot()
    directory = NodeDirectory(lambda: snap)
    auth = Authenticator(site_secret=SECRET, node_addresses=directory.addresses)
    server = ApiServer(IngestService(UsageStore(store.engine), auth, directory), "127.0.0.1", 0)
    burst: list[socket.socket] = []
    try:
        for _ in range(64):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(server.address)
            burst.append(c)
        waiting, until = set(burst), time.monotonic() + 10
        while waiting and time.monotonic() < until:
            _, writable, _ = select.select([], list(waiting), [], 0.5)
            waiting -= set(writable)
        assert not waiting, f"{64 - len(waiting)} of 64 connections queued"
        assert all(c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for c in burst)
    finally:
        for c in burst:
            c.close()
        server.httpd.server_close()

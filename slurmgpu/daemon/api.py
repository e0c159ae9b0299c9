"""The daemon's HTTP API server: agent ingest, node job lists, status, /healthz, /metrics.

Endpoints (JSON; see slurmgpu.wire for the schemas and authentication):

- ``POST /v1/samples``: a SampleBatch from a node agent → ``{"accepted", "duplicates"}``.
- ``GET /v1/nodes/<node>/jobs``: the running jobs on a node with their GPU indices
  (agents only: the node's own credential).
- ``GET /v1/jobs[?user=NAME]``: a user's status, authenticated with the user's own MUNGE
  credential (``munge -n | curl -H "Authorization: Munge $(cat)"`` style, payload
  ``"status\n" + sha256("")``): the caller's jobs only; every job (or ``user``'s) for an
  admin uid (root by default).
- ``GET /healthz``: the store's write health (no authentication, no data): 200
  ``{"ok": true, "store": "ok", ...}`` while writes succeed, 503 with the cause
  (``"store": "full"``, ``"read_only"``, ...) while they fail (store/health.py).
- ``GET /metrics``: Prometheus text format (no authentication, like /healthz; the API
  binds to localhost unless configured otherwise). See docs/metrics.md.

Status codes: 400 bad payload, 401 not authenticated, 403 authenticated but not for that
node, 404 unknown path, 413 body too large, 503 busy (database, connections or MUNGE
decodes; retry after ``Retry-After``). Refusals are counted by reason in /metrics
(``sgpu_api_rejected_total``) and logged one line per reason and peer per minute, with
the count of those not logged (``RejectionLog``). The limits (``ApiLimits``,
docs/reliability.md) are in /metrics.

This module is the HTTP server only (connections bounded in all and per peer, deadlines
on slow clients). The request logic is daemon/ingest.py, the credentials daemon/auth.py,
the node list daemon/node_directory.py, the limits daemon/api_limits.py and their
/metrics daemon/api_metrics.py.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.registry import CollectorRegistry

from slurmgpu.daemon.api_limits import ApiLimits, ApiStats
from slurmgpu.daemon.api_metrics import ApiCollector
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.rejections import RejectionLog
from slurmgpu.replyauth import REPLY_HEADER
from slurmgpu.wire import MAX_BODY_BYTES, Caller

log = logging.getLogger("slurmgpu.api")


class _HeadersTooLargeError(OSError):
    """The request line and headers went past ``max_header_bytes``."""


class _DeadlineReader(io.RawIOBase):
    """A connection's reads, each at most ``idle_s``, all of one request before ``deadline``:
    a client that trickles a byte at a time cannot hold a worker past the deadline (a socket
    timeout alone restarts with every byte). While the headers are read (``header_budget``
    not None) no read asks for more than the bytes the headers may still take."""

    def __init__(
        self,
        sock: socket.socket,
        idle_s: float,
        stats: ApiStats,
        on_timeout: Callable[[str], None],
    ) -> None:
        self.sock = sock
        self.idle_s = idle_s
        self.stats = stats
        self.on_timeout = on_timeout
        self.deadline = float("inf")
        self.header_budget: int | None = None

    def readable(self) -> bool:
        return True

    def _timed_out(self, why: str) -> TimeoutError:
        self.stats.add("timeouts")
        phase = "headers" if self.header_budget is not None else "body"
        self.on_timeout(f"slow_{phase}")
        return TimeoutError(f"{phase}: {why}")

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._timed_out("request took too long")
        view = memoryview(buffer)
        if self.header_budget is not None:
            if self.header_budget <= 0:
                raise _HeadersTooLargeError("request headers too large")
            view = view[: self.header_budget]
        self.sock.settimeout(min(self.idle_s, left))
        try:
            n = self.sock.recv_into(view)
        except TimeoutError:
            raise self._timed_out("idle") from None
        if self.header_budget is not None:
            self.header_budget -= n
        return n


def _handler(
    service: IngestService, limits: ApiLimits, stats: ApiStats
) -> type[BaseHTTPRequestHandler]:
    retry_after = str(limits.retry_after_s)

    class Handler(BaseHTTPRequestHandler):
        server_version = "slurmgpu"
        protocol_version = "HTTP/1.1"
        # The reply's headers and body go out in two writes: with Nagle on, the body waits
        # for the client's delayed ACK of the headers (~40 ms a request on Linux).
        disable_nagle_algorithm = True
        timeout = limits.idle_timeout_s  # writes (and reads, set per read below)
        server: _BoundedServer

        def setup(self) -> None:
            super().setup()
            self._peer = str(self.client_address[0])
            self._reader = _DeadlineReader(
                self.connection, limits.idle_timeout_s, stats, self._timed_out
            )
            self.rfile = io.BufferedReader(self._reader, 65536)
            self._reply_auth: str | None = None

        def _timed_out(self, reason: str) -> None:
            what = "headers" if reason == "slow_headers" else "request body"
            service.rejections.record(reason, self._peer, f"{what} too slow: connection closed")

        def handle(self) -> None:
            """One request per connection: a kept-alive connection would wait for the next
            request's headers in a served slot (agents open one per request)."""
            started = time.monotonic()
            self._reader.deadline = started + min(limits.header_timeout_s, limits.request_timeout_s)
            self._reader.header_budget = limits.max_header_bytes
            self._request_deadline = started + limits.request_timeout_s
            self.close_connection = True
            try:
                self.handle_one_request()
            except _HeadersTooLargeError:
                service.rejections.record(
                    "headers_too_large",
                    self._peer,
                    f"request headers over {limits.max_header_bytes} bytes: connection closed",
                )

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            self.close_connection = True
            self._reader.header_budget = None
            self._reader.deadline = self._request_deadline
            refused = self.server.promote(self.request, self._peer)
            if refused is not None:
                self._send(503, b'{"error": "server busy, retry"}')
                return False
            return True

        def handle_expect_100(self) -> bool:
            return True  # "100 Continue" only once the header passed (do_POST)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.client_address[0], *args)

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if status == HTTPStatus.SERVICE_UNAVAILABLE:
                self.send_header("Retry-After", retry_after)
            if self._reply_auth is not None:
                self.send_header(REPLY_HEADER, self._reply_auth)
            if self.close_connection:
                self.send_header("Connection", "close")
            # Headers and body leave in one write (one send, one return to the GIL: with
            # two agents posting at once, each extra wait for it costs up to 5 ms).
            self._headers_buffer.append(b"\r\n" + body)  # type: ignore[attr-defined]
            try:
                self.flush_headers()
            except OSError:  # the client went away: nothing to tell it
                self.close_connection = True

        def _signed(
            self, caller: Caller, auth: str, request_body: bytes, reply: tuple[int, bytes]
        ) -> None:
            """Send ``reply`` signed for ``caller`` (agents trust nothing else); a 401 is
            not signed: the request's own credentials failed."""
            status, body = reply
            if status != HTTPStatus.UNAUTHORIZED:
                self._reply_auth = service.auth.reply_header(
                    caller, auth, request_body, status, body
                )
            self._send(status, body)

        def do_GET(self) -> None:
            peer = self._peer
            path, _, query = self.path.partition("?")
            parts = path.strip("/").split("/")
            auth = self.headers.get("Authorization")
            if parts == ["healthz"]:
                self._send(*service.health())
            elif parts == ["metrics"] and service.metrics is not None:
                self._send(200, service.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            elif parts == ["v1", "jobs"]:
                if isinstance(screened := service.screen(peer, auth, user=True), tuple):
                    self._send(*screened)
                    return
                users = parse_qs(query).get("user")
                self._send(*service.get_jobs(peer, auth, users[0] if users else None))
            elif len(parts) == 4 and parts[:2] == ["v1", "nodes"] and parts[3] == "jobs":
                if isinstance(screened := service.screen(peer, auth), tuple):
                    self._send(*screened)
                    return
                assert auth is not None  # screened
                self._signed(screened, auth, b"", service.get_node_jobs(peer, auth, parts[2]))
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:
            peer = self._peer
            if self.path.split("?", 1)[0].rstrip("/") != "/v1/samples":
                self._send(*service.refuse(peer, HTTPStatus.NOT_FOUND, "not found"))
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._send(
                    *service.refuse(peer, HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
                )
                return
            auth = self.headers.get("Authorization")
            # Before a byte of the body is read: a token header signs the body's length.
            if isinstance(caller := service.screen(peer, auth, length=length), tuple):
                self._send(*caller)
                return
            assert auth is not None  # screened
            if length < 0 or length > MAX_BODY_BYTES:
                reply = service.refuse(
                    peer,
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"body of {length} bytes exceeds {MAX_BODY_BYTES}",
                )
                self._signed(caller, auth, b"", reply)
                return
            if self.headers.get("Expect", "").lower() == "100-continue":
                self.send_response_only(HTTPStatus.CONTINUE)
                self.end_headers()
            body = self.rfile.read(length)
            if len(body) < length:
                return  # the client went away mid-body
            self._signed(caller, auth, body, service.post_samples(peer, auth, body))

    return Handler


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, in two stages, each bounded in all and per address:

    - pending (``max_pending``, ``max_pending_per_peer``): the connection is sending its
      request line and headers, at most ``max_header_bytes`` within ``header_timeout_s``;
      one more is closed at once by the accepting thread (no thread started);
    - served (``max_connections``, ``max_per_peer``): its headers are in and it is being
      answered; one more is answered ``503`` with ``Retry-After``.

    A slow or hostile peer holds at most its pending and served shares, each for a bounded
    time; an agent's request, whose headers come in one packet, needs a served slot only
    for as long as it takes to answer it."""

    daemon_threads = True
    # socketserver's default backlog is 5: while attackers' connections arrive by the
    # thousand a second, an agent's SYN finds the queue full, is dropped, and is sent
    # again only after TCP's 1 s retransmission timeout (the agents' p99 was ~1 s).
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: ApiLimits,
        stats: ApiStats,
        rejections: RejectionLog,
    ) -> None:
        self.limits = limits
        self.stats = stats
        self.rejections = rejections
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._peers: dict[str, int] = {}  # connections being served, by address
        self._pending: dict[str, int] = {}  # connections sending headers, by address
        self._pending_total = 0
        # What each connection (by id()) holds: "pending", "served" or "" (refused a slot).
        self._held: dict[int, str] = {}
        self._peers_lock = threading.Lock()
        body = b'{"error": "server busy, retry"}'
        self._busy_reply = (
            "HTTP/1.1 503 Service Unavailable\r\n"
            f"Retry-After: {limits.retry_after_s}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        super().__init__(address, handler)

    def _busy(self, request: Any, peer: str) -> None:
        self.stats.add("pending_overloaded")
        self.rejections.record(
            "busy_peer", peer, "too many connections sending headers: connection closed"
        )
        try:
            request.settimeout(1.0)
            request.sendall(self._busy_reply)
        except OSError:
            pass
        self.shutdown_request(request)

    def _take_pending(self, request: Any, peer: str) -> bool:
        with self._peers_lock:
            if (
                self._pending.get(peer, 0) >= self.limits.max_pending_per_peer
                or self._pending_total >= self.limits.max_pending
            ):
                return False
            self._pending[peer] = self._pending.get(peer, 0) + 1
            self._pending_total += 1
            self._held[id(request)] = "pending"
        self.stats.add("pending")
        return True

    def _drop_pending(self, peer: str) -> None:
        left = self._pending.get(peer, 1) - 1
        if left:
            self._pending[peer] = left
        else:
            self._pending.pop(peer, None)
        self._pending_total -= 1

    def promote(self, request: Any, peer: str) -> str | None:
        """Move a connection whose headers are in from pending to served; the counter to
        bump (and the connection to refuse) when there is no served slot for it."""
        with self._peers_lock:
            if self._held.get(id(request)) != "pending":
                return None
            self._drop_pending(peer)
            refused: str | None = None
            if self._peers.get(peer, 0) >= self.limits.max_per_peer:
                refused = "peer_overloaded"
            elif not self._slots.acquire(blocking=False):
                refused = "overloaded"
            else:
                self._peers[peer] = self._peers.get(peer, 0) + 1
            self._held[id(request)] = "" if refused else "served"
        self.stats.add("pending", -1)
        if refused is not None:
            self.stats.add(refused)
            return refused
        self.stats.add("active")
        return None

    def _give_back(self, request: Any, peer: str) -> None:
        with self._peers_lock:
            held = self._held.pop(id(request), "")
            if held == "served":
                left = self._peers.get(peer, 1) - 1
                if left:
                    self._peers[peer] = left
                else:
                    self._peers.pop(peer, None)
                self._slots.release()
            elif held == "pending":
                self._drop_pending(peer)
        if held:
            self.stats.add("active" if held == "served" else "pending", -1)

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0])
        if not self._take_pending(request, peer):
            self._busy(request, peer)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(request, peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(request, str(client_address[0]))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line, not a traceback on stderr: a peer that went away mid-reply is routine."""
        log.debug("connection from %s ended with an error", client_address[0], exc_info=True)


class ApiServer:
    """The HTTP server for the API, started and stopped with the daemon (limits: ApiLimits)."""

    def __init__(
        self, service: IngestService, host: str, port: int, limits: ApiLimits | None = None
    ) -> None:
        self.service = service
        self.limits = limits or ApiLimits()
        self.stats = ApiStats()
        self.httpd = _BoundedServer(
            (host, port),
            _handler(service, self.limits, self.stats),
            self.limits,
            self.stats,
            service.rejections,
        )
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="sgpu-api", daemon=True
        )

    def export_metrics(self, registry: CollectorRegistry) -> None:
        """Serve the limits and what they refused in ``registry`` (the daemon's /metrics)."""
        registry.register(ApiCollector(self.limits, self.stats, self.service))

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

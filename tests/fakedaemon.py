"""A faithful fake of the slurmgpu daemon's agent API, over real HTTP on 127.0.0.1.

It implements the two endpoints the agent calls with the daemon's contract:

- ``GET /v1/nodes/<node>/jobs`` → 200 ``NodeJobs``;
- ``POST /v1/samples`` → 200 ``IngestResult`` (sample ids seen before count as duplicates);
  400 bad payload, 401 unauthenticated, 403 node mismatch, 413 too big, each with a one-line
  ``{"error": ...}``;

authenticating every request with ``wire.verify_hmac`` (or ``wire.verify_munge`` for a
``Munge`` header) and signing every reply to an authenticated request as the daemon does
(``replyauth``). ``script`` queues canned answers (e.g. a 503) for the next POSTs.
``stop()`` closes the socket (connection refused) and ``start()`` listens again on the same
port, which is how tests take "the daemon" down and bring it back.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from slurmgpu.replyauth import REPLY_HEADER, hmac_reply, munge_reply
from slurmgpu.wire import (
    MAX_BODY_BYTES,
    AuthError,
    Caller,
    NodeJob,
    NodeJobs,
    SampleBatch,
    WireError,
    decode_batch,
    encode,
    node_token,
    verify_hmac,
    verify_munge,
)

_JOBS_PATH = re.compile(r"/v1/nodes/([^/]+)/jobs")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    status: int
    authorization: str
    body: bytes
    caller: Caller | None


@dataclass
class FakeDaemon:
    site_secret: bytes
    jobs: dict[str, list[NodeJob]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    batches: list[SampleBatch] = field(default_factory=list)  # accepted, in arrival order
    seen_uids: set[str] = field(default_factory=set)
    script: deque[tuple[int, str]] = field(default_factory=deque)  # next POST answers
    retry_after: str | None = None  # the Retry-After header of a 503, when set
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeDaemon:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_for(self))
        server.daemon_threads = False  # server_close() then joins every handler thread
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        assert self._thread is not None
        self._thread.join()
        self._server = None
        self._thread = None

    def posts(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST"]

    def accepted(self) -> list[SampleBatch]:
        with self._lock:
            return list(self.batches)

    # -- request handling (called from handler threads) -------------------------------

    def _authenticate(self, header: str, body: bytes) -> Caller:
        if header.startswith("Munge "):
            return verify_munge(header, body)
        if header.startswith("Sgpu-HMAC "):
            return verify_hmac(header, body, self.site_secret)
        raise AuthError("missing or unknown Authorization scheme")

    def handle(
        self, method: str, path: str, header: str, body: bytes
    ) -> tuple[int, bytes, str | None]:
        """The reply's status, body and ``Sgpu-Reply`` header (None for a 401)."""
        caller: Caller | None = None
        signature: str | None = None
        try:
            caller = self._authenticate(header, body)
        except AuthError as exc:
            status, payload = 401, _error(str(exc))
        else:
            status, payload = self._route(method, path, caller, body)
            if caller.method == "hmac":
                token = node_token(self.site_secret, caller.node)
                signature = hmac_reply(token, caller.node, header, body, status, payload)
            else:
                signature = munge_reply(caller.node, header, body, status, payload)
        with self._lock:
            self.requests.append(RecordedRequest(method, path, status, header, body, caller))
        return status, payload, signature

    def _route(self, method: str, path: str, caller: Caller, body: bytes) -> tuple[int, bytes]:
        if method == "GET":
            m = _JOBS_PATH.fullmatch(path)
            if m is None:
                return 404, _error(f"no such endpoint {path}")
            node = m.group(1)
            if node != caller.node:
                return 403, _error(f"node {caller.node} may not read the jobs of {node}")
            with self._lock:
                jobs = list(self.jobs.get(node, []))
            return 200, encode(NodeJobs(node=node, jobs=jobs))
        if path != "/v1/samples":
            return 404, _error(f"no such endpoint {path}")
        with self._lock:
            scripted = self.script.popleft() if self.script else None
        if scripted is not None:
            return scripted[0], _error(scripted[1])
        try:
            batch = decode_batch(body)
        except WireError as exc:
            return 400, _error(str(exc))
        if batch.node != caller.node:
            return 403, _error(f"node {caller.node} may not send samples for {batch.node}")
        with self._lock:
            uids = [g.sample_uid for g in batch.gpu] + [h.sample_uid for h in batch.host]
            duplicates = sum(uid in self.seen_uids for uid in uids)
            self.seen_uids.update(uids)
            self.batches.append(batch)
        return 200, json.dumps(
            {"accepted": len(uids) - duplicates, "duplicates": duplicates}
        ).encode()


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def _handler_for(daemon: FakeDaemon) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, payload: bytes, signature: str | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if signature is not None:
                self.send_header(REPLY_HEADER, signature)
            if status == 503 and daemon.retry_after is not None:
                self.send_header("Retry-After", daemon.retry_after)
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self._answer(
                *daemon.handle("GET", self.path, self.headers.get("Authorization", ""), b"")
            )

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(413, _error(f"body of {length} bytes exceeds {MAX_BODY_BYTES}"))
                return
            body = self.rfile.read(length)
            self._answer(
                *daemon.handle("POST", self.path, self.headers.get("Authorization", ""), body)
            )

        def log_message(self, format: str, *args: object) -> None:
            pass  # tests assert on recorded requests, not on stderr

    return Handler

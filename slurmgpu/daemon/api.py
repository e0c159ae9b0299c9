"""The daemon's HTTP API: agent ingest and node job lists (later: status, /metrics).

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

A request's credentials are checked in full from its headers before its body is read (a
token header signs the body's length and digest; a MUNGE credential is decoded), so an
unauthenticated request costs the daemon its headers and no more. Every reply to an
authenticated agent request carries the daemon's signature bound to that request
(``slurmgpu.replyauth``): agents delete spooled batches only on such a reply.
"""

from __future__ import annotations

import io
import json
import logging
import pwd
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from slurmgpu.daemon.rejections import RejectionLog
from slurmgpu.model import ClusterSnapshot, JobState
from slurmgpu.replyauth import REPLY_HEADER, hmac_reply, munge_reply
from slurmgpu.store.database import StoreError
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import (
    MAX_BODY_BYTES,
    AuthError,
    Caller,
    IngestResult,
    JobsStatus,
    JobStatus,
    NodeJob,
    NodeJobs,
    WireError,
    body_digest,
    decode_batch,
    decode_munge,
    encode,
    node_token,
    verify_hmac,
    verify_hmac_header,
)

log = logging.getLogger("slurmgpu.api")


class AuthBusyError(AuthError):
    """Too many MUNGE credentials are being decoded at once: retry later (503)."""


@dataclass
class Authenticator:
    """Checks a request's Authorization header and that the caller may speak for a node.

    :meth:`screen` checks what the header alone can prove, before the server reads a body:
    the scheme; a token header in full (freshness, node, and the signature over the body's
    length and digest, the length matched to Content-Length); a MUNGE credential in full
    (``unmunge`` with a timeout, at most ``max_munge_decodes`` at once). The decoded
    credential is kept for the same request's :meth:`authenticate` on this thread, which
    then checks that the body is the one it was made for: munged refuses a credential
    decoded twice (replay). :meth:`reply_header` signs the reply for the same caller.
    """

    site_secret: bytes | None = None
    allow_munge: bool = True
    agent_uids: frozenset[int] = frozenset({0})
    node_addresses: Callable[[str], set[str] | None] = lambda _node: None
    admin_uids: frozenset[int] = frozenset({0})  # see every user's jobs in GET /v1/jobs
    munge_timeout_s: float = 5.0  # one unmunge run, and the wait for a free decode slot
    max_munge_decodes: int = 4  # unmunge processes at once
    munge_active: int = field(default=0, init=False)
    munge_busy: int = field(default=0, init=False)  # requests refused: every slot taken
    _slots: threading.BoundedSemaphore = field(init=False, repr=False)
    _count_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _screened: threading.local = field(default_factory=threading.local, init=False, repr=False)

    def __post_init__(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_munge_decodes)

    def _decode_munge(self, header: str) -> tuple[Caller, str]:
        """``unmunge`` one credential, waiting at most ``munge_timeout_s`` for a slot."""
        if not self._slots.acquire(timeout=self.munge_timeout_s):
            with self._count_lock:
                self.munge_busy += 1
            raise AuthBusyError(f"{self.max_munge_decodes} MUNGE credentials being decoded")
        with self._count_lock:
            self.munge_active += 1
        try:
            return decode_munge(header, timeout_s=self.munge_timeout_s)
        finally:
            with self._count_lock:
                self.munge_active -= 1
            self._slots.release()

    def _munge(self, header: str) -> tuple[Caller, str]:
        """The credential :meth:`screen` decoded for this request, else decode it now."""
        kept: tuple[str, Caller, str] | None = getattr(self._screened, "value", None)
        self._screened.value = None
        if kept is not None and kept[0] == header:
            return kept[1], kept[2]
        return self._decode_munge(header)

    def screen(
        self, header: str | None, *, user: bool = False, length: int | None = None
    ) -> Caller:
        """Check the header before the body is read (raise AuthError, PermissionError);
        return the caller it proves.

        ``user``: a status request, which only the caller's own MUNGE credential proves.
        ``length``: the request's Content-Length, which a token header must have signed.
        """
        self._screened.value = None
        if not header:
            raise AuthError("no Authorization header")
        if header.startswith("Munge "):
            if not self.allow_munge:
                raise AuthError("MUNGE authentication is disabled on this daemon")
            caller, digest = self._decode_munge(header)
            if not user and caller.uid not in self.agent_uids:
                raise AuthError(f"uid {caller.uid} may not report samples")
            self._screened.value = (header, caller, digest)
            return caller
        if user:
            raise AuthError("status requests need the caller's own MUNGE credential")
        if header.startswith("Sgpu-HMAC "):
            if self.site_secret is None:
                raise AuthError("token authentication is not configured on this daemon")
            caller, claim = verify_hmac_header(header, self.site_secret)
            if self.node_addresses(caller.node) is None:
                raise PermissionError(f"unknown node {caller.node!r}")
            if length is not None and claim.length != length:
                raise AuthError(
                    f"signed body length {claim.length} is not the Content-Length {length}"
                )
            return caller  # the body's digest is checked once it is read
        raise AuthError("unsupported Authorization scheme")

    def reply_header(
        self,
        caller: Caller,
        authorization: str,
        request_body: bytes,
        status: int,
        reply_body: bytes,
    ) -> str | None:
        """The ``Sgpu-Reply`` header proving this reply comes from the daemon, for this
        request (``slurmgpu.replyauth``); None when it cannot be made (munged away)."""
        if caller.method == "hmac" and self.site_secret is not None:
            token = node_token(self.site_secret, caller.node)
            return hmac_reply(token, caller.node, authorization, request_body, status, reply_body)
        if caller.method == "munge":
            try:
                return munge_reply(
                    caller.node,
                    authorization,
                    request_body,
                    status,
                    reply_body,
                    timeout_s=self.munge_timeout_s,
                )
            except AuthError as exc:
                log.warning("cannot sign a reply to node %s: %s", caller.node, exc)
        return None

    def authenticate(self, header: str | None, body: bytes) -> Caller:
        if not header:
            raise AuthError("no Authorization header")
        if header.startswith("Munge "):
            if not self.allow_munge:
                raise AuthError("MUNGE authentication is disabled on this daemon")
            caller, digest = self._munge(header)
            if digest != body_digest(body):
                raise AuthError("MUNGE credential does not match the request body")
            if caller.uid not in self.agent_uids:
                raise AuthError(f"uid {caller.uid} may not report samples")
            return caller
        if header.startswith("Sgpu-HMAC "):
            if self.site_secret is None:
                raise AuthError("token authentication is not configured on this daemon")
            return verify_hmac(header, body, self.site_secret)
        raise AuthError("unsupported Authorization scheme")

    def authenticate_user(self, header: str | None) -> Caller:
        """The user behind a status request: only a MUNGE credential proves a uid (a node
        token speaks for a node, not for a person)."""
        if not header:
            raise AuthError("no Authorization header")
        if not header.startswith("Munge "):
            raise AuthError("status requests need the caller's own MUNGE credential")
        if not self.allow_munge:
            raise AuthError("MUNGE authentication is disabled on this daemon")
        caller, digest = self._munge(header)
        if digest != body_digest(b""):
            raise AuthError("MUNGE credential does not match the request body")
        if caller.uid is None:
            raise AuthError("MUNGE credential carries no uid")
        return caller

    def authorize_node(self, caller: Caller, node: str) -> None:
        """Raise PermissionError unless ``caller`` proved it is ``node``."""
        if caller.node != node:
            raise PermissionError(f"credential is for node {caller.node!r}, not {node!r}")
        addresses = self.node_addresses(node)
        if addresses is None:
            raise PermissionError(f"unknown node {node!r}")
        if (
            caller.method == "munge"
            and caller.host_addr
            and addresses
            and caller.host_addr not in addresses
        ):
            raise PermissionError(
                f"credential made on {caller.host_addr}, not on node {node}'s address"
            )


@dataclass
class NodeDirectory:
    """Which nodes exist and their addresses, from the daemon's latest snapshot."""

    snapshot: Callable[[], ClusterSnapshot | None]
    _resolved: dict[str, set[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def addresses(self, node: str) -> set[str] | None:
        snap = self.snapshot()
        if snap is None:
            return None
        match = next((n for n in snap.nodes if n.name == node), None)
        if match is None:
            return None
        key = match.address or match.name
        with self._lock:
            if key not in self._resolved:
                try:
                    addrs = {str(ai[4][0]) for ai in socket.getaddrinfo(key, None)}
                except OSError:
                    addrs = set()
                self._resolved[key] = addrs | {key}
            return set(self._resolved[key])

    def jobs_on(self, node: str) -> NodeJobs:
        snap = self.snapshot()
        jobs: list[NodeJob] = []
        if snap is not None:
            for job in snap.jobs:
                if job.state is not JobState.RUNNING or node not in job.nodes:
                    continue
                alloc = next((a for a in job.gpu_allocations if a.node == node), None)
                per_node_cpus = job.cpus // max(job.node_count or len(job.nodes), 1)
                jobs.append(
                    NodeJob(
                        job_id=job.job_id,
                        gpu_indices=list(alloc.gpu_indices) if alloc else [],
                        shard_indices=list(alloc.shard_indices) if alloc else [],
                        shards=alloc.shards if alloc else 0,
                        cpus=per_node_cpus,
                        user=job.user,
                    )
                )
        return NodeJobs(node=node, jobs=jobs)


class IngestService:
    """The request logic, independent of the HTTP server (tested directly and over HTTP)."""

    def __init__(
        self,
        usage: UsageStore,
        auth: Authenticator,
        directory: NodeDirectory,
        metrics: Callable[[], bytes] | None = None,
        rejections: RejectionLog | None = None,
    ) -> None:
        self.usage = usage
        self.auth = auth
        self.directory = directory
        self.metrics = metrics  # the /metrics exposition, when the daemon has metrics
        self.rejections = rejections or RejectionLog(log)
        # The /healthz answer (status, body): the daemon's StoreHealth.healthz.
        self.health: Callable[[], tuple[int, bytes]] = lambda: (200, b'{"ok": true}')
        self.accepted = 0
        self.rejected = 0
        # node → when its agent last delivered a batch the store took (Unix time): the
        # sgpu_agent_last_seen_timestamp_seconds gauge. Bounded by the nodes Slurm lists
        # (an agent is only accepted for its own node).
        self.last_seen: dict[str, float] = {}
        self._store_trouble: str | None = None  # logged once until an ingest succeeds

    def _reject(self, peer: str, status: HTTPStatus, reason: str) -> tuple[int, bytes]:
        self.rejected += 1
        self.rejections.record(_REASONS.get(status, "other"), peer, f"{status.value} {reason}")
        return status.value, json.dumps({"error": reason}).encode()

    def _not_ready(self) -> tuple[int, bytes] | None:
        """503 until the daemon has seen Slurm's node list once: refusing a node as unknown
        then would make agents drop samples they should keep and resend."""
        if self.directory.snapshot() is None:
            return (
                HTTPStatus.SERVICE_UNAVAILABLE.value,
                b'{"error": "daemon starting: node list not loaded yet, retry"}',
            )
        return None

    def screen(
        self, peer: str, header: str | None, *, user: bool = False, length: int | None = None
    ) -> Caller | tuple[int, bytes]:
        """Check a request's header before its body is read: the caller when it may go on,
        else the reply (401/403; 503 while starting or while MUNGE decodes are all busy)."""
        if (busy := self._not_ready()) is not None:
            return busy
        try:
            return self.auth.screen(header, user=user, length=length)
        except AuthBusyError as exc:
            log.debug("request from %s deferred: %s", peer, exc)
            return HTTPStatus.SERVICE_UNAVAILABLE.value, json.dumps({"error": str(exc)}).encode()
        except AuthError as exc:
            return self._reject(peer, HTTPStatus.UNAUTHORIZED, str(exc))
        except PermissionError as exc:
            return self._reject(peer, HTTPStatus.FORBIDDEN, str(exc))

    def refuse(self, peer: str, status: HTTPStatus, reason: str) -> tuple[int, bytes]:
        """Refuse a request the server itself judged (413, 404, 411), counted and logged."""
        return self._reject(peer, status, reason)

    def post_samples(self, peer: str, header: str | None, body: bytes) -> tuple[int, bytes]:
        if (busy := self._not_ready()) is not None:
            return busy
        try:
            caller = self.auth.authenticate(header, body)
        except AuthError as exc:
            return self._reject(peer, HTTPStatus.UNAUTHORIZED, str(exc))
        try:
            batch = decode_batch(body)
        except WireError as exc:
            return self._reject(peer, HTTPStatus.BAD_REQUEST, str(exc))
        try:
            self.auth.authorize_node(caller, batch.node)
        except PermissionError as exc:
            return self._reject(peer, HTTPStatus.FORBIDDEN, str(exc))
        try:
            outcome = self.usage.ingest_batch(batch)
        except StoreError as exc:  # StoreBusyError included
            # Every agent retries every interval: one line per outage, not one per request.
            level = logging.WARNING if str(exc) != self._store_trouble else logging.DEBUG
            self._store_trouble = str(exc)
            log.log(level, "ingest from %s failed (agents keep their batches): %s", batch.node, exc)
            return HTTPStatus.SERVICE_UNAVAILABLE.value, json.dumps({"error": str(exc)}).encode()
        if self._store_trouble is not None:
            log.info("ingest works again")
            self._store_trouble = None
        self.accepted += outcome.accepted
        self.last_seen[batch.node] = time.time()
        if batch.dropped:
            log.debug("node %s reports %d samples dropped by its spool", batch.node, batch.dropped)
        # 200 even when some samples were refused (each counted and logged once per node
        # by the store): the rest are stored, and a resend could never change the verdict.
        reply = IngestResult(
            accepted=outcome.accepted,
            duplicates=outcome.duplicates,
            held=outcome.held,
            refused=outcome.refused,
        )
        return HTTPStatus.OK.value, encode(reply)

    def get_node_jobs(self, peer: str, header: str | None, node: str) -> tuple[int, bytes]:
        if (busy := self._not_ready()) is not None:
            return busy
        try:
            caller = self.auth.authenticate(header, b"")
            self.auth.authorize_node(caller, node)
        except AuthError as exc:
            return self._reject(peer, HTTPStatus.UNAUTHORIZED, str(exc))
        except PermissionError as exc:
            return self._reject(peer, HTTPStatus.FORBIDDEN, str(exc))
        return HTTPStatus.OK.value, encode(self.directory.jobs_on(node))

    def get_jobs(self, peer: str, header: str | None, user: str | None) -> tuple[int, bytes]:
        """A user's jobs; an admin's view of everyone's (or ``user``'s)."""
        if (busy := self._not_ready()) is not None:
            return busy
        try:
            caller = self.auth.authenticate_user(header)
        except AuthError as exc:
            return self._reject(peer, HTTPStatus.UNAUTHORIZED, str(exc))
        uid = caller.uid if caller.uid is not None else -1
        admin = uid in self.auth.admin_uids
        own = _user_name(uid)
        if user is not None and user != own and not admin:
            return self._reject(peer, HTTPStatus.FORBIDDEN, f"uid {uid} may only list its own jobs")
        snap = self.directory.snapshot()
        jobs = []
        for job in snap.jobs if snap is not None else ():
            mine = job.uid == uid if job.uid is not None else (own is not None and job.user == own)
            if (admin and (user is None or job.user == user)) or (not admin and mine):
                jobs.append(
                    JobStatus(
                        job_id=job.display_id,
                        user=job.user,
                        state=job.state.value,
                        name=job.name,
                        partition=job.partition,
                        nodes=list(job.nodes),
                        gpus=job.allocated_gpus or job.gpus.gpus,
                    )
                )
        return HTTPStatus.OK.value, encode(JobsStatus(caller_uid=uid, admin=admin, jobs=jobs))


# A refusal's reason in sgpu_api_rejected_total, by status; the server adds its own
# ("slow_headers", "slow_body", "headers_too_large", "busy_peer").
_REASONS = {
    HTTPStatus.BAD_REQUEST: "bad_payload",
    HTTPStatus.UNAUTHORIZED: "unauthenticated",
    HTTPStatus.FORBIDDEN: "forbidden",
    HTTPStatus.NOT_FOUND: "not_found",
    HTTPStatus.LENGTH_REQUIRED: "no_length",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "too_large",
}


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


@dataclass(frozen=True)
class ApiLimits:
    """How much of the daemon one peer, or all of them, can hold (docs/reliability.md)."""

    max_connections: int = 32  # served at once (headers in); one more is answered 503
    max_per_peer: int = 8  # of those, from one address (a node's agent needs one)
    # Connections still sending their request line and headers: each holds a thread and
    # at most max_header_bytes, for at most header_timeout_s; they take no served slot, so
    # clients trickling headers (slowloris) cannot keep an agent's request from a slot.
    max_pending: int = 256
    max_pending_per_peer: int = 16
    header_timeout_s: float = 5.0  # the request line and headers, from the connection's start
    max_header_bytes: int = 16 * 1024
    idle_timeout_s: float = 10.0  # one read or write waiting longer closes the connection
    request_timeout_s: float = 30.0  # a whole request: its wait, headers and body
    retry_after_s: int = 5  # what a 503 tells the client to wait


@dataclass
class ApiStats:
    """What the server counts for /metrics."""

    active: int = 0  # connections served (their headers in)
    pending: int = 0  # connections still sending their headers
    overloaded: int = 0  # connections answered 503 because every slot was taken
    peer_overloaded: int = 0  # answered 503 because their address held max_per_peer
    pending_overloaded: int = 0  # closed at once: too many connections sending headers
    timeouts: int = 0  # connections closed because a read or a request took too long
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)


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


class _ApiCollector(Collector):
    def __init__(self, server: ApiServer) -> None:
        self.server = server

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        limits, stats, auth = self.server.limits, self.server.stats, self.server.service.auth
        yield GaugeMetricFamily(
            "sgpu_api_connections", "API connections being served.", value=stats.active
        )
        yield GaugeMetricFamily(
            "sgpu_api_connections_limit",
            "API connections served at once; more are answered 503 + Retry-After.",
            value=limits.max_connections,
        )
        yield CounterMetricFamily(
            "sgpu_api_overloaded",
            "API connections answered 503 because every connection slot was taken.",
            value=stats.overloaded,
        )
        yield CounterMetricFamily(
            "sgpu_api_peer_overloaded",
            "API connections answered 503 because their address held max_per_peer connections.",
            value=stats.peer_overloaded,
        )
        yield GaugeMetricFamily(
            "sgpu_api_connections_per_peer_limit",
            "API connections served at once from one address.",
            value=limits.max_per_peer,
        )
        yield CounterMetricFamily(
            "sgpu_api_timeouts",
            "API connections closed: a read idle past the idle timeout, or a request past"
            " the request timeout.",
            value=stats.timeouts,
        )
        yield GaugeMetricFamily(
            "sgpu_api_pending_connections",
            "API connections still sending their request line and headers.",
            value=stats.pending,
        )
        pending = GaugeMetricFamily(
            "sgpu_api_pending_connections_limit",
            "API connections sending headers at once, in all and from one address.",
            labels=["scope"],
        )
        pending.add_metric(["all"], limits.max_pending)
        pending.add_metric(["peer"], limits.max_pending_per_peer)
        yield pending
        yield CounterMetricFamily(
            "sgpu_api_pending_overloaded",
            "API connections closed at once: too many were sending headers.",
            value=stats.pending_overloaded,
        )
        rejected = CounterMetricFamily(
            "sgpu_api_rejected",
            "API requests refused, by reason (each logged at most once a minute per peer).",
            labels=["reason"],
        )
        for reason, count in sorted(self.server.service.rejections.snapshot().items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield CounterMetricFamily(
            "sgpu_api_rejection_log_lines",
            "Log lines written about refused API requests (the rest were counted only).",
            value=self.server.service.rejections.lines,
        )
        yield GaugeMetricFamily(
            "sgpu_api_max_header_bytes",
            "Largest request line and headers read.",
            value=limits.max_header_bytes,
        )
        timeouts = GaugeMetricFamily(
            "sgpu_api_timeout_seconds", "API time limits by kind.", labels=["kind"]
        )
        timeouts.add_metric(["headers"], limits.header_timeout_s)
        timeouts.add_metric(["idle"], limits.idle_timeout_s)
        timeouts.add_metric(["request"], limits.request_timeout_s)
        timeouts.add_metric(["munge"], auth.munge_timeout_s)
        yield timeouts
        yield GaugeMetricFamily(
            "sgpu_api_max_body_bytes", "Largest request body accepted.", value=MAX_BODY_BYTES
        )
        yield GaugeMetricFamily(
            "sgpu_api_munge_decodes", "MUNGE credentials being decoded.", value=auth.munge_active
        )
        yield GaugeMetricFamily(
            "sgpu_api_munge_decodes_limit",
            "MUNGE credentials decoded at once.",
            value=auth.max_munge_decodes,
        )
        yield CounterMetricFamily(
            "sgpu_api_munge_busy",
            "Requests answered 503: every MUNGE decode slot stayed taken.",
            value=auth.munge_busy,
        )


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
        registry.register(_ApiCollector(self))

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

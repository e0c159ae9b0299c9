"""The daemon's HTTP API: agent ingest and node job lists (later: status, /metrics).

Endpoints (JSON; see slurmgpu.wire for the schemas and authentication):

- ``POST /v1/samples``: a SampleBatch from a node agent → ``{"accepted", "duplicates"}``.
- ``GET /v1/nodes/<node>/jobs``: the running jobs on a node with their GPU indices
  (agents only: the node's own credential).
- ``GET /v1/jobs[?user=NAME]``: a user's status, authenticated with the user's own MUNGE
  credential (``munge -n | curl -H "Authorization: Munge $(cat)"`` style, payload
  ``"status\n" + sha256("")``): the caller's jobs only; every job (or ``user``'s) for an
  admin uid (root by default).
- ``GET /healthz``: ``{"ok": true}`` (no authentication, no data).
- ``GET /metrics``: Prometheus text format (no authentication, like /healthz; the API
  binds to localhost unless configured otherwise). See docs/metrics.md.

Status codes: 400 bad payload, 401 not authenticated, 403 authenticated but not for that
node, 404 unknown path, 413 body too large, 503 database busy (retry). Every rejection is
logged as one line with the peer address and the reason.
"""

from __future__ import annotations

import json
import logging
import pwd
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from slurmgpu.model import ClusterSnapshot, JobState
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
    decode_batch,
    encode,
    verify_hmac,
    verify_munge,
)

log = logging.getLogger("slurmgpu.api")


@dataclass
class Authenticator:
    """Checks a request's Authorization header and that the caller may speak for a node."""

    site_secret: bytes | None = None
    allow_munge: bool = True
    agent_uids: frozenset[int] = frozenset({0})
    node_addresses: Callable[[str], set[str] | None] = lambda _node: None
    admin_uids: frozenset[int] = frozenset({0})  # see every user's jobs in GET /v1/jobs

    def authenticate(self, header: str | None, body: bytes) -> Caller:
        if not header:
            raise AuthError("no Authorization header")
        if header.startswith("Munge "):
            if not self.allow_munge:
                raise AuthError("MUNGE authentication is disabled on this daemon")
            caller = verify_munge(header, body)
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
        caller = verify_munge(header, b"")
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
    ) -> None:
        self.usage = usage
        self.auth = auth
        self.directory = directory
        self.metrics = metrics  # the /metrics exposition, when the daemon has metrics
        self.accepted = 0
        self.rejected = 0
        self._store_trouble: str | None = None  # logged once until an ingest succeeds

    def _reject(self, peer: str, status: HTTPStatus, reason: str) -> tuple[int, bytes]:
        self.rejected += 1
        log.warning("rejected request from %s: %d %s", peer, status.value, reason)
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
            accepted, duplicates = self.usage.ingest(batch)
        except StoreError as exc:  # StoreBusyError included
            # Every agent retries every interval: one line per outage, not one per request.
            level = logging.WARNING if str(exc) != self._store_trouble else logging.DEBUG
            self._store_trouble = str(exc)
            log.log(level, "ingest from %s failed (agents keep their batches): %s", batch.node, exc)
            return HTTPStatus.SERVICE_UNAVAILABLE.value, json.dumps({"error": str(exc)}).encode()
        if self._store_trouble is not None:
            log.info("ingest works again")
            self._store_trouble = None
        self.accepted += accepted
        if batch.dropped:
            log.debug("node %s reports %d samples dropped by its spool", batch.node, batch.dropped)
        return HTTPStatus.OK.value, encode(IngestResult(accepted=accepted, duplicates=duplicates))

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


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def _handler(service: IngestService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "slurmgpu"
        protocol_version = "HTTP/1.1"
        # The reply's headers and body go out in two writes: with Nagle on, the body waits
        # for the client's delayed ACK of the headers (~40 ms a request on Linux).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.client_address[0], *args)

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            peer = self.client_address[0]
            path, _, query = self.path.partition("?")
            parts = path.strip("/").split("/")
            if parts == ["healthz"]:
                self._send(200, b'{"ok": true}')
            elif parts == ["metrics"] and service.metrics is not None:
                self._send(200, service.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            elif parts == ["v1", "jobs"]:
                users = parse_qs(query).get("user")
                self._send(
                    *service.get_jobs(
                        peer, self.headers.get("Authorization"), users[0] if users else None
                    )
                )
            elif len(parts) == 4 and parts[:2] == ["v1", "nodes"] and parts[3] == "jobs":
                self._send(
                    *service.get_node_jobs(peer, self.headers.get("Authorization"), parts[2])
                )
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:
            peer = self.client_address[0]
            if self.path.split("?", 1)[0].rstrip("/") != "/v1/samples":
                self._send(404, b'{"error": "not found"}')
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._send(411, b'{"error": "Content-Length required"}')
                return
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(
                    *service._reject(
                        peer, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes"
                    )
                )
                return
            body = self.rfile.read(length)
            self._send(*service.post_samples(peer, self.headers.get("Authorization"), body))

    return Handler


class ApiServer:
    """A threaded HTTP server for the API, started and stopped with the daemon."""

    def __init__(self, service: IngestService, host: str, port: int) -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler(service))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="sgpu-api", daemon=True
        )

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


def parse_listen(listen: str) -> tuple[str, int]:
    """Return (host, port) from ``"127.0.0.1:8787"``, ``"[::1]:8787"`` or ``":8787"``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"listen address {listen!r} must look like 127.0.0.1:8787")
    return (host.strip("[]") or "127.0.0.1"), int(port)

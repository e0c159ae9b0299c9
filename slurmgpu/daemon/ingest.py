"""The API's request logic, apart from HTTP: agents' sample batches into the store, a node's
job list, a user's status; every refusal counted by reason and logged (``RejectionLog``).

Status codes: 400 bad payload, 401 not authenticated, 403 authenticated but not for that
node, 503 busy (database or MUNGE decodes) or still starting. The HTTP server
(daemon/api.py) adds its own refusals (404, 411, 413, slow or too many connections).
"""

from __future__ import annotations

import json
import logging
import pwd
import time
from collections.abc import Callable
from http import HTTPStatus

from slurmgpu.daemon.auth import AuthBusyError, Authenticator
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.daemon.rejections import RejectionLog
from slurmgpu.store.database import StoreError
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import (
    AuthError,
    Caller,
    IngestResult,
    JobsStatus,
    JobStatus,
    WireError,
    decode_batch,
    encode,
)

log = logging.getLogger("slurmgpu.api")


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

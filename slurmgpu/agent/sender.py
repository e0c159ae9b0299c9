"""``DaemonClient``: the agent's two HTTP calls to the slurmgpu daemon, and their outcomes.

- ``GET  /v1/nodes/<node>/jobs`` → ``NodeJobs`` (the jobs running here, with GPU indices);
- ``POST /v1/samples`` with an encoded ``SampleBatch`` → ``IngestResult``.

Every request carries an ``Authorization`` header (``wire.munge_header`` when munged
runs, else ``wire.hmac_header`` with this node's token), made fresh for each attempt so a
batch resent from the spool an hour later still has a current timestamp.

A POST ends in one of three ways (``SendOutcome``): ``SENT``; ``RETRY`` (connection
refused or reset, timeout, 408/429/5xx: the daemon is away or busy; 401/403: the daemon
does not take this node's credentials *now* (a token being rotated, munged restarting, the
node not yet in the daemon's node list), so the credentials are checked again (``reauth``:
the token file re-read, MUNGE availability re-checked) and the batch kept); ``REJECTED``
(400/413 and other 4xx: sending the same bytes again cannot succeed, so the batch is
dropped and counted, never retried forever).

Every reply that would make the agent let go of a batch (200, or a 4xx that drops it) must
prove it comes from the daemon and answers this very request (``slurmgpu.replyauth``: the
daemon's ``Sgpu-Reply`` signature over the request's header and body and the reply's
status and body, with this node's token or a MUNGE credential of a daemon uid). A reply
that does not is ``RETRY`` with ``unauthenticated`` set: whoever answered on the daemon's
port is not the daemon (it was stopped, and someone else bound the port), so nothing is
deleted and the client backs off as from an unreachable daemon. The job list is checked
the same way, and the agent asks for it before it sends any samples in a cycle: a peer
that cannot sign that reply gets no samples at all (the request is the challenge, its
unique header the nonce).

After a failed attempt the client backs off: it sends nothing (``RETRY`` at once, the
batch kept) for ``Backoff.delay`` (exponential from ``base_s`` to ``cap_s``, each drawn
between half and all of it, so a cluster's agents do not come back in step after an
outage), and at least the daemon's ``Retry-After``.

Requests bypass ``http_proxy``/``https_proxy``: the daemon is on the cluster network and a
site's web proxy would only see (and log) the node's telemetry.
"""

from __future__ import annotations

import enum
import http.client
import json
import logging
import os
import random
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

import msgspec

from slurmgpu.replyauth import REPLY_HEADER, ReplyAuthError, check_hmac_reply, check_munge_reply
from slurmgpu.wire import (
    AuthError,
    IngestResult,
    NodeJobs,
    hmac_header,
    munge_available,
    munge_header,
)

log = logging.getLogger(__name__)

DEFAULT_DAEMON_URL = "http://127.0.0.1:8787"
DEFAULT_TOKEN_FILE = Path("/etc/slurmgpu/node.token")
DEFAULT_TIMEOUT_S = 5.0
_RETRYABLE_STATUS = frozenset({408, 425, 429})
_CREDENTIALS_REFUSED = frozenset({401, 403})
_MAX_ERROR_CHARS = 300
_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class AgentAuthError(Exception):
    """The agent cannot authenticate (no munged, token file missing or too open)."""


class Authenticator(Protocol):
    """Makes the ``Authorization`` header of one request, and checks the daemon's reply."""

    method: str

    def header(self, node: str, body: bytes) -> str: ...

    def check_reply(
        self,
        node: str,
        authorization: str,
        body: bytes,
        status: int,
        reply: bytes,
        reply_auth: str | None,
    ) -> None:
        """Raise ReplyAuthError unless ``reply_auth`` proves the daemon sent this reply to
        this request."""
        ...


DEFAULT_DAEMON_UIDS = frozenset({0})


class MungeAuth:
    """``Munge <credential>`` from the local munged (the Slurm-native way); replies must
    carry a credential of one of ``daemon_uids`` (root, or the SlurmUser the daemon runs as)."""

    method = "munge"

    def __init__(self, daemon_uids: frozenset[int] = DEFAULT_DAEMON_UIDS) -> None:
        self.daemon_uids = daemon_uids

    def header(self, node: str, body: bytes) -> str:
        try:
            return munge_header(node, body)
        except AuthError as exc:
            raise AgentAuthError(str(exc)) from None

    def check_reply(
        self,
        node: str,
        authorization: str,
        body: bytes,
        status: int,
        reply: bytes,
        reply_auth: str | None,
    ) -> None:
        check_munge_reply(self.daemon_uids, node, authorization, body, status, reply, reply_auth)


class HmacAuth:
    """``Sgpu-HMAC`` signed with this node's token (``wire.node_token``); replies must be
    signed with it too."""

    method = "hmac"

    def __init__(self, token: bytes) -> None:
        self._token = token

    def header(self, node: str, body: bytes) -> str:
        return hmac_header(self._token, node, body)

    def check_reply(
        self,
        node: str,
        authorization: str,
        body: bytes,
        status: int,
        reply: bytes,
        reply_auth: str | None,
    ) -> None:
        check_hmac_reply(self._token, node, authorization, body, status, reply, reply_auth)


def read_node_token(path: Path) -> bytes:
    """Return the node token in ``path``; refuse a file that group or others can read.

    The file holds ``wire.node_token(site_secret, node)`` as 64 hex digits (a trailing
    newline is fine), or as its 32 raw bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise AgentAuthError(
            f"node token file {path} does not exist and munged is not answering: "
            "start munge, or install this node's token there with mode 600"
        ) from None
    except OSError as exc:
        raise AgentAuthError(f"cannot open node token file {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o077:
            raise AgentAuthError(
                f"node token file {path} is readable by group or others "
                f"(mode {stat.S_IMODE(mode):o}): chmod 600 {path}"
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    text = data.strip()
    if len(text) == 64:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    if len(data) == 32:
        return data
    raise AgentAuthError(
        f"node token file {path} does not hold a node token (64 hex digits expected)"
    )


def choose_auth(
    mode: str, token_file: Path, daemon_uids: frozenset[int] = DEFAULT_DAEMON_UIDS
) -> Authenticator:
    """Return the authenticator for ``mode`` (``auto``: MUNGE when munged answers, else HMAC)."""
    if mode == "munge" or (mode == "auto" and munge_available()):
        return MungeAuth(daemon_uids)
    if mode not in ("auto", "hmac"):
        raise ValueError(f"unknown authentication mode {mode!r}")
    return HmacAuth(read_node_token(token_file))


class SendOutcome(enum.Enum):
    SENT = "sent"
    RETRY = "retry"  # the daemon is away or busy: keep the batch
    REJECTED = "rejected"  # the daemon refused this batch for good: drop it


@dataclass(frozen=True, slots=True)
class SendResult:
    """How one request ended; ``error`` is one line for the log (empty when sent)."""

    outcome: SendOutcome
    status: int | None = None  # HTTP status, None when no response came back
    error: str = ""
    ingest: IngestResult | None = None
    unauthenticated: bool = False  # a reply came, but not provably the daemon's

    @property
    def unreachable(self) -> bool:
        """True when no reply from the daemon came back at all (refused, reset, timed out,
        or answered by someone who is not the daemon)."""
        return self.outcome is SendOutcome.RETRY and (self.status is None or self.unauthenticated)


class JobsUnavailableError(Exception):
    """``GET /v1/nodes/<node>/jobs`` failed; ``result`` says how."""

    def __init__(self, result: SendResult) -> None:
        super().__init__(result.error)
        self.result = result


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line[:_MAX_ERROR_CHARS]


def _error_text(status: int, body: bytes) -> str:
    """Return the daemon's ``{"error": ...}`` message, else the start of the body."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return _one_line(f"HTTP {status}: {doc['error']}")
    text = body.decode(errors="replace").strip()
    return _one_line(f"HTTP {status}: {text}" if text else f"HTTP {status}")


@dataclass(frozen=True)
class Backoff:
    """How long to wait after ``failures`` failed attempts in a row: exponential from
    ``base_s`` to ``cap_s``, drawn between half and all of it (jitter)."""

    base_s: float = 2.0
    cap_s: float = 300.0

    def delay(self, failures: int, rng: random.Random) -> float:
        if failures <= 0 or self.base_s <= 0:
            return 0.0
        return rng.uniform(0.5, 1.0) * min(self.cap_s, self.base_s * 2.0 ** min(failures - 1, 32))


def _retry_after(value: str | None) -> float:
    """Seconds from a ``Retry-After`` header (a number; a date or junk counts as 0)."""
    try:
        return max(0.0, min(float(value or 0), 3600.0))
    except ValueError:
        return 0.0


class DaemonClient:
    """Talks to the daemon at ``base_url`` as ``node``.

    ``backoff``: how long to hold off after failed attempts (``None``: never);
    ``reauth``: makes the credentials anew after a 401/403 (``choose_auth`` again).

    >>> client = DaemonClient("http://127.0.0.1:8787", "gpu1", HmacAuth(b"t"))  # doctest: +SKIP
    >>> client.post_samples(body).outcome  # doctest: +SKIP
    <SendOutcome.SENT: 'sent'>
    """

    def __init__(
        self,
        base_url: str,
        node: str,
        auth: Authenticator,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        backoff: Backoff | None = None,
        reauth: Callable[[], Authenticator] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"{base_url!r} is not an http:// or https:// URL")
        self.base_url = base_url.rstrip("/")
        self.node = node
        self.auth = auth
        self.timeout_s = timeout_s
        self.backoff = backoff
        self.reauth = reauth
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        self._retry_after_s = 0.0
        self.failures = 0  # failed attempts in a row
        self.retry_at = 0.0  # clock() before which nothing is sent
        self._last_error = ""
        self._credentials_error: str | None = None
        self._impostor_error: str | None = None  # logged once until the daemon signs again
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _request(self, method: str, path: str, body: bytes) -> tuple[SendResult, bytes]:
        """One request unless backing off; record how it ended for the backoff."""
        now = self._clock()
        if now < self.retry_at:
            wait = f"backing off {self.retry_at - now:.0f}s after {self.failures} failed attempt(s)"
            return SendResult(SendOutcome.RETRY, None, f"{wait}: {self._last_error}"), b""
        result, payload, retry_after = self._attempt(method, path, body)
        if result.unauthenticated:
            if result.error != self._impostor_error:
                log.error(
                    "%s answered %s %s without proving it is the daemon (%s); keeping "
                    "batches, backing off",
                    self.base_url,
                    method,
                    path,
                    result.error,
                )
                self._impostor_error = result.error
        elif result.outcome is not SendOutcome.RETRY and self._impostor_error is not None:
            log.info("daemon %s signs its replies again", self.base_url)
            self._impostor_error = None
        if result.outcome is SendOutcome.RETRY:
            self.failures += 1
            self._last_error = result.error
            delay = self.backoff.delay(self.failures, self._rng) if self.backoff else 0.0
            self.retry_at = self._clock() + max(delay, retry_after)
            if result.status in _CREDENTIALS_REFUSED:
                self._recheck_credentials(result.error)
        else:
            self.failures = 0
            self.retry_at = 0.0
            if self._credentials_error is not None and result.outcome is SendOutcome.SENT:
                log.info("daemon %s takes this node's credentials again", self.base_url)
                self._credentials_error = None
        return result, payload

    def _recheck_credentials(self, error: str) -> None:
        """After a 401/403: say so once, and make the credentials anew (a rotated token
        file, munged started or stopped since)."""
        if error != self._credentials_error:
            log.error(
                "daemon %s refused this node's credentials (%s); keeping batches and "
                "retrying with backoff, credentials re-read each time",
                self.base_url,
                error,
            )
            self._credentials_error = error
        if self.reauth is None:
            return
        try:
            fresh = self.reauth()
        except AgentAuthError as exc:
            log.error("cannot make new credentials: %s", exc)
            return
        if fresh.method != self.auth.method:
            log.warning("agent authentication is now %s (was %s)", fresh.method, self.auth.method)
        self.auth = fresh

    def _attempt(self, method: str, path: str, body: bytes) -> tuple[SendResult, bytes, float]:
        """Do one request; return how it ended, the response body (when 200) and the
        daemon's Retry-After in seconds (0 when none)."""
        result, payload = self._attempt_once(method, path, body)
        return result, payload, self._retry_after_s

    def _attempt_once(self, method: str, path: str, body: bytes) -> tuple[SendResult, bytes]:
        self._retry_after_s = 0.0
        try:
            authorization = self.auth.header(self.node, body)
        except AgentAuthError as exc:
            # munged hiccups are transient (restart, full queue): keep the data.
            return SendResult(SendOutcome.RETRY, None, _one_line(str(exc))), b""
        headers = {"Authorization": authorization, "User-Agent": "slurmgpu-agent"}
        if method == "POST":
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked in __init__
            self.base_url + path,
            data=body if method == "POST" else None,
            headers=headers,
            method=method,
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                status = int(response.status)
                payload = response.read(_MAX_RESPONSE_BYTES)
                reply_auth = response.headers.get(REPLY_HEADER)
        except urllib.error.HTTPError as exc:
            status = exc.code
            try:
                error_body = exc.read(64 * 1024)
            except (OSError, http.client.HTTPException):
                error_body = b""
            finally:
                exc.close()
            text = _error_text(status, error_body)
            self._retry_after_s = _retry_after(
                exc.headers.get("Retry-After") if exc.headers else None
            )
            if status >= 500 or status in _RETRYABLE_STATUS or status in _CREDENTIALS_REFUSED:
                return SendResult(SendOutcome.RETRY, status, text), b""
            # Dropping the batch for good needs the daemon's word for it.
            reply_auth = exc.headers.get(REPLY_HEADER) if exc.headers else None
            if (
                bad := self._check(authorization, body, status, error_body, reply_auth)
            ) is not None:
                return bad, b""
            return SendResult(SendOutcome.REJECTED, status, text), b""
        except TimeoutError:
            return SendResult(SendOutcome.RETRY, None, f"no answer within {self.timeout_s:g}s"), b""
        except urllib.error.URLError as exc:
            reason = exc.reason
            why = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
            return SendResult(SendOutcome.RETRY, None, _one_line(str(why))), b""
        except (OSError, http.client.HTTPException) as exc:  # reset, bad status line, ...
            error = _one_line(f"{type(exc).__name__}: {exc}")
            return SendResult(SendOutcome.RETRY, None, error), b""
        if (bad := self._check(authorization, body, status, payload, reply_auth)) is not None:
            return bad, b""
        if status != 200:
            return SendResult(SendOutcome.REJECTED, status, f"unexpected HTTP {status}"), b""
        return SendResult(SendOutcome.SENT, status), payload

    def _check(
        self, authorization: str, body: bytes, status: int, reply: bytes, reply_auth: str | None
    ) -> SendResult | None:
        """None when the reply provably comes from the daemon for this request, else the
        RETRY it amounts to (nothing is deleted on the word of an impostor)."""
        try:
            self.auth.check_reply(self.node, authorization, body, status, reply, reply_auth)
        except ReplyAuthError as exc:
            return SendResult(SendOutcome.RETRY, status, _one_line(str(exc)), unauthenticated=True)
        return None

    def post_samples(self, body: bytes) -> SendResult:
        """POST one encoded ``SampleBatch``; never raises."""
        result, payload = self._request("POST", "/v1/samples", body)
        if result.outcome is not SendOutcome.SENT:
            return result
        try:
            ingest = msgspec.json.decode(payload, type=IngestResult)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # The batch was taken (200); an odd reply is not a reason to send it again.
            log.debug("daemon answered 200 with an unexpected body: %r", payload[:200])
            ingest = None
        return SendResult(SendOutcome.SENT, result.status, ingest=ingest)

    def fetch_jobs(self) -> NodeJobs:
        """Return the jobs the daemon says run on this node; raise JobsUnavailableError."""
        result, payload = self._request("GET", f"/v1/nodes/{quote(self.node, safe='')}/jobs", b"")
        if result.outcome is not SendOutcome.SENT:
            raise JobsUnavailableError(result)
        try:
            jobs = msgspec.json.decode(payload, type=NodeJobs)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise JobsUnavailableError(
                SendResult(SendOutcome.REJECTED, result.status, _one_line(f"bad job list: {exc}"))
            ) from None
        if jobs.node != self.node:
            raise JobsUnavailableError(
                SendResult(
                    SendOutcome.REJECTED,
                    result.status,
                    f"daemon sent the jobs of node {jobs.node[:64]!r}, not {self.node!r}",
                )
            )
        return jobs

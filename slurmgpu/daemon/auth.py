"""Who is calling the daemon's API: the Authorization header checked (node tokens, MUNGE
credentials), the caller allowed to speak for a node, and the reply signed for it.

A request's credentials are checked in full from its headers before its body is read (a
token header signs the body's length and digest; a MUNGE credential is decoded), so an
unauthenticated request costs the daemon its headers and no more. Every reply to an
authenticated agent request carries the daemon's signature bound to that request
(``slurmgpu.replyauth``): agents delete spooled batches only on such a reply.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from slurmgpu.replyauth import hmac_reply, munge_reply
from slurmgpu.wire import (
    AuthError,
    Caller,
    body_digest,
    decode_munge,
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

"""The daemon's signed replies: how an agent knows the daemon, not whoever holds its port,
took a batch, before the agent deletes it from its spool.

Every reply to an authenticated agent request (everything but a 401, and the 503s sent
before the request's credentials were checked) carries one ``Sgpu-Reply`` header that
binds, for the node that asked:

- the request: the SHA-256 of its ``Authorization`` header, unique per request (a token
  header holds a fresh nonce; munged never makes the same credential twice), so a reply
  captured earlier does not fit a later request, even one resending the same batch;
- the request body's SHA-256, the reply's status and the reply body's SHA-256.

Two forms, the same as the request's:

- ``Sgpu-HMAC sig=<hex>``: HMAC-SHA256 with the node's token, which the daemon derives
  from its site secret. Only the daemon and that node hold the token.
- ``Munge <credential>``: a MUNGE credential made by the daemon, payload the same
  message. The agent decodes it with its own munged (which refuses a replayed credential)
  and checks the credential's uid is one the daemon runs as (``--daemon-uid``, root by
  default): every host sharing the MUNGE key can make credentials, but only for its
  own uid, so a user who binds the daemon's port cannot make one as root or SlurmUser.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection

from slurmgpu.wire import AuthError, body_digest, munge_encode, unmunge

REPLY_HEADER = "Sgpu-Reply"


class ReplyAuthError(AuthError):
    """A reply that does not prove it came from the daemon, for this request."""


def reply_message(
    node: str, authorization: str, request_body: bytes, status: int, reply_body: bytes
) -> bytes:
    request_id = hashlib.sha256(authorization.encode()).hexdigest()
    return (
        f"sgpu-reply\n{node}\n{request_id}\n{body_digest(request_body)}\n{status}\n"
        f"{body_digest(reply_body)}"
    ).encode()


def hmac_reply(
    token: bytes,
    node: str,
    authorization: str,
    request_body: bytes,
    status: int,
    reply_body: bytes,
) -> str:
    """The ``Sgpu-Reply`` header value of a reply to a token-authenticated request."""
    message = reply_message(node, authorization, request_body, status, reply_body)
    return "Sgpu-HMAC sig=" + hmac.new(token, message, hashlib.sha256).hexdigest()


def munge_reply(
    node: str,
    authorization: str,
    request_body: bytes,
    status: int,
    reply_body: bytes,
    *,
    timeout_s: float = 5.0,
) -> str:
    """The ``Sgpu-Reply`` header value of a reply to a MUNGE-authenticated request."""
    message = reply_message(node, authorization, request_body, status, reply_body)
    return "Munge " + munge_encode(message, timeout_s=timeout_s)


def check_hmac_reply(
    token: bytes,
    node: str,
    authorization: str,
    request_body: bytes,
    status: int,
    reply_body: bytes,
    header: str | None,
) -> None:
    """Raise ReplyAuthError unless ``header`` signs this reply to this request."""
    if not header:
        raise ReplyAuthError(f"HTTP {status} without the daemon's {REPLY_HEADER} signature")
    expected = hmac_reply(token, node, authorization, request_body, status, reply_body)
    if not hmac.compare_digest(expected.encode(), header.strip().encode()):
        raise ReplyAuthError(f"HTTP {status} whose signature does not fit this request")


def check_munge_reply(
    daemon_uids: Collection[int],
    node: str,
    authorization: str,
    request_body: bytes,
    status: int,
    reply_body: bytes,
    header: str | None,
    *,
    timeout_s: float = 5.0,
) -> None:
    """Raise ReplyAuthError unless ``header`` is a fresh credential of a daemon uid that
    binds this reply to this request."""
    if not header or not header.startswith("Munge "):
        raise ReplyAuthError(f"HTTP {status} without the daemon's {REPLY_HEADER} credential")
    try:
        cred = unmunge(header.removeprefix("Munge "), timeout_s=timeout_s)
    except AuthError as exc:
        raise ReplyAuthError(f"HTTP {status} with a bad reply credential ({exc})") from None
    if cred.uid not in daemon_uids:
        raise ReplyAuthError(
            f"HTTP {status} signed by uid {cred.uid}, not the daemon's "
            f"({', '.join(str(u) for u in sorted(daemon_uids))})"
        )
    expected = reply_message(node, authorization, request_body, status, reply_body)
    if not hmac.compare_digest(cred.payload.encode(), expected):
        raise ReplyAuthError(f"HTTP {status} whose credential does not fit this request")

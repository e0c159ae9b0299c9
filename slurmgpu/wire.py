"""The agent ↔ daemon wire format and its authentication, shared by both sides.

Payloads are JSON decoded with msgspec into the structs below (unknown fields refused,
types checked, sizes bounded). Every request carries one ``Authorization`` header:

- ``Munge <credential>``: a MUNGE credential (the Slurm-native way) whose payload is
  ``"<node>\\n<sha256 of the body>"``. The daemon decodes it with ``unmunge``: munged
  checks it was made on a host sharing the key, refuses replays and gives the uid.
- ``Sgpu-HMAC node=<node>,ts=<epoch>,nonce=<hex>,len=<bytes>,sha256=<hex>,sig=<hex>``: when
  munged is not running. Each node holds only its own token, ``HMAC(site_secret, "node:" +
  node)``, in a 0600 file, and signs ``ts, node, nonce, body length, sha256(body)`` with it;
  the daemon, which holds the site secret, recomputes the token, so a node can only speak
  for itself. The header names the body's length and digest, so the daemon verifies the
  signature, and the length against its limits, before it reads a byte of the body; then
  it reads exactly that many bytes and checks the digest. The nonce makes every request's
  header unique, so the daemon's signed reply (``slurmgpu.replyauth``) is bound to it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_SAMPLES_PER_BATCH = 20_000
HMAC_MAX_SKEW_S = 300
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


# No control characters: PostgreSQL refuses NUL in text, and a batch the store cannot take
# would be answered 503 and resent for ever.
Uid = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
Epoch = Annotated[float, msgspec.Meta(gt=1e9, lt=1e11)]  # 2001 … 5138
Amount = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
Source = Literal["process", "device", "idle", "error"]
# Bounded so every id fits the store's 64-bit integers (a bigger one would fail the
# insert, not the validation).
JobId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]

# Bounds are declared on the types so msgspec checks them in C while decoding: validating
# 20,000 samples a second in Python loops would cost more than storing them.


class GpuSampleIn(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One job's use of one GPU at one instant, as the agent attributed it."""

    sample_uid: Uid
    at: Epoch  # epoch seconds
    gpu_index: Annotated[int, msgspec.Meta(ge=0, lt=1024)]  # Slurm's device index on the node
    job_id: JobId | None = None  # None: unattributed/unallocated
    util_pct: Annotated[float, msgspec.Meta(ge=0, le=100)] | None = None
    memory_used_mib: Amount | None = None
    memory_total_mib: Amount | None = None
    power_w: Amount | None = None
    temperature_c: Annotated[float, msgspec.Meta(ge=-100, le=300)] | None = None
    processes: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 0
    shared: bool = False
    source: Source = "device"
    # The device's NVML total-energy counter, mJ since the driver was loaded (Volta+).
    energy_mj: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None


class HostSampleIn(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One job's CPU and memory on this node at one instant."""

    sample_uid: Uid
    at: Epoch
    job_id: JobId
    cpu_pct: Amount | None = None  # 100 = one core busy
    cpus_allocated: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None = None
    rss_mib: Amount | None = None
    cgroup_memory_mib: Amount | None = None
    # Percent of one process's time the job's processes waited for block I/O (None: the
    # kernel's delay accounting is off).
    iowait_pct: Amount | None = None


class SampleBatch(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What an agent POSTs to ``/v1/samples``."""

    node: Annotated[str, msgspec.Meta(pattern=NODE_NAME)]
    gpu: list[GpuSampleIn] = []
    host: list[HostSampleIn] = []
    agent: Annotated[str, msgspec.Meta(max_length=128)] = ""
    dropped: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = (
        0  # samples the agent's spool dropped so far
    )


class NodeJob(msgspec.Struct, frozen=True):
    """A running job on a node, as ``GET /v1/nodes/<node>/jobs`` reports it."""

    job_id: int
    gpu_indices: list[int]
    shard_indices: list[int]
    shards: int
    cpus: int
    user: str = ""
    mps_indices: list[int] = []  # GPUs whose SMs it shares through MPS; absent: none


class NodeJobs(msgspec.Struct, frozen=True):
    node: str
    jobs: list[NodeJob]


class IngestResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """The reply to a batch (200). Refused samples are left out for good (stamped in the
    future, a job that did not run there, a GPU the node lacks): the batch is not to be
    sent again. ``held``: of ``accepted``, samples of jobs the daemon has not seen yet,
    counted once Slurm lists the job and they fit its run."""

    accepted: int
    duplicates: int
    held: int = 0
    refused: int = 0


class JobStatus(msgspec.Struct, frozen=True):
    """One job as ``GET /v1/jobs`` shows it to its owner (or an admin)."""

    job_id: str  # "123" or "120_3" for an array task
    user: str
    state: str
    name: str
    partition: str
    nodes: list[str]
    gpus: int


class JobsStatus(msgspec.Struct, frozen=True):
    """``GET /v1/jobs``: the caller's jobs (every job, or ``?user=``, for an admin)."""

    caller_uid: int
    admin: bool
    jobs: list[JobStatus]


class WireError(ValueError):
    """A payload that does not match the schema, in one line."""


_QUOTED_LONG = re.compile(r"'([^']{61,})'")
_MAX_LINE = 400


def _line(exc: Exception) -> str:
    """The decoder's message on one line: it quotes field names, paths and values from
    the payload, which may hold newlines or other control characters, and may be long
    (an enum value of 5,000 digits): a quoted value is shortened to 60 characters, so
    the path after it (`` - at `$.gpu[3].source` ``) stays in the message."""
    text = _QUOTED_LONG.sub(lambda m: f"'{m.group(1)[:57]}...'", str(exc))
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= _MAX_LINE else text[: _MAX_LINE - 3] + "..."


_BATCH_DECODER = msgspec.json.Decoder(SampleBatch)


def decode_batch(body: bytes) -> SampleBatch:
    """Return the validated batch in ``body`` or raise WireError saying what is wrong."""
    if len(body) > MAX_BODY_BYTES:
        raise WireError(f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    try:
        batch = _BATCH_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise WireError(f"invalid batch: {_line(exc)}") from None
    except msgspec.DecodeError as exc:
        raise WireError(f"not JSON: {_line(exc)}") from None
    if len(batch.gpu) + len(batch.host) > MAX_SAMPLES_PER_BATCH:
        raise WireError(f"more than {MAX_SAMPLES_PER_BATCH} samples in one batch")
    return batch


def encode(obj: object) -> bytes:
    return msgspec.json.encode(obj)


# -- authentication ---------------------------------------------------------------


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def node_token(site_secret: bytes, node: str) -> bytes:
    """Return the token a node signs with; derived, so the site secret never leaves the daemon."""
    return hmac.new(site_secret, b"node:" + node.encode(), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class HmacClaim:
    """What an ``Sgpu-HMAC`` header says, before its signature is checked."""

    node: str
    ts: int
    nonce: str
    length: int
    digest: str
    sig: str

    def message(self) -> bytes:
        return (
            f"sgpu-request\n{self.ts}\n{self.node}\n{self.nonce}\n{self.length}\n{self.digest}"
        ).encode()


_HMAC_HEADER = re.compile(
    r"Sgpu-HMAC node=([^,\s]{1,128}),ts=(\d{1,12}),nonce=([0-9a-f]{32}),len=(\d{1,12}),"
    r"sha256=([0-9a-f]{64}),sig=([0-9a-f]{64})"
)


def hmac_header(
    token: bytes, node: str, body: bytes, *, now: float | None = None, nonce: str | None = None
) -> str:
    """The ``Authorization`` header of one request: a fresh nonce each call."""
    claim = HmacClaim(
        node=node,
        ts=int(time.time() if now is None else now),
        nonce=secrets.token_hex(16) if nonce is None else nonce,
        length=len(body),
        digest=body_digest(body),
        sig="",
    )
    sig = hmac.new(token, claim.message(), hashlib.sha256).hexdigest()
    return (
        f"Sgpu-HMAC node={node},ts={claim.ts},nonce={claim.nonce},len={claim.length},"
        f"sha256={claim.digest},sig={sig}"
    )


class AuthError(Exception):
    """The request is not authenticated, or not for the node it claims."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request, as authentication proved it."""

    node: str
    method: str  # "munge" | "hmac"
    uid: int | None = None
    host_addr: str | None = None


def parse_hmac(header: str) -> HmacClaim:
    m = _HMAC_HEADER.fullmatch(header.strip())
    if not m:
        raise AuthError("malformed Sgpu-HMAC authorization header")
    return HmacClaim(
        node=m.group(1),
        ts=int(m.group(2)),
        nonce=m.group(3),
        length=int(m.group(4)),
        digest=m.group(5),
        sig=m.group(6),
    )


def verify_hmac_header(
    header: str, site_secret: bytes, *, now: float | None = None
) -> tuple[Caller, HmacClaim]:
    """Check an ``Sgpu-HMAC`` header alone (before the body is read): its form, freshness and
    signature; the body it names is checked against it by :func:`check_body`."""
    claim = parse_hmac(header)
    current = time.time() if now is None else now
    if abs(current - claim.ts) > HMAC_MAX_SKEW_S:
        raise AuthError(
            f"signature timestamp is {current - claim.ts:+.0f}s off (clock skew or replay)"
        )
    token = node_token(site_secret, claim.node)
    expected = hmac.new(token, claim.message(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, claim.sig):
        raise AuthError(f"bad signature for node {claim.node}")
    return Caller(node=claim.node, method="hmac"), claim


def check_body(claim: HmacClaim, body: bytes) -> None:
    """Raise AuthError unless ``body`` is the one the signed header names."""
    if len(body) != claim.length or not hmac.compare_digest(body_digest(body), claim.digest):
        raise AuthError("body does not match the signed length and digest")


def verify_hmac(
    header: str, body: bytes, site_secret: bytes, *, now: float | None = None
) -> Caller:
    caller, claim = verify_hmac_header(header, site_secret, now=now)
    check_body(claim, body)
    return caller


def munge_encode(payload: bytes, *, timeout_s: float = 10.0) -> str:
    """Return a MUNGE credential carrying ``payload`` (runs the ``munge`` client)."""
    try:
        proc = subprocess.run(
            ["munge"], input=payload, capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AuthError(f"munge failed: {exc}") from None
    if proc.returncode != 0:
        raise AuthError(f"munge failed: {proc.stderr.decode(errors='replace').strip()[:200]}")
    return proc.stdout.decode().strip()


def munge_header(node: str, body: bytes, *, timeout_s: float = 10.0) -> str:
    """Return a ``Munge`` authorization header (runs the ``munge`` client)."""
    payload = f"{node}\n{body_digest(body)}".encode()
    return "Munge " + munge_encode(payload, timeout_s=timeout_s)


def verify_munge(header: str, body: bytes, *, timeout_s: float = 10.0) -> Caller:
    """Decode a ``Munge`` header with ``unmunge``; check the payload binds node and body."""
    caller, digest = decode_munge(header, timeout_s=timeout_s)
    if digest != body_digest(body):
        raise AuthError("MUNGE credential does not match the request body")
    return caller


@dataclass(frozen=True, slots=True)
class MungeCredential:
    """A credential as ``unmunge`` decoded it: who made it, where, and its payload."""

    uid: int | None
    host_addr: str | None
    payload: str


def unmunge(credential: str, *, timeout_s: float = 10.0) -> MungeCredential:
    """Decode one credential with ``unmunge`` (munged refuses one decoded twice: a replay)."""
    cred = credential.strip()
    if not re.fullmatch(r"MUNGE:[A-Za-z0-9+/=:_-]{16,4096}", cred):
        raise AuthError("malformed MUNGE credential")
    try:
        proc = subprocess.run(
            ["unmunge"], input=cred.encode(), capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AuthError(f"unmunge failed: {exc}") from None
    text = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        err = (proc.stderr.decode(errors="replace").strip() or text.strip()).splitlines()
        raise AuthError(f"MUNGE credential rejected: {err[0][:200] if err else proc.returncode}")
    head, _, payload = text.partition("\n\n")
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in head.splitlines())
    )
    uid_m = re.search(r"\((\d+)\)", fields.get("UID", ""))
    addr_m = re.search(r"\(([^)]+)\)", fields.get("ENCODE_HOST", ""))
    return MungeCredential(
        uid=int(uid_m.group(1)) if uid_m else None,
        host_addr=addr_m.group(1) if addr_m else None,
        payload=payload.rstrip("\n"),
    )


def decode_munge(header: str, *, timeout_s: float = 10.0) -> tuple[Caller, str]:
    """Decode a ``Munge`` header with ``unmunge`` (before the body is read): the caller it
    proves, and the body digest its payload binds (checked by the caller against the body).
    munged refuses a credential decoded twice (replay), so decode each request once."""
    cred = unmunge(header.strip().removeprefix("Munge").strip(), timeout_s=timeout_s)
    node, _, digest = cred.payload.partition("\n")
    caller = Caller(node=node, method="munge", uid=cred.uid, host_addr=cred.host_addr)
    return caller, digest


def munge_available(timeout_s: float = 5.0) -> bool:
    """True when a local munged answers (``munge -n | unmunge`` works)."""
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=timeout_s, check=False)
        if cred.returncode != 0:
            return False
        ok = subprocess.run(
            ["unmunge"], input=cred.stdout, capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ok.returncode == 0


def write_secret(path: Path, data: bytes) -> None:
    """Write a secret file 0600 atomically (never world-readable, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_or_create_site_secret(path: Path) -> bytes:
    """Return the daemon's site secret, creating a random one (0600) on first use."""
    if path.exists():
        mode = path.stat().st_mode & 0o077
        if mode:
            raise AuthError(
                f"{path} is readable by others "
                f"(mode {oct(path.stat().st_mode & 0o777)}); chmod 600 it"
            )
        data = path.read_bytes().strip()
        if len(data) < 32:
            raise AuthError(f"{path} holds a secret shorter than 32 bytes")
        return data
    secret = secrets.token_hex(32).encode()
    write_secret(path, secret)
    return secret

"""Decode ``squeue --json`` / ``sinfo --json`` (Slurm 22.05 … 26.05) into model objects.

Pure functions, no subprocess: :func:`decode_squeue` and :func:`decode_sinfo` (re-exported
by ``slurmgpu.slurm.cli``) are what the CLI backend, the daemon's replay, the tests and
the benchmark call.

Versions covered (Slurm's ``data_parser`` plugin, named in ``meta``):

* ``v0.0.38`` (22.05, ``meta.plugin.type = "openapi/v0.0.38"``, ``meta.Slurm``): plain
  integers, ``job_state`` a string that may be a flag alone (``"COMPLETING"``),
  ``time_limit`` minutes or ``null``, times epoch seconds with 0 for unset,
  ``exit_code`` the raw wait status, ``tres_per_node`` like ``"gres:gpu:2"``, node
  ``state`` a lower-case base (``"mixed"``) plus ``state_flags``.
* ``v0.0.39`` … ``v0.0.42`` (23.02 … 24.11, ``meta.plugin.data_parser``, ``meta.slurm``):
  numbers wrapped as ``{"set", "infinite", "number"}``, ``job_state`` a list
  (``["PENDING", "REQUEUED"]``), ``exit_code`` an object with ``return_code``/``signal``,
  ``tres_per_*`` like ``"gres/gpu:2"``, node ``state`` a list (``["IDLE", "DRAIN"]``),
  ``job_resources.nodes`` an object (not read here). From 23.11 ``sinfo --json`` prints
  ``"sinfo"`` records (one per node and partition with ``--Node``) instead of ``"nodes"``;
  both shapes are read, and ``scontrol show nodes --json`` (``"nodes"``) works too.
* ``v0.0.43`` … ``v0.0.45`` (25.05 … 26.05; 26.05 prints v0.0.42 … v0.0.45, default
  v0.0.45): no field slurmgpu reads changed shape (SchedMD's OpenAPI release notes for
  25.05, 25.11 and 26.05: enums written inline instead of as named schemas, new fields
  such as ``segment_size``, ``step_id``, ``submit_line``, ``memory_update_delay``; node
  ``tres_weighted`` removed; node states ``BLOCKED``, ``POWER_DOWN_ASAP``,
  ``POWER_DOWN_FORCE`` added, read as flags). What changed is in the values: 26.05
  prints a node's shard usage on a GPU held by a whole-GPU job as ``-/4``
  (``shard:6(-/4,-/4,2/4,4/4)``), read by :func:`slurmgpu.slurm.parse.parse_gres`.

Decoding is per record. ``squeue``: the document is scanned with each job record kept
as raw bytes, then each record is decoded on its own (with a memo, only those whose bytes
changed since the last listing: :func:`decode_squeue`). ``sinfo``: the document is first
decoded in one pass; if that fails on a record's shape or bytes, it is decoded again with
each node record on its own. A bad record is skipped with a counted warning
(:mod:`slurmgpu.slurm.decode_stats`, ``/metrics``) while the rest of the listing is
used. Invalid UTF-8 in a string (a job name any user can set) is decoded with U+FFFD in
its place, as are lone UTF-16 surrogate escapes. A data_parser version outside
:data:`KNOWN_DATA_PARSERS` is decoded where it can be, with one warning per process.

Only the fields slurmgpu uses are declared in the ``msgspec`` schemas, so unknown fields
are skipped without building Python objects; unions (``int | Num | None``,
``str | list[str]``) absorb the differences between versions. A document of an unknown
data_parser version is accepted when its shape is compatible.

Normalisation choices (see also :class:`slurmgpu.model.Job`):

* 0 / unset / infinite numbers become ``None``; ``array_job_id`` 0 means "not an array";
  ``array_max_tasks`` 0 means "no throttle" (``None``).
* ``end_time`` of a running job is Slurm's projection (start + time limit) and
  ``start_time`` of a pending job its expected start, when Slurm has one: both are kept.
* ``memory_mib`` is the job total: ``memory_per_node`` x nodes, else
  ``memory_per_cpu`` x cpus, else the ``mem=`` of ``tres_alloc_str``/``tres_req_str``.
* ``exit_code``: v0.0.38's raw wait status and newer ``return_code``/``signal`` are both
  turned into a shell-style code (status, or 128 + signal); ``None`` while pending.
* ``GpuRequest.gpus`` is the best whole-GPU total: ``tres_per_job``, else
  ``tres_per_node`` x nodes, else ``tres_per_task`` x tasks, else ``tres_per_socket`` x
  sockets per node x nodes, else ``gres/gpu`` in ``tres_alloc_str``/``tres_req_str``,
  else what ``gres_detail`` shows allocated. Shards likewise.
* ``gpu_allocations`` pairs each allocated node (hostlist order) with its
  ``gres_detail`` entry (Slurm prints one per node, in node order).
* A value that does not parse inside an otherwise well-formed document (a GRES string of
  a future Slurm) is logged and left empty rather than failing the whole listing; a wrong
  *shape* of the document (not JSON, no ``jobs``) raises :class:`SlurmParseError`; a
  wrong shape of one record skips that record.
"""

from __future__ import annotations

import gc
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final, TypeVar

import msgspec

from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.slurm import decode_stats
from slurmgpu.slurm.client import SlurmCommandError, SlurmParseError, SlurmUnavailableError
from slurmgpu.slurm.parse import (
    GresItem,
    SlurmValueError,
    expand_hostlist,
    parse_gres_lenient,
    parse_job_state,
    parse_tres,
)

__all__ = [
    "KNOWN_DATA_PARSERS",
    "JobMemo",
    "JobRecord",
    "NodeRecord",
    "SinfoDocument",
    "SinfoRecord",
    "SqueueDocument",
    "data_parser_version",
    "decode_sinfo",
    "decode_squeue",
    "job_from_record",
    "node_from_record",
]

log = logging.getLogger("slurmgpu.slurm")

KNOWN_DATA_PARSERS: Final = (
    "v0.0.38",
    "v0.0.39",
    "v0.0.40",
    "v0.0.41",
    "v0.0.42",
    "v0.0.43",
    "v0.0.44",
    "v0.0.45",
)

# --------------------------------------------------------------------------- schemas


class Num(msgspec.Struct, gc=False):
    """data_parser v0.0.39+ ``{"set": bool, "infinite": bool, "number": n}``."""

    set: bool = True
    infinite: bool = False
    number: int | float | None = None


IntLike = int | float | Num | None
Flag = bool | int | None


class ExitSignal(msgspec.Struct, gc=False):
    id: IntLike = None
    signal_id: IntLike = None
    name: str | None = None


class ExitCode(msgspec.Struct, gc=False):
    """v0.0.39+ ``exit_code``: ``{"status": [...], "return_code": n, "signal": {...}}``."""

    status: list[str] | str | None = None
    return_code: IntLike = None
    signal: ExitSignal | None = None


class JobRecord(msgspec.Struct, gc=False):
    """The fields of one ``squeue --json`` job that slurmgpu reads (all versions)."""

    job_id: int | Num
    name: str | None = None
    user_name: str | None = None
    user_id: IntLike = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    job_state: str | list[str] | None = None
    state_reason: str | None = None
    array_job_id: IntLike = None
    array_task_id: IntLike = None
    array_task_string: str | None = None
    array_max_tasks: IntLike = None
    submit_time: IntLike = None
    eligible_time: IntLike = None
    start_time: IntLike = None
    end_time: IntLike = None
    time_limit: IntLike = None
    time_minimum: IntLike = None
    cpus: IntLike = None
    node_count: IntLike = None
    tasks: IntLike = None
    memory_per_node: IntLike = None
    memory_per_cpu: IntLike = None
    sockets_per_node: IntLike = None
    tres_per_node: str | None = None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    tres_per_socket: str | None = None
    tres_req_str: str | None = None
    tres_alloc_str: str | None = None
    nodes: str | None = None
    gres_detail: list[str] | None = None
    restart_cnt: IntLike = None
    nice: IntLike = None
    priority: IntLike = None
    requeue: Flag = None
    comment: str | None = None
    admin_comment: str | None = None
    current_working_directory: str | None = None
    command: str | None = None
    exit_code: int | ExitCode | None = None
    batch_flag: Flag = None


class Plugin(msgspec.Struct, gc=False):
    type: str | None = None
    name: str | None = None
    data_parser: str | None = None


class SlurmVersion(msgspec.Struct, gc=False):
    major: int | str | None = None
    minor: int | str | None = None
    micro: int | str | None = None


class SlurmInfo(msgspec.Struct, gc=False):
    version: SlurmVersion | None = None
    release: str | None = None


class Meta(msgspec.Struct, gc=False):
    plugin: Plugin | None = None
    slurm_v38: SlurmInfo | None = msgspec.field(default=None, name="Slurm")
    slurm: SlurmInfo | None = None


class ErrorItem(msgspec.Struct, gc=False):
    description: str | None = None
    error: str | None = None
    error_number: IntLike = None
    errno: IntLike = None
    source: str | None = None


class SqueueDocument(msgspec.Struct, gc=False):
    meta: Meta | None = None
    errors: list[ErrorItem | str] | None = None
    jobs: list[JobRecord] | None = None


class _RawSqueueDocument(msgspec.Struct, gc=False):
    """The fallback shape: each job record kept as raw JSON, decoded on its own."""

    meta: Meta | None = None
    errors: list[ErrorItem | str] | None = None
    jobs: list[msgspec.Raw] | None = None


class NodeRecord(msgspec.Struct, gc=False):
    """One node of 22.05 ``sinfo --json`` / ``scontrol show nodes --json`` / slurmrestd."""

    name: str
    state: str | list[str] | None = None
    state_flags: list[str] | None = None
    cpus: IntLike = None
    alloc_cpus: IntLike = None
    real_memory: IntLike = None
    alloc_memory: IntLike = None
    gres: str | None = None
    gres_used: str | None = None
    partitions: list[str] | str | None = None
    reason: str | None = None
    address: str | None = None


class SinfoNodeState(msgspec.Struct, gc=False):
    state: list[str] | str | None = None


class SinfoNodes(msgspec.Struct, gc=False):
    nodes: list[str] | str | None = None
    addresses: list[str] | str | None = None


class SinfoCpus(msgspec.Struct, gc=False):
    allocated: IntLike = None
    total: IntLike = None
    maximum: IntLike = None


class SinfoMemory(msgspec.Struct, gc=False):
    minimum: IntLike = None
    maximum: IntLike = None
    allocated: IntLike = None


class SinfoGres(msgspec.Struct, gc=False):
    total: str | None = None
    used: str | None = None


class SinfoPartition(msgspec.Struct, gc=False):
    name: str | None = None


class SinfoReason(msgspec.Struct, gc=False):
    description: str | None = None


class SinfoRecord(msgspec.Struct, gc=False):
    """One record of 23.11+ ``sinfo --json`` (``SINFO_DATA``): nodes of one partition."""

    node: SinfoNodeState | None = None
    nodes: SinfoNodes | None = None
    cpus: SinfoCpus | None = None
    memory: SinfoMemory | None = None
    gres: SinfoGres | None = None
    partition: SinfoPartition | None = None
    reason: str | SinfoReason | None = None


class SinfoDocument(msgspec.Struct, gc=False):
    meta: Meta | None = None
    errors: list[ErrorItem | str] | None = None
    nodes: list[NodeRecord] | None = None
    sinfo: list[SinfoRecord] | None = None


class _RawSinfoDocument(msgspec.Struct, gc=False):
    meta: Meta | None = None
    errors: list[ErrorItem | str] | None = None
    nodes: list[msgspec.Raw] | None = None
    sinfo: list[msgspec.Raw] | None = None


_SINFO_DECODER: Final = msgspec.json.Decoder(SinfoDocument)
_RAW_SQUEUE_DECODER: Final = msgspec.json.Decoder(_RawSqueueDocument)
_RAW_SINFO_DECODER: Final = msgspec.json.Decoder(_RawSinfoDocument)
_JOB_DECODER: Final = msgspec.json.Decoder(JobRecord)
_NODE_DECODER: Final = msgspec.json.Decoder(NodeRecord)
_SINFO_RECORD_DECODER: Final = msgspec.json.Decoder(SinfoRecord)

# --------------------------------------------------------------------------- helpers

_NO_VALS: Final = frozenset({0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF})


def _num(v: IntLike) -> int | None:
    """An integer from a plain number or a ``Num``; unset/infinite/NO_VAL → None."""
    if v is None:
        return None
    if type(v) is int:
        return None if v in _NO_VALS else v
    if isinstance(v, Num):
        if not v.set or v.infinite or v.number is None:
            return None
        n = int(v.number)
        return None if n in _NO_VALS else n
    if isinstance(v, float):
        return int(v)
    return int(v)


def _pos(v: IntLike) -> int | None:
    """Like :func:`_num` but 0 also means unset (times, array ids, throttles)."""
    n = _num(v)
    return n if n else None


def _time(v: IntLike) -> datetime | None:
    n = _pos(v)
    if n is None:
        return None
    try:
        return datetime.fromtimestamp(n, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _str(v: str | None) -> str:
    return v if v else ""


class _Problems:
    """Collects value-level parse problems of one document; logged once."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def add(self, where: str, exc: Exception) -> None:
        self.count += 1
        if not self.first:
            self.first = f"{where}: {exc}"

    def log(self, what: str) -> None:
        if self.count:
            decode_stats.values_unparsed(what.split(maxsplit=1)[0], self.count)
            log.warning("%s: %d value(s) did not parse; first: %s", what, self.count, self.first)


class _Skipped:
    """Records of one listing left out (bad bytes, shape or value); logged once."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def add(self, where: str, why: object) -> None:
        self.count += 1
        if not self.first:
            text = " ".join(str(why).split())
            self.first = f"{where}: {text[:200]}"

    def add_shape(self, where: str, exc: Exception, hint: str) -> None:
        """A record msgspec refused: its path is made whole (``$.jobs[3].job_id``)."""
        text = str(exc)
        if "at `$" in text:
            self.add(f"unexpected shape{hint}", text.replace("at `$", f"at `{where}"))
        else:
            self.add(f"{where}{hint}", text)

    def log(self, what: str) -> None:
        if self.count:
            decode_stats.records_skipped(what.split(maxsplit=1)[0], self.count)
            log.warning(
                "%s: %d record(s) skipped, the rest of the listing used; first: %s",
                what,
                self.count,
                self.first,
            )


_PLUGIN_RE: Final = re.compile(rb'"(?:data_parser|type)"\s*:\s*"[^"]*?(v0\.0\.\d+)"')


class _MetaOnly(msgspec.Struct, gc=False):
    meta: Meta | None = None


_META_DECODER: Final = msgspec.json.Decoder(_MetaOnly)


def _sniff_version(data: bytes | str) -> str | None:
    """The data_parser version named in ``meta`` (wherever it sits in the document)."""
    try:
        meta = _META_DECODER.decode(data).meta
    except (msgspec.ValidationError, msgspec.DecodeError):
        meta = None
    if meta is not None and meta.plugin is not None:
        for text in (meta.plugin.data_parser, meta.plugin.type):
            m = re.search(r"v0\.0\.\d+", text or "")
            if m:
                return m.group(0)
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    for chunk in (raw[:8192], raw[-8192:]):
        found = _PLUGIN_RE.search(chunk)
        if found:
            return found.group(1).decode()
    return None


def _version_hint(data: bytes | str) -> str:
    version = _sniff_version(data)
    if version and version not in KNOWN_DATA_PARSERS:
        return f" (data_parser {version} is newer than slurmgpu knows)"
    return ""


def _meta_version(meta: Meta | None) -> str | None:
    if meta is None or meta.plugin is None:
        return None
    for text in (meta.plugin.data_parser, meta.plugin.type):
        m = re.search(r"v0\.0\.\d+", text or "")
        if m:
            return m.group(0)
    return None


def _note_version(meta: Meta | None, what: str) -> None:
    """Count the data_parser version of a decoded document (one warning if unknown)."""
    version = _meta_version(meta)
    if version:
        decode_stats.note_data_parser(version, version in KNOWN_DATA_PARSERS, what)


def _release(meta: Meta | None) -> str:
    if meta is None:
        return ""
    info = meta.slurm or meta.slurm_v38
    if info is None:
        return ""
    if info.release:
        return info.release
    v = info.version
    if v is not None and v.major is not None and v.minor is not None:
        micro = v.micro if v.micro is not None else 0
        try:  # 24.11+ send strings; a damaged document may send "" or words
            return f"{int(v.major):02d}.{int(v.minor):02d}.{micro}"
        except ValueError:
            return ""  # the release is only informative: unknown, not a failed decode
    return ""


_T = TypeVar("_T")
_R = TypeVar("_R")


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many acyclic objects (a listing of 100k jobs
    otherwise triggers repeated full collections); restored even on error."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _decode(decoder: msgspec.json.Decoder[_T], data: bytes | str, what: str) -> _T:
    try:
        with _gc_paused():
            return decoder.decode(data)
    except msgspec.ValidationError as exc:
        hint = _version_hint(data)
        raise SlurmParseError(f"{what}: unexpected shape{hint}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise SlurmParseError(f"{what}: not valid JSON: {exc}") from None


# JSON escapes, to find \uD800-\uDFFF escapes that are not half of a surrogate pair
# (msgspec refuses them; Python's json writes them for lone surrogates); an escaped
# backslash is its own escape, so "\\\\uD800" (literal text) is left alone.
_ESCAPE: Final = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
# Control bytes JSON forbids raw (tab, newline and return may be whitespace: kept).
_RAW_CONTROL: Final = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _lone_surrogates_replaced(raw: bytes) -> bytes:
    spans: list[tuple[int, int]] = []
    high: tuple[int, int] | None = None  # the last high surrogate escape, if unpaired yet
    for m in _ESCAPE.finditer(raw):
        code = int(m.group(1), 16) if m.group(1) else -1
        if high is not None:
            if 0xDC00 <= code <= 0xDFFF and m.start() == high[1]:
                high = None  # a pair: fine
                continue
            spans.append(high)
            high = None
        if 0xD800 <= code <= 0xDBFF:
            high = (m.start(), m.end())
        elif 0xDC00 <= code <= 0xDFFF:
            spans.append((m.start(), m.end()))
    if high is not None:
        spans.append(high)
    if not spans:
        return raw
    out = bytearray()
    last = 0
    for a, b in spans:
        out += raw[last:a] + b"\\ufffd"
        last = b
    return bytes(out + raw[last:])


def _repaired(data: bytes | str) -> bytes | None:
    """The document with invalid UTF-8, lone surrogate escapes and raw control bytes
    made valid (U+FFFD; control bytes escaped), or None when there was nothing to do."""
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    fixed = raw.decode("utf-8", "replace").encode("utf-8")
    if b"\\u" in fixed:
        fixed = _lone_surrogates_replaced(fixed)
    fixed = _RAW_CONTROL.sub(lambda m: b"\\u%04x" % m.group(0)[0], fixed)
    return fixed if fixed != raw else None


def _decode_lenient(
    decoder: msgspec.json.Decoder[_T],
    raw_decoder: msgspec.json.Decoder[_R],
    data: bytes | str,
    what: str,
) -> tuple[_T | None, _R | None, bytes | str]:
    """The document decoded in one pass, else with its records kept raw.

    Returns ``(document, None, data)`` when the typed decode works (after repairing bad
    UTF-8 if needed), else ``(None, raw document, data)`` for per-record decoding. Raises
    :class:`SlurmParseError` when the text is not JSON at all or its top level has the
    wrong shape.
    """
    try:
        with _gc_paused():
            return decoder.decode(data), None, data
    except msgspec.ValidationError:
        pass  # a record of the wrong shape, or bytes msgspec had not reached yet
    except msgspec.DecodeError:
        data = _repair_or_raise(decoder, data, what)
        try:
            with _gc_paused():
                return decoder.decode(data), None, data
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
    try:
        with _gc_paused():
            return None, raw_decoder.decode(data), data
    except msgspec.DecodeError:
        data = _repair_or_raise(raw_decoder, data, what)
    return None, _decode(raw_decoder, data, what), data


def _repair_or_raise(decoder: msgspec.json.Decoder[_T], data: bytes | str, what: str) -> bytes:
    """``data`` with bad UTF-8 replaced (counted, one warning), or the clear parse error
    when that is not what is wrong with it."""
    fixed = _repaired(data)
    if fixed is None:
        _decode(decoder, data, what)  # raises "not valid JSON: ..."
        raise SlurmParseError(f"{what}: not valid JSON")  # (it decoded after all)
    decode_stats.values_unparsed(what.split(maxsplit=1)[0], 1)
    log.warning("%s: invalid UTF-8 in the output, decoded with replacement", what)
    return fixed


def _scan(
    decoder: msgspec.json.Decoder[_T], data: bytes | str, what: str
) -> tuple[_T, bytes | str]:
    """A document whose records are kept raw, decoded in one scan (bad UTF-8, lone
    surrogate escapes and raw control bytes repaired first when the scan trips on them);
    with the data it was decoded from. Raises :class:`SlurmParseError` when the text is
    not JSON or its top level has the wrong shape."""
    try:
        with _gc_paused():
            return decoder.decode(data), data
    except msgspec.ValidationError as exc:
        raise SlurmParseError(f"{what}: unexpected shape{_version_hint(data)}: {exc}") from None
    except msgspec.DecodeError:
        data = _repair_or_raise(decoder, data, what)
    return _decode(decoder, data, what), data


class _HintOnce:
    """:func:`_version_hint` of one document, sniffed at most once (only when a record
    is skipped: sniffing may scan the whole document)."""

    __slots__ = ("data", "text")

    def __init__(self, data: bytes | str) -> None:
        self.data = data
        self.text: str | None = None

    def __call__(self) -> str:
        if self.text is None:
            self.text = _version_hint(self.data)
        return self.text


_UNAVAILABLE_RE: Final = re.compile(
    r"contact slurm controller|connect|connection|timed? ?out|munge|authenticat|credential|"
    r"communication|socket|transmitted|unspecified error|backup controller|in standby",
    re.IGNORECASE,
)


def _errors_to_exception(
    errors: Sequence[ErrorItem | str], what: str
) -> SlurmUnavailableError | SlurmCommandError:
    """Turn Slurm's ``errors`` array (with nothing else in the answer) into our error."""
    texts: list[str] = []
    codes: list[int] = []
    for e in errors:
        if isinstance(e, str):
            texts.append(e)
            continue
        parts = [p for p in (e.description, e.error) if p]
        code = _num(e.error_number) if e.error_number is not None else _num(e.errno)
        if code is not None:
            codes.append(code)
            parts.append(f"error {code}")
        if e.source:
            parts.append(f"in {e.source}")
        texts.append(", ".join(parts) if parts else "unknown error")
    message = f"{what}: " + "; ".join(texts)
    if len(message) > 400:  # one log line, however much Slurm (or a broken proxy) said
        message = message[:397] + "..."
    message = " ".join(message.split())
    # SLURM_COMMUNICATIONS_* (1001-1008), SLURMCTLD_COMMUNICATIONS_* (1800s), socket
    # errors (5000s), auth plugin errors (6000s) and the bare -1 slurm_load_* returns when
    # it could not reach slurmctld: all mean "Slurm is not answering".
    unavailable = any(
        c == -1 or 1000 <= c < 1010 or 1800 <= c < 1900 or 5000 <= c < 7000 for c in codes
    ) or any(_UNAVAILABLE_RE.search(t) for t in texts)
    if unavailable:
        return SlurmUnavailableError(message)
    return SlurmCommandError(message)


# --------------------------------------------------------------------------- jobs


def _exit_code(v: int | ExitCode | None, state: JobState) -> int | None:
    if state is JobState.PENDING or v is None:
        return None
    if type(v) is int:
        # v0.0.38: the raw wait(2) status.
        if v & 0x7F:
            return 128 + (v & 0x7F)
        return (v >> 8) & 0xFF
    if isinstance(v, ExitCode):
        if v.signal is not None:
            sig = _num(v.signal.id) if v.signal.id is not None else _num(v.signal.signal_id)
            if sig:
                return 128 + sig
        return _num(v.return_code)
    return None


_JOB_BASES: Final = {s.value for s in JobState}


_STATE_CACHE: dict[object, tuple[JobState, frozenset[str]]] = {}


def _job_state(raw: str | list[str] | None, problems: _Problems) -> tuple[JobState, frozenset[str]]:
    if raw is None:
        return JobState.UNKNOWN, frozenset()
    key: object = raw if isinstance(raw, str) else tuple(raw)
    hit = _STATE_CACHE.get(key)
    if hit is not None:
        return hit
    try:
        result = parse_job_state(raw)
    except SlurmValueError as exc:
        problems.add("job_state", exc)
        tokens = [raw] if isinstance(raw, str) else list(raw)
        base = next((JobState(t) for t in tokens if t in _JOB_BASES), JobState.UNKNOWN)
        return base, frozenset(t.upper() for t in tokens if t not in _JOB_BASES)
    if len(_STATE_CACHE) < 4096:
        _STATE_CACHE[key] = result
    return result


def _gres_items(text: str | None, where: str, problems: _Problems) -> tuple[GresItem, ...]:
    """The GRES items of ``text``; a bad item or detail is counted and left out, the
    others kept (a node's GPUs still count when its shard detail is a new spelling)."""
    if not text:
        return ()
    items, skipped = parse_gres_lenient(text)
    for why in skipped:
        problems.add(where, ValueError(why))
    return items


def _count(items: tuple[GresItem, ...], name: str) -> tuple[int | None, str | None]:
    """(count or None when ``name`` is absent, type when exactly one)."""
    total: int | None = None
    types: set[str] = set()
    for it in items:
        if it.name == name:
            total = (total or 0) + it.count
            if it.type:
                types.add(it.type)
    return total, (next(iter(types)) if len(types) == 1 else None)


_REQUEST_FIELDS: Final = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")


@lru_cache(maxsize=16384)
def _gpu_request_from_options(
    per_node_s: str | None,
    per_job_s: str | None,
    per_task_s: str | None,
    per_socket_s: str | None,
    node_count: int,
    tasks: int,
    sockets_per_node: int,
) -> tuple[GpuRequest, str]:
    """GpuRequest from the ``tres_per_*`` options (cached: few distinct combinations)."""
    problems = _Problems()
    parsed = {
        name: _gres_items(text, name, problems)
        for name, text in zip(
            _REQUEST_FIELDS, (per_node_s, per_job_s, per_task_s, per_socket_s), strict=True
        )
    }
    gpus: dict[str, int | None] = {}
    shards: dict[str, int | None] = {}
    mps: dict[str, int | None] = {}
    gpu_type: str | None = None
    sources: list[str] = []
    for name in _REQUEST_FIELDS:
        g, t = _count(parsed[name], "gpu")
        s, _ = _count(parsed[name], "shard")
        m, _ = _count(parsed[name], "mps")
        gpus[name], shards[name], mps[name] = g, s, m
        if g is not None or s is not None or m is not None:
            sources.append(name)
        if gpu_type is None and t:
            gpu_type = t
    nodes = max(node_count, 1)
    ntasks = max(tasks, 1)
    sockets = max(sockets_per_node, 1)

    def total(d: dict[str, int | None]) -> int:
        if d["tres_per_job"] is not None:
            return d["tres_per_job"]
        if d["tres_per_node"] is not None:
            return d["tres_per_node"] * nodes
        if d["tres_per_task"] is not None:
            return d["tres_per_task"] * ntasks
        if d["tres_per_socket"] is not None:
            return d["tres_per_socket"] * sockets * nodes
        return 0

    req = GpuRequest(
        gpus=total(gpus),
        per_node=gpus["tres_per_node"],
        per_job=gpus["tres_per_job"],
        per_task=gpus["tres_per_task"],
        gpu_type=gpu_type,
        shards=total(shards),
        shards_per_node=shards["tres_per_node"],
        sources=tuple(sources),
        mps=total(mps),
        mps_per_node=mps["tres_per_node"],
    )
    return req, problems.first


@lru_cache(maxsize=16384)
def _allocation(node: str, detail: str) -> tuple[NodeGpuAllocation | None, tuple[str, ...]]:
    """A node's allocation from one ``gres_detail`` entry, and what did not parse."""
    items, skipped = parse_gres_lenient(detail)
    gpu_idx: list[int] = []
    shard_idx: list[int] = []
    shards = 0
    mps_idx: list[int] = []
    mps = 0
    seen = False
    for it in items:
        if it.name == "gpu":
            seen = True
            gpu_idx.extend(it.indices)
        elif it.name == "shard":
            seen = True
            # 22.05: "shard:2(IDX:3)"; 24.11+: "shard:2(0/4,0/4,2/4,0/4)", the shards
            # taken on each GPU: the GPUs with some are the job's
            shard_idx.extend(it.indices or (i for i, (n, _) in enumerate(it.shares) if n))
            shards += it.count
        elif it.name == "mps":
            seen = True
            # "mps:50(IDX:0)" on every release recorded: one GPU's SMs, shared
            mps_idx.extend(it.indices or (i for i, (n, _) in enumerate(it.shares) if n))
            mps += it.count
    if not seen:
        return None, skipped
    alloc = NodeGpuAllocation(
        node=node,
        gpu_indices=tuple(gpu_idx),
        shard_indices=tuple(shard_idx),
        shards=shards,
        mps_indices=tuple(mps_idx),
        mps=mps,
    )
    return alloc, skipped


def job_from_record(r: JobRecord, problems: _Problems | None = None) -> Job:
    """Normalise one decoded job record into a :class:`Job` (see the module docstring)."""
    if problems is None:
        problems = _Problems()
    job_id = _num(r.job_id)
    if job_id is None:
        raise SlurmParseError("job record without a job_id")
    state, flags = _job_state(r.job_state, problems)
    node_count = _num(r.node_count) or 0
    tasks = _num(r.tasks) or 0
    cpus = _num(r.cpus) or 0

    hosts: tuple[str, ...] = ()
    if r.nodes:
        try:
            hosts = expand_hostlist(r.nodes)
        except SlurmValueError as exc:
            problems.add(f"job {job_id} nodes", exc)

    allocations: list[NodeGpuAllocation] = []
    if r.gres_detail and hosts:
        for host, detail in zip(hosts, r.gres_detail, strict=False):
            a, skipped = _allocation(host, detail)
            for why in skipped:
                problems.add(f"job {job_id} gres_detail", ValueError(why))
            if a is not None:
                allocations.append(a)

    gpus, first_problem = _gpu_request_from_options(
        r.tres_per_node or None,
        r.tres_per_job or None,
        r.tres_per_task or None,
        r.tres_per_socket or None,
        node_count,
        tasks,
        _num(r.sockets_per_node) or 1,
    )
    if first_problem:
        problems.add(f"job {job_id}", ValueError(first_problem))
    if not gpus.sources:
        gpus = _gpu_request_fallback(r, allocations, problems, job_id)

    memory = _num(r.memory_per_node)
    if memory:
        memory *= max(node_count, 1)
    else:
        per_cpu = _num(r.memory_per_cpu)
        memory = per_cpu * cpus if per_cpu and cpus else None
    if memory is None:
        for text in (r.tres_alloc_str, r.tres_req_str):
            if text:
                try:
                    memory = parse_tres(text).mem_mib
                except SlurmValueError as exc:
                    problems.add(f"job {job_id} tres", exc)
                if memory is not None:
                    break

    reason = r.state_reason
    uid = _num(r.user_id)
    user = r.user_name or (str(uid) if uid is not None else "")
    return Job(
        job_id=job_id,
        name=_str(r.name),
        user=user,
        state=state,
        uid=uid,
        account=_str(r.account),
        partition=_str(r.partition),
        qos=_str(r.qos),
        state_flags=flags,
        reason="" if not reason or reason == "None" else reason,
        array_job_id=_pos(r.array_job_id),
        array_task_id=_num(r.array_task_id),
        array_task_spec=r.array_task_string or None,
        array_max_tasks=_pos(r.array_max_tasks),
        submit_time=_time(r.submit_time),
        eligible_time=_time(r.eligible_time),
        start_time=_time(r.start_time),
        end_time=_time(r.end_time),
        time_limit=_minutes(r.time_limit),
        cpus=cpus,
        memory_mib=memory,
        node_count=node_count,
        tasks=tasks,
        gpus=gpus,
        nodes=hosts,
        gpu_allocations=tuple(allocations),
        restart_count=_num(r.restart_cnt) or 0,
        requeue=bool(r.requeue),
        nice=_num(r.nice) or 0,
        priority=_num(r.priority),
        comment=_str(r.comment),
        admin_comment=_str(r.admin_comment),
        work_dir=_str(r.current_working_directory),
        command=_str(r.command),
        exit_code=_exit_code(r.exit_code, state),
        batch=True if r.batch_flag is None else bool(r.batch_flag),
        time_min=_minutes(r.time_minimum),
    )


_MINUTES: dict[int, timedelta] = {}


def _minutes(v: IntLike) -> timedelta | None:
    """A time limit in minutes; unset/infinite → None (no limit). Memoised.

    Zero is no limit too, as ``--time=0`` means to sbatch ("no time limit be imposed"),
    and so is a negative number, which no Slurm writes: neither is a run that must end
    at once."""
    n = _num(v)
    if n is None or n <= 0:
        return None
    td = _MINUTES.get(n)
    if td is None:
        try:
            td = timedelta(minutes=n)
        except OverflowError:
            return None
        if len(_MINUTES) < 65536:
            _MINUTES[n] = td
    return td


def _gpu_request_fallback(
    r: JobRecord, allocations: list[NodeGpuAllocation], problems: _Problems, job_id: int
) -> GpuRequest:
    """No ``tres_per_*`` GPU option: use the TRES strings, then what was allocated."""
    for name, text in (("tres_alloc_str", r.tres_alloc_str), ("tres_req_str", r.tres_req_str)):
        if not text or "gres/" not in text:
            continue
        try:
            tres = parse_tres(text)
        except SlurmValueError as exc:
            problems.add(f"job {job_id} {name}", exc)
            continue
        if tres.gpus or tres.shards:
            return GpuRequest(
                gpus=tres.gpus, gpu_type=tres.gpu_type, shards=tres.shards, sources=(name,)
            )
    if allocations:
        g = sum(len(a.gpu_indices) for a in allocations)
        s = sum(a.shards for a in allocations)
        if g or s:
            return GpuRequest(gpus=g, shards=s, sources=("gres_detail",))
    return _NO_GPUS


_NO_GPUS: Final = GpuRequest()


JobMemo = dict[int, Job]
"""What :func:`decode_squeue` keeps between listings: the hash of each job record's
bytes → the :class:`Job` made of them (one int and one reference a job)."""


class _RecordRepair:
    """Job records of one listing whose bytes were not valid UTF-8: repaired, counted once."""

    __slots__ = ("done", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.done = False

    def __call__(self, raw: bytes | msgspec.Raw) -> bytes | None:
        """``raw`` made valid (U+FFFD), or None when bad bytes are not what is wrong."""
        fixed = _repaired(bytes(raw))
        if fixed is not None and not self.done:
            self.done = True
            decode_stats.values_unparsed(self.what.split(maxsplit=1)[0], 1)
            log.warning("%s: invalid UTF-8 in the output, decoded with replacement", self.what)
        return fixed


def _job_record(
    raw: bytes | msgspec.Raw,
    i: int,
    skipped: _Skipped,
    repair: _RecordRepair,
    hint: Callable[[], str],
) -> JobRecord | None:
    """One job record decoded on its own; None (counted in ``skipped``) when it cannot be."""
    try:
        return _JOB_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        skipped.add_shape(f"$.jobs[{i}]", exc, hint())
        return None
    except msgspec.DecodeError as exc:
        fixed = repair(raw)
        if fixed is None:
            skipped.add_shape(f"$.jobs[{i}]", exc, hint())
            return None
    try:
        return _JOB_DECODER.decode(fixed)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        skipped.add_shape(f"$.jobs[{i}]", exc, hint())
        return None


def decode_squeue(data: bytes | str, memo: JobMemo | None = None) -> tuple[list[Job], str]:
    """Decode ``squeue --json`` output into jobs and the Slurm release (``"22.05.8"``).

    The release comes from ``meta`` (``""`` when absent). Raises
    :class:`SlurmParseError` for malformed JSON or an unexpected shape of the document
    (no ``jobs`` list), and :class:`SlurmUnavailableError` / :class:`SlurmCommandError`
    when Slurm answered only with ``errors``. A job record of the wrong shape (the
    warning carries msgspec's path, e.g. ``$.jobs[3].job_id``) or with a value that
    cannot be normalised is skipped and counted; the other jobs are returned.

    The document is first scanned with each job record kept as its raw bytes (a scan
    is several times faster than decoding), then each record is decoded on its own.
    ``memo`` (see :data:`JobMemo`) lets a poller skip both steps for a record whose
    bytes are the same as in the previous listing: its Job is that listing's object,
    reused (so the observer's diff knows it unchanged by identity). Keys are Python's
    keyed hash of the bytes, which a user who writes a job name cannot aim at. The
    memo is replaced in place by this listing's.
    """
    what = "squeue --json"
    doc, data = _scan(_RAW_SQUEUE_DECODER, data, what)
    meta, errors, raws = doc.meta, doc.errors, doc.jobs
    _note_version(meta, what)
    if errors and not raws:
        raise _errors_to_exception(errors, "squeue")
    if raws is None:
        raise SlurmParseError(f"{what}: no 'jobs' list in the output{_version_hint(data)}")
    hint = _HintOnce(data)
    skipped = _Skipped()
    problems = _Problems()
    repair = _RecordRepair(what)
    jobs: list[Job] = []
    append = jobs.append
    fresh: JobMemo = {}
    known = memo if memo is not None else {}
    with _gc_paused():
        for i, raw_record in enumerate(raws):
            raw: bytes | msgspec.Raw = raw_record
            key = 0
            if memo is not None:
                raw = bytes(raw_record)
                key = hash(raw)
                job = known.get(key)
                if job is not None:
                    fresh[key] = job
                    append(job)
                    continue
            r = _job_record(raw, i, skipped, repair, hint)
            if r is None:
                continue
            if type(r.job_id) is not int and _num(r.job_id) is None:
                skipped.add(f"$.jobs[{i}].job_id{hint()}", "no job id number")
                continue
            try:
                job = job_from_record(r, problems)
            except (SlurmParseError, ValueError, TypeError, ArithmeticError) as exc:
                skipped.add(f"job {_num(r.job_id)}", exc)
                continue
            if memo is not None:
                fresh[key] = job
            append(job)
    problems.log(what)
    skipped.log(what)
    if memo is not None:
        memo.clear()
        memo.update(fresh)
    return jobs, _release(meta)


def data_parser_version(data: bytes | str) -> str:
    """The data_parser version (``"v0.0.38"``) named in a squeue/sinfo document, or ``""``."""
    return _sniff_version(data) or ""


# --------------------------------------------------------------------------- nodes

_NODE_BASES: Final = {
    "IDLE": "idle",
    "MIXED": "mixed",
    "MIX": "mixed",
    "ALLOCATED": "allocated",
    "ALLOC": "allocated",
    "DOWN": "down",
    "FUTURE": "future",
    "UNKNOWN": "unknown",
    "ERROR": "error",
}


@lru_cache(maxsize=1024)
def _node_state(tokens: tuple[str, ...]) -> tuple[str, frozenset[str]]:
    base = ""
    flags: list[str] = []
    for tok in tokens:
        for part in tok.split("+"):
            up = part.strip().rstrip("*~#!%$@^-").upper()
            if not up:
                continue
            if not base and up in _NODE_BASES:
                base = _NODE_BASES[up]
            else:
                flags.append(up)
    return base or "unknown", frozenset(flags)


def _node_sharing(
    total_s: str | None, used_s: str | None
) -> tuple[tuple[tuple[str, int], ...], int, int]:
    """A node's GPU types with their counts (MIG profiles on a MIG node), and its MPS
    total and use. Bad items were already counted by :func:`_node_gres`."""
    total, _ = parse_gres_lenient(total_s) if total_s else ((), ())
    used, _ = parse_gres_lenient(used_s) if used_s else ((), ())
    types: dict[str, int] = {}
    for it in total:
        if it.name == "gpu" and it.type:
            types[it.type] = types.get(it.type, 0) + it.count
    mps, _ = _count(total, "mps")
    mps_used, _ = _count(used, "mps")
    return tuple(types.items()), mps or 0, mps_used or 0


def _node_gres(
    total_s: str | None, used_s: str | None, where: str, problems: _Problems
) -> tuple[int, str | None, int, int, tuple[int, ...], int, _ShardGpus]:
    total = _gres_items(total_s, f"{where} gres", problems)
    used = _gres_items(used_s, f"{where} gres_used", problems)
    gpus, gpu_type = _count(total, "gpu")
    shards, _ = _count(total, "shard")
    gpus_used, _ = _count(used, "gpu")
    shards_used, _ = _count(used, "shard")
    idx = sorted({i for it in used if it.name == "gpu" for i in it.indices})
    return (
        gpus or 0,
        gpu_type,
        shards or 0,
        gpus_used or 0,
        tuple(idx),
        shards_used or 0,
        _shard_gpus(used),
    )


_ShardGpus = tuple[tuple[int, ...], tuple[tuple[int, int], ...]]


def _shard_gpus(used: tuple[GresItem, ...]) -> _ShardGpus:
    """The GPUs a node's ``gres_used`` says hold shards, and the shards on each where it
    counts them: 22.05 names the GPUs (``shard:(null):2(IDX:2-3)``: a GPU count, not a
    shard count), 24.11+ counts per GPU (``shard:6(-/4,-/4,3/4,3/4)``; ``-``: held whole)."""
    gpus: set[int] = set()
    per_gpu: dict[int, int] = {}
    for it in used:
        if it.name != "shard":
            continue
        gpus.update(it.indices)
        for i, (n, _) in enumerate(it.shares):
            if n:
                gpus.add(i)
                per_gpu[i] = per_gpu.get(i, 0) + n
    return tuple(sorted(gpus)), tuple(sorted(per_gpu.items()))


def node_from_record(r: NodeRecord, problems: _Problems | None = None) -> Node:
    """Normalise one ``"nodes"`` record (22.05 sinfo, scontrol, slurmrestd)."""
    if problems is None:
        problems = _Problems()
    raw = r.state
    tokens: tuple[str, ...]
    if raw is None:
        tokens = ()
    elif isinstance(raw, str):
        tokens = (raw,)
    else:
        tokens = tuple(raw)
    if r.state_flags:
        tokens = tokens + tuple(r.state_flags)
    state, flags = _node_state(tokens)
    gpus, gpu_type, shards, gpus_used, idx, shards_used, (shard_gpus, by_gpu) = _node_gres(
        r.gres, r.gres_used, f"node {r.name}", problems
    )
    gpu_types, mps, mps_used = _node_sharing(r.gres, r.gres_used)
    parts = r.partitions
    partitions = tuple(p for p in parts.split(",") if p) if isinstance(parts, str) else parts or ()
    return Node(
        name=r.name,
        state=state,
        state_flags=flags,
        cpus=_num(r.cpus) or 0,
        cpus_allocated=_num(r.alloc_cpus) or 0,
        memory_mib=_num(r.real_memory) or 0,
        memory_allocated_mib=_num(r.alloc_memory) or 0,
        gpus=gpus,
        gpu_type=gpu_type,
        shards=shards,
        gpus_used=gpus_used,
        gpu_indices_used=idx,
        shards_used=shards_used,
        shard_gpus_used=shard_gpus,
        shards_used_by_gpu=by_gpu,
        gpu_types=gpu_types,
        mps=mps,
        mps_used=mps_used,
        partitions=tuple(partitions),
        reason=_str(r.reason),
        address=_str(r.address),
    )


def _names(v: list[str] | str | None, where: str, problems: _Problems) -> tuple[str, ...]:
    if not v:
        return ()
    if isinstance(v, list):
        out: list[str] = []
        for item in v:
            try:
                out.extend(expand_hostlist(item))
            except SlurmValueError as exc:
                problems.add(where, exc)
        return tuple(out)
    try:
        return expand_hostlist(v)
    except SlurmValueError as exc:
        problems.add(where, exc)
        return ()


def _nodes_from_sinfo_records(records: list[SinfoRecord], problems: _Problems) -> list[Node]:
    """23.11+ ``sinfo`` records → nodes, one per name, partitions merged.

    With ``--Node`` every record holds one node. A record that aggregates several nodes
    gives each the per-node maximum of CPUs/memory and an even share of the allocated
    CPUs/memory; its ``gres.used`` then cannot be split and is given to each node as is.
    """
    by_name: dict[str, Node] = {}
    order: list[str] = []
    for rec in records:
        names = _names(rec.nodes.nodes if rec.nodes else None, "sinfo nodes", problems)
        if not names:
            continue
        addresses = _names(rec.nodes.addresses if rec.nodes else None, "sinfo addr", problems)
        n = len(names)
        raw = rec.node.state if rec.node else None
        tokens = (raw,) if isinstance(raw, str) else tuple(raw or ())
        state, flags = _node_state(tokens)
        cpus_rec, mem_rec = rec.cpus, rec.memory
        if n == 1:
            cpus = _num(cpus_rec.total) if cpus_rec else None
            mem = _num(mem_rec.maximum) if mem_rec else None
        else:
            cpus = _num(cpus_rec.maximum) if cpus_rec else None
            mem = _num(mem_rec.maximum) if mem_rec else None
        alloc_cpus = (_num(cpus_rec.allocated) or 0) // n if cpus_rec else 0
        alloc_mem = (_num(mem_rec.allocated) or 0) // n if mem_rec else 0
        gres = rec.gres or SinfoGres()
        gpus, gpu_type, shards, gpus_used, idx, shards_used, (shard_gpus, by_gpu) = _node_gres(
            gres.total, gres.used, f"sinfo {names[0]}", problems
        )
        gpu_types, mps, mps_used = _node_sharing(gres.total, gres.used)
        part = rec.partition.name if rec.partition and rec.partition.name else ""
        reason = rec.reason
        reason_s = reason if isinstance(reason, str) else (reason.description if reason else "")
        for i, name in enumerate(names):
            old = by_name.get(name)
            if old is not None:
                if part and part not in old.partitions:
                    by_name[name] = _with_partition(old, part)
                continue
            order.append(name)
            by_name[name] = Node(
                name=name,
                state=state,
                state_flags=flags,
                cpus=cpus or 0,
                cpus_allocated=alloc_cpus,
                memory_mib=mem or 0,
                memory_allocated_mib=alloc_mem,
                gpus=gpus,
                gpu_type=gpu_type,
                shards=shards,
                gpus_used=gpus_used,
                gpu_indices_used=idx,
                shards_used=shards_used,
                shard_gpus_used=shard_gpus,
                shards_used_by_gpu=by_gpu,
                gpu_types=gpu_types,
                mps=mps,
                mps_used=mps_used,
                partitions=(part,) if part else (),
                reason=_str(reason_s),
                address=addresses[i] if i < len(addresses) else "",
            )
    return [by_name[name] for name in order]


def _with_partition(node: Node, part: str) -> Node:
    return replace(node, partitions=(*node.partitions, part))


def decode_sinfo(data: bytes | str) -> list[Node]:
    """Decode ``sinfo --json`` (or ``scontrol show nodes --json``) output into nodes.

    Reads both the ``"nodes"`` shape (22.05 sinfo, scontrol, slurmrestd) and the
    ``"sinfo"`` shape of 23.11+ sinfo. Errors as for :func:`decode_squeue`.
    """
    what = "sinfo --json"
    decoded = _decode_lenient(_SINFO_DECODER, _RAW_SINFO_DECODER, data, what)
    doc, raw_doc, data = decoded
    skipped = _Skipped()
    node_records: list[NodeRecord] | None
    sinfo_records: list[SinfoRecord] | None
    if doc is None:
        assert raw_doc is not None
        meta, errors = raw_doc.meta, raw_doc.errors
        node_records = _records(raw_doc.nodes, _NODE_DECODER, "$.nodes", skipped, data)
        sinfo_records = _records(raw_doc.sinfo, _SINFO_RECORD_DECODER, "$.sinfo", skipped, data)
    else:
        meta, errors = doc.meta, doc.errors
        node_records, sinfo_records = doc.nodes, doc.sinfo
    _note_version(meta, what)
    if errors and not node_records and not sinfo_records and not skipped.count:
        raise _errors_to_exception(errors, "sinfo")
    problems = _Problems()
    if node_records is not None:
        nodes: list[Node] = []
        with _gc_paused():
            for r in node_records:
                try:
                    nodes.append(node_from_record(r, problems))
                except (SlurmParseError, ValueError, TypeError, ArithmeticError) as exc:
                    skipped.add(f"node {r.name!r}", exc)
    elif sinfo_records is not None:
        with _gc_paused():
            nodes = _nodes_from_sinfo_records(sinfo_records, problems)
    else:
        raise SlurmParseError(f"{what}: neither a 'nodes' nor a 'sinfo' list in the output")
    problems.log(what)
    skipped.log(what)
    return nodes


def _records(
    raws: list[msgspec.Raw] | None,
    decoder: msgspec.json.Decoder[_T],
    where: str,
    skipped: _Skipped,
    data: bytes | str,
) -> list[_T] | None:
    if raws is None:
        return None
    out: list[_T] = []
    for i, raw in enumerate(raws):
        try:
            out.append(decoder.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            skipped.add_shape(f"{where}[{i}]", exc, _version_hint(data))
    return out

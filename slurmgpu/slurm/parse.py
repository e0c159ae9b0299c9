"""Pure parsers for the strings Slurm prints: hostlists, times, memory, TRES, GRES, states.

Every parser either returns a value or raises a subclass of :class:`SlurmValueError`
(itself a ``ValueError``) whose one-line message names the bad input. Nothing here talks
to Slurm; ``slurmgpu.slurm.cli`` and ``slurmgpu.slurm.pyslurm`` build on these.

GRES strings come in many spellings depending on the field and the Slurm release::

    gres:gpu:2                  22.05 tres_per_node / tres_per_job / tres_per_task
    gres/gpu:2  gres/gpu=2      23.x+ tres_per_*, TRES strings
    gpu:a100:2                  typed request or node ``gres``
    gpu:2(IDX:0-1)              gres_detail (one entry per allocated node)
    gpu:a100:2(IDX:0,2)         typed gres_detail / gres_used
    gpu:4(S:0-1)                node ``gres`` with socket affinity
    shard:(null):1(IDX:3)       22.05 node gres_used, untyped shard
    shard:0(0/4,0/4,0/4,0/4)    24.x node gres_used: shards used/total per GPU
    shard:6(-/4,-/4,2/4,4/4)    26.05 node gres_used: "-" where a whole-GPU job holds
                                that GPU (24.11 prints 0/4 there)

:func:`parse_gres` reads all of them into :class:`GresItem` tuples;
:func:`parse_gres_lenient` reads what it can of a string with a bad part (a spelling of a
future Slurm) and says what it left out, so one odd detail never loses a node's usage.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ClusterShell.NodeSet import NodeSet, NodeSetException
from ClusterShell.RangeSet import RangeSetException

from slurmgpu.model import JobState

# Time limits live in the leaf module units (pure policies use them too); re-exported here
# with the other Slurm string parsers.
from slurmgpu.units import (
    SlurmValueError,
    TimeStringError,
    format_time_limit,
    parse_time_limit,
)

__all__ = [
    "GresItem",
    "GresStringError",
    "HostlistError",
    "IndexListError",
    "JobStateError",
    "MemoryStringError",
    "SlurmValueError",
    "TimeStringError",
    "Tres",
    "TresStringError",
    "compress_hostlist",
    "expand_hostlist",
    "format_time_limit",
    "gres_count",
    "parse_gres",
    "parse_gres_lenient",
    "parse_index_list",
    "parse_job_state",
    "parse_memory_mib",
    "parse_time_limit",
    "parse_tres",
]


# --------------------------------------------------------------------------- errors


class HostlistError(SlurmValueError):
    """A hostlist expression such as ``gpu[1-4`` that does not parse."""


class MemoryStringError(SlurmValueError):
    """A memory size that is not ``<number>[K|M|G|T|P]``."""


class TresStringError(SlurmValueError):
    """A TRES string that is not ``name=value,...``."""


class GresStringError(SlurmValueError):
    """A GRES string that is not ``name[:type][:count][(IDX:...)]``."""


class IndexListError(SlurmValueError):
    """A device index list that is not like ``0-1,3``."""


class JobStateError(SlurmValueError):
    """A job state that Slurm does not define."""


def _oneline(text: object) -> str:
    """First line of an exception text (ClusterShell's can span lines)."""
    lines = str(text).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= 160 else line[:157] + "..."  # it may quote the whole input


def _show(value: object, limit: int = 80) -> str:
    """``repr`` of a bad input, shortened so messages stay one line."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


# --------------------------------------------------------------------------- hostlists

# Host names Slurm accepts in practice. ClusterShell gives "@", "!", "&", "^" and ":"
# meanings of its own (groups, set operations), so those never reach it.
_SIMPLE_HOST = re.compile(r"[A-Za-z0-9._\-]+")
_BRACKET_GROUP = re.compile(r"[A-Za-z0-9._\-\[\],]+")
# More names than any cluster has: refused before expanding (a[0-999999999] would
# otherwise build a billion strings).
MAX_HOSTLIST_NAMES = 100_000


_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def _bracket_size(group: str) -> int:
    """An upper bound of the names a bracket group names (its ranges' sizes multiplied)."""
    total = 1
    for body in _BRACKET.findall(group):
        count = 0
        for part in body.split(","):
            m = _RANGE.fullmatch(part)
            if m is None or len(m.group(1)) > 18 or len(m.group(2) or "") > 18:
                return MAX_HOSTLIST_NAMES + 1 if m is not None else 1
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            count += max(hi - lo + 1, 1)
        total *= max(count, 1)
        if total > MAX_HOSTLIST_NAMES:
            return total
    return total


@lru_cache(maxsize=65536)
def _expand_cached(expr: str) -> tuple[str, ...]:
    out: list[str] = []
    seen: set[str] = set()
    try:
        groups = _split_top_level(expr, ",")
    except SlurmValueError as exc:
        raise HostlistError(f"invalid hostlist {_show(expr)}: {exc}") from None
    for raw_group in groups:
        group = raw_group.strip()
        if not group:
            continue
        if "[" not in group and "]" not in group:
            if not _SIMPLE_HOST.fullmatch(group):
                raise HostlistError(f"invalid hostlist {_show(expr)}: bad host name {_show(group)}")
            names: Iterable[str] = (group,)
        else:
            if not _BRACKET_GROUP.fullmatch(group):
                raise HostlistError(f"invalid hostlist {_show(expr)}: bad characters")
            if _bracket_size(group) + len(out) > MAX_HOSTLIST_NAMES:
                # Checked before ClusterShell, which builds every number of a range.
                raise HostlistError(
                    f"invalid hostlist {_show(expr)}: more than {MAX_HOSTLIST_NAMES} names"
                )
            try:
                nodeset = NodeSet(group)
                size = len(nodeset)
            except (
                NodeSetException,
                RangeSetException,
                ValueError,
                TypeError,
                OverflowError,
            ) as exc:
                raise HostlistError(f"invalid hostlist {_show(expr)}: {_oneline(exc)}") from None
            if size + len(out) > MAX_HOSTLIST_NAMES:
                raise HostlistError(
                    f"invalid hostlist {_show(expr)}: more than {MAX_HOSTLIST_NAMES} names"
                )
            names = list(nodeset)
        for name in names:
            if name not in seen:
                seen.add(name)
                out.append(name)
    return tuple(out)


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist (``gpu[01-03],login1``) into host names.

    Host groups are returned in the order they appear (Slurm prints a job's nodes in
    allocation order, which ``gres_detail`` follows); inside one bracket group the order
    is ClusterShell's (ascending, as Slurm prints ranges). Duplicates are dropped.
    Empty strings (a pending job) and Slurm's ``(null)`` / ``None`` give ``()``.
    """
    if not isinstance(expr, str):
        raise HostlistError(f"invalid hostlist {_show(expr)}: not a string")
    expr = expr.strip()
    if not expr or expr in ("(null)", "None", "N/A"):
        return ()
    if "[" not in expr and "]" not in expr:
        # Fast path: the common "gpu1" / "gpu1,gpu7" costs no NodeSet.
        parts = tuple(p.strip() for p in expr.split(",") if p.strip())
        for p in parts:
            if not _SIMPLE_HOST.fullmatch(p):
                raise HostlistError(f"invalid hostlist {_show(expr)}: bad host name {_show(p)}")
        if len(parts) == len(set(parts)):
            return parts
    return _expand_cached(expr)


def compress_hostlist(names: Iterable[str]) -> str:
    """Fold host names into a hostlist expression (``gpu[1-3,7]``), via ClusterShell."""
    names = list(names)
    for name in names:
        if not isinstance(name, str) or not _SIMPLE_HOST.fullmatch(name):
            raise HostlistError(f"cannot compress host name {_show(name)}")
    if not names:
        return ""
    try:
        return str(NodeSet.fromlist(names))
    except (NodeSetException, RangeSetException, ValueError, TypeError) as exc:
        raise HostlistError(f"cannot compress hostlist {_show(names)}: {_oneline(exc)}") from None


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside ``[...]`` and ``(...)``."""
    if "[" not in text and "(" not in text:
        return text.split(sep)
    out: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth < 0:
                raise SlurmValueError(f"unbalanced brackets in {_show(text)}")
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise SlurmValueError(f"unbalanced brackets in {_show(text)}")
    out.append(text[start:])
    return out


# --------------------------------------------------------------------------- times

# --------------------------------------------------------------------------- memory

_MEM_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(?:([KMGTP])(?:I?B)?)?", re.IGNORECASE)
_MEM_FACTOR_KIB = {"K": 1, "": 1024, "M": 1024, "G": 1024**2, "T": 1024**3, "P": 1024**4}


def parse_memory_mib(value: str | int) -> int:
    """Parse a memory size into MiB: ``256M`` → 256, ``4G`` → 4096, ``1T`` → 1048576.

    A bare number is MiB (Slurm's default unit). Sizes below 1 MiB round up
    (``512K`` → 1), as Slurm does for ``--mem``.
    """
    if isinstance(value, bool):
        raise MemoryStringError(f"invalid memory size {_show(value)}")
    if isinstance(value, int):
        if value < 0:
            raise MemoryStringError(f"invalid memory size {_show(value)}: negative")
        return value
    if not isinstance(value, str):
        raise MemoryStringError(f"invalid memory size {_show(value)}: not a string")
    m = _MEM_RE.fullmatch(value.strip())
    if not m:
        raise MemoryStringError(f"invalid memory size {_show(value)}")
    number, unit = m.groups()
    kib = float(number) * _MEM_FACTOR_KIB[(unit or "").upper()]
    if not math.isfinite(kib):
        raise MemoryStringError(f"invalid memory size {_show(value)}: too large")
    return math.ceil(kib / 1024)


# --------------------------------------------------------------------------- TRES


@dataclass(frozen=True, slots=True)
class Tres:
    """A parsed TRES string such as ``cpu=4,mem=8G,node=1,billing=4,gres/gpu=2``.

    ``gres`` maps ``"gpu"`` / ``"gpu:a100"`` / ``"shard"`` to counts (the ``gres/``
    prefix removed); anything else Slurm tracks (``license/x``, ``fs/disk``, ``energy``,
    ``bb/...``) is kept as text in ``other``. Not hashable (it holds dicts).
    """

    cpu: int | None = None
    mem_mib: int | None = None
    node: int | None = None
    billing: float | None = None
    gres: Mapping[str, int] = field(default_factory=dict)
    other: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """Whole GPUs: the untyped ``gres/gpu`` count, else the sum of typed ones."""
        if "gpu" in self.gres:
            return self.gres["gpu"]
        return sum(v for k, v in self.gres.items() if k.startswith("gpu:"))

    @property
    def gpu_type(self) -> str | None:
        """The GPU type when exactly one typed ``gres/gpu:TYPE`` is present."""
        types = [k.split(":", 1)[1] for k in self.gres if k.startswith("gpu:")]
        return types[0] if len(types) == 1 else None

    @property
    def shards(self) -> int:
        if "shard" in self.gres:
            return self.gres["shard"]
        return sum(v for k, v in self.gres.items() if k.startswith("shard:"))


_COUNT_RE = re.compile(r"(\d{1,19})([KMGTP]?)", re.IGNORECASE)
_COUNT_FACTOR = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def _parse_count(text: str, whole: str, err: type[SlurmValueError]) -> int:
    m = _COUNT_RE.fullmatch(text.strip())
    if not m:
        raise err(f"invalid count {_show(text)} in {_show(whole)}")
    return int(m.group(1)) * _COUNT_FACTOR[m.group(2).upper()]


@lru_cache(maxsize=4096)
def _parse_tres_cached(text: str) -> Tres:
    cpu = mem = node = None
    billing: float | None = None
    gres: dict[str, int] = {}
    other: dict[str, str] = {}
    for raw_item in text.split(","):
        item = raw_item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        value = value.strip()
        if not sep or not key or not value:
            raise TresStringError(f"invalid TRES {_show(text)}: item {_show(item)} is not k=v")
        if key == "cpu":
            cpu = _parse_count(value, text, TresStringError)
        elif key == "mem":
            try:
                mem = parse_memory_mib(value)
            except MemoryStringError:
                raise TresStringError(f"invalid TRES {_show(text)}: mem={_show(value)}") from None
        elif key == "node":
            node = _parse_count(value, text, TresStringError)
        elif key == "billing":
            try:
                billing = float(value)
            except ValueError:
                raise TresStringError(
                    f"invalid TRES {_show(text)}: billing={_show(value)}"
                ) from None
            if not math.isfinite(billing):
                raise TresStringError(f"invalid TRES {_show(text)}: billing={_show(value)}")
        elif key.startswith("gres/"):
            name = key[5:]
            if not name:
                raise TresStringError(f"invalid TRES {_show(text)}: empty gres name")
            gres[name] = _parse_count(value, text, TresStringError)
        else:
            other[key] = value
    return Tres(cpu=cpu, mem_mib=mem, node=node, billing=billing, gres=gres, other=other)


def parse_tres(text: str | None) -> Tres:
    """Parse a TRES string (``tres_req_str``, ``tres_alloc_str``, node ``tres``)."""
    if text is None:
        return Tres()
    if not isinstance(text, str):
        raise TresStringError(f"invalid TRES {_show(text)}: not a string")
    text = text.strip()
    if not text or text in ("(null)", "N/A"):
        return Tres()
    return _parse_tres_cached(text)


# --------------------------------------------------------------------------- GRES


@dataclass(frozen=True, slots=True)
class GresItem:
    """One GRES entry: ``name`` (``gpu``, ``shard``…), optional ``type``, ``count``.

    ``indices`` are the device indices from ``(IDX:…)``; ``shares`` the per-device
    ``used/total`` pairs Slurm 24.x+ prints for shards (``shard:1(0/4,1/4)``); ``used``
    is ``None`` for 26.05's ``-/4`` (that GPU is held whole, none of its shards usable).
    """

    name: str
    type: str | None = None
    count: int = 0
    indices: tuple[int, ...] = ()
    shares: tuple[tuple[int | None, int], ...] = ()


_INDEX_ITEM = re.compile(r"(\d{1,12})(?:-(\d{1,12}))?")
_MAX_INDEX_SPAN = 1 << 16


@lru_cache(maxsize=4096)
def parse_index_list(text: str) -> tuple[int, ...]:
    """``"0-1,3"`` → ``(0, 1, 3)``; ``"N/A"`` / ``""`` → ``()``."""
    if not isinstance(text, str):
        raise IndexListError(f"invalid index list {_show(text)}: not a string")
    text = text.strip()
    if not text or text in ("N/A", "(null)"):
        return ()
    out: list[int] = []
    for part in text.split(","):
        m = _INDEX_ITEM.fullmatch(part.strip())
        if not m:
            raise IndexListError(f"invalid index list {_show(text)}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi - lo > _MAX_INDEX_SPAN:
            raise IndexListError(f"invalid index range {_show(part)} in {_show(text)}")
        out.extend(range(lo, hi + 1))
    return tuple(out)


_SHARE_RE = re.compile(r"(\d{1,12}|-)/(\d{1,12})")
_NULL_TYPES = frozenset({"(null)", "null", ""})


def _parse_gres_item(item: str, whole: str, skipped: list[str] | None = None) -> GresItem:
    """One GRES item; a bad detail piece raises, or with ``skipped`` is noted there and
    left out (name, type, count and the other pieces kept)."""
    # 22.05 prints an untyped GRES in gres_used as "shard:(null):1(IDX:3)".
    item = item.replace(":(null)", ":")
    body = item
    detail = ""
    paren = item.find("(")
    if paren >= 0:
        if not item.endswith(")"):
            if skipped is None:
                raise GresStringError(f"invalid GRES {_show(whole)}: unclosed '(' in {_show(item)}")
            skipped.append(f"unclosed '(' in {_show(item)}")
        else:
            detail = item[paren + 1 : -1]
        body = item[:paren]
    # "name=count" spellings (gres/gpu=2, gres/gpu:a100=2)
    count_text: str | None = None
    if "=" in body:
        body, _, count_text = body.partition("=")
    for prefix in ("gres:", "gres/"):
        if body.startswith(prefix):
            body = body[len(prefix) :]
            break
    parts = body.split(":")
    name = parts[0].strip()
    if not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise GresStringError(f"invalid GRES {_show(whole)}: bad name in {_show(item)}")
    gtype: str | None = None
    rest = [p.strip() for p in parts[1:]]
    if count_text is None:
        if rest and _COUNT_RE.fullmatch(rest[-1]):
            count_text = rest.pop()
        elif rest and rest[-1] in _NULL_TYPES and len(rest) == 1:
            rest.pop()
    if len(rest) > 1:
        raise GresStringError(f"invalid GRES {_show(whole)}: too many fields in {_show(item)}")
    if rest:
        gtype = None if rest[0] in _NULL_TYPES else rest[0]
        # "+" for MIG profiles with extra engines ("1g.10gb+me").
        if gtype is not None and not re.fullmatch(r"[A-Za-z0-9_.+\-]+", gtype):
            raise GresStringError(f"invalid GRES {_show(whole)}: bad type in {_show(item)}")
    count = _parse_count(count_text, whole, GresStringError) if count_text is not None else 1
    indices: tuple[int, ...] = ()
    shares: tuple[tuple[int | None, int], ...] = ()
    if detail:
        for piece in _split_detail(detail):
            problem = ""
            if piece.startswith("IDX:"):
                try:
                    indices = parse_index_list(piece[4:])
                except IndexListError as exc:
                    problem = str(exc)
            elif piece.startswith("S:"):
                continue  # socket affinity of a node's GRES: not needed here
            elif _SHARE_RE.fullmatch(piece):
                used, total = piece.split("/")
                shares += ((None if used == "-" else int(used), int(total)),)
            else:
                problem = f"bad detail {_show(piece)}"
            if problem:
                if skipped is None:
                    raise GresStringError(f"invalid GRES {_show(whole)}: {problem}")
                skipped.append(f"{problem} in {_show(item)}")
    return GresItem(name=name, type=gtype, count=count, indices=indices, shares=shares)


def _split_detail(detail: str) -> list[str]:
    """Split ``IDX:0-1,3`` / ``S:0-1`` / ``0/4,1/4`` detail text into pieces."""
    detail = detail.strip()
    if detail.startswith(("IDX:", "S:")):
        # A single key whose value may contain commas ("IDX:0,2"); several keys would be
        # separated by ")(" which Slurm does not print in one item.
        return [detail]
    return [p.strip() for p in detail.split(",") if p.strip()]


@lru_cache(maxsize=8192)
def _parse_gres_cached(text: str) -> tuple[GresItem, ...]:
    items: list[GresItem] = []
    try:
        pieces = _split_top_level(text, ",")
    except SlurmValueError as exc:
        raise GresStringError(f"invalid GRES {_show(text)}: {exc}") from None
    for piece in pieces:
        raw = piece.strip()
        if not raw:
            continue
        items.append(_parse_gres_item(raw, text))
    return tuple(items)


def parse_gres(text: str | None) -> tuple[GresItem, ...]:
    """Parse any GRES spelling Slurm prints (see the module docstring) into items.

    A missing count means 1 (``--gres=gpu``). Non-GRES items in ``tres_per_task``
    (``cpu=2``) come back as items named ``cpu``. ``""``, ``N/A`` and ``(null)`` give ``()``.
    """
    if text is None:
        return ()
    if not isinstance(text, str):
        raise GresStringError(f"invalid GRES {_show(text)}: not a string")
    text = text.strip()
    if not text or text in ("N/A", "(null)"):
        return ()
    return _parse_gres_cached(text)


@lru_cache(maxsize=4096)
def _parse_gres_lenient_cached(text: str) -> tuple[tuple[GresItem, ...], tuple[str, ...]]:
    try:
        pieces = _split_top_level(text, ",")
    except SlurmValueError:
        # Unbalanced brackets: split at the commas that are not inside "(...)" as far
        # as they close, so the well-formed items before and after still count.
        pieces = re.findall(r"[^,(]+(?:\([^)]*\)?)?", text)
    items: list[GresItem] = []
    skipped: list[str] = []
    for piece in pieces:
        raw = piece.strip()
        if not raw:
            continue
        try:
            items.append(_parse_gres_item(raw, text, skipped))
        except SlurmValueError as exc:
            skipped.append(_oneline(exc))
    return tuple(items), tuple(skipped)


def parse_gres_lenient(text: str | None) -> tuple[tuple[GresItem, ...], tuple[str, ...]]:
    """Like :func:`parse_gres`, but a bad item or detail piece is left out, not fatal.

    Returns the items that parsed (an item whose detail had a bad piece keeps its name,
    type, count and other pieces) and one message per thing left out (empty when the
    whole string parsed). Strict callers use :func:`parse_gres`.
    """
    if text is None:
        return (), ()
    if not isinstance(text, str):
        return (), (f"invalid GRES {_show(text)}: not a string",)
    text = text.strip()
    if not text or text in ("N/A", "(null)"):
        return (), ()
    try:
        return _parse_gres_cached(text), ()
    except SlurmValueError:
        return _parse_gres_lenient_cached(text)


def gres_count(items: Iterable[GresItem], name: str) -> tuple[int, str | None]:
    """Total count of GRES ``name`` over ``items`` and its type (when only one type)."""
    total = 0
    types: set[str] = set()
    for it in items:
        if it.name == name:
            total += it.count
            if it.type:
                types.add(it.type)
    return total, (next(iter(types)) if len(types) == 1 else None)


# --------------------------------------------------------------------------- job states

_BASE_STATES: dict[str, JobState] = {s.value: s for s in JobState}
_COMPACT: dict[str, str] = {
    "PD": "PENDING",
    "R": "RUNNING",
    "S": "SUSPENDED",
    "CD": "COMPLETED",
    "CA": "CANCELLED",
    "F": "FAILED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "PR": "PREEMPTED",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "OOM": "OUT_OF_MEMORY",
    "CG": "COMPLETING",
    "CF": "CONFIGURING",
    "RD": "RESV_DEL_HOLD",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "RQ": "REQUEUED",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "SI": "SIGNALING",
    "SE": "SPECIAL_EXIT",
    "SO": "STAGE_OUT",
    "ST": "STOPPED",
    "CANCELED": "CANCELLED",
}
# Flag states and the base state assumed when Slurm prints the flag alone (22.05's
# ``job_state`` string, pyslurm's ``Job.state``, squeue's compact codes). Newer
# data_parser versions print the base state too, and that base always wins.
_FLAG_DEFAULT_BASE: dict[str, JobState] = {
    # Still holding its nodes (and GPUs) while steps end / epilogs run; how it ended is
    # not known yet, so for resource accounting it is RUNNING-ish.
    "COMPLETING": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,  # allocated, nodes booting
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,  # SIGSTOPped, keeps its allocation
    "POWER_UP_NODE": JobState.RUNNING,
    "UPDATE_DB": JobState.RUNNING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "STAGE_OUT": JobState.COMPLETED,  # burst-buffer stage-out after the job ended
    "REVOKED": JobState.CANCELLED,  # federation sibling revoked
    "LAUNCH_FAILED": JobState.FAILED,
    "RECONFIG_FAIL": JobState.FAILED,
    "EXPEDITING": JobState.PENDING,
}


@lru_cache(maxsize=1024)
def _parse_state_cached(tokens: tuple[str, ...]) -> tuple[JobState, frozenset[str]]:
    base: JobState | None = None
    flags: list[str] = []
    for raw in tokens:
        tok = raw.strip().upper()
        tok = _COMPACT.get(tok, tok)
        if tok in _BASE_STATES:
            if base is not None and _BASE_STATES[tok] is not base:
                raise JobStateError(f"invalid job state {_show(list(tokens))}: two base states")
            base = _BASE_STATES[tok]
        elif tok in _FLAG_DEFAULT_BASE:
            flags.append(tok)
        else:
            raise JobStateError(f"unknown job state {_show(raw)} in {_show(list(tokens))}")
    if base is None:
        if not flags:
            raise JobStateError(f"invalid job state {_show(list(tokens))}: empty")
        base = _FLAG_DEFAULT_BASE[flags[0]]
    return base, frozenset(flags)


def parse_job_state(value: str | Sequence[str]) -> tuple[JobState, frozenset[str]]:
    """Parse a job state into ``(base state, flags)``.

    Accepts Slurm's long names (``"PENDING"``), lists from data_parser v0.0.40+
    (``["PENDING", "REQUEUED"]``), ``+``-joined strings (``"RUNNING+COMPLETING"``) and
    squeue's compact codes (``"CG"``). When only a flag is given, the base state is
    inferred: ``COMPLETING``/``CONFIGURING``/``RESIZING``/``SIGNALING``/``STOPPED`` →
    RUNNING (the job still holds its allocation), ``REQUEUED``/``REQUEUE_HOLD``/
    ``REQUEUE_FED``/``RESV_DEL_HOLD``/``SPECIAL_EXIT`` → PENDING, ``STAGE_OUT`` →
    COMPLETED, ``REVOKED`` → CANCELLED, ``LAUNCH_FAILED`` → FAILED.
    """
    if isinstance(value, str):
        tokens = tuple(t for t in value.replace(",", "+").split("+") if t.strip())
    elif isinstance(value, Sequence):
        tokens = tuple(value)
        for t in tokens:
            if not isinstance(t, str):
                raise JobStateError(f"invalid job state {_show(value)}: not strings")
    else:
        raise JobStateError(f"invalid job state {_show(value)}")
    return _parse_state_cached(tokens)

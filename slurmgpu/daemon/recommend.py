"""Export per-key recommendations for the Slurm-side plugin (``plugins/job_submit.lua``).

The daemon writes two files side by side, each replaced atomically (temporary file in the
same directory, fsync, rename, mode 0644 because slurmctld reads them as SlurmUser):

``recommendations.json`` -- for people and tools::

    {"version": 1, "generated_at": 1733150000,
     "by_key":   {"alice|train|gpu": {"time_limit_min": 120, "mem_mib": 1500, "cpus": 4,
                                      "gpus": 1, "samples": 12}, ...},
     "fallback": {"alice": {"time_limit_min": 240, "samples": 30}, ...}}

``recommendations.tsv`` -- what job_submit.lua reads at every submission. A line format
needs no JSON parser in Lua (sites rarely have lua-cjson, and a hand-written parser inside
slurmctld is risk for nothing), and the plugin finds one key with a plain substring search::

    # slurmgpu recommendations v1
    # generated_at=1733150000
    # key<TAB>time_limit_min<TAB>mem_mib<TAB>cpus<TAB>gpus<TAB>samples
    alice|train|gpu<TAB>120<TAB>1500<TAB>4<TAB>1<TAB>12
    alice<TAB>240<TAB>-<TAB>-<TAB>-<TAB>30
    # end 2

Keys are ``user|job name|partition`` (``by_key``) and ``user`` (``fallback``); ``-`` (JSON:
the field is left out) means no recommendation. Both files hold the same entries, sorted.
:func:`build_export` is pure; :class:`RecommendationExport` does the I/O.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_PATH",
    "FIELDS",
    "TSV_HEADER",
    "ExportError",
    "ExportResult",
    "Recommendation",
    "RecommendationExport",
    "atomic_write",
    "build_export",
    "parse_tsv",
    "render_json",
    "render_tsv",
    "split_key",
    "tsv_path_for",
]

DEFAULT_PATH = Path("/etc/slurmgpu/recommendations.json")
# job_submit.lua reads the whole TSV at every submission: ~2 ms per 50k rows
DEFAULT_MAX_ENTRIES = 50_000
FIELDS = ("time_limit_min", "mem_mib", "cpus", "gpus")
TSV_HEADER = "# slurmgpu recommendations v1"
_TSV_COLUMNS = "# key\t" + "\t".join((*FIELDS, "samples"))
_VERSION = 1
# far below Slurm's NO_VAL (2**32 - 2) and exact in Lua's doubles
_MAX_VALUE = 2**31 - 1
_FILE_MODE = 0o644


class ExportError(ValueError):
    """A recommendations file is not what the daemon writes."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    """What one key's jobs should ask for; None = no recommendation for that resource."""

    time_limit_min: int | None = None
    mem_mib: int | None = None
    cpus: int | None = None
    gpus: int | None = None
    samples: int = 0


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What :meth:`RecommendationExport.write` wrote."""

    json_path: Path
    tsv_path: Path
    entries: int
    skipped: tuple[str, ...]  # keys left out: unusable characters or no usable value


def tsv_path_for(json_path: Path | str) -> Path:
    """The TSV that goes with a JSON export path (same directory, suffix ``.tsv``)."""
    return Path(json_path).with_suffix(".tsv")


def split_key(key: str) -> tuple[str, str, str]:
    """``user|name|partition`` -> its parts; the job name may itself contain ``|``."""
    user, sep, rest = key.partition("|")
    name, sep2, partition = rest.rpartition("|")
    if not (sep and sep2 and user and name and partition):
        raise ValueError(f"not a user|name|partition key: {key!r}")
    return user, name, partition


def _clean_part(text: str, *, allow_bar: bool) -> bool:
    if not text:
        return False
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        return False
    return allow_bar or "|" not in text


def _key_of(key: object) -> str | None:
    """A by_key key from ``"u|n|p"`` or ``(u, n, p)``; None when Lua could never match it."""
    if isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) for k in key):
        user, name, partition = key
    elif isinstance(key, str):
        try:
            user, name, partition = split_key(key)
        except ValueError:
            return None
    else:
        return None
    if not (
        _clean_part(user, allow_bar=False)
        and _clean_part(name, allow_bar=True)
        and _clean_part(partition, allow_bar=False)
        and "," not in partition
    ):
        return None
    return f"{user}|{name}|{partition}"


def _field(value: object, name: str) -> object:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


def _count(raw: object) -> int | None:
    """A positive whole number Slurm can take, rounded up; None for anything else."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    if isinstance(raw, float):
        if not math.isfinite(raw):
            return None
        raw = math.ceil(raw)
    if not 1 <= raw <= _MAX_VALUE:
        return None
    return int(raw)


def _entry(value: object) -> dict[str, int] | None:
    entry: dict[str, int] = {}
    for name in FIELDS:
        count = _count(_field(value, name))
        if count is not None:
            entry[name] = count
    if not entry:
        return None
    samples = _field(value, "samples")
    if isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0:
        entry["samples"] = min(samples, _MAX_VALUE)
    else:
        entry["samples"] = 0
    return entry


def _normalise(
    by_key: Mapping[Any, object],
    fallback: Mapping[str, object] | None,
    max_entries: int | None,
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], list[str]]:
    skipped: list[str] = []
    keyed: dict[str, dict[str, int]] = {}
    for raw_key, value in by_key.items():
        key = _key_of(raw_key)
        entry = _entry(value) if key is not None else None
        if key is None or entry is None:
            skipped.append(str(raw_key))
            continue
        keyed[key] = entry
    users: dict[str, dict[str, int]] = {}
    for user, value in (fallback or {}).items():
        ok = isinstance(user, str) and _clean_part(user, allow_bar=False)
        entry = _entry(value) if ok else None
        if entry is None:
            skipped.append(str(user))
            continue
        users[user] = entry
    if max_entries is not None and len(keyed) + len(users) > max_entries:
        # keep the best-supported keys; fallbacks first (one per user, they cover most)
        room = max(max_entries - len(users), 0)
        if len(users) > max_entries:
            kept_users = sorted(users, key=lambda u: (-users[u]["samples"], u))[:max_entries]
            skipped += sorted(set(users) - set(kept_users))
            users = {u: users[u] for u in kept_users}
        kept = sorted(keyed, key=lambda k: (-keyed[k]["samples"], k))[:room]
        skipped += sorted(set(keyed) - set(kept))
        keyed = {k: keyed[k] for k in kept}
    return (
        {k: keyed[k] for k in sorted(keyed)},
        {u: users[u] for u in sorted(users)},
        skipped,
    )


def build_export(
    by_key: Mapping[Any, object],
    fallback: Mapping[str, object] | None = None,
    *,
    generated_at: int,
    max_entries: int | None = DEFAULT_MAX_ENTRIES,
) -> dict[str, Any]:
    """The export document from the policy layer's recommendations (pure).

    ``by_key`` maps ``"user|name|partition"`` (or a ``(user, name, partition)`` tuple) and
    ``fallback`` maps ``"user"`` to a :class:`Recommendation`, any object with the same
    attribute names, or a dict with the same keys. Values are rounded up to whole numbers;
    missing, non-positive or absurd values are left out. Keys Lua could never match (control
    characters, ``|`` in a user or partition, several partitions) and entries without any
    usable value are dropped; so are the least-sampled keys beyond ``max_entries``.
    """
    keyed, users, _ = _normalise(by_key, fallback, max_entries)
    return {
        "version": _VERSION,
        "generated_at": int(generated_at),
        "by_key": keyed,
        "fallback": users,
    }


def render_json(doc: Mapping[str, Any]) -> str:
    """The JSON file's text: sorted keys, one entry per line, no padding."""
    lines = [
        "{",
        f'"version": {int(doc["version"])},',
        f'"generated_at": {int(doc["generated_at"])},',
    ]
    for section, comma in (("by_key", ","), ("fallback", "")):
        entries = doc[section]
        if not entries:
            lines.append(f'"{section}": {{}}{comma}')
            continue
        lines.append(f'"{section}": {{')
        items = sorted(entries.items())
        for i, (key, entry) in enumerate(items):
            body = json.dumps(dict(sorted(entry.items())), separators=(",", ":"))
            lines.append(f"{json.dumps(key)}: {body}{',' if i < len(items) - 1 else ''}")
        lines.append(f"}}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _tsv_row(key: str, entry: Mapping[str, int]) -> str:
    cells = [str(entry[f]) if entry.get(f) is not None else "-" for f in FIELDS]
    return "\t".join([key, *cells, str(entry.get("samples", 0))])


def render_tsv(doc: Mapping[str, Any]) -> str:
    """The TSV file's text (see the module docstring); by_key rows, then fallback rows."""
    rows = [_tsv_row(k, e) for k, e in sorted(doc["by_key"].items())]
    rows += [_tsv_row(u, e) for u, e in sorted(doc["fallback"].items())]
    lines = [TSV_HEADER, f"# generated_at={int(doc['generated_at'])}", _TSV_COLUMNS]
    lines += rows
    lines.append(f"# end {len(rows)}")
    return "\n".join(lines) + "\n"


def parse_tsv(text: str) -> dict[str, Any]:
    """Parse a TSV export strictly (every row, the header and the end count) into the same
    document :func:`build_export` returns. Raises :class:`ExportError`."""
    try:
        return _parse_tsv(text)
    except ValueError as exc:  # int() of a comment line's number
        if isinstance(exc, ExportError):
            raise
        raise ExportError(f"bad recommendations TSV: {exc}") from exc


def _parse_tsv(text: str) -> dict[str, Any]:
    lines = text.split("\n")
    if not text.endswith("\n") or lines[0] != TSV_HEADER:
        raise ExportError("not a slurmgpu v1 recommendations TSV")
    lines = lines[:-1]
    generated_at: int | None = None
    end: int | None = None
    by_key: dict[str, dict[str, int]] = {}
    fallback: dict[str, dict[str, int]] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if end is not None:
            raise ExportError(f"line {lineno}: data after the end line")
        if line.startswith("#"):
            if line.startswith("# generated_at="):
                generated_at = int(line.split("=", 1)[1])
            elif line.startswith("# end "):
                end = int(line[len("# end ") :])
            continue
        cells = line.split("\t")
        if len(cells) != len(FIELDS) + 2 or not cells[0]:
            raise ExportError(f"line {lineno}: expected {len(FIELDS) + 2} tab-separated cells")
        key, *values, samples = cells
        entry: dict[str, int] = {}
        for name, cell in zip(FIELDS, values, strict=True):
            if cell == "-":
                continue
            if not cell.isdigit():
                raise ExportError(f"line {lineno}: {name} is not a count: {cell!r}")
            entry[name] = int(cell)
        if not samples.isdigit():
            raise ExportError(f"line {lineno}: samples is not a count: {samples!r}")
        entry["samples"] = int(samples)
        (by_key if "|" in key else fallback)[key] = entry
    if end is None:
        raise ExportError("no end line (truncated?)")
    if end != len(by_key) + len(fallback):
        raise ExportError(f"end line says {end} rows, found {len(by_key) + len(fallback)}")
    if generated_at is None:
        raise ExportError("no generated_at line")
    return {
        "version": _VERSION,
        "generated_at": generated_at,
        "by_key": by_key,
        "fallback": fallback,
    }


def atomic_write(path: Path | str, data: bytes, mode: int = _FILE_MODE) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, whole.

    Temporary file in the same directory (a rename never crosses file systems), fsync,
    rename over the target, fsync of the directory (the rename survives a crash).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class RecommendationExport:
    """The recommendations files of one site: ``path`` (JSON) and the TSV next to it."""

    def __init__(
        self, path: Path | str = DEFAULT_PATH, *, max_entries: int | None = DEFAULT_MAX_ENTRIES
    ) -> None:
        self.json_path = Path(path)
        self.tsv_path = tsv_path_for(self.json_path)
        self.max_entries = max_entries

    def __repr__(self) -> str:
        return f"RecommendationExport({str(self.json_path)!r})"

    def write(
        self,
        by_key: Mapping[Any, object],
        fallback: Mapping[str, object] | None = None,
        *,
        generated_at: int | None = None,
    ) -> ExportResult:
        """Build the export (see :func:`build_export`) and replace both files atomically.

        The TSV goes first: it is the one slurmctld reads.
        """
        stamp = int(time.time()) if generated_at is None else int(generated_at)
        keyed, users, skipped = _normalise(by_key, fallback, self.max_entries)
        doc = {"version": _VERSION, "generated_at": stamp, "by_key": keyed, "fallback": users}
        atomic_write(self.tsv_path, render_tsv(doc).encode())
        atomic_write(self.json_path, render_json(doc).encode())
        return ExportResult(
            json_path=self.json_path,
            tsv_path=self.tsv_path,
            entries=len(keyed) + len(users),
            skipped=tuple(skipped),
        )

    def load(self) -> dict[str, Any]:
        """The JSON export as written (raises OSError, ExportError)."""
        try:
            doc = json.loads(self.json_path.read_text())
        except json.JSONDecodeError as exc:
            raise ExportError(f"{self.json_path}: not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("version") != _VERSION:
            raise ExportError(f"{self.json_path}: not a version {_VERSION} export")
        return doc

    def load_tsv(self) -> dict[str, Any]:
        """The TSV export, parsed strictly (raises OSError, ExportError)."""
        return parse_tsv(self.tsv_path.read_text())

    def remove(self) -> None:
        """Delete both files (the plugin then passes every job unchanged)."""
        for path in (self.tsv_path, self.json_path):
            path.unlink(missing_ok=True)

"""A benchmark run's record: its figures, the baseline measured in the same run, targets.

Every script in ``bench/`` takes ``--smoke`` (a size that runs in seconds, what CI runs so
a bench that breaks fails CI) and ``--json-out PATH`` and, at the end, writes one JSON
document per run (``PATH`` a directory: a new file ``<bench>-<UTC time>.json`` in it), so
figures can be compared across commits and machines::

    {"bench": "ingest", "at": "2026-12-04T18:00:00Z", "commit": "577b3c8…", "smoke": false,
     "machine": {"cpus": 2, "memory_gib": 24.0, "python": "3.11.9", "platform": "…"},
     "params": {...}, "figures": {...}, "baseline": {...},
     "targets": {"name": {"value": 0.61, "target": ">= 0.5", "met": true}, ...}}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BenchRun", "Target", "add_arguments"]


def add_arguments(parser: argparse.ArgumentParser, smoke: str) -> None:
    """Add ``--smoke`` (described by ``smoke``: what the small size is) and ``--json-out``."""
    parser.add_argument("--smoke", action="store_true", help=f"smoke size (seconds): {smoke}")
    parser.add_argument(
        "--json-out",
        type=Path,
        metavar="PATH",
        help="write this run's figures and baseline as JSON to PATH (a directory: a new file)",
    )


@dataclass(frozen=True)
class Target:
    """One target a figure is held to: ``value`` against ``target`` (``">= 0.5"``)."""

    value: float
    target: str
    met: bool


def _commit() -> str:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 0


@dataclass
class BenchRun:
    """Collects one run's figures; :meth:`write` stores them where ``--json-out`` says."""

    bench: str
    smoke: bool
    params: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    targets: dict[str, Target] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    @classmethod
    def from_args(cls, bench: str, args: argparse.Namespace) -> BenchRun:
        params = {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("json_out", "smoke") and not k.startswith("_")
        }
        return cls(bench=bench, smoke=bool(getattr(args, "smoke", False)), params=params)

    def target(self, name: str, value: float, target: str, met: bool) -> bool:
        self.targets[name] = Target(value=float(value), target=target, met=bool(met))
        return met

    def document(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "commit": _commit(),
            "smoke": self.smoke,
            "seconds": round(time.time() - self.started, 3),
            "machine": {
                "cpus": _cpus(),
                "memory_gib": _memory_gib(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "params": _plain(self.params),
            "figures": _plain(self.figures),
            "baseline": _plain(self.baseline),
            "targets": {
                k: {"value": t.value, "target": t.target, "met": t.met}
                for k, t in self.targets.items()
            },
        }

    def write(self, path: Path | None) -> Path | None:
        """Write the document to ``path`` (a directory: a new file in it); ``None``: nothing."""
        if path is None:
            return None
        if path.is_dir():
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.started))
            path = path / f"{self.bench}-{stamp}-{os.getpid()}.json"
        path.write_text(json.dumps(self.document(), indent=2, sort_keys=True) + "\n")
        print(f"figures written to {path}")
        return path


def _plain(value: Any) -> Any:
    """JSON-ready: mappings and sequences walked, paths as text, floats rounded to 6 digits."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float):
        return round(value, 6)
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)

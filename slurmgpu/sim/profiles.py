"""Throughput of the Pollux applications, interpolated from their measured profiles.

``shared/data/pollux/profiles/MODEL/placements.csv`` holds measured ``step_time`` and
``sync_time`` (seconds) per *placement* -- GPUs per node, e.g. ``"22"`` is two nodes with
two GPUs each -- and local batch size; ``scalability.csv`` the same by ``num_nodes``,
``num_replicas`` and local batch size for layouts over more nodes (ATTRIBUTION.md: the
Pollux OSDI'21 artifact, Apache-2.0).

The step time of a job whose global batch size ``B`` runs on ``r`` GPUs:

- local batch ``ceil(B / r)``; when it exceeds the largest measured local batch, the job
  accumulates gradients over ``a`` extra micro-steps (as the Pollux simulator does), each
  costing the compute part of a step (``step_time - sync_time``);
- a placement that was measured is interpolated linearly in local batch size (clamped to
  the measured range); any other placement uses the mean of the measured placements and
  the scalability rows with the same node count (the nearest measured node count, capped
  at 16) and is interpolated linearly in replicas, then in local batch size.

How much work a job has (``APPLICATIONS``): the Pollux workloads do not say how long a
job runs; the application does. A job trains ``epochs`` passes over ``samples_per_epoch``
samples at its fixed global batch size, so it needs ``ceil(epochs * samples / B)`` steps.
The epochs are the Pollux simulator's per-application budgets; the samples per epoch are
the datasets' sizes (CIFAR-10 50,000; ImageNet-1k 1,281,167; PASCAL VOC 07+12 trainval
16,551; SQuAD 1.1 BERT features 88,641; MovieLens-1M with 4 negatives per positive
4,971,008; DeepSpeech2's corpus about 7,150 utterances), which agree with the iteration
counts in the artifact's validation traces. Unlike Pollux, the global batch size is the
user's and never changes (Slurm jobs do not retune themselves), so statistical efficiency
is constant and a resize changes only the step time.
"""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = [
    "APPLICATIONS",
    "Application",
    "ProfileError",
    "ThroughputProfile",
    "load_profiles",
]


class ProfileError(ValueError):
    """A profile file is missing or malformed (names the file and line)."""


@dataclass(frozen=True, slots=True)
class Application:
    """How much an application trains and what it looks like on a GPU.

    ``util_pct`` and ``memory_mib`` feed the co-location model; they are typical values
    for these models on a V100-class GPU, not measurements from the traces.
    """

    name: str
    epochs: int
    samples_per_epoch: int
    util_pct: float = 90.0
    memory_mib: float = 12_000.0

    def steps(self, batch_size: int) -> int:
        """Return the optimiser steps a job needs at global batch size ``batch_size``."""
        return max(1, math.ceil(self.epochs * self.samples_per_epoch / max(1, batch_size)))


APPLICATIONS: Mapping[str, Application] = {
    "cifar10": Application("cifar10", 100, 50_000, util_pct=60.0, memory_mib=3_000.0),
    "imagenet": Application("imagenet", 90, 1_281_167, util_pct=95.0, memory_mib=14_000.0),
    "yolov3": Application("yolov3", 50, 16_551, util_pct=90.0, memory_mib=12_000.0),
    "bert": Application("bert", 2, 88_641, util_pct=95.0, memory_mib=14_000.0),
    "ncf": Application("ncf", 10, 4_971_008, util_pct=40.0, memory_mib=2_000.0),
    "deepspeech2": Application("deepspeech2", 80, 7_150, util_pct=85.0, memory_mib=10_000.0),
}


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation, clamped to the end points (``xs`` sorted)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class _Curve:
    """step and sync time against local batch size, for one layout."""

    __slots__ = ("bsz", "step", "sync")

    def __init__(self, points: list[tuple[float, float, float]]) -> None:
        points.sort()
        merged: dict[float, list[tuple[float, float]]] = {}
        for b, st, sy in points:
            merged.setdefault(b, []).append((st, sy))
        self.bsz = list(merged)
        self.step = [sum(p[0] for p in v) / len(v) for v in merged.values()]
        self.sync = [sum(p[1] for p in v) / len(v) for v in merged.values()]

    def at(self, local_bsz: float) -> tuple[float, float]:
        return _interp(self.bsz, self.step, local_bsz), _interp(self.bsz, self.sync, local_bsz)


def _canonical(placement: Sequence[int]) -> tuple[int, ...]:
    """The lexicographically smallest rotation of the non-empty nodes (as measured)."""
    p = tuple(g for g in placement if g > 0)
    if not p:
        return p
    return min(p[i:] + p[:i] for i in range(len(p)))


class ThroughputProfile:
    """Measured step times of one application, interpolated to any placement."""

    def __init__(
        self,
        name: str,
        placements: Mapping[tuple[int, ...], list[tuple[float, float, float]]],
        scalability: Mapping[tuple[int, int], list[tuple[float, float, float]]],
    ) -> None:
        if not placements:
            raise ProfileError(f"profile {name}: no placements")
        self.name = name
        self._placements = {k: _Curve(list(v)) for k, v in placements.items()}
        layouts: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
        for key, pts in placements.items():
            layouts.setdefault((len(key), sum(key)), []).extend(pts)
        for key2, pts in scalability.items():
            layouts.setdefault(key2, []).extend(pts)
        # node count -> sorted replica counts -> curve
        self._by_nodes: dict[int, tuple[list[int], list[_Curve]]] = {}
        for (nodes, replicas), pts in sorted(layouts.items()):
            reps, curves = self._by_nodes.setdefault(nodes, ([], []))
            reps.append(replicas)
            curves.append(_Curve(list(pts)))
        all_bsz = [b for pts in placements.values() for b, _, _ in pts]
        self.min_local_bsz = min(all_bsz)
        self.max_local_bsz = max(all_bsz)
        self._cached = lru_cache(maxsize=65536)(self._step_time)

    def layout_time(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """Return (step, sync) seconds for one atomic step on ``placement``."""
        exact = self._placements.get(placement)
        if exact is not None:
            return exact.at(local_bsz)
        nodes = min(len(placement), 16)
        replicas = sum(placement)
        counts = sorted(self._by_nodes)
        nearest = min(counts, key=lambda n: (abs(n - nodes), -n))
        reps, curves = self._by_nodes[nearest]
        if replicas <= reps[0]:
            return curves[0].at(local_bsz)
        if replicas >= reps[-1]:
            return curves[-1].at(local_bsz)
        i = bisect.bisect_right(reps, replicas)
        lo, hi = curves[i - 1].at(local_bsz), curves[i].at(local_bsz)
        f = (replicas - reps[i - 1]) / (reps[i] - reps[i - 1])
        return lo[0] + (hi[0] - lo[0]) * f, lo[1] + (hi[1] - lo[1]) * f

    def step_time(self, placement: Sequence[int], batch_size: int) -> float:
        """Return seconds per optimiser step at global ``batch_size`` on ``placement``."""
        return self._cached(_canonical(placement), batch_size)

    def _step_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        replicas = sum(placement)
        if replicas <= 0:
            return math.inf
        local = math.ceil(batch_size / replicas - 1e-8)
        accum = max(0, math.ceil(local / self.max_local_bsz - 1e-8) - 1)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        step, sync = self.layout_time(placement, atomic)
        return step + accum * max(0.0, step - sync)

    def max_replicas(self, batch_size: int) -> int:
        """The most GPUs a job of ``batch_size`` can use (each needs a measured local batch)."""
        return max(1, int(batch_size // self.min_local_bsz))


def _read(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise ProfileError(f"{path}: missing column(s) {', '.join(missing)}")
    return list(reader)


def _num(row: Mapping[str, str], key: str, path: Path, line: int) -> float:
    try:
        value = float(row[key])
    except (TypeError, ValueError):
        raise ProfileError(f"{path}, line {line}: {key} must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise ProfileError(f"{path}, line {line}: {key} must be a finite number >= 0")
    return value


def load_profile(directory: Path) -> ThroughputProfile:
    """Read one application's ``placements.csv`` (and ``scalability.csv`` when present)."""
    pfile = directory / "placements.csv"
    placements: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
    for line, row in enumerate(_read(pfile, ("placement", "local_bsz", "step_time")), 2):
        text = row["placement"].strip()
        if not text.isdigit():
            raise ProfileError(f"{pfile}, line {line}: placement must be digits like 2211")
        key = _canonical([int(c) for c in text])
        sync = _num(row, "sync_time", pfile, line) if row.get("sync_time") else 0.0
        placements.setdefault(key, []).append(
            (_num(row, "local_bsz", pfile, line), _num(row, "step_time", pfile, line), sync)
        )
    sfile = directory / "scalability.csv"
    scal: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
    if sfile.exists():
        cols = ("num_nodes", "num_replicas", "local_bsz", "step_time")
        for line, row in enumerate(_read(sfile, cols), 2):
            key2 = (
                int(_num(row, "num_nodes", sfile, line)),
                int(_num(row, "num_replicas", sfile, line)),
            )
            sync = _num(row, "sync_time", sfile, line) if row.get("sync_time") else 0.0
            scal.setdefault(key2, []).append(
                (_num(row, "local_bsz", sfile, line), _num(row, "step_time", sfile, line), sync)
            )
    return ThroughputProfile(directory.name, placements, scal)


def load_profiles(root: Path) -> dict[str, ThroughputProfile]:
    """Read every ``root/MODEL/placements.csv``; raises ProfileError when there is none."""
    if not root.is_dir():
        raise ProfileError(f"{root}: no such profile directory")
    found = {d.name: load_profile(d) for d in sorted(root.iterdir()) if d.is_dir()}
    if not found:
        raise ProfileError(f"{root}: no MODEL/placements.csv profiles")
    return found

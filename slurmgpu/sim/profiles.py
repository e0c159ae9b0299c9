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

How much work a job has (``APPLICATIONS``) follows the Pollux simulator's model
(petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/applications.py`` and
``simulator/simulator.py`` ``Job.step``): an application is done after its epoch budget
(bert 2, cifar10 100, ncf 10, imagenet 90, deepspeech2 80, yolov3 50), measured as
*progress* -- optimiser steps at the initial batch size ``B0`` (the smallest batch size
the artifact validated), each weighted by statistical efficiency. A step at global batch
``B`` advances progress by the gain ``(B/B0) * (phi + B0) / (phi + B)``, where ``phi`` is
the gradient noise scale (Pollux's PGNS, ``grad_var / grad_sqr * B0``) at that point of
training. A job of fixed batch ``B`` therefore needs ``sum_k P/K * (B0/B) * (phi_k + B) /
(phi_k + B0)`` steps (:meth:`Application.steps`), where ``P`` is the progress the artifact
counts to the end of the budget and ``phi_k`` the noise scale over the k-th of ``K = 8``
equal slices of it.

The ``phi_k`` are ours: fitted (coordinate descent on log phi, starting from the
per-slice geometric mean of the artifact's measured ``grad_var / grad_sqr`` over its
validation runs) so that the sum reproduces the step counts Pollux's own ``Job.step``
integrates for every validated batch size and every batch size in the workloads (it
interpolates the measured gradient statistics between validated batch sizes, epoch by
epoch): largest deviation 1.3 % (ncf) to 3.5 % (imagenet). Large batches are therefore
worth less per sample than small ones (cifar10 at B = 2048 needs 3,343 steps, not the
2,441 of 100 epochs over 50,000 images), which is why jobs take longer here than under a
constant-efficiency model. Batch sizes never change (Slurm jobs do not retune
themselves), so a job's step count is fixed when it is submitted and a resize changes its
step time only.

Step times follow the artifact too: yolov3 is limited to a local batch of 8 (its
``max_local_bsz``), and a job of ``B > B0`` on one GPU accumulates at least one extra
micro-step (``update_local_bsz``).
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

    ``init_batch_size`` is Pollux's ``B0``, ``progress`` the efficiency-weighted steps at
    ``B0`` to the end of ``epochs``, ``noise_scale`` the gradient noise scale over equal
    slices of that progress (see the module docstring). ``max_local_bsz`` caps the local
    batch below the largest profiled one where the artifact does (yolov3).
    ``util_pct`` and ``memory_mib`` feed the co-location model; they are typical values
    for these models on a V100-class GPU, not measurements from the traces.
    """

    name: str
    epochs: int
    init_batch_size: int
    progress: float
    noise_scale: tuple[float, ...]
    util_pct: float = 90.0
    memory_mib: float = 12_000.0
    max_local_bsz: int | None = None

    def efficiency(self, batch_size: int) -> float:
        """Statistical efficiency at ``batch_size`` over the whole run (1.0 at ``B0``).

        Progress per sample, averaged the way a run integrates it: one over the mean of
        ``(phi + B) / (phi + B0)`` over the slices.
        """
        b0 = float(self.init_batch_size)
        b = max(float(batch_size), b0)
        k = len(self.noise_scale)
        return k / sum((phi + b) / (phi + b0) for phi in self.noise_scale)

    def efficiency_in(self, batch_size: int, phase: int) -> float:
        """Statistical efficiency at ``batch_size`` over the ``phase``-th slice of training
        (its noise scale ``phi_k``): ``(phi_k + B0) / (phi_k + B)``."""
        b0 = float(self.init_batch_size)
        b = max(float(batch_size), b0)
        phi = self.noise_scale[min(max(phase, 0), len(self.noise_scale) - 1)]
        return (phi + b0) / (phi + b)

    def steps(self, batch_size: int) -> int:
        """Return the optimiser steps a job needs at global batch size ``batch_size``."""
        b0 = float(self.init_batch_size)
        b = max(float(batch_size), b0)
        return max(1, math.ceil(self.progress * (b0 / b) / self.efficiency(batch_size)))


APPLICATIONS: Mapping[str, Application] = {
    "cifar10": Application(
        "cifar10",
        100,
        128,
        39_063.0,
        (1130.0, 4190.0, 5100.0, 7330.0, 10500.0, 13900.0, 24000.0, 35800.0),
        util_pct=60.0,
        memory_mib=3_000.0,
    ),
    "imagenet": Application(
        "imagenet",
        90,
        200,
        576_526.0,
        (10000.0, 7390.0, 13800.0, 28000.0, 24200.0, 39300.0, 45500.0, 47100.0),
        util_pct=95.0,
        memory_mib=14_000.0,
    ),
    "yolov3": Application(
        "yolov3",
        50,
        8,
        103_444.0,
        (40.8, 183.0, 514.0, 502.0, 666.0, 856.0, 1650.0, 3010.0),
        util_pct=90.0,
        memory_mib=12_000.0,
        max_local_bsz=8,
    ),
    "bert": Application(
        "bert",
        2,
        12,
        14_774.0,
        (6820.0, 4630.0, 4870.0, 4870.0, 19000.0, 18000.0, 18000.0, 18000.0),
        util_pct=95.0,
        memory_mib=14_000.0,
    ),
    "ncf": Application(
        "ncf",
        10,
        256,
        194_174.0,
        (127e3, 2.64e6, 2.65e6, 7.92e6, 10.9e6, 11.5e6, 32.3e6, 37.1e6),
        util_pct=40.0,
        memory_mib=2_000.0,
    ),
    "deepspeech2": Application(
        "deepspeech2",
        80,
        20,
        28_536.0,
        (140.0, 1140.0, 3350.0, 5460.0, 56500.0, 206000.0, 142000.0, 243000.0),
        util_pct=85.0,
        memory_mib=10_000.0,
    ),
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

    def step_time(
        self,
        placement: Sequence[int],
        batch_size: int,
        *,
        max_local_bsz: float | None = None,
        init_batch_size: int | None = None,
    ) -> float:
        """Return seconds per optimiser step at global ``batch_size`` on ``placement``.

        ``max_local_bsz`` lowers the largest local batch a GPU takes (gradients are
        accumulated beyond it); with ``init_batch_size`` a one-GPU job of a larger batch
        accumulates at least one extra micro-step, as the Pollux simulator has it.
        """
        return self._cached(_canonical(placement), batch_size, max_local_bsz, init_batch_size)

    def _step_time(
        self,
        placement: tuple[int, ...],
        batch_size: int,
        max_local_bsz: float | None,
        init_batch_size: int | None,
    ) -> float:
        replicas = sum(placement)
        if replicas <= 0:
            return math.inf
        cap = (
            self.max_local_bsz if max_local_bsz is None else min(max_local_bsz, self.max_local_bsz)
        )
        local = math.ceil(batch_size / replicas - 1e-8)
        accum = max(0, math.ceil(local / cap - 1e-8) - 1)
        if replicas == 1 and init_batch_size is not None and batch_size > init_batch_size:
            accum = max(1, accum)
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

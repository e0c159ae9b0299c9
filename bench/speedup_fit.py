"""Evaluate the speedup-curve fit (``slurmgpu.policy.speedup``) on measured Pollux profiles.

Data: ``shared/data/pollux/profiles/MODEL/{placements,scalability}.csv`` (measured step
and sync times of six models by placement and local batch size; Pollux OSDI'21 artifact,
Apache-2.0, see shared/data/ATTRIBUTION.md; read in place). The truth at ``n`` GPUs is
the measured step time of the packed placement (``4`` GPUs per node, like the Pollux
study) at the job's global batch -- ``slurmgpu.sim.profiles`` interpolates the measured
rows in local batch size, as the simulator does. Throughput = batch / step time.

Cases: every (model, global batch) pair the Pollux workloads submit, each size ``n0`` in
{1, 2, 4, 6, 8, 12, 16} the job could start at, and what a malleable job has measured by
then: ``1 size`` (its start), ``2 sizes`` (after one resize: ``n0/2`` or ``2 n0``), ``3
sizes`` (``n0/2, n0, 2 n0``). Each predicts every other size up to the model's useful
maximum (held out: never in the fit).

Methods: the fit (Pollux-style four-term curve, regularised to a prior), a plain two-term
Amdahl fit, and the baseline *linear scaling* from the nearest measured size. The prior is
chosen by grid search **leaving the evaluated model out** (chosen on the other five), so
no model's error comes from a prior fitted on it; ``--choose-prior`` prints the prior
chosen on all six (the shipped default).

Errors: absolute percentage error of predicted throughput (median and mean over held-out
points), and the share of "is a resize to n faster by >= 15 %?" calls that agree with the
truth (the question the malleable policy asks). Also the time of one fit.

Run: ``.venv/bin/python bench/speedup_fit.py``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.policy.speedup import (
    DEFAULT_PRIOR,
    SpeedupPrior,
    fit_amdahl,
    fit_speedup,
    linear_scaling,
)
from slurmgpu.sim.profiles import ThroughputProfile, load_profiles
from slurmgpu.sim.workload import packed

DEFAULT_DATA = Path(
    os.environ.get("SGPU_SHARED_DATA", str(Path(__file__).resolve().parents[2] / "shared/data"))
)
GPUS_PER_NODE = 4
SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
STARTS = (1, 2, 4, 6, 8, 12, 16)
GAIN = 0.15  # the decision question: is n at least 15 % faster than the current size?


@dataclass(frozen=True, slots=True)
class Case:
    """One job's measurements and the held-out sizes to predict, with the truth."""

    model: str
    batch: int
    scenario: str
    current: int
    measured: Mapping[int, float]
    truth: Mapping[int, float]  # held-out size -> true throughput


def workload_batches(root: Path) -> dict[str, set[int]]:
    """Return the global batch sizes each model is submitted with in the Pollux workloads."""
    out: dict[str, set[int]] = {}
    for path in sorted((root / "pollux/workloads").glob("*.csv")):
        with path.open() as fh:
            for row in csv.DictReader(fh):
                out.setdefault(row["application"], set()).add(int(row["batch_size"]))
    return out


def build_cases(
    profiles: Mapping[str, ThroughputProfile], batches: Mapping[str, set[int]]
) -> list[Case]:
    cases: list[Case] = []
    for model, sizes in sorted(batches.items()):
        prof = profiles[model]
        for batch in sorted(sizes):
            top = min(64, prof.max_replicas(batch))
            ns = [n for n in SIZES if n <= top]

            def rate(n: int, prof: ThroughputProfile = prof, batch: int = batch) -> float:
                return batch / prof.step_time(packed(n, GPUS_PER_NODE), batch)

            truth = {n: rate(n) for n in ns}
            for n0 in STARTS:
                if n0 > top:
                    continue
                sets: list[tuple[str, tuple[int, ...]]] = [("1 size", (n0,))]
                for other in (n0 // 2, n0 * 2):
                    if other >= 1 and other != n0 and other <= top:
                        sets.append(("2 sizes", (n0, other)))
                if n0 // 2 >= 1 and n0 * 2 <= top and n0 // 2 != n0:
                    sets.append(("3 sizes", (n0 // 2, n0, n0 * 2)))
                for name, seen in sets:
                    measured = {n: rate(n) for n in seen}
                    held = {n: truth[n] for n in ns if n not in measured}
                    if held:
                        cases.append(Case(model, batch, name, n0, measured, held))
    return cases


Predictor = Callable[[Mapping[int, float], int], float]


def predictor_fit(prior: SpeedupPrior) -> Predictor:
    def predict(measured: Mapping[int, float], n: int) -> float:
        curve = fit_speedup(measured, prior)
        return curve.throughput(n) if curve else 0.0

    return predict


def predictor_amdahl(measured: Mapping[int, float], n: int) -> float:
    curve = fit_amdahl(measured)
    return curve.throughput(n) if curve else 0.0


@dataclass(slots=True)
class Score:
    ape: list[float]
    agree: int = 0
    calls: int = 0

    def add(self, other: Score) -> None:
        self.ape.extend(other.ape)
        self.agree += other.agree
        self.calls += other.calls


def score(cases: Iterable[Case], predict: Predictor) -> Score:
    s = Score([])
    for c in cases:
        base_true = c.measured[c.current]
        for n, true in c.truth.items():
            pred = predict(c.measured, n)
            s.ape.append(abs(pred - true) / true)
            s.calls += 1
            s.agree += (pred / base_true >= 1 + GAIN) == (true / base_true >= 1 + GAIN)
    return s


def log_error(cases: Iterable[Case], predict: Predictor) -> float:
    errs = [
        abs(math.log(max(1e-9, predict(c.measured, n)) / t))
        for c in cases
        for n, t in c.truth.items()
    ]
    return sum(errs) / len(errs) if errs else 0.0


PRIOR_GRID = tuple(
    SpeedupPrior(serial=a, sync=b, per_gpu=c, weight=w)
    for a, b, c, w in product(
        (0.0, 0.015, 0.03, 0.06),
        (0.0, 0.015, 0.03, 0.06),
        (0.0, 0.002, 0.01),
        (1.0, 3.0, 10.0, 30.0),
    )
)


def choose_prior(
    errors: Mapping[SpeedupPrior, Mapping[str, float]],
    counts: Mapping[str, int],
    exclude: str | None,
) -> SpeedupPrior:
    """Return the grid prior with the lowest mean log error over the models but ``exclude``."""

    def total(p: SpeedupPrior) -> float:
        num = sum(errors[p][m] * counts[m] for m in counts if m != exclude)
        den = sum(counts[m] for m in counts if m != exclude)
        return num / den

    return min(errors, key=total)  # the grid searched (a smoke run searches a few)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument(
        "--choose-prior", action="store_true", help="print the prior chosen on all models"
    )
    add_arguments(ap, "4 priors searched instead of the whole grid")
    args = ap.parse_args(argv)
    run = BenchRun.from_args("speedup_fit", args)
    grid = (DEFAULT_PRIOR, *PRIOR_GRID[:3]) if args.smoke else PRIOR_GRID
    root = args.data / "pollux/profiles"
    if not root.is_dir():
        print(f"bench/speedup_fit: {root} is absent; nothing to measure", file=sys.stderr)
        return 1
    profiles = load_profiles(root)
    cases = build_cases(profiles, workload_batches(args.data))
    by_model: dict[str, list[Case]] = {}
    for c in cases:
        by_model.setdefault(c.model, []).append(c)
    counts = {m: sum(len(c.truth) for c in cs) for m, cs in by_model.items()}

    t0 = time.perf_counter()
    errors = {p: {m: log_error(cs, predictor_fit(p)) for m, cs in by_model.items()} for p in grid}
    search_s = time.perf_counter() - t0
    if args.choose_prior:
        print(choose_prior(errors, counts, None))
        return 0

    methods: dict[str, dict[str, Score]] = {
        "fit (prior chosen without the model)": {},
        "fit (shipped default prior)": {},
        "Amdahl 2-term fit": {},
        "linear scaling (baseline)": {},
    }
    for model, cs in by_model.items():
        loo = choose_prior(errors, counts, model)
        for scen in ("1 size", "2 sizes", "3 sizes"):
            sub = [c for c in cs if c.scenario == scen]
            for label, pred in (
                ("fit (prior chosen without the model)", predictor_fit(loo)),
                ("fit (shipped default prior)", predictor_fit(DEFAULT_PRIOR)),
                ("Amdahl 2-term fit", predictor_amdahl),
                ("linear scaling (baseline)", linear_scaling),
            ):
                methods[label].setdefault(scen, Score([])).add(score(sub, pred))
                methods[label].setdefault("all", Score([])).add(score(sub, pred))

    print(
        f"speedup fit on {len(profiles)} measured Pollux profiles: {len(cases)} cases "
        f"({', '.join(f'{m} {len(cs)}' for m, cs in sorted(by_model.items()))}), "
        f"{sum(counts.values())} held-out (size, throughput) points"
    )
    print(f"{'method':<40}{'measured':>9}{'median APE':>12}{'mean APE':>10}{'resize call ok':>16}")
    for label, per in methods.items():
        for scen in ("1 size", "2 sizes", "3 sizes", "all"):
            s = per[scen]
            print(
                f"{label if scen == '1 size' else '':<40}{scen:>9}"
                f"{statistics.median(s.ape):>12.1%}{statistics.fmean(s.ape):>10.1%}"
                f"{s.agree / s.calls:>16.1%}"
            )
    base = statistics.median(methods["linear scaling (baseline)"]["all"].ape)
    fit = statistics.median(methods["fit (prior chosen without the model)"]["all"].ape)
    print(f"median APE, fit / linear scaling: {fit / base:.2f}")
    for model in sorted(by_model):
        print(f"  prior chosen without {model}: {choose_prior(errors, counts, model)}")
    print(f"  prior chosen on all models: {choose_prior(errors, counts, None)}")
    print(f"  shipped default:            {DEFAULT_PRIOR}")

    # Time of one fit (cache bypassed), 2 and 3 measured sizes, median of repeats.
    pts2 = ((2, 51.0), (4, 100.0))
    pts3 = ((2, 51.0), (4, 100.0), (8, 150.0))
    from slurmgpu.policy import speedup

    for pts in (pts2, pts3):
        reps = []
        for _ in range(5):
            t = time.perf_counter()
            for i in range(200):
                speedup._fit.__wrapped__(tuple((g, r + i * 1e-3) for g, r in pts), DEFAULT_PRIOR)
            reps.append((time.perf_counter() - t) / 200)
        t = time.perf_counter()
        for _ in range(200):
            linear_scaling(dict(pts), 16)
        lin = (time.perf_counter() - t) / 200
        print(
            f"one fit, {len(pts)} sizes: {statistics.median(reps) * 1e6:.0f} us "
            f"(linear-scaling guess: {lin * 1e6:.1f} us; the policy memoises fits)"
        )
    print(f"prior grid search: {len(grid)} priors in {search_s:.1f} s")
    run.baseline = {
        "linear_scaling": {
            scen: statistics.median(s.ape)
            for scen, s in methods["linear scaling (baseline)"].items()
        }
    }
    run.figures = {
        label: {scen: statistics.median(s.ape) for scen, s in per.items()}
        for label, per in methods.items()
        if label != "linear scaling (baseline)"
    }
    run.figures["fit_vs_linear_median_ape"] = fit / base
    run.figures["prior_search_s"] = search_s
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

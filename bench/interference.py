"""Fit and evaluate the co-location interference model on Lucid's measured GPU pairs.

Data: ``shared/data/lucid/colocate_info.csv`` (1,388 pairs of DL jobs measured sharing one
GPU: each job's speed relative to running alone, the pair's combined GPU util and memory;
see shared/data/ATTRIBUTION.md, S-Lab licence, non-commercial: read in place, never copied).

What a site can observe of a job before pairing it is its utilisation and memory when it
ran alone (its history). The file has only the pairs' combined figures, so each job
configuration's solo profile (model, dataset, batch size, AMP) is recovered by least
squares from the *training* pairs: combined memory = sum of the two jobs' memory; combined
util = sum of the two utils, fitted on pairs below 95 % (saturated pairs say only "at
least"). Held-out pairs never contribute to the profiles or the coefficients.

Per run (``--seeds`` random 75/25 splits of the pairs, medians printed):

- model: ``slurmgpu.policy.interference`` refitted on the training pairs, predicting both
  jobs' speed on the held-out pairs;
- baseline "no slowdown" (speed 1.0, what packing without a model assumes), same pairs;
- baseline "time-slicing" (speed min(1, 1 / (a + b)): no fitting, the physics alone).

Errors are of predicted speed (MAE, RMSE), and for admission at ``--bound`` (a pair is
admitted when both predicted slowdowns are within it): the share of admitted pairs that
really are within it, and the share of really compatible pairs admitted.

``--fit`` fits on every pair and prints the coefficients shipped in
``slurmgpu/policy/interference.py``. Run: ``.venv/bin/python bench/interference.py``.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.policy.interference import MIN_SPEED, InterferenceModel

DEFAULT_DATA = Path(
    os.environ.get("SGPU_SHARED_DATA", str(Path(__file__).resolve().parents[2] / "shared/data"))
)
LUCID_CSV = "lucid/colocate_info.csv"
SATURATED_UTIL_PCT = 95.0

Config = tuple[str, str, str, str]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Pair:
    """One measured pair: the two jobs' configurations and speeds, and combined figures."""

    a: Config
    b: Config
    speed_a: float
    speed_b: float
    util_pct: float
    memory_mib: float


def load_pairs(path: Path) -> list[Pair]:
    """Return the pairs of Lucid's colocate_info.csv; a malformed row is one clear error."""
    pairs = []
    with path.open(newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                pairs.append(
                    Pair(
                        a=(row["model1"], row["dataset1"], row["batchsize1"], row["amp1"]),
                        b=(row["model2"], row["dataset2"], row["batchsize2"], row["amp2"]),
                        speed_a=float(row["speed1"]),
                        speed_b=float(row["speed2"]),
                        util_pct=float(row["gpu_util"]),
                        memory_mib=float(row["gmem"]),
                    )
                )
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}, line {line}: not a Lucid pair row ({exc})") from None
    return pairs


def solo_profiles(train: Sequence[Pair]) -> dict[Config, tuple[float, float]]:
    """Config → (util % alone, memory MiB alone), by least squares on the pairs' sums."""
    configs = sorted({c for p in train for c in (p.a, p.b)})
    index = {c: i for i, c in enumerate(configs)}
    design = np.zeros((len(train), len(configs)))
    for row, p in enumerate(train):
        design[row, index[p.a]] += 1.0
        design[row, index[p.b]] += 1.0
    memory = np.array([p.memory_mib for p in train])
    util = np.array([p.util_pct for p in train])
    mem_solo = np.linalg.lstsq(design, memory, rcond=None)[0]
    ok = util < SATURATED_UTIL_PCT
    util_solo = np.linalg.lstsq(design[ok], util[ok], rcond=None)[0]
    # A configuration seen only in saturated pairs has no unsaturated equation: call it
    # half of its busiest pair's combined util (each side got at least that much).
    seen = design[ok].sum(axis=0) > 0
    for c, i in index.items():
        if not seen[i]:
            util_solo[i] = max(p.util_pct for p in train if c in (p.a, p.b)) / 2.0
    return {
        c: (float(np.clip(util_solo[i], 0.0, 100.0)), float(max(mem_solo[i], 0.0)))
        for c, i in index.items()
    }


def _features(util_self: Floats, util_partner: Floats) -> Floats:
    a, b = util_self / 100.0, util_partner / 100.0
    total = a + b
    fill = np.where(total <= 1.0, 1.0, 1.0 / np.maximum(total, 1e-9))
    return np.column_stack([np.ones_like(a), b, a * b, fill])


def _directions(
    pairs: Sequence[Pair], profiles: dict[Config, tuple[float, float]]
) -> tuple[Floats, Floats, Floats]:
    """(util of the job, util of its partner, measured speed), both directions of each pair."""
    ua = np.array([profiles[p.a][0] for p in pairs])
    ub = np.array([profiles[p.b][0] for p in pairs])
    speeds = np.array([p.speed_a for p in pairs] + [p.speed_b for p in pairs])
    return np.concatenate([ua, ub]), np.concatenate([ub, ua]), speeds


def fit(train: Sequence[Pair]) -> tuple[InterferenceModel, dict[Config, tuple[float, float]]]:
    """Return the model fitted on ``train`` and the solo profiles it was fitted with."""
    profiles = solo_profiles(train)
    own, partner, speed = _directions(train, profiles)
    beta = np.linalg.lstsq(_features(own, partner), speed, rcond=None)[0]
    model = InterferenceModel(
        intercept=float(beta[0]),
        partner=float(beta[1]),
        product=float(beta[2]),
        saturation=float(beta[3]),
    )
    return model, profiles


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Held-out errors of one split: model and the two baselines, same pairs."""

    pairs: int
    mae_model: float
    mae_naive: float
    mae_slicing: float
    rmse_model: float
    rmse_naive: float
    rmse_slicing: float
    admitted_ok_model: float  # of the pairs the model admits, share truly within the bound
    admitted_ok_naive: float  # "no slowdown" admits every pair: the base rate
    compatible_admitted_model: float  # of the truly compatible pairs, share admitted
    fit_s: float


def evaluate(
    pairs: Sequence[Pair], seed: int, bound: float, test_share: float = 0.25
) -> Evaluation:
    """Fit on a random ``1 - test_share`` of the pairs; score all three on the rest."""
    order = np.random.default_rng(seed).permutation(len(pairs))
    cut = round(len(pairs) * (1.0 - test_share))
    train = [pairs[i] for i in order[:cut]]
    test = [pairs[i] for i in order[cut:]]
    started = time.perf_counter()
    model, profiles = fit(train)
    fit_s = time.perf_counter() - started
    # Every configuration occurs in many pairs, so the training pairs profile all of them.
    test = [p for p in test if p.a in profiles and p.b in profiles]
    own, partner, truth = _directions(test, profiles)
    predicted = np.array([model.speed(u, v) for u, v in zip(own, partner, strict=True)])
    slicing = np.minimum(1.0, 1.0 / np.maximum((own + partner) / 100.0, 1e-9))
    slicing = np.maximum(slicing, MIN_SPEED)

    def mae(x: Floats) -> float:
        return float(np.mean(np.abs(x - truth)))

    def rmse(x: Floats) -> float:
        return float(np.sqrt(np.mean((x - truth) ** 2)))

    n = len(test)
    limit = 1.0 / bound
    truly_ok = (truth[:n] >= limit) & (truth[n:] >= limit)
    admitted = (predicted[:n] >= limit) & (predicted[n:] >= limit)
    ok_admitted = float(np.mean(truly_ok[admitted])) if admitted.any() else float("nan")
    recall = float(np.mean(admitted[truly_ok])) if truly_ok.any() else float("nan")
    return Evaluation(
        pairs=n,
        mae_model=mae(predicted),
        mae_naive=mae(np.ones_like(truth)),
        mae_slicing=mae(slicing),
        rmse_model=rmse(predicted),
        rmse_naive=rmse(np.ones_like(truth)),
        rmse_slicing=rmse(slicing),
        admitted_ok_model=ok_admitted,
        admitted_ok_naive=float(np.mean(truly_ok)),
        compatible_admitted_model=recall,
        fit_s=fit_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared/data directory")
    parser.add_argument("--seeds", type=int, default=10, help="random splits (medians printed)")
    parser.add_argument("--bound", type=float, default=1.25, help="admission slowdown bound")
    parser.add_argument("--fit", action="store_true", help="fit on all pairs, print coefficients")
    add_arguments(parser, "2 random splits")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds = 2
    run = BenchRun.from_args("interference", args)
    path = args.data / LUCID_CSV
    if not path.is_file():
        print(f"bench/interference: {path} is absent; nothing to measure", file=sys.stderr)
        return 1
    pairs = load_pairs(path)
    if args.fit:
        model, profiles = fit(pairs)
        print(f"# {len(pairs)} pairs, {len(profiles)} job configurations")
        print("COEFFICIENTS = InterferenceModel(")
        for name in ("intercept", "partner", "product", "saturation"):
            print(f"    {name}={getattr(model, name):.6f},")
        print(")")
        return 0
    runs = [evaluate(pairs, seed, args.bound) for seed in range(args.seeds)]

    def med(name: str) -> float:
        return float(statistics.median(float(getattr(r, name)) for r in runs))

    print(
        f"interference model on {len(pairs)} Lucid pairs: {args.seeds} random 75/25 splits, "
        f"{runs[0].pairs} held-out pairs x 2 jobs each; medians"
    )
    print(f"{'predicted speed':<22}{'MAE':>8}{'RMSE':>8}{'MAE / naive':>13}")
    for label, key in (
        ("model", "model"),
        ("no slowdown (naive)", "naive"),
        ("time-slicing 1/(a+b)", "slicing"),
    ):
        mae, rmse = med(f"mae_{key}"), med(f"rmse_{key}")
        print(f"{label:<22}{mae:>8.4f}{rmse:>8.4f}{mae / med('mae_naive'):>13.2f}")
    print(
        f"admission at slowdown <= {args.bound:g}: model admits pairs that are truly within "
        f"it {med('admitted_ok_model'):.1%} of the time (naive, admitting all: "
        f"{med('admitted_ok_naive'):.1%}); it admits {med('compatible_admitted_model'):.1%} "
        "of the truly compatible pairs"
    )
    print(f"fit time (profiles + coefficients): {med('fit_s') * 1000:.1f} ms")
    run.baseline = {
        "mae_naive": med("mae_naive"),
        "rmse_naive": med("rmse_naive"),
        "mae_slicing": med("mae_slicing"),
        "admitted_ok_naive": med("admitted_ok_naive"),
    }
    run.figures = {
        "mae_model": med("mae_model"),
        "rmse_model": med("rmse_model"),
        "admitted_ok_model": med("admitted_ok_model"),
        "compatible_admitted_model": med("compatible_admitted_model"),
        "fit_s": med("fit_s"),
    }
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

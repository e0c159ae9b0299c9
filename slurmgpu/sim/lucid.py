"""A fractional-GPU workload built from Lucid's measured GPU pairs, and their measured speeds.

Data: ``shared/data/lucid/colocate_info.csv`` (Lucid, ASPLOS'23; S-Lab licence,
non-commercial, read in place and never copied, see shared/data/ATTRIBUTION.md): 1,388
pairs of 1-GPU training jobs measured sharing one GPU -- each job's configuration
(model, dataset, batch size, AMP), its speed next to the partner relative to running
alone, and the pair's combined GPU util and memory.

**Solo profiles** (:func:`solo_profiles`). What a site knows of a job before pairing it
is how busy it kept its GPU and how much memory it took alone. The file has the pairs'
sums only, so each of the 56 configurations' solo util and memory are recovered by least
squares over the pairs (combined memory = the sum of the two; combined util = the sum,
fitted on the pairs below 95 %, since a saturated pair says only "at least"; a
configuration seen only in saturated pairs gets half of its busiest pair) -- the method of
``bench/interference.py``, here in plain Python so the package needs no numpy.

**Workload** (:func:`lucid_workload`, every draw seeded):

- ``users`` (16) users, each with ``configs_per_user`` (3) configurations drawn from the
  56; a job is a uniformly drawn user running one of theirs (people resubmit the same
  training, the observation behind the priors, docs/ANCHORS.md §5). Its name is the
  configuration (``ResNet18-CIFAR-10-b64-amp``), its model a 1-GPU
  :class:`~slurmgpu.sim.workload.RigidJob` with the configuration's solo util and memory.
- Every job asks ``--gres=gpu:1`` (the request co-location may turn into shards).
- Run time alone: log-normal, median ``median_run_s`` (30 min), ``sigma`` 1.0, clipped to
  2 min .. 12 h (Lucid's file has no durations; this is the 1-GPU shape of Philly and
  Helios: mostly short, a heavy tail).
- Arrivals: Poisson, at the rate that makes the offered demand ``load`` (1.0) times the
  cluster's GPUs when every job holds a whole GPU (mean run time x rate = GPUs x load).
- Time limits: the seeded :class:`~slurmgpu.sim.workload.TimeLimitModel`.
- Hints: a ``declare_share`` (0.3) share of the users submit their light configurations
  (solo util <= ``light_util_pct``, 40 %) ``sgpu submit --shareable --gpu-mem`` (comment
  tokens, memory rounded up to whole GiB); the rest are judged from their history.

**Measured slowdown** (:func:`measured_interference`): for SimSlurm, the mean measured
speeds of the two configurations when Lucid measured them together, and the interference
model's prediction for pairs it never measured -- so the simulation does not grade the
policy's model against itself.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmgpu.policy.interference import COEFFICIENTS, MIN_SPEED, InterferenceModel
from slurmgpu.sim.workload import RigidJob, TimeLimitModel, TraceJob
from slurmgpu.tokens import SHAREABLE, gpu_mem_token

__all__ = [
    "LUCID_COLUMNS",
    "Config",
    "LucidError",
    "LucidPair",
    "LucidWorkload",
    "SoloProfile",
    "config_name",
    "load_lucid_pairs",
    "lucid_setup",
    "lucid_workload",
    "measured_interference",
    "model_interference",
    "parse_lucid_pairs",
    "solo_profiles",
]

LUCID_COLUMNS = (
    "model1",
    "dataset1",
    "batchsize1",
    "amp1",
    "speed1",
    "model2",
    "dataset2",
    "batchsize2",
    "amp2",
    "speed2",
    "gpu_util",
    "gmem",
)
SATURATED_UTIL_PCT = 95.0

Config = tuple[str, str, str, str]  # model, dataset, batch size, AMP ("0"/"1")
Interference = Callable[[float, float, float, float], tuple[float, float]]


class LucidError(ValueError):
    """A Lucid pairs file that cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class LucidPair:
    """One measured pair: configurations, each one's speed, the pair's util and memory."""

    a: Config
    b: Config
    speed_a: float
    speed_b: float
    util_pct: float
    memory_mib: float


@dataclass(frozen=True, slots=True)
class SoloProfile:
    """A configuration alone on its GPU: util % and memory MiB (least-squares estimates)."""

    util_pct: float
    memory_mib: float


def config_name(config: Config) -> str:
    """``("ResNet18", "CIFAR-10", "64", "1")`` -> ``"ResNet18-CIFAR-10-b64-amp"``."""
    model, dataset, batch, amp = config
    return f"{model}-{dataset}-b{batch}" + ("-amp" if amp == "1" else "")


def parse_lucid_pairs(text: str, path: str = "colocate_info.csv") -> list[LucidPair]:
    """Return the pairs of a colocate_info.csv text; a bad row raises one clear error."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        fields = reader.fieldnames or []
    except csv.Error as exc:
        raise LucidError(f"{Path(path).name}, line 1: not valid CSV: {exc}") from None
    missing = [c for c in LUCID_COLUMNS if c not in fields]
    name = Path(path).name
    if missing:
        raise LucidError(f"{name}, line 1: not Lucid's colocate_info.csv (no {', '.join(missing)})")
    pairs = []
    rows = enumerate(reader, start=2)
    while True:
        try:
            line, row = next(rows)
        except StopIteration:
            break
        except csv.Error as exc:
            raise LucidError(f"{name}, line {reader.line_num}: not valid CSV: {exc}") from None
        try:
            values = [float(row[k] or "") for k in ("speed1", "speed2", "gpu_util", "gmem")]
        except (TypeError, ValueError):
            raise LucidError(
                f"{name}, line {line}: speeds, gpu_util and gmem must be numbers"
            ) from None
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise LucidError(f"{name}, line {line}: speeds, gpu_util and gmem must be >= 0")
        pairs.append(
            LucidPair(
                a=(row["model1"], row["dataset1"], row["batchsize1"], row["amp1"]),
                b=(row["model2"], row["dataset2"], row["batchsize2"], row["amp2"]),
                speed_a=values[0],
                speed_b=values[1],
                util_pct=values[2],
                memory_mib=values[3],
            )
        )
    if not pairs:
        raise LucidError(f"{name}: no pairs")
    return pairs


def load_lucid_pairs(path: Path) -> list[LucidPair]:
    """Read Lucid's colocate_info.csv; unreadable files raise :class:`LucidError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LucidError(f"{path}: cannot read: {exc}") from None
    return parse_lucid_pairs(text, str(path))


def _least_squares(rows: Sequence[tuple[int, int, float]], n: int) -> list[float] | None:
    """Solve min ||A x - y|| where row (i, j, y) of A is e_i + e_j; None when singular.

    Normal equations (n x n, n = 56 here) by Gaussian elimination with partial pivoting.
    """
    ata = [[0.0] * n for _ in range(n)]
    aty = [0.0] * n
    for i, j, y in rows:
        for k in (i, j):
            aty[k] += y
            ata[k][i] += 1.0
            ata[k][j] += 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(ata[r][col]))
        if abs(ata[pivot][col]) < 1e-9:
            return None
        ata[col], ata[pivot] = ata[pivot], ata[col]
        aty[col], aty[pivot] = aty[pivot], aty[col]
        for r in range(col + 1, n):
            f = ata[r][col] / ata[col][col]
            if f:
                row, top = ata[r], ata[col]
                for c in range(col, n):
                    row[c] -= f * top[c]
                aty[r] -= f * aty[col]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (aty[r] - sum(ata[r][c] * x[c] for c in range(r + 1, n))) / ata[r][r]
    return x


def solo_profiles(pairs: Sequence[LucidPair]) -> dict[Config, SoloProfile]:
    """Each configuration's util and memory alone, from the pairs' sums (module docstring).

    Raises :class:`LucidError` when the pairs do not determine them (a configuration only
    ever measured next to one other, say).
    """
    configs = sorted({c for p in pairs for c in (p.a, p.b)})
    index = {c: i for i, c in enumerate(configs)}
    memory = _least_squares([(index[p.a], index[p.b], p.memory_mib) for p in pairs], len(configs))
    unsaturated = [p for p in pairs if p.util_pct < SATURATED_UTIL_PCT]
    seen = sorted({c for p in unsaturated for c in (p.a, p.b)})
    seen_index = {c: i for i, c in enumerate(seen)}
    util = _least_squares(
        [(seen_index[p.a], seen_index[p.b], p.util_pct) for p in unsaturated], len(seen)
    )
    if memory is None or util is None:
        raise LucidError("the pairs do not determine every configuration's solo profile")
    out: dict[Config, SoloProfile] = {}
    for c, i in index.items():
        if c in seen_index:
            u = util[seen_index[c]]
        else:
            u = max(p.util_pct for p in pairs if c in (p.a, p.b)) / 2.0
        out[c] = SoloProfile(min(max(u, 0.0), 100.0), max(memory[i], 0.0))
    return out


@dataclass(frozen=True, slots=True)
class LucidWorkload:
    """How :func:`lucid_workload` draws a trace (see the module docstring)."""

    jobs: int = 600
    load: float = 1.0
    users: int = 16
    configs_per_user: int = 3
    median_run_s: float = 1800.0
    sigma: float = 1.0
    min_run_s: float = 120.0
    max_run_s: float = 12 * 3600.0
    declare_share: float = 0.3
    light_util_pct: float = 40.0


def lucid_workload(
    profiles: Mapping[Config, SoloProfile],
    cluster_gpus: int,
    *,
    seed: int = 1,
    shape: LucidWorkload | None = None,
    limits: TimeLimitModel | None = None,
) -> list[TraceJob]:
    """Return a seeded 1-GPU workload over ``profiles`` for a cluster of ``cluster_gpus``."""
    w = shape or LucidWorkload()
    if w.jobs < 1 or w.users < 1 or w.configs_per_user < 1 or cluster_gpus < 1:
        raise ValueError("a Lucid workload needs jobs, users, configurations and GPUs")
    if not (w.load > 0 and math.isfinite(w.load)):
        raise ValueError(f"load must be a number > 0, not {w.load}")
    configs = sorted(profiles)
    if not configs:
        raise ValueError("no configurations to draw jobs from")

    def rng(salt: str) -> random.Random:
        return random.Random(f"{seed}:lucid:{salt}")  # noqa: S311 - reproducible draws

    pick, runs, arrive, hints, limit_rng = (
        rng("users"),
        rng("run"),
        rng("arrive"),
        rng("hints"),
        rng("limits"),
    )
    per_user = min(w.configs_per_user, len(configs))
    owned = {f"u{u + 1:02d}": pick.sample(configs, per_user) for u in range(w.users)}
    declares = {user: hints.random() < w.declare_share for user in owned}
    users = sorted(owned)
    # E[lognormal clipped] is close to median * exp(sigma^2 / 2); measure it on the draws
    # instead, so the offered load is what was asked for.
    run_times = [
        min(w.max_run_s, max(w.min_run_s, w.median_run_s * math.exp(runs.gauss(0.0, w.sigma))))
        for _ in range(w.jobs)
    ]
    rate = cluster_gpus * w.load / (sum(run_times) / len(run_times))  # jobs per second
    limits = limits or TimeLimitModel()
    out: list[TraceJob] = []
    t = 0.0
    for i, run_s in enumerate(run_times):
        if i:
            t += arrive.expovariate(rate)
        user = users[pick.randrange(len(users))]
        config = owned[user][pick.randrange(per_user)]
        solo = profiles[config]
        comment = ""
        if declares[user] and solo.util_pct <= w.light_util_pct:
            gib = max(1, math.ceil(solo.memory_mib / 1024.0))
            comment = f"{SHAREABLE} {gpu_mem_token(gib * 1024)}"
        out.append(
            TraceJob(
                submit_s=t,
                name=config_name(config),
                user=user,
                model=RigidJob(run_s, 1, util_pct=solo.util_pct, memory_mib=solo.memory_mib),
                gpus=1,
                gpus_per_node=1,
                time_limit_s=limits.limit(run_s, limit_rng),
                line=i + 1,
                comment=comment,
            )
        )
    return out


def model_interference(model: InterferenceModel = COEFFICIENTS) -> Interference:
    """SimSlurm's slowdown callable from the policy's interference model."""

    def pair(ua: float, ma: float, ub: float, mb: float) -> tuple[float, float]:
        del ma, mb  # memory does not enter the speed (slurmgpu.policy.interference)
        return 1.0 / model.speed(ua, ub), 1.0 / model.speed(ub, ua)

    return pair


def measured_interference(
    pairs: Sequence[LucidPair],
    profiles: Mapping[Config, SoloProfile],
    model: InterferenceModel = COEFFICIENTS,
) -> Interference:
    """SimSlurm's slowdown callable from Lucid's measured speeds (module docstring).

    A job is recognised by its model's (util, memory), which are its configuration's
    solo profile in :func:`lucid_workload`; a profile two configurations share, or one
    not in ``profiles``, gets the model's prediction.
    """
    by_profile: dict[tuple[float, float], Config | None] = {}
    for c, solo in profiles.items():
        key = (solo.util_pct, solo.memory_mib)
        by_profile[key] = None if key in by_profile else c
    sums: dict[tuple[Config, Config], list[float]] = {}
    for p in pairs:
        for own, other, speed in ((p.a, p.b, p.speed_a), (p.b, p.a, p.speed_b)):
            acc = sums.setdefault((own, other), [0.0, 0.0])
            acc[0] += speed
            acc[1] += 1.0
    measured = {k: min(1.0, max(MIN_SPEED, s / n)) for k, (s, n) in sums.items()}
    fallback = model_interference(model)

    def pair(ua: float, ma: float, ub: float, mb: float) -> tuple[float, float]:
        a, b = by_profile.get((ua, ma)), by_profile.get((ub, mb))
        if a is not None and b is not None and (a, b) in measured and (b, a) in measured:
            return 1.0 / measured[(a, b)], 1.0 / measured[(b, a)]
        return fallback(ua, ma, ub, mb)

    return pair


def lucid_setup(
    path: Path, slowdown: str = "measured"
) -> tuple[dict[Config, SoloProfile], Interference]:
    """Lucid's pairs at ``path`` (colocate_info.csv) as a workload's solo profiles and
    SimSlurm's slowdown of sharers: its measured pair speeds (``"measured"``) or the
    policy's interference model (``"model"``). LucidError if the file cannot be used."""
    if slowdown not in ("measured", "model"):
        raise LucidError(f"slowdown must be 'measured' or 'model', not {slowdown!r}")
    pairs = load_lucid_pairs(path)
    profiles = solo_profiles(pairs)
    interference = (
        measured_interference(pairs, profiles) if slowdown == "measured" else model_interference()
    )
    return profiles, interference

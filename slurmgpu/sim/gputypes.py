"""How fast each simulated application runs on each GPU type (a heterogeneous cluster).

Speeds are relative to a V100 (the GPU the Pollux profiles were measured on, so a job on
V100 runs exactly as its profile says). They come from Gavel (Narayanan et al., OSDI'20,
github.com/stanford-futuredata/gavel, MIT licence), ``scheduler/simulation_throughputs.json``:
the measured single-GPU throughput of each of its models on K80, P100 and V100 at every
batch size it profiled. Per model, the speed on a type is the geometric mean over those
batch sizes of ``throughput(type) / throughput(v100)``:

=================  ======  =====  ========================================
Gavel model        p100    k80    Pollux application(s) it stands for
=================  ======  =====  ========================================
ResNet-18          0.90    0.16   cifar10 (Pollux trains ResNet-18 on it)
ResNet-50          0.66    0.16   imagenet (ResNet-50), yolov3 (a deep CNN)
Transformer        0.74    0.28   bert (a Transformer encoder)
LM (LSTM)          0.84    0.25   deepspeech2 (recurrent layers)
Recommendation     2.17    1.31   ncf (recommendation on MovieLens)
=================  ======  =====  ========================================

The pairing is ours and approximate (Gavel did not profile BERT, DeepSpeech2 or YOLOv3):
the nearest architecture it did. Recommendation really is faster on the older GPUs in
Gavel's measurements -- the heterogeneity a type-aware scheduler exploits. A job without
an application (a rigid trace job) gets the geometric mean over the five models. Gavel
measured no A100/H100, so those types have no factors here: a cluster naming one is
refused with the list of known types rather than given invented numbers.
"""

from __future__ import annotations

import math

__all__ = ["APP_MODEL", "GAVEL_SPEED", "known_types", "speed_factor", "type_speeds"]

REFERENCE = "v100"

# Gavel model -> GPU type -> speed relative to V100 (see the module docstring).
GAVEL_SPEED: dict[str, dict[str, float]] = {
    "ResNet-18": {"v100": 1.0, "p100": 0.90, "k80": 0.16},
    "ResNet-50": {"v100": 1.0, "p100": 0.66, "k80": 0.16},
    "Transformer": {"v100": 1.0, "p100": 0.74, "k80": 0.28},
    "LM": {"v100": 1.0, "p100": 0.84, "k80": 0.25},
    "Recommendation": {"v100": 1.0, "p100": 2.17, "k80": 1.31},
}

# Pollux application -> the Gavel model it is paired with.
APP_MODEL: dict[str, str] = {
    "cifar10": "ResNet-18",
    "imagenet": "ResNet-50",
    "yolov3": "ResNet-50",
    "bert": "Transformer",
    "deepspeech2": "LM",
    "ncf": "Recommendation",
}


def known_types() -> tuple[str, ...]:
    return tuple(sorted(GAVEL_SPEED[next(iter(GAVEL_SPEED))]))


def _check(gpu_type: str) -> str:
    key = gpu_type.lower()
    if key not in GAVEL_SPEED["ResNet-18"]:
        raise ValueError(
            f"no measured speed for GPU type {gpu_type!r} (known: {', '.join(known_types())};"
            " Gavel's measurements, docs/simulator.md)"
        )
    return key


def speed_factor(app: str | None, gpu_type: str | None) -> float:
    """Speed of ``app`` (a Pollux application name, None: unknown) on ``gpu_type``.

    >>> speed_factor("ncf", "p100"), speed_factor("cifar10", "V100"), speed_factor(None, None)
    (2.17, 1.0, 1.0)
    """
    if gpu_type is None:
        return 1.0
    key = _check(gpu_type)
    model = APP_MODEL.get(app or "")
    if model is not None:
        return GAVEL_SPEED[model][key]
    logs = [math.log(speeds[key]) for speeds in GAVEL_SPEED.values()]
    return math.exp(sum(logs) / len(logs))


def type_speeds(app: str | None, types: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """``(type, speed)`` of ``app`` on each of ``types``."""
    return tuple((t, speed_factor(app, t)) for t in types)

"""How fast each simulated application runs on each GPU type (a heterogeneous cluster).

The Pollux profiles (``shared/data/pollux/profiles``) were measured on AWS g4dn.12xlarge
nodes, 4 NVIDIA T4 each; Sia (Jayaram Subramanya et al., SOSP'23,
github.com/siasosp23/artifacts, ``sia-simulator/traces/APP/placements-TYPE.csv``)
profiled the *same six applications* the same way on more GPU types, and its
``placements-aws.csv`` is the Pollux profile itself. Per application, the speed on a
type is the geometric mean, over the local batch sizes measured on one GPU on both, of
``step_time(T4) / step_time(type)``; T4 is 1 (a job on T4 runs exactly as its profile
says):

=============  =====  =====  ==================================================
application    v100   a100   measured on
=============  =====  =====  ==================================================
bert           2.49   4.07   v100: Azure ND40rs_v2 (8x V100 32 GB);
cifar10        1.13   2.75   a100: DGX-A100 40 GB (Sia's "dgx-ext" profiles)
deepspeech2    2.00   1.26
imagenet       1.67   1.89
ncf            0.07   0.94
yolov3         1.50   1.32
=============  =====  =====  ==================================================

These are measurements, quirks included (ncf's tiny steps ran 14x slower on the Azure
V100 nodes than on T4; deepspeech2 faster on V100 than A100) -- the heterogeneity a
type-aware scheduler exploits. Only the first two places of each ratio are kept. A job
without an application (a rigid trace job) gets the geometric mean over the six. Types
Sia profiled that ``telemetry.gpupower`` has no power figures for (RTX 2080 Ti, Quadro
RTX 6000) are left out, as are types nobody measured these applications on: a cluster
naming one is refused with the list of known types rather than given invented numbers.
"""

from __future__ import annotations

import math

__all__ = ["REFERENCE", "SPEED", "known_types", "speed_factor", "type_speeds"]

REFERENCE = "t4"  # the GPU the Pollux profiles were measured on

# application -> GPU type -> speed relative to T4 (see the module docstring).
SPEED: dict[str, dict[str, float]] = {
    "bert": {"t4": 1.0, "v100": 2.49, "a100": 4.07},
    "cifar10": {"t4": 1.0, "v100": 1.13, "a100": 2.75},
    "deepspeech2": {"t4": 1.0, "v100": 2.00, "a100": 1.26},
    "imagenet": {"t4": 1.0, "v100": 1.67, "a100": 1.89},
    "ncf": {"t4": 1.0, "v100": 0.07, "a100": 0.94},
    "yolov3": {"t4": 1.0, "v100": 1.50, "a100": 1.32},
}


def known_types() -> tuple[str, ...]:
    return tuple(sorted(SPEED["bert"]))


def _check(gpu_type: str) -> str:
    key = gpu_type.lower()
    if key not in SPEED["bert"]:
        raise ValueError(
            f"no measured speed for GPU type {gpu_type!r} (known: {', '.join(known_types())};"
            " Sia's measurements of the Pollux applications, docs/simulator.md)"
        )
    return key


def speed_factor(app: str | None, gpu_type: str | None) -> float:
    """Speed of ``app`` (a Pollux application name, None: unknown) on ``gpu_type``.

    >>> speed_factor("bert", "a100"), speed_factor("cifar10", "T4"), speed_factor(None, None)
    (4.07, 1.0, 1.0)
    """
    if gpu_type is None:
        return 1.0
    key = _check(gpu_type)
    speeds = SPEED.get(app or "")
    if speeds is not None:
        return speeds[key]
    logs = [math.log(s[key]) for s in SPEED.values()]
    return math.exp(sum(logs) / len(logs))


def type_speeds(app: str | None, types: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """``(type, speed)`` of ``app`` on each of ``types``."""
    return tuple((t, speed_factor(app, t)) for t in types)

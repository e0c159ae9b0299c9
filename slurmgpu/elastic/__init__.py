"""slurmgpu.elastic: the runtime inside a malleable job (no torch needed).

``init()`` describes this run (job id, restart count, rank, world size, GPUs) and turns
the checkpoint signal and SIGTERM into flags; ``ElasticRun.checkpoint(state)`` writes
atomically and acknowledges a request where the daemon can see it; ``resume()`` loads
the newest checkpoint. :mod:`slurmgpu.elastic.scaling` has the batch-size and
learning-rate rules; :mod:`slurmgpu.elastic.torch` optional torch helpers.
"""

from __future__ import annotations

from slurmgpu.elastic.runtime import ElasticRun, hard_exit, init
from slurmgpu.elastic.scaling import (
    GradientNoise,
    adascale_gain,
    global_batch,
    scaled_lr,
    statistical_efficiency,
)

__all__ = [
    "ElasticRun",
    "GradientNoise",
    "adascale_gain",
    "global_batch",
    "hard_exit",
    "init",
    "scaled_lr",
    "statistical_efficiency",
]

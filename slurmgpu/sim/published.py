"""Published average JCTs on the Pollux workloads, to print beside ours.

Source: shared/data/ATTRIBUTION.md, from the Pollux OSDI'21 artifact's
``results-jobload/*-1.0/summary.json`` (64 GPUs = 16 nodes x 4, load 1.0). Their
simulator charges 30 s per restart and lets Pollux retune batch sizes; ours charges
Slurm's costs and keeps each job's batch size (docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PUBLISHED_AVG_JCT_S", "published_mean"]

# workload -> scheduler -> average JCT in seconds
PUBLISHED_AVG_JCT_S: Mapping[int, Mapping[str, float]] = {
    1: {"pollux": 2089, "tiresias": 2474, "optimus": 4087},
    2: {"pollux": 3323, "tiresias": 5145, "optimus": 6914},
    3: {"pollux": 2188, "tiresias": 3876, "optimus": 3944},
    4: {"pollux": 2721, "tiresias": 3280, "optimus": 5968},
    5: {"pollux": 2674, "tiresias": 3501, "optimus": 5656},
    7: {"pollux": 3616, "tiresias": 5480, "optimus": 7291},
}


def published_mean(scheduler: str) -> float:
    """Mean over the six workloads (Tiresias 3,959 s, Pollux 2,769 s, Optimus 5,643 s)."""
    values = [row[scheduler] for row in PUBLISHED_AVG_JCT_S.values()]
    return sum(values) / len(values)

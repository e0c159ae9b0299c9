"""Published average JCTs on the Pollux workloads, to print beside ours.

Source: the Pollux OSDI'21 artifact (petuum/adaptdl, branch ``osdi21-artifact``),
``simulator/results-jobload/{pollux,tiresias,optimus}-{1.0,2.0}/summary.json`` (64 GPUs =
16 nodes x 4; shared/data/ATTRIBUTION.md has the 1.0 column). Load 2.0 is the artifact's
own ``workloads-2.0/`` files, not ours scaled. Our Tiresias reproduces theirs within
±15 % per workload (docs/simulator.md), so their Tiresias is comparable with ours; their
Pollux retunes batch sizes and pays 30 s per restart, which a Slurm job does not do, so
it is printed as context only.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PUBLISHED", "PUBLISHED_AVG_JCT_S", "published_for", "published_mean"]

# load -> workload -> scheduler -> average JCT in seconds
PUBLISHED: Mapping[float, Mapping[int, Mapping[str, float]]] = {
    1.0: {
        1: {"pollux": 2089, "tiresias": 2474, "optimus": 4087},
        2: {"pollux": 3323, "tiresias": 5145, "optimus": 6914},
        3: {"pollux": 2188, "tiresias": 3876, "optimus": 3944},
        4: {"pollux": 2721, "tiresias": 3280, "optimus": 5968},
        5: {"pollux": 2674, "tiresias": 3501, "optimus": 5656},
        7: {"pollux": 3616, "tiresias": 5480, "optimus": 7291},
    },
    2.0: {
        1: {"pollux": 6186, "tiresias": 10138, "optimus": 10807},
        2: {"pollux": 4191, "tiresias": 8656, "optimus": 8515},
        3: {"pollux": 5132, "tiresias": 10728, "optimus": 8363},
        4: {"pollux": 5262, "tiresias": 9665, "optimus": 10313},
        5: {"pollux": 6591, "tiresias": 12098, "optimus": 11830},
        7: {"pollux": 3836, "tiresias": 8371, "optimus": 6998},
    },
}
PUBLISHED_AVG_JCT_S: Mapping[int, Mapping[str, float]] = PUBLISHED[1.0]


def published_for(load: float, workload: int) -> Mapping[str, float]:
    """The published figures of one workload at one load ({} when none was published)."""
    return PUBLISHED.get(load, {}).get(workload, {})


def published_mean(scheduler: str, load: float = 1.0) -> float:
    """Mean over the six workloads (load 1.0: Tiresias 3,959 s, Pollux 2,769 s)."""
    values = [row[scheduler] for row in PUBLISHED[load].values()]
    return sum(values) / len(values)

"""How much of a GPU a MIG slice, an MPS share or a shard is: the GPU-equivalents rule.

Reports and ``/metrics`` count GPU-hours and GPUs in *GPU-equivalents*, so a job on a
slice is not counted as a whole GPU (issue 39, item 4). The rule, by what the job holds:

- a whole GPU: 1;
- a MIG slice: its **compute** slices out of the board's, read off the profile name
  Slurm types the GPU with (NVIDIA's ``<c>g.<m>gb``: ``1g.10gb`` holds 1 of the 7
  compute slices of an A100/H100/H200/B200, so 1/7; ``3g.40gb`` 3/7; ``7g.80gb`` the
  whole GPU). The A30 has 4 compute slices; its profiles (``1g.6gb``, ``2g.12gb``,
  ``4g.24gb``) count out of 4. Memory-heavy profiles (``1g.20gb``) still count their
  compute slices: the SMs are what a slice takes from others;
- an MPS share: ``mps / (mps per GPU)`` (100 per GPU on the usual gres.conf, so
  ``mps:50`` is half a GPU);
- shards: ``shards / (shards per GPU)``.

Energy follows the same split where the counter is per device: a MIG-enabled board has
one energy counter and one power reading, and each slice is given its compute fraction
of them (``split_by_slices``). The slices of a board add up to at most the whole board
(a board not fully partitioned leaves the rest to no job).

Pure: no I/O, standard library only.
"""

from __future__ import annotations

import re
from typing import Literal

from slurmgpu.model import GpuRequest

__all__ = [
    "A30_PROFILES",
    "DEFAULT_MPS_PER_GPU",
    "DEFAULT_SHARDS_PER_GPU",
    "MIG_COMPUTE_SLICES",
    "Sharing",
    "job_equivalents",
    "mig_board_slices",
    "mig_compute_slices",
    "mig_gpu_fraction",
    "mig_sql_patterns",
    "share_fraction",
]

# compute slices of an A100 / H100 / H200 / B200 (a 7g profile is the whole GPU)
MIG_COMPUTE_SLICES = 7
# The A30's profiles (4 compute slices, 6 GB each), the one board with another count.
A30_PROFILES = frozenset({"1g.6gb", "2g.12gb", "4g.24gb"})
A30_COMPUTE_SLICES = 4
# gres/mps per GPU when the nodes do not tell (Slurm's usual gres.conf: 100 per GPU)
DEFAULT_MPS_PER_GPU = 100.0
DEFAULT_SHARDS_PER_GPU = 16.0
Sharing = Literal["gpu", "mig", "mps", "shard"]
_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(?:\+\w+)?$")


def mig_compute_slices(profile: str | None) -> int | None:
    """The compute slices a MIG profile holds (``3g.40gb+me`` → 3); None if no profile.

    >>> mig_compute_slices("3g.40gb+me"), mig_compute_slices("a100")
    (3, None)
    """
    m = _PROFILE.match(profile or "")
    if m is None or int(m.group(1)) < 1:
        return None
    return int(m.group(1))


def mig_board_slices(profile: str | None) -> int | None:
    """The compute slices of the board a profile is cut from (7, or 4 on an A30)."""
    if mig_compute_slices(profile) is None:
        return None
    base = (profile or "").split("+", 1)[0]
    return A30_COMPUTE_SLICES if base in A30_PROFILES else MIG_COMPUTE_SLICES


def mig_gpu_fraction(profile: str | None) -> float | None:
    """The share of a GPU a MIG slice is (compute slices / the board's); None if no profile.

    >>> mig_gpu_fraction("1g.10gb"), mig_gpu_fraction("2g.12gb"), mig_gpu_fraction("h100")
    (0.14285714285714285, 0.5, None)
    """
    slices, board = mig_compute_slices(profile), mig_board_slices(profile)
    if slices is None or board is None:
        return None
    return min(slices, board) / board


def share_fraction(units: float, units_per_gpu: float) -> float:
    """``units`` of a per-GPU count (MPS, shards) as GPUs; 0 when the count is unknown.

    >>> share_fraction(50, 100), share_fraction(4, 0)
    (0.5, 0.0)
    """
    if units_per_gpu <= 0 or units <= 0:
        return 0.0
    return units / units_per_gpu


def mig_sql_patterns() -> list[tuple[str, float]]:
    """``LIKE`` patterns of GPU types and their fraction, first match wins: the SQL form
    of :func:`mig_gpu_fraction` for the report (a type matching none is a whole GPU).

    >>> mig_sql_patterns()[0]
    ('1g.6gb', 0.25)
    """
    out: list[tuple[str, float]] = []
    for name in sorted(A30_PROFILES):
        fraction = mig_gpu_fraction(name)
        assert fraction is not None
        out += [(name, fraction), (f"{name}+%", fraction)]
    out += [(f"{c}g.%gb", c / MIG_COMPUTE_SLICES) for c in range(1, MIG_COMPUTE_SLICES + 1)]
    out += [(f"{c}g.%gb+%", c / MIG_COMPUTE_SLICES) for c in range(1, MIG_COMPUTE_SLICES + 1)]
    return out


def job_equivalents(
    request: GpuRequest,
    *,
    shards_per_gpu: float = DEFAULT_SHARDS_PER_GPU,
    mps_per_gpu: float = DEFAULT_MPS_PER_GPU,
) -> tuple[Sharing, float]:
    """How a job's request shares GPUs and how many GPU-equivalents it is.

    >>> job_equivalents(GpuRequest(gpus=2, gpu_type="1g.10gb"))
    ('mig', 0.2857142857142857)
    >>> job_equivalents(GpuRequest(mps=50)), job_equivalents(GpuRequest(gpus=2))
    (('mps', 0.5), ('gpu', 2.0))
    """
    if request.gpus > 0:
        fraction = mig_gpu_fraction(request.gpu_type)
        if fraction is not None:
            return "mig", request.gpus * fraction
        return "gpu", float(request.gpus)
    if request.shards > 0:
        return "shard", share_fraction(request.shards, shards_per_gpu)
    if request.mps > 0:
        return "mps", share_fraction(request.mps, mps_per_gpu)
    return "gpu", 0.0

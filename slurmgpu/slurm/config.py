"""Slurm's priority settings as ``scontrol show config`` and ``scontrol show partition -o``
print them: what the least-attained-service policy's Nice is measured against.

Both are text on every release (22.05, 24.11 and 26.05 alike; golden files
``tests/golden/slurm-*/site_show_*.txt``): the configuration one ``Key = Value`` a line
(first a header, later sections of plugin settings, a ``Slurmctld(primary) at ... is UP``
line at the end), the partitions one line each of ``Key=Value`` words. Keys are matched
without regard to case: slurm.conf spells ``PriorityWeightFairshare``, ``show config``
``PriorityWeightFairShare``.

With ``priority/multifactor`` a job's priority is the sum of the weighted factors, each
factor between 0 and 1, minus its Nice, and Slurm raises a result below 1 to 1. The part
every job has whatever it is, its *base*, is the partition term at the lowest
partition's factor: ``PriorityWeightPartition`` x (lowest ``PriorityJobFactor`` /
highest), Slurm's normalisation. The age, fair-share, QOS, association, job-size and
TRES terms can each be 0 for some job, so they count for nothing in the base.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from slurmgpu.slurm.client import SlurmParseError

__all__ = [
    "PriorityConfig",
    "PriorityConfigClient",
    "parse_partition_factors",
    "parse_show_config",
    "priority_config",
]

_LINE_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_()]*)\s*=\s?(.*)$")
_FACTOR_RE = re.compile(r"(?:^|\s)PriorityJobFactor=(\d+)(?:\s|$)")
_NAME_RE = re.compile(r"^PartitionName=(\S+)")


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` as ``{key in lower case: value}`` (the first of a key)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE_RE.match(line)
        if m is not None:
            out.setdefault(m.group(1).lower(), m.group(2).strip())
    if "prioritytype" not in out:
        raise SlurmParseError("scontrol show config printed no PriorityType line")
    return out


def parse_partition_factors(text: str) -> dict[str, int]:
    """``scontrol show partition -o`` as ``{partition: PriorityJobFactor}``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name = _NAME_RE.match(line.strip())
        if name is None:
            continue
        factor = _FACTOR_RE.search(line)
        if factor is None:
            raise SlurmParseError(f"partition {name.group(1)[:40]!r} has no PriorityJobFactor")
        out[name.group(1)] = int(factor.group(1))
    return out


def _weight(config: Mapping[str, str], key: str) -> int:
    value = config.get(key.lower(), "0")
    if value in {"", "(null)"}:
        return 0
    try:
        return int(value)
    except ValueError:
        raise SlurmParseError(f"{key} = {value[:40]!r} is not a number") from None


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    """What the cluster's priority plugin does with a Nice (module docstring)."""

    priority_type: str
    weight_fairshare: int
    weight_partition: int
    partition_factors: Mapping[str, int]

    @property
    def multifactor(self) -> bool:
        return self.priority_type == "priority/multifactor"

    @property
    def base(self) -> int:
        """The priority every job has at least, before its Nice (module docstring)."""
        factors = [f for f in self.partition_factors.values() if f >= 0]
        if not factors or max(factors) == 0:
            return 0
        return self.weight_partition * min(factors) // max(factors)

    def base_reason(self) -> str:
        """How :attr:`base` came about, in slurm.conf's words."""
        factors = self.partition_factors.values()
        if factors and min(factors) != max(factors):
            return (
                f"PriorityWeightPartition={self.weight_partition} x lowest/highest "
                f"partition PriorityJobFactor {min(factors)}/{max(factors)}"
            )
        return f"PriorityWeightPartition={self.weight_partition}"


def priority_config(show_config: str, show_partition: str) -> PriorityConfig:
    """The :class:`PriorityConfig` of the two commands' outputs (SlurmParseError if not)."""
    config = parse_show_config(show_config)
    return PriorityConfig(
        priority_type=config["prioritytype"],
        weight_fairshare=_weight(config, "PriorityWeightFairShare"),
        weight_partition=_weight(config, "PriorityWeightPartition"),
        partition_factors=parse_partition_factors(show_partition),
    )


@runtime_checkable
class PriorityConfigClient(Protocol):
    """Optional SlurmClient capability: the cluster's priority settings (callers test for
    it with ``isinstance`` and do without)."""

    def priority_config(self) -> PriorityConfig:
        """``scontrol show config`` and ``show partition -o``, parsed; raises
        :class:`~slurmgpu.slurm.client.SlurmError` subclasses like the listings do."""
        ...

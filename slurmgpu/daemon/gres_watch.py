"""Logs and counts where Slurm's node usage disagrees with its running jobs' allocations.

The comparison is pure (:mod:`slurmgpu.nodeusage`); this keeps, across cycles, which
(node, cause) pairs disagree now: one warning when a pair starts disagreeing, one info
line when it agrees again, never one per cycle. A pair must be seen in
``confirm_cycles`` listings in a row before it counts: squeue and sinfo are two calls, so
a job that starts or ends between them makes one listing disagree for nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from slurmgpu.nodeusage import KINDS, UsageFinding

log = logging.getLogger("slurmgpu.daemon")

_WHAT = {
    "gpus": "whole-GPU usage",
    "shards": "shard usage",
    "shard_overcommit": "shards on one GPU",
}


class GresUsageWatch:
    """Per (node, cause): seen since when, reported or not; counters by cause."""

    def __init__(self, confirm_cycles: int = 2) -> None:
        self.confirm_cycles = max(confirm_cycles, 1)
        self._seen: dict[tuple[str, str, int | None], int] = {}
        self._reported: dict[tuple[str, str, int | None], UsageFinding] = {}
        # Disagreements that started, by cause (a counter: one per episode).
        self.started: dict[str, int] = dict.fromkeys(KINDS, 0)

    def observe(self, findings: Iterable[UsageFinding]) -> None:
        """Take one successful listing's findings."""
        now = {f.key: f for f in findings}
        for key, f in now.items():
            self._seen[key] = self._seen.get(key, 0) + 1
            if key in self._reported or self._seen[key] < self.confirm_cycles:
                continue
            self._reported[key] = f
            self.started[f.kind] = self.started.get(f.kind, 0) + 1
            if f.kind == "shard_overcommit":
                log.warning(
                    "node %s: GPU %s holds more shards than it has (%s of its %s): "
                    "Slurm placed shard jobs on it after losing count of them",
                    f.node,
                    f.gpu,
                    f.allocations,
                    f.slurm,
                )
            else:
                log.warning(
                    "node %s: Slurm's %s (%s) disagrees with its running jobs' "
                    "allocations (%s); using the allocations'",
                    f.node,
                    _WHAT.get(f.kind, f.kind),
                    f.slurm,
                    f.allocations,
                )
        for key in [k for k in self._seen if k not in now]:
            del self._seen[key]
        for key in [k for k in self._reported if k not in now]:
            f = self._reported.pop(key)
            if f.kind == "shard_overcommit":
                log.info("node %s: GPU %s holds no more shards than it has again", f.node, f.gpu)
            else:
                log.info(
                    "node %s: Slurm's %s agrees with the jobs' allocations again",
                    f.node,
                    _WHAT.get(f.kind, f.kind),
                )

    def open_by_kind(self) -> dict[str, int]:
        """How many (node, cause) disagreements stand now, by cause."""
        out = dict.fromkeys(KINDS, 0)
        for f in self._reported.values():
            out[f.kind] = out.get(f.kind, 0) + 1
        return out

    @property
    def reported(self) -> tuple[UsageFinding, ...]:
        return tuple(self._reported.values())

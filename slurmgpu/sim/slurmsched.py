"""Slurm's own scheduling as SimSlurm can model it: a main scheduler and sched/backfill.

Checked against Slurm 22.05's sources (the same logic through 26.05):

- **Main scheduler** (``_schedule()`` in src/slurmctld/job_scheduler.c): pending jobs in
  priority order; the first of a partition that cannot start marks the partition failed
  (``failed_parts``) and no lower-priority job of it starts in that pass (reason
  ``Priority``). It runs when a job ends (``_slurm_rpc_epilog_complete`` calls
  ``schedule()``), shortly after a submission or an update (``queue_job_scheduler()``:
  the background thread runs it once ``batch_sched_delay``, 3 s, passed since its last),
  and over the whole queue every ``sched_interval`` (60 s, controller.c). The backfill's
  plans do not bind it.
- **Time limits** are whole minutes (``time_str2mins`` rounds seconds up), whether
  given at submission or by an update.
- **Backfill** (``_attempt_backfill()`` in src/plugins/sched/backfill/backfill.c): every
  ``bf_interval`` (30 s) after the previous pass ended, each pending job in priority
  order (at most ``bf_max_job_test``, 500) gets the earliest start at which it fits --
  running jobs end at their time limits (the select plugin's will-run test), and the
  nodes of every earlier job's plan are off limits while the plans overlap -- and starts
  now if that start is now; else its plan is added to the map (conservative: every
  pending job gets one, not only the first). A plan covers its *whole nodes*
  (``_add_reservation`` ANDs node bitmaps), from its start to start + limit, both
  rounded down to ``bf_resolution`` (60 s; at least one step), and only within
  ``bf_window`` (1 day).

Left out: partitions (one queue), QOS and association limits, ``bf_continue`` and
lock yielding (a pass is instant), ``default_queue_depth`` (100 jobs for a main pass
that is not a full one: the main pass stops at its first blocked job long before),
``sched_min_interval`` (2 us), the backfill thread skipping a pass when nothing changed
since the last (with jobs pending, priority/multifactor recalculating their priorities
every ``PriorityCalcPeriod`` counts as a change), array-task limits on plans
(``bf_max_job_array_resv``), and any plan for a shard, MPS or MIG job that cannot start
now (such a job starts when it fits and its node is not planned for; it plans nothing).
Submission and begin-time latencies are the cost sets' (``submit_delay``,
``requeue_delay``: measured arrival -> start and requeue -> start, which include the
user's ``sbatch`` and the wait for a pass: ``batch_sched_delay`` and the background
thread's one-second tick after a submission, the next backfill or full pass after a
begin time), so a job becoming eligible triggers a main pass here; modelling those
waits as well would count them twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["NodePlans", "SlurmScheduling"]


@dataclass(frozen=True, slots=True)
class SlurmScheduling:
    """sched/backfill's parameters (slurm.conf ``SchedulerParameters``), Slurm's defaults.

    Seconds of the simulator's clock: :meth:`scaled` for a time-compressed replay.
    """

    bf_interval_s: float = 30.0
    bf_resolution_s: float = 60.0
    bf_max_job_test: int = 500
    bf_window_s: float = 86400.0
    sched_interval_s: float = 60.0  # the main scheduler's full pass
    bf_poll_s: float = 1.0  # the backfill thread's short sleep while a pass is not due
    # Slurm keeps a time limit in whole minutes: one given in seconds (sbatch --time,
    # scontrol update TimeLimit=HH:MM:SS) is rounded up (parse_time.c, time_str2mins)
    limit_unit_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("bf_interval_s", "bf_resolution_s", "bf_window_s", "sched_interval_s"):
            value = getattr(self, name)
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a number > 0, not {value!r}")
        if self.bf_max_job_test < 1:
            raise ValueError(f"bf_max_job_test must be >= 1, not {self.bf_max_job_test}")
        if not self.limit_unit_s > 0 or not math.isfinite(self.limit_unit_s):
            raise ValueError(f"limit_unit_s must be a number > 0, not {self.limit_unit_s!r}")
        if not self.bf_poll_s > 0:
            raise ValueError(f"bf_poll_s must be > 0, not {self.bf_poll_s!r}")

    def scaled(self, factor: float) -> SlurmScheduling:
        """Every period times ``factor`` (a replay compressed by C runs the simulator in
        trace time: Slurm's wall seconds there are C trace seconds)."""
        if not factor > 0 or not math.isfinite(factor):
            raise ValueError(f"the factor must be a number > 0, not {factor!r}")
        return replace(
            self,
            bf_interval_s=self.bf_interval_s * factor,
            bf_resolution_s=self.bf_resolution_s * factor,
            bf_window_s=self.bf_window_s * factor,
            sched_interval_s=self.sched_interval_s * factor,
            bf_poll_s=self.bf_poll_s * factor,
            limit_unit_s=self.limit_unit_s * factor,
        )

    def limit(self, seconds: float | None) -> float | None:
        """A time limit as Slurm keeps it: rounded up to whole ``limit_unit_s``."""
        if seconds is None or not math.isfinite(seconds):
            return seconds
        unit = self.limit_unit_s
        return math.ceil(seconds / unit - 1e-9) * unit

    def next_backfill(self, last_s: float, now: float) -> float:
        """When the backfill thread next runs a pass, work being due at ``now``: once
        ``bf_interval`` passed since the last (``last_s``), else at its next poll."""
        due = last_s + self.bf_interval_s
        if now <= due:
            return due
        return due + math.ceil((now - due) / self.bf_poll_s - 1e-9) * self.bf_poll_s


class NodePlans:
    """The backfill map of one pass: whole nodes planned for pending jobs, per window."""

    def __init__(self, resolution_s: float) -> None:
        self.resolution_s = resolution_s
        self._plans: list[tuple[float, float, frozenset[int]]] = []

    def add(self, start_s: float, end_s: float, nodes: frozenset[int]) -> tuple[float, float]:
        """Plan ``nodes`` from ``start_s`` to ``end_s``, rounded down to the resolution
        (at least one step), as ``_add_reservation``; returns the window planned."""
        res = self.resolution_s
        start = math.floor(start_s / res) * res
        end = math.floor(end_s / res) * res if math.isfinite(end_s) else math.inf
        end = max(end, start + res)
        self._plans.append((start, end, nodes))
        return start, end

    def blocked(self, start_s: float, end_s: float) -> set[int]:
        """Nodes planned for during any of ``[start_s, end_s]`` (a job's window)."""
        out: set[int] = set()
        for start, end, nodes in self._plans:
            if end > start_s and start <= end_s:
                out |= nodes
        return out

    def ends(self) -> list[float]:
        """When each plan ends (a later start may find its nodes free)."""
        return [end for _, end, _ in self._plans if math.isfinite(end)]

    def __len__(self) -> int:
        return len(self._plans)

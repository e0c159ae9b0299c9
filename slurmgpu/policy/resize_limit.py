"""The time limit a malleable job gets when its GPU count changes (pure).

A job on fewer GPUs runs slower, so the ``TimeLimit`` it was submitted with would kill
it before it finishes; one on more GPUs finishes sooner. The resize's pending update
(``scontrol update`` of the held job, or the ``start_smaller`` update) therefore sets
the limit in the same call as the GPU request.

**Rule.** Slurm counts a job's ``TimeLimit`` from each start, and a resize requeues the
job, so the new limit is for the run after the restart. ``left`` is the run time the
job's limit still allows at its current size, ``limit - elapsed`` (the whole limit for a
pending job), or the policy's estimate of its remaining time when that is longer;
``restart`` is the checkpoint time + start-up time.

- **Fewer GPUs** (a shrink, a start smaller): ``left`` is scaled by the speed ratio of
  the two sizes (the job's fitted speedup curve, :mod:`slurmgpu.policy.speedup`),
  taken between 1 (a fit that says fewer GPUs are as fast is not believed) and
  ``gpus_now / gpus_after`` (linear scaling, the most a job slows), with ``headroom``
  (1.1: the curve is a fit)::

      new = left * clamp(speed_now / speed_after, 1, gpus_now / gpus_after) * headroom
            + restart

  only ever raised, and never above the partition's ``MaxTime`` when that is known.
- **More GPUs** (an expansion): ``new = left + restart``, only ever lowered. The job keeps
  the time it was allowed in all (used + left), so a speed-up the curve over-promised
  costs no timeout; the ratio is not applied (scaling by it killed 13 and 17 jobs at
  their limit, all after expansions, in bench/sim_pollux.py's malleable and all sets).
  A job shrunk earlier gives back its raise this way as it uses it.

Rounded up to whole minutes (Slurm's resolution), and never past ``LONGEST``, the
longest finite limit Slurm stores (a uint32 of minutes below ``NO_VAL`` and
``INFINITE``): a remaining-time estimate from a throughput near zero can be of any size,
and a limit past Python's ``timedelta`` range raised ``OverflowError``, which cost the
malleable policy a whole cycle's decisions (twice in ``bench/sim_pollux.py``: workload 1,
seed 3, load 2.0). ``None`` when the limit stays as it is (no limit, no speed change, or
nothing to raise or lower).
"""

from __future__ import annotations

import math
from datetime import timedelta

__all__ = ["DEFAULT_HEADROOM", "LONGEST", "resized_time_limit"]

DEFAULT_HEADROOM = 1.1
LONGEST = timedelta(minutes=0xFFFFFFFD)  # Slurm's longest finite TimeLimit
_LONGEST_MIN = LONGEST.total_seconds() / 60.0


def resized_time_limit(
    limit: timedelta | None,
    elapsed: timedelta,
    gpus_now: int,
    gpus_after: int,
    speed_now: float,
    speed_after: float,
    *,
    remaining: timedelta = timedelta(0),
    restart: timedelta = timedelta(0),
    headroom: float = DEFAULT_HEADROOM,
    max_time: timedelta | None = None,
) -> timedelta | None:
    """The job's new ``TimeLimit`` for its run at the new size, or None to leave it.

    ``gpus_now``/``gpus_after``: the two sizes; ``speed_now``/``speed_after``: throughput
    (any unit) there, from the job's speedup curve;
    ``remaining``: the estimate of its remaining run time at the current size;
    ``max_time``: the partition's MaxTime, when known. See the module docstring.
    """
    if limit is None or gpus_now < 1 or gpus_after < 1 or gpus_now == gpus_after:
        return None
    left = max(limit - elapsed, remaining, timedelta(0)).total_seconds()
    restart_s = max(0.0, restart.total_seconds())
    if gpus_after < gpus_now:  # slower: only ever raised, capped at the partition's MaxTime
        ratio = 1.0
        if speed_after > 0 and math.isfinite(speed_now / speed_after):
            ratio = speed_now / speed_after
        ratio = min(max(ratio, 1.0), gpus_now / gpus_after)
        new = _minutes(left * ratio * max(1.0, headroom) + restart_s)
        if max_time is not None:
            new = min(new, max(max_time, limit))
        return new if new > limit else None
    new = _minutes(left + restart_s)  # faster: only ever lowered, never below used + left
    return new if new < limit else None


def _minutes(seconds: float) -> timedelta:
    return timedelta(minutes=math.ceil(min(seconds / 60.0, _LONGEST_MIN) - 1e-6))

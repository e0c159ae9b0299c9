"""The time limit a resized malleable job gets (slurmgpu.policy.resize_limit)."""

from __future__ import annotations

import math
from datetime import timedelta

from slurmgpu.policy.resize_limit import LONGEST, resized_time_limit

H = timedelta(hours=1)
MIN = timedelta(minutes=1)


def test_a_shrink_raises_what_is_left_of_the_limit_by_the_speed_ratio() -> None:
    # 4 h limit, 1 h used, 4 -> 2 GPUs at half speed: the 3 h left take 6 h, +10 %, +2 min.
    new = resized_time_limit(4 * H, 1 * H, 4, 2, 200.0, 100.0, restart=2 * MIN)
    assert new == 398 * MIN  # 180 * 2 * 1.1 + 2
    assert resized_time_limit(4 * H, 1 * H, 4, 2, 200.0, 100.0, headroom=1.0) == 6 * H
    # Poor scaling: 4 -> 2 GPUs costs 10 % of the speed, so 4 h * 1.1 * 1.1 from the start,
    # and 3 h * 1.1 * 1.1 (218 min) after 1 h is less than the fresh 4 h a requeue gives.
    assert resized_time_limit(4 * H, timedelta(0), 4, 2, 110.0, 100.0) == 291 * MIN
    assert resized_time_limit(4 * H, 1 * H, 4, 2, 110.0, 100.0) is None


def test_a_pending_job_started_smaller_scales_its_whole_limit() -> None:
    assert resized_time_limit(H, timedelta(0), 4, 1, 3.0, 1.0, headroom=1.0) == 3 * H


def test_a_shrink_takes_the_speed_ratio_between_no_loss_and_linear_scaling() -> None:
    # A fit that says 3 GPUs beat 9 is not believed: the limit is still raised (headroom).
    assert resized_time_limit(4 * H, timedelta(0), 9, 3, 90.0, 100.0) == 264 * MIN
    # Nor one that says 2 GPUs are 5x slower than 4: at most linear, 2x.
    assert resized_time_limit(4 * H, 1 * H, 4, 2, 500.0, 100.0, headroom=1.0) == 6 * H


def test_a_shrink_never_lowers_the_limit() -> None:
    # Nearly done: 10 min left at double time is 20 min, below the 4 h it has per run.
    assert resized_time_limit(4 * H, 4 * H - 10 * MIN, 4, 2, 2.0, 1.0) is None


def test_the_raised_limit_stops_at_the_partition_max_time() -> None:
    assert resized_time_limit(4 * H, H, 4, 2, 2.0, 1.0, max_time=5 * H) == 5 * H
    # A limit already past MaxTime is never lowered by the cap.
    assert resized_time_limit(4 * H, H, 4, 2, 2.0, 1.0, max_time=3 * H) is None


def test_an_expansion_lowers_the_limit_to_what_it_had_left() -> None:
    # 10 h limit, 2 h used: the run after the restart gets the 8 h left + the restart,
    # whatever speed-up the curve promises (so used + allowed is still its 10 h).
    assert resized_time_limit(10 * H, 2 * H, 2, 4, 100.0, 200.0, restart=MIN) == 8 * H + MIN
    assert resized_time_limit(10 * H, 2 * H, 2, 4, 100.0, 90.0, restart=MIN) == 8 * H + MIN


def test_an_expansion_never_lowers_below_the_remaining_estimate() -> None:
    # The limit would allow 2 h more, but the job is estimated to need 6 h.
    assert resized_time_limit(10 * H, 8 * H, 2, 4, 1.0, 2.0, remaining=6 * H) == 6 * H
    # Never raised by an expansion, and a fresh job keeps its limit.
    assert resized_time_limit(10 * H, 0 * H, 2, 4, 1.0, 2.0, remaining=30 * H) is None
    assert resized_time_limit(10 * H, 0 * H, 2, 4, 1.0, 2.0) is None


def test_no_limit_or_no_size_change_leaves_the_limit() -> None:
    assert resized_time_limit(None, H, 4, 2, 2.0, 1.0) is None
    assert resized_time_limit(H, H, 4, 4, 2.0, 1.0) is None
    assert resized_time_limit(H, H, 0, 2, 2.0, 1.0) is None
    # No usable speeds: a shrink still gets the headroom.
    assert resized_time_limit(H, timedelta(0), 4, 2, 1.0, 0.0) == 66 * MIN
    assert resized_time_limit(H, timedelta(0), 4, 2, math.inf, 1.0) == 66 * MIN


def test_limits_are_whole_minutes_rounded_up() -> None:
    new = resized_time_limit(H, timedelta(0), 4, 2, 1.01, 1.0, headroom=1.0)
    assert new == 61 * MIN


def test_a_remaining_estimate_of_any_size_gives_at_most_slurms_longest_limit() -> None:
    """A throughput near zero makes the remaining-time estimate any size: the limit
    stops at the longest Slurm stores instead of overflowing timedelta (which made the
    malleable policy skip a whole cycle in the simulator)."""
    huge = timedelta(days=900_000_000)  # near timedelta's own range
    assert resized_time_limit(4 * H, H, 4, 2, 2.0, 1.0, remaining=huge) == LONGEST
    assert resized_time_limit(4 * H, H, 4, 1, 4.0, 1.0, remaining=huge, max_time=5 * H) == 5 * H
    assert resized_time_limit(4 * H, H, 2, 4, 1.0, 2.0, remaining=huge) is None  # not lowered
    assert timedelta(minutes=4_294_967_293) == LONGEST

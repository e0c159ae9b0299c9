"""The daemon's start-up check of LAS against the site's priority settings
(daemon/las_check.py), on the site-profile lab, the daemon as its own user: the profile
(base 100000 = one queue's Nice, ``PriorityWeightFairShare`` 100000) breaks neither rule;
three queues of 100000 do, and the daemon says in one line which setting to change."""

from __future__ import annotations

import pytest

from tests.slurm.site_users import SiteWork

pytestmark = pytest.mark.release  # the site profile on every release

FLOOR = "LAS can push priorities to Slurm's floor of 1"


def test_the_daemon_warns_once_where_nice_reaches_the_floor(site_work: SiteWork) -> None:
    quiet = site_work.daemon_once(config="[policy.las]\nenabled = true\n")
    assert FLOOR not in quiet.stderr and "priority weights not read" not in quiet.stderr
    loud = site_work.daemon_once(config="[policy.las]\nenabled = true\nqueue_limits = [1, 4, 16]\n")
    lines = [line for line in loud.stderr.splitlines() if FLOOR in line]
    assert len(lines) == 1, loud.stderr
    assert "the worst queue's Nice is 300000" in lines[0]
    assert "base priority is only 100000 (PriorityWeightPartition=100000)" in lines[0]
    assert "set PriorityWeightPartition >= 300000 in slurm.conf" in lines[0]

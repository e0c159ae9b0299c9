"""jobdiff: what a cycle's listing changed, and what it hands on unchanged."""

from __future__ import annotations

from dataclasses import replace

from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import Job, JobState


def _job(job_id: int = 1, **kw: object) -> Job:
    return Job(job_id, "train", "alice", JobState.PENDING, **kw)  # type: ignore[arg-type]


def test_an_unchanged_job_is_handed_on_as_the_object_seen_before() -> None:
    prev = _job(priority=100)
    diff = diff_jobs({1: prev}, [_job(priority=100)])
    assert diff.empty and diff.listing[0] is prev


def test_a_move_of_slurms_priority_alone_is_no_change_but_the_listing_has_it() -> None:
    """Priorities move with every fair-share calculation and are not stored: no write,
    no event, but the policies see the new one (they order the queue by it)."""
    prev = _job(priority=100)
    now = _job(priority=250)
    diff = diff_jobs({1: prev}, [now])
    assert diff.empty
    assert diff.listing[0] is now and diff.listing[0].priority == 250


def test_any_other_field_still_changes_the_job() -> None:
    prev = _job(priority=100)
    now = replace(prev, nice=10, priority=90)
    diff = diff_jobs({1: prev}, [now])
    assert diff.changed == [now] and diff.listing[0] is now

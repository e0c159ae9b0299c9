"""``decode_squeue`` with a memo: only records whose bytes changed are decoded again.

The memo (hash of each job record's bytes → its Job) must never change what a listing
decodes to: with or without it, every capture of every release, hostile records slipped
in or not, gives equal jobs; an unchanged record gives the previous listing's very
object (the diff and the policies know it unchanged by identity), a changed one a new
Job; a bad record is never remembered, so it is skipped and counted every listing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu.model import JobState
from slurmgpu.slurm import decode_stats
from slurmgpu.slurm.jsonformat import JobMemo, decode_squeue
from tests.hypothesis_profiles import examples
from tests.unit.hostile_records import with_hostile

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SQUEUE = sorted(GOLDEN.glob("slurm-*/mixed_squeue*.json"))


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _edited(path: Path, job_id: int, **fields: Any) -> bytes:
    """The capture with one job's fields changed (the rest byte for byte the same)."""
    raw = path.read_bytes()
    doc = json.loads(raw.decode("utf-8", "surrogateescape"))
    for record in doc["jobs"]:
        if record["job_id"] == job_id:
            record.update(fields)
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogateescape")


@pytest.mark.parametrize("path", SQUEUE, ids=_id)
def test_memo_changes_nothing_and_reuses_unchanged_jobs(path: Path) -> None:
    data = path.read_bytes()
    plain, release = decode_squeue(data)
    memo: JobMemo = {}
    first, release_memo = decode_squeue(data, memo)
    assert first == plain and release_memo == release
    assert len(memo) == len(plain) and set(map(id, memo.values())) == set(map(id, first))
    again, _ = decode_squeue(data, memo)
    assert again == plain
    assert all(a is b for a, b in zip(again, first, strict=True))  # not decoded again


@pytest.mark.parametrize("path", SQUEUE, ids=_id)
def test_a_changed_record_is_decoded_again_the_others_reused(path: Path) -> None:
    memo: JobMemo = {}
    before, _ = decode_squeue(path.read_bytes(), memo)
    target = next(j for j in before if j.state is JobState.PENDING)
    # the same bytes but for one job's reason: json.dumps spells every record anew
    relisted = _edited(path, -1)
    after_same, _ = decode_squeue(relisted, memo)
    assert after_same == before
    edited = _edited(path, target.job_id, state_reason="Dependency")
    after, _ = decode_squeue(edited, memo)
    assert after == decode_squeue(edited)[0]
    for old, new in zip(after_same, after, strict=True):
        if new.job_id == target.job_id:
            assert new is not old and new.reason == "Dependency" and old.reason != "Dependency"
        else:
            assert new is old


def test_the_memo_holds_only_the_last_listing() -> None:
    path = GOLDEN / "slurm-24.11" / "mixed_squeue.json"
    doc = json.loads(path.read_bytes().decode("utf-8", "replace"))
    memo: JobMemo = {}
    decode_squeue(json.dumps(doc).encode(), memo)
    dropped = doc["jobs"].pop()
    jobs, _ = decode_squeue(json.dumps(doc).encode(), memo)
    assert len(memo) == len(jobs) == len(doc["jobs"])
    assert dropped["job_id"] not in {j.job_id for j in memo.values()}


def test_bad_utf8_is_repaired_and_counted_once_a_listing(caplog: pytest.LogCaptureFixture) -> None:
    path = GOLDEN / "slurm-26.05" / "mixed_squeue.json"
    data = path.read_bytes()
    assert b"bad\xff\xfename" in data  # the capture's job name in invalid UTF-8
    unparsed = decode_stats.snapshot().values_unparsed.get("squeue", 0)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs, _ = decode_squeue(data, {})
    assert "bad\ufffd\ufffdname" in {j.name for j in jobs}
    assert decode_stats.snapshot().values_unparsed.get("squeue", 0) == unparsed + 1
    assert caplog.text.count("invalid UTF-8") == 1


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_hostile_records_decode_the_same_with_a_memo(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(SQUEUE), label="capture")
    raw, _ = with_hostile(path, data, "jobs")
    plain, _ = decode_squeue(raw)
    memo: JobMemo = {}
    skipped = decode_stats.snapshot().records_skipped.get("squeue", 0)
    first, _ = decode_squeue(raw, memo)
    once = decode_stats.snapshot().records_skipped.get("squeue", 0) - skipped
    second, _ = decode_squeue(raw, memo)
    twice = decode_stats.snapshot().records_skipped.get("squeue", 0) - skipped
    assert first == plain and second == plain
    assert twice == 2 * once  # a skipped record is not remembered: counted each listing
    assert len(memo) == len(plain)

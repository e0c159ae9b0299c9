"""Files a user writes that the daemon reads as root (a malleable job's ack.json and
progress.json), and what one hostile file costs: that job alone.

Issue 36, finding 1: a ``progress.json`` of 60,000 ``[`` made the JSON reader raise
RecursionError, every policy cycle failed, and an idle job of another user went unwarned.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from slurmgpu import userinput_stats
from slurmgpu.actuate.actuator import Actuator
from slurmgpu.boundedjson import JsonRejected, depth_exceeds, loads
from slurmgpu.cycle.transactions import GuardedAckReader
from slurmgpu.daemon.malleable import MalleableDirectory
from slurmgpu.daemon.metrics import DaemonMetrics
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.elastic.spec import (
    Ack,
    UserFileRejected,
    load_progress,
    read_ack,
    read_progress,
)
from slurmgpu.model import ClusterSnapshot, Job
from slurmgpu.policy.base import Action, Mode, PolicySnapshot
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.idle import IdleGpuPolicy
from slurmgpu.policy.malleable import MalleablePolicy
from slurmgpu.policy.settings import EngineSettings, IdleGpuSettings, MalleableSettings
from slurmgpu.store import JobStore
from slurmgpu.tokens import ckpt_tokens, malleable_token
from slurmgpu.userfiles import UserFileRejected as FileRejected
from slurmgpu.userfiles import read_user_file
from tests.unit.policy_world import T0, World, running_job

DEEP = b"[" * 60_000  # the finding's file: 60 KB, under the 64 KiB size bound


class Seen:
    """A policy that proposes nothing and keeps what it was shown."""

    name = "seen"

    def __init__(self) -> None:
        self.snapshots: list[PolicySnapshot] = []

    def propose(self, snapshot: PolicySnapshot) -> Iterable[Action]:
        self.snapshots.append(snapshot)
        return ()


def _malleable_job(job_id: int, user: str, edir: Path) -> Job:
    tokens = [malleable_token(1, 4), *ckpt_tokens("USR2", 60, str(edir))]
    job = running_job(job_id)
    return replace(job, user=user, comment=" ".join(tokens))


def _progress(edir: Path, job_id: int, body: bytes) -> None:
    (edir / str(job_id)).mkdir(parents=True, exist_ok=True)
    (edir / str(job_id) / "progress.json").write_bytes(body)


def _counted(source: str) -> int:
    return userinput_stats.counts()[source]


def _scraped(metrics: DaemonMetrics, source: str) -> float:
    text = metrics.exposition().decode()
    m = re.search(rf'^sgpu_user_input_rejected_total{{source="{source}"}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def test_a_hostile_progress_file_costs_its_job_only_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = World(tmp_path, Mode.ENFORCE)
    seen = Seen()
    engine = PolicyEngine(
        [
            (IdleGpuPolicy(IdleGpuSettings(mode=Mode.ENFORCE)), Mode.ENFORCE),
            (MalleablePolicy(MalleableSettings(mode=Mode.ENFORCE)), Mode.ENFORCE),
            (seen, Mode.ADVISE),
        ],
        EngineSettings(),
    )
    w.cycle = PolicyCycle(
        engine,
        w.usage,
        w.audit,
        Actuator(w.slurm, w.audit),
        directory=MalleableDirectory(w.store),
    )
    edir = tmp_path / "edir"
    idle = running_job(1)  # alice's, at 0 % for two hours
    hostile = _malleable_job(2, "mallory", edir)
    honest = _malleable_job(3, "bob", edir)
    _progress(edir, 2, DEEP)
    _progress(edir, 3, json.dumps({"version": 1, "job_id": 3, "throughput": {"1": 5.0}}).encode())
    w.samples(idle, T0 - timedelta(minutes=130), T0, 0.0)
    metrics = DaemonMetrics(w.store.engine)
    counted, scraped = _counted("progress"), _scraped(metrics, "progress")

    with caplog.at_level(logging.WARNING):
        for minute in (0, 1, 2):
            w.run([idle, hostile, honest], T0 + timedelta(minutes=minute))

    assert w.alerts(1)[0] == ("warn", "notified")  # the idle job is warned in the first cycle
    assert "cycle" not in w.cycle.errors
    assert not [r for r in caplog.records if "policy cycle failed" in r.getMessage()]
    about_2 = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job 2:")]
    assert about_2 == [
        f"job 2: progress.json in {edir / '2'} ignored: nested deeper than 8; "
        "the job is not resized while it stays so"
    ]  # once, not once a cycle
    for snap in seen.snapshots:
        assert 2 not in snap.malleable  # not resized on input the daemon refused
        assert snap.malleable[3].max_gpus == 4 and snap.throughput[3] == {1: 5.0}
    assert _counted("progress") - counted == 3  # every refused read counts
    assert _scraped(metrics, "progress") - scraped == 3


@pytest.mark.parametrize(
    ("make", "cause"),
    [
        (lambda p: p.write_bytes(DEEP), "nested deeper than 8"),
        (lambda p: p.write_bytes(b'{"version": 1, "job_id": 9, "x": ' + b"{" * 9), "nested"),
        (lambda p: p.write_bytes(b" " * (64 * 1024 + 1)), "larger than 65536 bytes"),
        (lambda p: p.write_bytes(b'{"version": 1, "job_id": 9, "\xff": 1}'), "not UTF-8 text"),
        (lambda p: p.write_bytes(b'{"version": 1, "job_id": 9'), "not valid JSON"),
        (lambda p: p.write_bytes(b"[1, 2]"), "not a JSON object"),
        (lambda p: p.write_bytes(b'{"version": 1, "job_id": 8}'), "written for another job"),
        (lambda p: p.write_bytes(b'{"version": 2, "job_id": 9}'), "not a version-1 record"),
        (
            lambda p: p.write_bytes(b'{"job_id": 9, "version": 1, "acks": 9' + b"9" * 5000 + b"}"),
            "not valid JSON",
        ),
        (os.mkfifo, "a FIFO"),
        (lambda p: p.mkdir(), "a directory"),
        (lambda p: p.symlink_to("/dev/zero"), "a symbolic link (not followed)"),
        (lambda p: p.symlink_to("/etc/shadow"), "a symbolic link (not followed)"),
    ],
)
def test_an_unusable_file_is_refused_with_its_cause_and_read_as_none(
    tmp_path: Path, make: Callable[[Path], object], cause: str
) -> None:
    (tmp_path / "9").mkdir()
    for name, reader in (("ack.json", read_ack), ("progress.json", read_progress)):
        path = tmp_path / "9" / name
        make(path)
        assert reader(tmp_path, 9) is None  # returns (a FIFO would block a plain open)
    with pytest.raises(UserFileRejected, match=re.escape(cause)):
        load_progress(tmp_path, 9)


def test_wrong_types_and_non_finite_numbers_are_no_ack_and_no_rate(tmp_path: Path) -> None:
    (tmp_path / "4").mkdir()
    ack = tmp_path / "4" / "ack.json"
    good = Ack(4, 2, 0, 10, 2, 1.0).to_json()
    for bad in ({"acks": "2"}, {"acks": True}, {"at": float("nan")}, {"restart_count": None}):
        ack.write_text(json.dumps({**good, **bad}))
        assert read_ack(tmp_path, 4) is None, bad
    ack.write_text(json.dumps(good))
    assert read_ack(tmp_path, 4) == Ack(4, 2, 0, 10, 2, 1.0)
    (tmp_path / "4" / "progress.json").write_text(
        '{"version": 1, "job_id": 4, "throughput": '
        '{"1": NaN, "2": Infinity, "3": -1, "4": true, "٣": 2.0, "1234567": 1.0, "5": 7.5}}'
    )
    progress = read_progress(tmp_path, 4)
    assert progress is not None and progress.throughput == {5: 7.5}


def test_a_root_only_target_behind_a_link_is_never_opened(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"version": 1, "job_id": 9, "throughput": {"1": 1.0}}))
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "progress.json").symlink_to(secret)  # a valid record, but not the job's
    assert read_progress(tmp_path, 9) is None


def test_read_user_file_reads_no_more_than_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "f"
    assert read_user_file(path, max_bytes=4) is None  # absent: no fault
    path.write_bytes(b"1234")
    assert read_user_file(path, max_bytes=4) == b"1234"
    path.write_bytes(b"12345")
    with pytest.raises(FileRejected, match="larger than 4 bytes"):
        read_user_file(path, max_bytes=4)
    with pytest.raises(FileRejected, match="NUL"):
        read_user_file(str(tmp_path / "a\0b"), max_bytes=4)
    (tmp_path / "d").write_text("x")
    with pytest.raises(FileRejected, match="not a directory"):
        read_user_file(tmp_path / "d" / "f", max_bytes=4)


def test_bounded_json_measures_depth_outside_strings_only() -> None:
    assert loads(b'{"a": "[[[[{{{{", "b": ["\\"]]]]"]}', max_depth=2) == {
        "a": "[[[[{{{{",
        "b": ['"]]]]'],
    }
    assert not depth_exceeds(b'["\\\\", [1]]', 2)  # an escaped backslash ends no string early
    assert depth_exceeds(b'["\\\\", [[1]]]', 2)
    with pytest.raises(JsonRejected, match="nested deeper than 2"):
        loads(b"[[[1]]]", max_depth=2)
    assert loads(b"[[1]]", max_depth=2) == [[1]]
    # An unterminated string hides its brackets; the text is refused as not JSON.
    assert not depth_exceeds(b'["' + b"[" * 100, 2)
    with pytest.raises(JsonRejected, match="not valid JSON"):
        loads(b'["' + b"[" * 100, max_depth=2)
    # Not JSON either way: refused, whichever cause is found first.
    with pytest.raises(JsonRejected):
        loads(b"[]]" + b"[" * 60_000, max_depth=2)


def test_a_reader_that_raises_costs_its_job_only(caplog: pytest.LogCaptureFixture) -> None:
    def reader(state_dir: str, job_id: int) -> Ack | None:
        if job_id == 1:
            raise RecursionError("deep")
        return Ack(job_id, 1, 0, None, None, 0.0)

    guarded = GuardedAckReader(reader)
    with caplog.at_level(logging.ERROR):
        assert guarded("/x", 1) is None
        assert guarded("/x", 1) is None
        assert guarded("/x", 2) == Ack(2, 1, 0, None, None, 0.0)
    assert [r.getMessage() for r in caplog.records] == [
        "job 1: acknowledgement not read; treated as none"
    ]


def test_a_malformed_comment_token_is_counted_and_logged_once(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    directory = MalleableDirectory(store)
    job = running_job(41)
    job = replace(job, comment="sgpu:malleable=1:4 sgpu:ckpt=KILL:60")
    before = _counted("comment")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            (spec,) = directory.specs(ClusterSnapshot(T0, (job,), ())).values()
    assert spec.checkpoint_signal == "USR2"  # the default, not KILL
    assert _counted("comment") - before == 1  # the spec is read once per job
    assert len([r for r in caplog.records if r.getMessage().startswith("job 41:")]) == 1


def test_one_jobs_exception_while_gathering_its_spec_leaves_the_others(
    tmp_path: Path,
    store: JobStore,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = MalleableDirectory(store)
    jobs = tuple(_malleable_job(j, "bob", tmp_path) for j in (51, 52))
    real = directory._submission

    def submission(job_id: int) -> dict[str, object] | None:
        if job_id == 51:
            raise TypeError("a record no one foresaw")
        return real(job_id)

    monkeypatch.setattr(directory, "_submission", submission)
    with caplog.at_level(logging.ERROR):
        for _ in range(2):
            specs = directory.specs(ClusterSnapshot(T0, jobs, ()))
            assert set(specs) == {52}
    assert directory.errors["inputs"] == 2
    assert len([r for r in caplog.records if r.getMessage().startswith("job 51:")]) == 1

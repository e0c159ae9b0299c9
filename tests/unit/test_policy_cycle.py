"""The daemon's decide → act step on a real SQLite store with the in-memory Slurm fake:
idle jobs are warned, warned again, then requeued; a job busy again is spared; a pending
job is rightsized from history only in enforce mode and only when it opted in."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from slurmgpu.daemon.observer import Observer
from slurmgpu.daemon.policy_cycle import opted_in
from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import Mode
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.slurm.update import parse_fields
from tests.fakes import FakeSlurm
from tests.unit.policy_world import T0, World, running_job


def test_idle_job_is_warned_twice_then_requeued_in_enforce_mode(tmp_path: Path) -> None:
    w = World(tmp_path, Mode.ENFORCE)
    job = running_job(1)
    w.samples(job, T0 - timedelta(minutes=130), T0, 0.0)
    w.run([job], T0)
    assert w.alerts(1) == [("warn", "notified")]
    assert w.slurm.calls.count("requeue") == 0
    w.samples(job, T0 + timedelta(minutes=1), T0 + timedelta(minutes=16), 0.0)
    w.run([job], T0 + timedelta(minutes=16))
    assert w.alerts(1) == [("warn", "notified"), ("warn", "notified")]
    w.samples(job, T0 + timedelta(minutes=17), T0 + timedelta(minutes=32), 0.0)
    w.run([job], T0 + timedelta(minutes=32))
    assert w.alerts(1)[-1] == ("requeue", "done")
    (requeued,) = w.slurm.jobs()
    assert requeued.restart_count == 1
    assert w.slurm.actions == [("requeue", "1")]


def test_same_verdict_is_not_audited_every_cycle(tmp_path: Path) -> None:
    w = World(tmp_path, Mode.ENFORCE)
    job = running_job(2)
    w.samples(job, T0 - timedelta(minutes=70), T0, 0.0)
    w.run([job], T0)
    w.samples(job, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2), 0.0)
    w.run([job], T0 + timedelta(minutes=2))
    assert w.alerts(2) == [("warn", "notified")]


def test_job_busy_again_after_a_warning_is_spared(tmp_path: Path) -> None:
    w = World(tmp_path, Mode.ENFORCE)
    job = running_job(3)
    w.samples(job, T0 - timedelta(minutes=130), T0, 0.0)
    w.run([job], T0)
    w.samples(job, T0 + timedelta(minutes=1), T0 + timedelta(minutes=20), 85.0)
    w.run([job], T0 + timedelta(minutes=20))
    w.samples(job, T0 + timedelta(minutes=21), T0 + timedelta(minutes=40), 85.0)
    w.run([job], T0 + timedelta(minutes=40))
    assert [k for k, _ in w.alerts(3)] == ["warn"]
    assert "requeue" not in w.slurm.calls


def test_advise_mode_warns_but_never_requeues(tmp_path: Path) -> None:
    w = World(tmp_path, Mode.ADVISE)
    job = running_job(4)
    w.samples(job, T0 - timedelta(minutes=200), T0, 0.0)
    for k in range(4):
        at = T0 + timedelta(minutes=16 * k)
        if k:
            w.samples(job, at - timedelta(minutes=15), at, 0.0)
        w.run([job], at)
    kinds = [k for k, _ in w.alerts(4)]
    assert kinds[:2] == ["warn", "warn"]
    assert all(outcome != "done" for _, outcome in w.alerts(4))
    assert w.slurm.jobs()[0].restart_count == 0


def _history(w: World) -> None:
    """Five finished runs of alice's 'sim' job that took about 20 minutes of a 10 h limit."""
    finished = [
        Job(
            job_id=100 + i,
            name="sim",
            user="alice",
            state=JobState.COMPLETED,
            partition="gpu",
            submit_time=T0 - timedelta(days=1, hours=i),
            start_time=T0 - timedelta(days=1, hours=i),
            end_time=T0 - timedelta(days=1, hours=i) + timedelta(minutes=20),
            time_limit=timedelta(hours=10),
            cpus=1,
        )
        for i in range(5)
    ]
    Observer(FakeSlurm(finished), w.store, clock=lambda: T0).cycle()


def _pending(comment: str) -> Job:
    return Job(
        job_id=200,
        name="sim",
        user="alice",
        state=JobState.PENDING,
        partition="gpu",
        submit_time=T0,
        time_limit=timedelta(hours=10),
        cpus=1,
        comment=comment,
    )


@pytest.mark.parametrize(
    ("mode", "comment", "lowered"),
    [
        (Mode.ENFORCE, "sgpu:rightsize", True),
        (Mode.ENFORCE, "", False),  # did not opt in
        (Mode.ADVISE, "sgpu:rightsize", False),  # advice only
    ],
)
def test_pending_job_time_limit_is_lowered_only_when_enforced_and_opted_in(
    tmp_path: Path, mode: Mode, comment: str, lowered: bool
) -> None:
    w = World(tmp_path, mode)
    _history(w)
    job = _pending(comment)
    w.slurm.set_jobs([job])
    w.run([job], T0)
    (record,) = [r for r in w.audit.list(job_id=200) if r.policy == "rightsize"]
    assert "TimeLimit" in record.fields
    updates = [intents for job_id, intents in w.slurm.updates if job_id == 200]
    if lowered:
        assert record.outcome == "done"
        assert updates == [parse_fields(record.fields)[0]]  # what the audit recorded
        (listed,) = [j for j in w.slurm.jobs() if j.job_id == 200]
        assert listed.time_limit is not None and job.time_limit is not None
        assert listed.time_limit < job.time_limit
    else:
        assert updates == []
        assert record.outcome != "done"


def test_opt_in_token_is_a_whole_word() -> None:
    assert opted_in("run 3 sgpu:rightsize")
    assert opted_in("a,sgpu:rightsize;b")
    assert not opted_in("sgpu:rightsizer")
    assert not opted_in("")


def test_recommendations_for_job_submit_lua_are_exported_after_a_history_load(
    tmp_path: Path,
) -> None:
    from slurmgpu.daemon.recommend import RecommendationExport, parse_tsv

    w = World(tmp_path, Mode.ADVISE)
    _history(w)
    rightsize = RightsizePolicy(RightsizeSettings(mode=Mode.ADVISE))
    w.cycle.rightsize = rightsize
    w.cycle.export = RecommendationExport(tmp_path / "etc" / "recommendations.json")
    w.run([], T0)
    doc = parse_tsv((tmp_path / "etc" / "recommendations.tsv").read_text())
    entry = doc["by_key"]["alice|sim|gpu"]
    assert entry["time_limit_min"] == 30  # 20 min x 1.3 = 26, rounded up to 5 min
    assert entry["samples"] == 5
    # The per-user fallback sets no time limit: the user's other jobs never do.
    assert "time_limit_min" not in doc["fallback"].get("alice", {})
    w.cycle.rightsize = RightsizePolicy(
        RightsizeSettings(mode=Mode.ADVISE, time_from_other_jobs=True)
    )
    w.cycle.history_refresh = timedelta(0)
    w.run([], T0 + timedelta(minutes=1))
    doc = parse_tsv((tmp_path / "etc" / "recommendations.tsv").read_text())
    assert doc["fallback"]["alice"]["time_limit_min"] == 30


def test_sgpu_advice_shows_the_newest_advice_per_job(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from slurmgpu.cli.main import main

    w = World(tmp_path, Mode.ADVISE)
    _history(w)
    job = _pending("sgpu:rightsize")
    w.run([job], T0)
    db = f"sqlite:///{tmp_path / 's.db'}"
    config = tmp_path / "empty.toml"
    config.write_text("")
    result = CliRunner().invoke(
        main, ["--db", db, "advice", "--json"], env={"SGPU_CONFIG": str(config)}
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["job_id"] == 200
    assert row["fields"]["TimeLimit"] == "00:30:00"
    assert row["mode"] == "advise"


def test_a_requeued_job_is_judged_on_its_current_run_only(tmp_path: Path) -> None:
    w = World(tmp_path, Mode.ENFORCE)
    old_run = running_job(9)
    w.samples(old_run, T0 - timedelta(minutes=200), T0 - timedelta(minutes=65), 0.0)
    # Requeued and restarted an hour ago; idle for the last 62 minutes of this run.
    job = replace(old_run, restart_count=1, start_time=T0 - timedelta(minutes=62))
    w.samples(job, T0 - timedelta(minutes=62), T0, 0.0)
    w.run([job], T0)
    (record,) = w.audit.list(job_id=9)
    # 62 min since the restart, not 200 min since the first run: the first warning only.
    assert record.kind == "warn"
    assert record.numbers["idle_minutes"] < 65

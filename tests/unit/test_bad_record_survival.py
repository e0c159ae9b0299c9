"""One bad job, key or database costs that job, key or command one clear line, not more.

Config bounds (``history_days = 1000000`` passed ``sgpu policy check`` and then killed the
daemon with an OverflowError), every bad key reported, a policy that raises on one job,
a cycle that raises, and read commands on a corrupt, foreign or newer-schema database.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.cli.main import main
from slurmgpu.config import ConfigError, parse_settings
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.model import ClusterSnapshot, Job
from slurmgpu.policy.base import Action, Mode, PolicySnapshot
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.isolate import propose_isolated
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from tests.fakes import FakeSlurm
from tests.unit.policy_builders import pending_job, snapshot

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


# -- configuration bounds ---------------------------------------------------------------


def test_history_days_of_a_million_is_refused_by_policy_check(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[policy]\nhistory_days = 1000000\n")
    out = CliRunner().invoke(main, ["policy", "check", str(cfg)])
    assert out.exit_code == 3, out.output
    assert "line 2: policy.history_days must be at most 3650, not 1000000" in out.output
    assert "Traceback" not in out.output


def test_every_bad_key_gets_its_own_line(tmp_path: Path) -> None:
    text = (
        '[daemon]\npoll_interval = "99999999d"\nvanish_after_cycles = 0\n'
        "[policy]\nhistory_days = 1000000\n"
        '[policy.idle_gpu]\nwarn_after = "soon"\n'
        "[policy.rightsize]\ntime_quantile = inf\n"
        "[bogus]\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_settings(text, tmp_path / "c.toml")
    lines = str(caught.value).splitlines()
    assert len(lines) == 6, lines
    for expected in (
        "line 2: daemon.poll_interval must be at most 3650d",
        "line 3: daemon.vanish_after_cycles must be an integer >= 1",
        "line 5: policy.history_days must be at most 3650",
        "line 7: policy.idle_gpu.warn_after must be a duration",
        "line 9: policy.rightsize.time_quantile must be a finite number",
        "line 10: [bogus] is not a known section",
    ):
        assert sum(expected in line for line in lines) == 1, (expected, lines)


def test_a_good_file_still_reads_and_one_bad_key_reads_as_before() -> None:
    assert parse_settings("[policy]\nhistory_days = 3650\n").policy.history_days == 3650
    with pytest.raises(ConfigError) as caught:
        parse_settings("[daemon]\nmode = 'x'\n")
    assert (
        str(caught.value)
        == "config error: daemon.mode must be one of observe, advise, enforce, not 'x'"
    )


def test_the_daemon_refuses_to_start_on_an_out_of_range_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\ndatabase = "sqlite:///{tmp_path}/s.db"\n[policy]\nhistory_days = 1000000\n'
    )
    out = CliRunner().invoke(main, ["--config", str(cfg), "daemon", "--once"])
    assert out.exit_code == 3, out.output
    assert "policy.history_days must be at most 3650" in out.output
    assert not (tmp_path / "s.db").exists()


# -- a policy that raises on one job ----------------------------------------------------


class _Picky:
    """Proposes a warning for every pending job; raises on the ones it is told to."""

    name = "picky"

    def __init__(self, raise_on: Iterable[int], *, always: bool = False) -> None:
        self.raise_on = frozenset(raise_on)
        self.always = always
        self.calls = 0

    def propose(self, snap: PolicySnapshot) -> list[Action]:
        self.calls += 1
        if self.always:
            raise RuntimeError("broken policy")
        out = []
        for job in snap.cluster.jobs:
            if job.job_id in self.raise_on:
                raise KeyError(f"no such partition for job {job.job_id}")
            out.append(Action(self.name, "warn", job.job_id, job.user, "hello"))
        return out


def _jobs(n: int) -> list[Job]:
    return [pending_job(i) for i in range(1, n + 1)]


def test_a_policy_raising_on_one_job_loses_only_that_job() -> None:
    policy = _Picky({13})
    made, failures = propose_isolated(policy, snapshot(_jobs(40)))
    assert sorted(a.job_id for a in made) == [i for i in range(1, 41) if i != 13]
    assert [(f.policy, f.job_id) for f in failures] == [("picky", 13)]
    assert "KeyError" in failures[0].error and "job 13" in failures[0].error


def test_two_bad_jobs_are_both_found_and_the_rest_kept() -> None:
    made, failures = propose_isolated(_Picky({2, 37}), snapshot(_jobs(40)))
    assert len(made) == 38
    assert sorted(f.job_id or 0 for f in failures) == [2, 37]


def test_a_broken_policy_is_skipped_and_the_others_still_decide() -> None:
    engine = PolicyEngine([(_Picky((), always=True), Mode.ADVISE), (_Picky({5}), Mode.ADVISE)])
    decisions = engine.decide(snapshot(_jobs(6)))
    assert sorted(d.action.job_id for d in decisions) == [1, 2, 3, 4, 6]
    assert [(f.policy, f.job_id) for f in engine.failures] == [("picky", None), ("picky", 5)]


def test_the_policy_cycle_logs_the_job_counts_it_and_goes_on(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    usage, audit = UsageStore(store.engine), AuditStore(store.engine)
    engine = PolicyEngine([(_Picky({3}), Mode.ADVISE)])
    cycle = PolicyCycle(engine, usage, audit, Actuator(FakeSlurm(), audit))
    jobs = tuple(_jobs(4))
    with caplog.at_level(logging.DEBUG, logger="slurmgpu.daemon"):
        cycle.run(ClusterSnapshot(taken_at=T0, jobs=jobs, nodes=()), T0)
        cycle.run(ClusterSnapshot(taken_at=T0, jobs=jobs, nodes=()), T0 + timedelta(minutes=1))
    assert sorted(r.job_id or 0 for r in audit.list()) == [1, 2, 4]
    assert cycle.errors["picky"] == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "raised on job 3" in errors[0].getMessage()


def test_a_cycle_that_raises_is_logged_counted_and_survived(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    usage, audit = UsageStore(store.engine), AuditStore(store.engine)
    cycle = PolicyCycle(PolicyEngine([]), usage, audit, Actuator(FakeSlurm(), audit))
    snap = ClusterSnapshot(taken_at=T0, jobs=tuple(_jobs(2)), nodes=())
    broken = ClusterSnapshot(taken_at=T0, jobs=(None,), nodes=())  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="slurmgpu.daemon"):
        assert cycle.run(broken, T0) == []
    assert cycle.errors["cycle"] == 1
    assert "policy cycle failed" in caplog.text
    assert cycle.run(snap, T0) == []  # and the next one runs


def test_history_days_beyond_the_calendar_does_not_overflow(store: JobStore) -> None:
    usage, audit = UsageStore(store.engine), AuditStore(store.engine)
    cycle = PolicyCycle(
        PolicyEngine([]), usage, audit, Actuator(FakeSlurm(), audit), history_days=1_000_000
    )
    assert cycle.history(T0) == ()


# -- read commands on a database that is not ours ---------------------------------------


def _corrupt(path: Path) -> None:
    path.write_bytes(b"\x00garbage" * 600)


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE x (a)")


def _newer(path: Path) -> None:
    open_store(f"sqlite:///{path}").engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")


@pytest.mark.parametrize(
    ("make", "expected", "code"),
    [
        # A file whose header is not SQLite's: exit 6 (restore it), no longer "corrupt, or
        # not a database", a guess that permission denied and read-only got too (issue 36).
        (_corrupt, "cannot be read: not a database (file is not a database)", 6),
        (_foreign, "is not a slurmgpu database", 4),
        (_newer, "has schema revision '9999', which this slurmgpu does not know", 4),
    ],
)
@pytest.mark.parametrize("command", [["jobs"], ["actions"], ["advice"], ["resizes"], ["eff", "1"]])
def test_read_commands_give_one_line_on_a_database_not_ours(
    tmp_path: Path, make: object, expected: str, code: int, command: list[str]
) -> None:
    db = tmp_path / "s.db"
    make(db)  # type: ignore[operator]
    out = CliRunner().invoke(main, ["--db", f"sqlite:///{db}", *command])
    assert out.exit_code == code, out.output
    assert expected in out.output and "Traceback" not in out.output
    assert len([line for line in out.output.splitlines() if line.startswith("sgpu:")]) == 1


def test_the_daemon_does_not_downgrade_a_newer_schema(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _newer(db)
    out = CliRunner().invoke(main, ["--db", f"sqlite:///{db}", "daemon", "--once"])
    assert out.exit_code == 4, out.output
    assert "a newer slurmgpu wrote it" in out.output


# -- the observe loop itself -------------------------------------------------------------


def _unforeseen_error() -> None:
    raise TypeError("unexpected None in a job record")  # a bug on a record


def test_a_cycle_that_raises_costs_that_cycle_not_the_daemon(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    from slurmgpu.daemon.loop import DaemonLoop
    from slurmgpu.daemon.observer import Observer

    slurm = FakeSlurm(_jobs(2))
    slurm.before_next_listing = _unforeseen_error  # the first listing only
    loop = DaemonLoop(
        Observer(slurm, store),
        interval=timedelta(milliseconds=1),
        max_backoff=timedelta(milliseconds=2),
    )
    with caplog.at_level(logging.ERROR, logger="slurmgpu.daemon"):
        loop.run(max_cycles=3)
    assert loop.cycles == 3 and loop.crashes == 1
    assert "cycle failed unexpectedly" in caplog.text
    assert store.count_jobs() == 2  # the later cycles stored the listing

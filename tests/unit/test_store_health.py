"""A damaged, read-only, full or forbidden store: caught, named by its real cause, one line.

Issue 36 item 4: a database with corrupt pages in the middle opened fine, so the daemon
ran on printing a traceback every cycle, ``sgpu daemon --once`` exited 0 and ``sgpu jobs``
worked; permission denied and read-only read as "corrupt, or not a database". Item 6:
``/healthz`` said ok while the database was full.

Corrupt stores are real files with pages overwritten (tests/unit/store_damage.py); full
and read-only ones a real tmpfs (root only, else skipped); permission denied a real
process that dropped to uid 65534.

The new modules (store/health.py, daemon/store_watch.py) are imported inside the tests
that use them, so the behaviour tests (the CLI, the daemon) also run, and fail, on the
code before them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from slurmgpu.cli import context
from slurmgpu.cli.main import main
from slurmgpu.config import Settings
from slurmgpu.daemon.app import Daemon, DaemonError
from slurmgpu.daemon.lease import DaemonLease
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from tests.fakes import FakeSlurm
from tests.unit import store_damage
from tests.unit.store_damage import NODES, corrupt_middle, listing, populated, samples, tmpfs

needs_mounts = pytest.mark.skipif(
    store_damage.why_no_mounts() is not None, reason=store_damage.why_no_mounts() or ""
)


def _sgpu(db: Path | str, *args: str, slurm: FakeSlurm | None = None) -> Result:
    url = db if isinstance(db, str) else f"sqlite:///{db}"
    if slurm is not None:
        old = context.AppContext.slurm
        context.AppContext.slurm = lambda self: slurm  # type: ignore[method-assign]
    try:
        return CliRunner().invoke(main, ["--db", url, *args])
    finally:
        if slurm is not None:
            context.AppContext.slurm = old  # type: ignore[method-assign]


def _one_line(out: Result) -> str:
    assert "Traceback" not in out.output, out.output
    lines = [line for line in out.output.splitlines() if line.startswith("sgpu:")]
    assert len(lines) == 1, out.output
    return lines[0]


@pytest.fixture
def corrupt_db(tmp_path: Path) -> tuple[Path, FakeSlurm]:
    db = tmp_path / "state.db"
    slurm = populated(db)
    corrupt_middle(db)
    return db, slurm


# -- the integrity check ------------------------------------------------------------------


def test_a_corrupt_page_in_the_middle_opens_fine_but_fails_the_check(
    corrupt_db: tuple[Path, FakeSlurm],
) -> None:
    from slurmgpu.store.health import Cause, check_store

    db, _ = corrupt_db
    engine = open_store(f"sqlite:///{db}", migrate=False).engine  # opens: the header is fine
    found = check_store(engine)
    assert found.cause is Cause.CORRUPT and found.detail.startswith("quick_check: ")
    assert "\n" not in found.detail


def test_an_intact_store_passes_the_check(tmp_path: Path) -> None:
    from slurmgpu.store.health import check_store

    db = tmp_path / "state.db"
    populated(db)
    assert check_store(open_store(f"sqlite:///{db}").engine).ok


def test_sgpu_db_check_says_ok_or_corrupt_in_one_line(
    corrupt_db: tuple[Path, FakeSlurm], tmp_path: Path
) -> None:
    db, _ = corrupt_db
    out = _sgpu(db, "db", "check")
    assert out.exit_code == 6, out.output
    assert "corrupt" in _one_line(out) and "restore it from a backup" in out.output
    good = tmp_path / "good.db"
    populated(good)
    out = _sgpu(good, "db", "check")
    assert out.exit_code == 0 and "ok" in out.output, out.output


# -- the daemon at start and mid-run ---------------------------------------------------------


def test_the_daemon_refuses_to_start_on_a_corrupt_store_with_one_line(
    corrupt_db: tuple[Path, FakeSlurm],
) -> None:
    db, slurm = corrupt_db
    before = db.read_bytes()
    out = _sgpu(db, "daemon", "--once", slurm=slurm)
    assert out.exit_code == 6, out.output
    line = _one_line(out)
    assert "corrupt" in line and "restore it from a backup" in line
    assert "docs/admin-guide.md" in line
    assert db.read_bytes() == before, "nothing may be written to a corrupt store"


def test_db_upgrade_refuses_to_migrate_a_corrupt_store(
    corrupt_db: tuple[Path, FakeSlurm],
) -> None:
    db, _ = corrupt_db
    out = _sgpu(db, "db", "upgrade")
    assert out.exit_code == 6, out.output
    assert "corrupt" in _one_line(out)


def _daemon(url: str, slurm: FakeSlurm, tmp_path: Path) -> Daemon:
    settings = Settings().with_database(url)
    settings = replace(
        settings, daemon=replace(settings.daemon, secret_file=str(tmp_path / "site.secret"))
    )
    store = open_store(url)
    lease = DaemonLease(store.engine, ttl=timedelta(seconds=60))
    lease.acquire()
    return Daemon(settings, store, slurm, lease, poll=timedelta(milliseconds=1))


def test_a_corrupt_page_met_mid_run_stops_the_daemon_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "state.db"
    slurm = populated(db)
    d = _daemon(f"sqlite:///{db}", slurm, tmp_path)
    assert d.run_once().ok
    corrupt_middle(db)  # a bad disk under the running daemon
    d.usage.engine.dispose()
    caplog.set_level(logging.INFO)
    with pytest.raises(DaemonError) as stopped:
        d.serve(listen=None, api=False, cycles=5)
    assert stopped.value.kind == "damaged"
    assert "corrupt" in str(stopped.value) and "restore it from a backup" in str(stopped.value)
    assert "\n" not in str(stopped.value)
    assert d.loop.cycles == 2, "the daemon must stop after the cycle that met the page"
    assert d.store_watch.checks == 1
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
    assert "Traceback" not in caplog.text


def test_once_exits_6_when_its_cycle_meets_a_corrupt_page(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    slurm = populated(db)
    d = _daemon(f"sqlite:///{db}", slurm, tmp_path)
    corrupt_middle(db)
    d.usage.engine.dispose()
    with pytest.raises(DaemonError) as stopped:
        d.run_once()
    assert stopped.value.kind == "damaged"


def test_a_harmless_database_error_is_checked_once_and_the_daemon_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from slurmgpu.daemon.store_watch import StoreWatch
    from slurmgpu.store.health import Cause, Diagnosis, StoreHealth

    db = tmp_path / "state.db"
    populated(db)
    engine = open_store(f"sqlite:///{db}").engine
    health = StoreHealth()
    watch = StoreWatch(engine, health)
    glitch = Diagnosis(Cause.CORRUPT, "database disk image is malformed")
    caplog.set_level(logging.WARNING)
    for _ in range(3):  # the same error three cycles running: checked once, said once
        health.failed(glitch)
        assert watch.after_cycle() is None
    assert watch.checks == 1
    said = [r.getMessage() for r in caplog.records if "integrity check" in r.getMessage()]
    assert len(said) == 1 and "intact" in said[0] and "carrying on" in said[0]
    assert watch.after_cycle() is None  # a cycle without the error, writes still failing
    health.failed(glitch)
    assert watch.after_cycle() is None
    assert watch.checks == 1, "the same fault: not checked again"
    health.wrote()
    assert watch.after_cycle() is None  # writes work again
    health.failed(glitch)
    assert watch.after_cycle() is None
    assert watch.checks == 2, "after a good write the error is news again"


# -- the real cause, in words ----------------------------------------------------------------


def test_read_commands_on_a_corrupt_page_say_may_be_corrupt_and_how_to_check(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state.db"
    populated(db)
    corrupt_middle(db, "jobs")
    out = _sgpu(db, "jobs")
    assert out.exit_code == 4, out.output
    line = _one_line(out)
    assert "may be corrupt" in line and "sgpu db check" in line


def test_a_file_that_is_not_a_database_is_named_so_and_exits_6(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"\x00garbage" * 600)
    for args in (["jobs"], ["db", "check"], ["daemon", "--once"]):
        out = _sgpu(db, *args, slurm=FakeSlurm())
        assert out.exit_code == 6, (args, out.output)
        assert "not a database" in _one_line(out)


def test_a_locked_store_is_named_locked(tmp_path: Path) -> None:
    from slurmgpu.store.health import Cause, classify

    db = tmp_path / "state.db"
    populated(db)
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        engine = create_engine(f"sqlite:///{db}", connect_args={"timeout": 0})
        with pytest.raises(SQLAlchemyError) as err, engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs"))
        found = classify(err.value, db)
        assert found is not None and found.cause is Cause.LOCKED
    finally:
        holder.rollback()
        holder.close()


def test_a_mode_ro_connection_is_named_read_only(tmp_path: Path) -> None:
    from slurmgpu.store.health import Cause, classify

    db = tmp_path / "state.db"
    populated(db)
    engine = create_engine(f"sqlite:///file:{db}?mode=ro&uri=true")
    with pytest.raises(SQLAlchemyError) as err, engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs"))
    found = classify(err.value)
    assert found is not None and found.cause is Cause.READ_ONLY
    assert "corrupt" not in str(found)


_AS_NOBODY = textwrap.dedent(
    """
    import os, sys
    from click.testing import CliRunner
    from slurmgpu.cli.main import main
    db, commands = sys.argv[1], [c.split() for c in sys.argv[2:]]
    for command in commands:  # every module imported while root (the stdlib is root's)
        CliRunner().invoke(main, ["--db", db, *command])
    os.setgid(65534)
    os.setuid(65534)
    for command in commands:
        out = CliRunner().invoke(main, ["--db", db, *command])
        print(out.exit_code, out.output.strip().replace(chr(10), " / "))
    """
)


@needs_mounts
def test_permission_denied_is_named_not_called_corrupt() -> None:
    shared = Path(tempfile.mkdtemp(prefix="sgpu-perm-", dir="/tmp"))  # others may enter
    try:
        shared.chmod(0o755)
        db = shared / "state.db"
        open_store(f"sqlite:///{db}").engine.dispose()
        db.chmod(0o600)  # root's, as the daemon leaves it
        proc = subprocess.run(
            [sys.executable, "-c", _AS_NOBODY, f"sqlite:///{db}", "jobs", "db check"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            check=False,
        )
    finally:
        shutil.rmtree(shared)
    answers = proc.stdout.splitlines()
    assert len(answers) == 2, proc.stdout + proc.stderr
    for answer in answers:
        code, _, line = answer.partition(" ")
        assert code == "4", answer
        assert line.startswith("sgpu: ") and " / " not in line, answer
        assert "permission denied" in line and "uid 65534 may not read" in line, line
        assert "corrupt" not in line and "not a database" not in line


@needs_mounts
def test_a_read_only_file_system_is_named_read_only(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs") as fs:
        db = fs.path / "state.db"
        slurm = populated(db)
        fs.remount("ro")
        for args in (["daemon", "--once"], ["jobs"], ["db", "check"]):
            out = _sgpu(db, *args, slurm=slurm)
            assert out.exit_code == 4, (args, out.output)
            line = _one_line(out)
            assert "read-only" in line and "mounted read-only" in line, line
            assert "corrupt" not in line and "not a database" not in line


@needs_mounts
def test_once_exits_4_naming_disk_full_when_its_cycle_could_not_store(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "4m") as fs:
        db = fs.path / "state.db"
        populated(db)
        slurm = FakeSlurm(listing(400), NODES)  # 200 new jobs to store
        slurm.before_next_listing = fs.fill  # Slurm answers; meanwhile the disk fills up
        out = _sgpu(db, "daemon", "--once", "--no-policies", slurm=slurm)
        assert slurm.before_next_listing is None, "the disk was never filled"
        assert out.exit_code == 4, out.output
        line = _one_line(out)
        assert "disk full" in line and "free space" in line, line


# -- /healthz --------------------------------------------------------------------------------


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def full_disk_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, store_damage.Tmpfs, str]]:
    with tmpfs(tmp_path / "fs", "4m") as fs:
        db = fs.path / "state.db"
        slurm = populated(db)
        d = _daemon(f"sqlite:///{db}", slurm, tmp_path)
        with socket.socket() as probe:  # a free port: the listen syntax refuses port 0
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server, munge = d._start_api(f"127.0.0.1:{port}")
        try:
            yield d, fs, f"http://127.0.0.1:{server.address[1]}/healthz"
        finally:
            munge.stop()
            server.stop()
            d.usage.engine.dispose()


# slow tier: mounts a tiny file system and runs a daemon on it, ~6 s
@pytest.mark.slow
@needs_mounts
def test_healthz_answers_503_store_full_while_writes_fail_and_200_after(
    full_disk_daemon: tuple[Daemon, store_damage.Tmpfs, str],
) -> None:
    d, fs, url = full_disk_daemon
    assert d.loop.run_once().ok
    status, body = _get(url)
    assert status == 200 and body["ok"] is True and body["store"] == "ok", body
    fs.fill()
    slurm = d.observer.slurm
    assert isinstance(slurm, FakeSlurm)
    slurm.set_jobs(listing(400))
    assert not d.loop.run_once().ok
    with pytest.raises(Exception):  # noqa: B017 - an agent's upload fails too
        d.usage.ingest(samples(50))
    status, body = _get(url)
    assert status == 503, body
    assert body["ok"] is False and body["store"] == "full", body
    assert body["last_write"] and body["failing_since"]
    assert set(body) == {"ok", "store", "last_write", "failing_since"}, "no data, no path"
    fs.free()
    assert d.loop.run_once().ok
    status, body = _get(url)
    assert status == 200 and body["store"] == "ok", body


# -- PostgreSQL's SQLSTATEs ------------------------------------------------------------------


def test_postgresql_sqlstates_map_to_the_same_causes(postgres_url: str) -> None:
    from slurmgpu.store.health import Cause, classify

    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS sgpu_health_probe"))
        conn.execute(text("CREATE TABLE sgpu_health_probe (a int)"))
        conn.execute(text("DROP ROLE IF EXISTS sgpu_nopriv"))
        conn.execute(text("CREATE ROLE sgpu_nopriv LOGIN"))
        # The schema may be one a test recreated (no USAGE for others): without USAGE the
        # table is not found (42P01) instead of refused (42501).
        conn.execute(text("GRANT USAGE ON SCHEMA public TO sgpu_nopriv"))
    try:
        with pytest.raises(SQLAlchemyError) as ro, engine.connect() as conn:
            conn.execute(text("SET TRANSACTION READ ONLY"))
            conn.execute(text("INSERT INTO sgpu_health_probe VALUES (1)"))
        found = classify(ro.value)
        assert found is not None and found.cause is Cause.READ_ONLY, found
        assert "25006" in found.detail
        nopriv = create_engine(postgres_url.replace("postgres@", "sgpu_nopriv@"))
        with pytest.raises(SQLAlchemyError) as denied, nopriv.connect() as conn:
            conn.execute(text("SELECT * FROM sgpu_health_probe"))
        nopriv.dispose()
        found = classify(denied.value)
        assert found is not None and found.cause is Cause.PERMISSION_DENIED, found
        assert "42501" in found.detail
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS sgpu_health_probe"))
            conn.execute(text("REVOKE USAGE ON SCHEMA public FROM sgpu_nopriv"))
            conn.execute(text("DROP ROLE IF EXISTS sgpu_nopriv"))
        engine.dispose()


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"server said {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("sqlstate", "cause"),
    [
        ("XX001", "corrupt"),
        ("XX002", "corrupt"),
        ("53100", "full"),
        ("42501", "permission_denied"),
        ("25006", "read_only"),
        ("55P03", "locked"),
        ("08006", "unreachable"),
        ("XX000", "error"),
    ],
)
def test_sqlstates_that_cannot_be_provoked_here_map_too(sqlstate: str, cause: str) -> None:
    from slurmgpu.store.health import classify

    found = classify(_PgError(sqlstate))
    assert found is not None and found.cause == cause


def test_a_constraint_violation_says_nothing_about_the_store(tmp_path: Path) -> None:
    from slurmgpu.store.health import classify

    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute("CREATE TABLE t (a PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as err:
        conn.execute("INSERT INTO t VALUES (1)")
    assert classify(err.value) is None
    assert classify(_PgError("23505")) is None  # unique_violation


def test_store_health_answers_from_the_last_write() -> None:
    from slurmgpu.store.health import Cause, Diagnosis, StoreHealth

    health = StoreHealth()
    assert health.healthz()[0] == 200
    health.failed(Diagnosis(Cause.FULL, "database or disk is full"))
    status, body = health.healthz()
    assert status == 503 and json.loads(body)["store"] == "full"
    health.wrote()
    assert health.healthz()[0] == 200
    usage = UsageStore(create_engine("sqlite://"))
    assert usage.health is None


def test_store_errors_the_daemon_logs_are_one_line_with_their_cause(tmp_path: Path) -> None:
    """An audit write or a history read that fails says its cause in one line; before,
    the message carried SQLAlchemy's statement, parameters and help link (4+ lines, and a
    batch's worth of text for a multi-row write)."""
    from slurmgpu.store import StoreError
    from slurmgpu.store.audit import AuditStore
    from slurmgpu.store.history import load_history

    db = tmp_path / "state.db"
    populated(db)
    read_only = create_engine(f"sqlite:///file:{db}?mode=ro&uri=true")
    with pytest.raises(StoreError) as write:
        AuditStore(read_only).set_outcome(1, "done")
    db.write_bytes(b"\x00garbage" * 600)
    with pytest.raises(StoreError) as read:
        load_history(create_engine(f"sqlite:///{db}"), "", store_damage.T0)
    for err, cause in ((write, "read-only"), (read, "not a database")):
        text_ = str(err.value)
        assert "\n" not in text_ and "[SQL" not in text_ and "sqlalche.me" not in text_, text_
        assert cause in text_, text_


def test_a_file_system_gone_read_only_after_a_disk_error_is_named_read_only(
    tmp_path: Path,
) -> None:
    """What a failing disk does (ext4 ``errors=remount-ro``): SQLite says "disk I/O error";
    Linux 6.x keeps the mount ``rw`` and marks the super block ``emergency_ro``, which
    statvfs does not show. The line must say read-only, not "disk I/O error" alone."""
    from tests.unit.store_damage import Ext4, ext4_unavailable

    if (why := ext4_unavailable()) is not None:
        pytest.skip(why)
    from slurmgpu.store.health import Cause, classify

    disk = Ext4(tmp_path)
    try:
        db = disk.mnt / "state.db"
        engine = open_store(f"sqlite:///{db}").engine
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM meta"))
        disk.fail()
        with pytest.raises(SQLAlchemyError) as err, engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = version_num"))
        engine.dispose()
        found = classify(err.value, db)
        assert found is not None and found.cause is Cause.READ_ONLY, repr(err.value)
        assert "read-only" in str(found)
    finally:
        disk.close()


def test_emergency_read_only_is_read_from_the_super_block_options(tmp_path: Path) -> None:
    from slurmgpu.store.health import _emergency_read_only

    info = tmp_path / "mountinfo"
    info.write_text(
        "27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "90 27 7:0 / /srv/db rw,relatime - ext4 /dev/loop0 rw,emergency_ro,errors=remount-ro\n"
        "91 90 0:50 / /srv/db/sub rw - tmpfs tmpfs rw\n"
    )
    assert _emergency_read_only(Path("/srv/db/state"), info) == "/srv/db"
    assert _emergency_read_only(Path("/srv/db/sub/x"), info) is None  # the tmpfs inside
    assert _emergency_read_only(Path("/var/lib"), info) is None

"""``sgpu jobs --watch`` / ``sgpu actions --watch``: what the live table shows (GPU use, the
daemon's newest decision per job), and that it redraws in a real terminal and quits cleanly
on Ctrl-C."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import select
import signal
import struct
import sys
import termios
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import insert

from slurmgpu.cli.actions import _watch as actions_watch
from slurmgpu.cli.jobs import _watch as jobs_watch
from slurmgpu.cli.jobs import decision_text, gpu_use_text, jobs_table
from slurmgpu.jobdiff import diff_jobs
from slurmgpu.model import GpuRequest, Job, JobState, NodeGpuAllocation
from slurmgpu.store import JobStore, StoredJob, open_store, schema
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from slurmgpu.store.usage_query import GpuUsage
from slurmgpu.wire import GpuSampleIn, SampleBatch


def _job(job_id: int, state: JobState, gpus: tuple[int, ...], start: datetime) -> Job:
    running = state is not JobState.PENDING
    return Job(
        job_id=job_id,
        name=f"train{job_id}",
        user="alice",
        account="ml",
        partition="gpu",
        state=state,
        submit_time=start,
        start_time=start if running else None,
        end_time=start + timedelta(minutes=5) if state.is_terminal else None,
        time_limit=timedelta(hours=1),
        cpus=4,
        node_count=1,
        tasks=1,
        gpus=GpuRequest(gpus=len(gpus) or 1),
        nodes=("gpu1",) if running else (),
        gpu_allocations=(NodeGpuAllocation("gpu1", gpus),) if running else (),
    )


def _action(
    store: JobStore, job_id: int, at: datetime, policy: str, kind: str, reason: str
) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            insert(schema.actions),
            [
                {
                    "at": at,
                    "cluster": store.cluster,
                    "job_id": job_id,
                    "user": "alice",
                    "policy": policy,
                    "kind": kind,
                    "mode": "advise",
                    "taken": False,
                    "reason": reason,
                    "numbers": {},
                    "outcome": "notified",
                }
            ],
        )


def seed(url: str) -> JobStore:
    """Three jobs: 101 running on two GPUs with samples, 102 pending, 103 completed."""
    now = datetime.now(UTC)
    store = open_store(url)
    jobs = [
        _job(101, JobState.RUNNING, (0, 1), now - timedelta(minutes=10)),
        _job(102, JobState.PENDING, (), now - timedelta(minutes=3)),
        _job(103, JobState.COMPLETED, (2,), now - timedelta(hours=1)),
    ]
    store.apply_cycle(diff_jobs({}, jobs), {}, [], now)
    samples = [
        GpuSampleIn(
            sample_uid=f"s-{gpu}-{i}",
            at=(now - timedelta(seconds=10 * i)).timestamp(),
            gpu_index=gpu,
            job_id=101,
            util_pct=40.0 if gpu == 0 else 60.0,
            memory_used_mib=6144.0 if gpu == 0 else 2048.0,
            memory_total_mib=81920.0,
            processes=1,
        )
        for gpu in (0, 1)
        for i in range(3)
    ]
    UsageStore(store.engine, store.cluster).ingest(SampleBatch(node="gpu1", gpu=samples))
    _action(store, 101, now - timedelta(minutes=5), "idle_gpu", "warn", "older decision")
    _action(store, 101, now - timedelta(minutes=1), "rightsize", "advise", "asks 2 GPUs, uses 1")
    _action(store, 103, now - timedelta(hours=1), "idle_gpu", "warn", "idle 30 min")
    return store


def _text(renderable: object, width: int = 220) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def _row(text: str, job_id: int) -> str:
    rows = [line for line in text.splitlines() if line.startswith(f"│ {job_id} ")]
    assert len(rows) == 1, text
    return rows[0]


def _usage(gpu: int, util: float | None, mem: float | None, total: float | None) -> GpuUsage:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return GpuUsage("gpu1", gpu, 3, util, util, mem, total, at, at, timedelta(0), False, False, 0)


def test_gpu_use_text_is_mean_util_and_most_memory() -> None:
    assert gpu_use_text([]) == "-"
    two = [_usage(0, 10.0, 1024.0, 40960.0), _usage(1, 31.0, 3584.0, 40960.0)]
    assert gpu_use_text(two) == "20% 3.5/40G"
    assert gpu_use_text([_usage(0, 99.6, None, None)]) == "100%"
    assert gpu_use_text([_usage(0, 5.0, 512.0, None)]) == "5% 0.5G"
    assert gpu_use_text([_usage(0, None, 512.0, 1024.0)]) == "-", "no utilisation: no use known"


def test_live_jobs_table_shows_each_jobs_gpu_use_and_newest_decision(tmp_path: Path) -> None:
    store = seed(f"sqlite:///{tmp_path / 's.db'}")
    now = datetime.now(UTC)
    rows = store.jobs(limit=10)
    usage = UsageStore(store.engine).gpu_usage_many([101], since=now - timedelta(minutes=1))
    decisions = AuditStore(store.engine).latest_by_job([101, 102, 103])
    assert sorted(decisions) == [101, 103]
    text = _text(jobs_table(rows, now, usage=usage, decisions=decisions))
    assert "GPU USE" in text and "LAST DECISION" in text and "RESTARTS" not in text
    row = _row(text, 101)
    assert "50% 6.0/80G" in row, "mean of 40 % and 60 %, the most memory of one GPU"
    assert "rightsize advise (notified): asks 2 GPUs, uses 1" in row
    assert "older decision" not in text
    assert _row(text, 102).count(" - ") >= 2, "no samples and no decision yet"
    assert "idle_gpu warn (notified): idle 30 min" in _row(text, 103)
    # The plain table keeps its columns.
    plain = _text(jobs_table(rows, now))
    assert "RESTARTS" in plain and "GPU USE" not in plain


def test_decision_text_of_no_decision_is_a_dash() -> None:
    assert decision_text(None) == "-"


def _terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=220, height=40, color_system=None), buf


def test_jobs_watch_draws_the_live_table_and_stops(tmp_path: Path) -> None:
    store = seed(f"sqlite:///{tmp_path / 's.db'}")
    console, buf = _terminal()
    stop = threading.Event()
    stop.set()  # draw once, then stop
    jobs_watch(store, lambda: store.jobs(limit=10), 0.5, console=console, stop=stop)
    out = buf.getvalue()
    assert "sgpu jobs: every 0.5s" in out and "Ctrl-C to quit" in out
    assert "50% 6.0/80G" in out and "asks 2 GPUs, uses 1" in out


def test_actions_watch_draws_the_newest_decisions(tmp_path: Path) -> None:
    store = seed(f"sqlite:///{tmp_path / 's.db'}")
    audit = AuditStore(store.engine)
    console, buf = _terminal()
    stop = threading.Event()
    stop.set()
    actions_watch(lambda: audit.list(limit=2), 1.0, console=console, stop=stop)
    out = buf.getvalue()
    assert "2 decision(s)" in out and "asks 2 GPUs, uses 1" in out and "idle 30 min" in out
    assert "older decision" not in out


def test_watch_keeps_the_last_table_when_the_database_fails(tmp_path: Path) -> None:
    store = seed(f"sqlite:///{tmp_path / 's.db'}")
    console, buf = _terminal()
    calls: list[int] = []
    stop = threading.Event()

    def read() -> list[StoredJob]:
        calls.append(1)
        if len(calls) == 2:
            stop.set()
            from sqlalchemy.exc import OperationalError

            raise OperationalError("SELECT", {}, Exception("database is locked"))
        return store.jobs(limit=10)

    jobs_watch(store, read, 0.1, console=console, stop=stop)
    out = buf.getvalue()
    assert "database: (builtins.Exception) database is locked" in out
    assert out.rsplit("database is locked", 1)[1].count("train101") == 1, "last table kept"


def test_watch_refuses_a_pipe(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurmgpu.cli.main import main

    seed(f"sqlite:///{tmp_path / 's.db'}")
    result = CliRunner().invoke(main, ["--db", f"sqlite:///{tmp_path / 's.db'}", "jobs", "--watch"])
    assert result.exit_code == 2
    assert "--watch needs a terminal" in result.output


def _read_until(fd: int, needle: bytes, seen: bytearray, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while needle not in seen:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(
                f"{needle!r} never appeared; got:\n{seen.decode(errors='replace')}"
            )
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"{needle!r} never appeared before the end:\n{seen!r}")
            seen.extend(chunk)


@pytest.mark.skipif(sys.platform != "linux", reason="needs a Linux pseudo-terminal")
def test_jobs_watch_redraws_in_a_real_terminal_and_quits_on_ctrl_c(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = seed(url)
    config = tmp_path / "c.toml"
    config.write_text("")
    pid, fd = pty.fork()
    if pid == 0:  # the child: sgpu on the pseudo-terminal, as a user would run it
        env = {**os.environ, "SGPU_CONFIG": str(config), "TERM": "xterm-256color"}
        for var in ("COLUMNS", "LINES", "NO_COLOR", "SGPU_DB"):
            env.pop(var, None)
        argv = [sys.executable, "-m", "slurmgpu", "--db", url, "jobs", "--watch"]
        os.execve(sys.executable, [*argv, "--interval", "0.2s"], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    seen = bytearray()
    try:
        _read_until(fd, b"asks 2 GPUs, uses 1", seen)
        _read_until(fd, b"50% 6.0/80G", seen)
        # A new decision arrives while it watches: the table in place shows it.
        _action(store, 102, datetime.now(UTC), "colocate", "advise", "packs with 101")
        _read_until(fd, b"packs with 101", seen)
        assert b"\x1b[" in seen, "redrawn with cursor moves, not printed again and again"
        os.write(fd, b"\x03")  # Ctrl-C, through the terminal's line discipline
        end = time.monotonic() + 60
        status = 0
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                with contextlib.suppress(OSError):
                    seen.extend(os.read(fd, 65536))
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("sgpu jobs --watch did not stop on Ctrl-C")
    finally:
        os.close(fd)
    text = seen.decode(errors="replace")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, text[-2000:])
    assert "Traceback" not in text and "KeyboardInterrupt" not in text

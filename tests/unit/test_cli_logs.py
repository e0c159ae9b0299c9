"""sgpu's log output: slurmgpu's events at INFO, libraries' chatter only with -v, and JSON
lines for the daemon."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgpu.cli import logs


def _sgpu(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "c.toml"
    config.write_text('[slurm]\nbackend = "cli"\n')
    # Slurm's commands answer at once that the controller is down (as they do when it is).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("squeue", "sinfo", "scontrol", "sacct", "sbatch"):
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\nexit 1\n")
        tool.chmod(0o755)
    env = {**os.environ, "SGPU_CONFIG": str(config), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("SGPU_LOG_FORMAT", None)
    return subprocess.run(
        [sys.executable, "-m", "slurmgpu", "--db", f"sqlite:///{tmp_path / 's.db'}", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow  # runs sgpu as separate processes
def test_db_upgrade_shows_no_alembic_lines_unless_verbose(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    quiet = _sgpu(tmp_path / "a", "db", "upgrade")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    assert quiet.stdout.startswith("database ")
    (tmp_path / "b").mkdir()
    loud = _sgpu(tmp_path / "b", "-v", "db", "upgrade")
    assert loud.returncode == 0
    assert " INFO alembic." in loud.stderr


@pytest.mark.slow  # runs sgpu as separate processes
def test_daemon_logs_one_json_object_a_line(tmp_path: Path) -> None:
    # No Slurm reachable here: the daemon starts, warns once, stops after its cycles.
    argv = ["daemon", "--no-api", "--cycles", "2", "--interval", "0.1s", "--log-format", "json"]
    proc = _sgpu(tmp_path, *argv)
    lines = proc.stderr.splitlines()
    assert lines, proc.stderr
    records = [json.loads(line) for line in lines]
    assert all(set(r) >= {"ts", "level", "logger", "msg"} for r in records)
    assert records[0]["msg"].startswith("daemon started: database sqlite:///")
    assert records[-1]["msg"] == "daemon stopped after 2 cycle(s)"
    assert not any(r["logger"].startswith("alembic") for r in records)


def test_json_lines_carry_the_exception(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(fmt="json")
    log = logging.getLogger("slurmgpu.test")
    try:
        raise ValueError("bad value")
    except ValueError:
        log.exception("it failed: %s", "here")
    logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, "the library's INFO line is not shown"
    record = json.loads(err[0])
    assert record["level"] == "ERROR" and record["msg"] == "it failed: here"
    assert "ValueError: bad value" in record["exc"]


@pytest.mark.parametrize(
    ("verbose", "quiet", "ours", "others"),
    [
        (0, False, logging.INFO, logging.WARNING),
        (1, False, logging.INFO, logging.INFO),
        (2, False, logging.DEBUG, logging.DEBUG),
        (0, True, logging.WARNING, logging.WARNING),
    ],
)
def test_levels(verbose: int, quiet: bool, ours: int, others: int) -> None:
    assert logs.levels(verbose, quiet) == (ours, others)

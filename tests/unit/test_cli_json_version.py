"""A ``--json=vX`` this Slurm lacks, and other "exit 0, no document" answers, never read
as an empty cluster (CliSlurmClient over scripts that answer as 22.05/24.11/26.05 do;
the same answers are checked on real daemons by tests/slurm/test_release_smoke.py)."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.client import SlurmParseError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SQUEUE = GOLDEN / "slurm-26.05" / "mixed_squeue.json"


def _client(tmp_path: Path, body: str, **kw: str) -> CliSlurmClient:
    """squeue and sacct as one shell script; every call's argv goes to tmp/argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("squeue", "sacct"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "argv"}\n{body}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return CliSlurmClient(bin_dir=str(bin_dir), timeout_s=10, **kw)  # type: ignore[arg-type]


# 26.05 / 24.11 squeue for a version it lacks: exit 1, stderr only
LACKS = (
    'case "$1" in --json=v0.0.40) echo "squeue: error: load_plugins: unable to find plugin:'
    ' data_parser/v0.0.40" >&2; exit 1;; esac; cat ' + str(SQUEUE)
)
# sacct for a version it lacks: exit 0 and nothing at all
SILENT = f'case "$1" in --json=v0.0.40) exit 0;; esac; cat {SQUEUE}'


@pytest.mark.parametrize("body", [LACKS, SILENT], ids=["exit-1", "exit-0-silent"])
def test_a_missing_data_parser_falls_back_to_the_default_once(
    tmp_path: Path, body: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = _client(tmp_path, body, data_parser="v0.0.40")
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        assert len(client.jobs()) == 7
        assert len(client.jobs()) == 7
    calls = (tmp_path / "argv").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["--json=v0.0.40", "--json", "--json"]
    assert client.data_parser is None
    assert caplog.text.count("lacks data_parser v0.0.40") == 1


def test_a_supported_data_parser_is_asked_for(tmp_path: Path) -> None:
    client = _client(tmp_path, f"cat {SQUEUE}", data_parser="v0.0.45")
    assert len(client.jobs()) == 7
    assert (tmp_path / "argv").read_text().split()[0] == "--json=v0.0.45"


@pytest.mark.parametrize("body", ["exit 0", "echo; exit 0", "echo 'squeue: error: x' >&2"])
def test_nothing_printed_is_one_clear_error_not_an_empty_cluster(tmp_path: Path, body: str) -> None:
    client = _client(tmp_path, body)
    with pytest.raises(SlurmParseError, match="exited 0 but printed no JSON document") as info:
        client.jobs()
    assert "\n" not in str(info.value)


def test_sacct_printing_nothing_is_not_no_jobs(tmp_path: Path) -> None:
    client = _client(tmp_path, "exit 0")
    with pytest.raises(SlurmParseError, match="sacct --json exited 0 but printed no JSON"):
        client.finished_jobs([1, 2])


def test_an_odd_data_parser_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"v0\.0\.42"):
        CliSlurmClient(data_parser="latest; rm -rf /")

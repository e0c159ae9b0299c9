"""The agent's on-disk spool: order, bounds, crash damage and permissions, on real files."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from slurmgpu.agent.spool import BatchSpool, SpoolError


def _drain(spool: BatchSpool) -> list[bytes]:
    out: list[bytes] = []
    while (item := spool.peek_oldest()) is not None:
        out.append(item.data)
        spool.ack_oldest()
    return out


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.batch"))


def test_batches_come_back_oldest_first_across_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    with BatchSpool(directory) as spool:
        for i in range(5):
            assert spool.append(f"batch-{i}".encode(), samples=i)
        first = spool.peek_oldest()
        assert first is not None and (first.data, first.samples) == (b"batch-0", 0)
        spool.ack_oldest()
    with BatchSpool(directory) as reopened:
        assert len(reopened) == 4
        reopened.append(b"batch-5")
        assert _drain(reopened) == [f"batch-{i}".encode() for i in range(1, 6)]
        assert len(reopened) == 0 and reopened.total_bytes == 0
    assert _files(directory) == []


def test_peek_does_not_remove_and_ack_on_empty_is_harmless(tmp_path: Path) -> None:
    with BatchSpool(tmp_path / "spool") as spool:
        assert spool.peek_oldest() is None
        spool.ack_oldest()
        spool.append(b"x")
        assert spool.peek_oldest() == spool.peek_oldest()
        assert len(spool) == 1


def test_the_batch_bound_drops_the_oldest_and_counts_their_samples(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    with BatchSpool(directory, max_batches=3) as spool:
        for i in range(5):
            spool.append(f"b{i}".encode(), samples=10 + i)
        assert spool.dropped_samples == 10 + 11
        assert _drain(spool) == [b"b2", b"b3", b"b4"]
    with BatchSpool(directory) as reopened:
        assert reopened.dropped_samples == 21  # the counter survives restarts
        reopened.add_dropped(4)
    with BatchSpool(directory) as again:
        assert again.dropped_samples == 25


def test_the_byte_bound_drops_the_oldest(tmp_path: Path) -> None:
    payload = b"x" * 1000
    with BatchSpool(tmp_path / "spool", max_bytes=3 * 1100) as spool:
        for _ in range(5):
            spool.append(payload, samples=1)
        assert len(spool) == 3 and spool.total_bytes <= 3 * 1100
        assert spool.dropped_samples == 2


def test_a_batch_bigger_than_the_whole_spool_is_dropped_and_counted(tmp_path: Path) -> None:
    with BatchSpool(tmp_path / "spool", max_bytes=100) as spool:
        spool.append(b"small", samples=1)
        assert not spool.append(b"y" * 200, samples=7)
        assert spool.dropped_samples == 7
        assert _drain(spool) == [b"small"]


def test_a_torn_last_file_is_discarded_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "spool"
    with BatchSpool(directory) as spool:
        for i in range(3):
            spool.append(f"batch-{i}".encode() * 20, samples=2)
    last = _files(directory)[-1]
    last.write_bytes(last.read_bytes()[:30])  # the disk lost the end of the last write
    (directory / "0000000000000099.batch").write_bytes(b"")  # and one that is empty
    (directory / ".0000000000000100.batch.tmp").write_bytes(b"half")  # never renamed
    caplog.set_level(logging.WARNING, logger="slurmgpu.agent.spool")
    with BatchSpool(directory) as reopened:
        assert _drain(reopened) == [b"batch-0" * 20, b"batch-1" * 20]
    torn = [r for r in caplog.records if "torn spool file" in r.getMessage()]
    assert len(torn) == 2
    assert list(directory.glob("*.tmp")) == []


def test_a_file_with_a_bad_checksum_is_skipped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "spool"
    with BatchSpool(directory) as spool:
        spool.append(b"aaaa", samples=3)
        spool.append(b"bbbb", samples=5)
        first = _files(directory)[0]
        data = bytearray(first.read_bytes())
        data[-1] ^= 0xFF  # same length, damaged content
        first.write_bytes(bytes(data))
        caplog.set_level(logging.WARNING, logger="slurmgpu.agent.spool")
        assert _drain(spool) == [b"bbbb"]
        assert spool.dropped_samples == 3
    assert any("checksum" in r.getMessage() for r in caplog.records)


def test_spool_files_are_private_to_root(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    with BatchSpool(directory) as spool:
        spool.append(b"secret", samples=1)
        spool.add_dropped(1)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = [p for p in directory.iterdir()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


def test_a_second_agent_cannot_share_the_spool(tmp_path: Path) -> None:
    with BatchSpool(tmp_path / "spool"), pytest.raises(SpoolError, match="in use"):
        BatchSpool(tmp_path / "spool")


def test_an_unusable_spool_directory_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SpoolError, match="--spool-dir"):
        BatchSpool(blocker / "spool")

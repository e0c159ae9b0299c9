"""``BatchSpool``: an on-disk FIFO of encoded batches the daemon could not take yet.

One file per batch in a 0700 directory (default ``/var/spool/slurmgpu-agent``), named by a
sequence number so the oldest is the smallest::

    0000000000000042.batch   = header (magic, payload length, CRC-32, sample count) + payload

A batch is written to a temporary file (0600), fsynced and renamed into place, and the
directory is fsynced, so a crash leaves either the whole batch or none of it. A file whose
header, length or checksum is wrong (a disk that lost the last write, a truncated copy)
is logged once and discarded; it never stops the agent.

The spool is bounded by total bytes and by batch count. When a new batch does not fit,
the *oldest* batches are dropped: recent data is worth more to the daemon's policies than
old data. Every sample dropped (here, or rejected by the daemon for good) is added to a
persistent counter, ``dropped_samples``, which the agent reports in ``SampleBatch.dropped``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_SPOOL_DIR = Path("/var/spool/slurmgpu-agent")
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BATCHES = 100_000

_MAGIC = b"SGB1"
_HEADER = struct.Struct(">4sIII")  # magic, payload length, crc32, samples
_SUFFIX = ".batch"
_DROPPED_FILE = "dropped_samples"
_LOCK_FILE = ".lock"


class SpoolError(OSError):
    """The spool directory cannot be used; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class SpooledBatch:
    """One batch read back from the spool (``seq`` orders batches, oldest smallest)."""

    seq: int
    data: bytes
    samples: int


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    size: int  # bytes on disk, header included
    samples: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BatchSpool:
    """A bounded, crash-safe FIFO of batches on disk; one agent process per directory.

    >>> spool = BatchSpool(Path("/tmp/spool"), max_bytes=1 << 20)  # doctest: +SKIP
    >>> spool.append(b'{"node": "gpu1"}', samples=0)  # doctest: +SKIP
    True
    >>> spool.peek_oldest().data  # doctest: +SKIP
    b'{"node": "gpu1"}'
    """

    def __init__(
        self,
        directory: Path = DEFAULT_SPOOL_DIR,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_batches: int = DEFAULT_MAX_BATCHES,
    ) -> None:
        if max_bytes <= _HEADER.size or max_batches < 1:
            raise ValueError("the spool needs room for at least one batch")
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_batches = max_batches
        self._entries: deque[_Entry] = deque()
        self._bytes = 0
        self._dropped = 0
        self._full_warned = False
        self._lock_fd: int | None = None
        self._open_directory()
        self._lock()
        self._dropped = self._read_dropped()
        self._load()

    # -- setup ---------------------------------------------------------------------

    def _open_directory(self) -> None:
        path = self.directory
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            if path.stat().st_mode & 0o777 != 0o700:
                path.chmod(0o700)  # batches name jobs and users: not for other accounts
        except OSError as exc:
            raise SpoolError(
                f"cannot use spool directory {path}: {exc.strerror or exc} "
                "(pass --spool-dir to choose another)"
            ) from None
        if not path.is_dir():
            raise SpoolError(f"spool path {path} is not a directory")

    def _lock(self) -> None:
        fd = os.open(self.directory / _LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise SpoolError(
                f"spool directory {self.directory} is in use by another agent process"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        """Release the directory lock; safe to call twice."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> BatchSpool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _read_dropped(self) -> int:
        try:
            text = (self.directory / _DROPPED_FILE).read_text().strip()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("cannot read %s: %s; counting dropped samples from 0", _DROPPED_FILE, exc)
            return 0
        if not text.isdigit():
            log.warning("%s is damaged; counting from 0", self.directory / _DROPPED_FILE)
            return 0
        return int(text)

    def _load(self) -> None:
        found: list[_Entry] = []
        for path in self.directory.iterdir():
            name = path.name
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    path.unlink()  # a write that never got renamed: not a batch yet
                continue
            if not name.endswith(_SUFFIX) or not name[: -len(_SUFFIX)].isdigit():
                continue
            entry = self._check_file(path, int(name[: -len(_SUFFIX)]))
            if entry is not None:
                found.append(entry)
        found.sort(key=lambda e: e.seq)
        self._entries = deque(found)
        self._bytes = sum(e.size for e in found)
        if found:
            log.info(
                "spool %s holds %d unsent batch(es), %d bytes",
                self.directory,
                len(found),
                self._bytes,
            )

    def _check_file(self, path: Path, seq: int) -> _Entry | None:
        """Return the entry of a well-formed batch file; discard a torn one."""
        try:
            with path.open("rb") as f:
                header = f.read(_HEADER.size)
                size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            log.warning("discarding unreadable spool file %s: %s", path, exc)
            self._discard(path)
            return None
        if len(header) < _HEADER.size:
            log.warning("discarding torn spool file %s (%d bytes, no header)", path, size)
            self._discard(path)
            return None
        magic, length, _crc, samples = _HEADER.unpack(header)
        if magic != _MAGIC or size != _HEADER.size + length:
            log.warning(
                "discarding torn spool file %s (%d bytes, header says %d)",
                path,
                size,
                _HEADER.size + length,
            )
            self._discard(path)
            return None
        return _Entry(seq=seq, size=size, samples=samples)

    @staticmethod
    def _discard(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    # -- state ---------------------------------------------------------------------

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:016d}{_SUFFIX}"

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    @property
    def dropped_samples(self) -> int:
        """Samples lost so far (spool full, torn files, rejected by the daemon), persistent."""
        return self._dropped

    def add_dropped(self, samples: int) -> None:
        """Count ``samples`` as lost for good (e.g. a batch the daemon refused) and persist."""
        if samples <= 0:
            return
        self._dropped += samples
        self._write_dropped()

    def _write_dropped(self) -> None:
        target = self.directory / _DROPPED_FILE
        tmp = self.directory / f".{_DROPPED_FILE}.tmp"
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.write(fd, f"{self._dropped}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except OSError as exc:
            log.warning("cannot persist the dropped-sample counter: %s", exc)

    # -- FIFO ----------------------------------------------------------------------

    def append(self, data: bytes, *, samples: int = 0) -> bool:
        """Store one batch as the newest; drop the oldest ones to make room.

        Returns False (and counts the batch's samples as dropped) when the batch alone is
        bigger than the spool. Raises SpoolError when the disk refuses the write.
        """
        size = _HEADER.size + len(data)
        if size > self.max_bytes:
            log.warning(
                "batch of %d bytes is larger than the whole spool (%d bytes); dropped",
                size,
                self.max_bytes,
            )
            self.add_dropped(samples)
            return False
        dropped = 0
        while self._entries and (
            self._bytes + size > self.max_bytes or len(self._entries) >= self.max_batches
        ):
            oldest = self._entries.popleft()
            self._bytes -= oldest.size
            dropped += oldest.samples
            self._discard(self._path(oldest.seq))
        if dropped:
            if not self._full_warned:
                log.warning(
                    "spool %s is full (%d bytes, %d batches): dropping the oldest batches",
                    self.directory,
                    self.max_bytes,
                    self.max_batches,
                )
                self._full_warned = True
            self.add_dropped(dropped)
        seq = self._entries[-1].seq + 1 if self._entries else 1
        self._write_batch(seq, data, samples)
        self._entries.append(_Entry(seq=seq, size=size, samples=samples))
        self._bytes += size
        return True

    def _write_batch(self, seq: int, data: bytes, samples: int) -> None:
        target = self._path(seq)
        tmp = self.directory / f".{target.name}.tmp"
        header = _HEADER.pack(_MAGIC, len(data), zlib.crc32(data), samples)
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.write(fd, header)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
            _fsync_dir(self.directory)
        except OSError as exc:
            self._discard(tmp)
            reason = exc.strerror or exc
            raise SpoolError(f"cannot write to spool {self.directory}: {reason}") from None

    def peek_oldest(self) -> SpooledBatch | None:
        """Return the oldest batch without removing it, or None when the spool is empty.

        A batch whose checksum does not match is discarded (its samples counted as
        dropped) and the next one is returned.
        """
        while self._entries:
            entry = self._entries[0]
            path = self._path(entry.seq)
            try:
                raw = path.read_bytes()
            except OSError as exc:
                log.warning("discarding unreadable spool file %s: %s", path, exc)
                self._forget_oldest(entry.samples)
                continue
            if len(raw) >= _HEADER.size:
                magic, length, crc, samples = _HEADER.unpack_from(raw)
                data = raw[_HEADER.size :]
                if magic == _MAGIC and len(data) == length and zlib.crc32(data) == crc:
                    return SpooledBatch(seq=entry.seq, data=data, samples=samples)
            log.warning("discarding damaged spool file %s (checksum mismatch)", path)
            self._forget_oldest(entry.samples)
        return None

    def _forget_oldest(self, lost_samples: int) -> None:
        entry = self._entries.popleft()
        self._bytes -= entry.size
        self._discard(self._path(entry.seq))
        self.add_dropped(lost_samples)

    def ack_oldest(self) -> None:
        """Remove the oldest batch (it reached the daemon, or it was refused for good)."""
        if not self._entries:
            return
        entry = self._entries.popleft()
        self._bytes -= entry.size
        self._discard(self._path(entry.seq))
        if not self._entries:
            self._full_warned = False

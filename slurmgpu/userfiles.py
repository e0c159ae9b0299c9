"""Reading, as root, a small file in a directory a user owns.

The daemon reads a malleable job's ``ack.json`` and ``progress.json`` from the job's
state directory, which belongs to the job's user. That user decides what the path is: a
symbolic link to ``/dev/zero`` or to a root-only file, a FIFO (a plain ``open`` blocks
until someone writes to it: the daemon would hang for ever), a directory, a file of a
gigabyte. :func:`read_user_file` opens with ``O_NOFOLLOW`` (a link is refused, not
followed) and ``O_NONBLOCK`` (opening a FIFO returns at once), checks with ``fstat``
that what it opened is a regular file, and reads at most ``max_bytes`` (plus one, to
know there was more) whatever the file says its size is.

A missing file is no fault (the job has not written one yet): None. Anything else that
is not a small regular file raises :class:`UserFileRejected`, whose ``cause`` is a short
phrase for a log line.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["OPEN_FLAGS", "UserFileRejected", "read_user_file"]

OPEN_FLAGS: Final = (
    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
)
_ABSENT: Final = frozenset({errno.ENOENT})


class UserFileRejected(Exception):
    """A user's file not read; ``cause`` says why in a few words (no content quoted)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_cause(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link (not followed)"
    if exc.errno == errno.ENXIO:
        return "a socket or device (not a regular file)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "not readable"
    if exc.errno == errno.ENOTDIR:
        return "a part of its path is not a directory"
    if exc.errno == errno.ENAMETOOLONG:
        return "its path is too long"
    return f"cannot be opened ({exc.strerror or exc.errno})"


def read_user_file(path: str | Path, *, max_bytes: int) -> bytes | None:
    """The bytes of the regular file ``path``; None when there is no such file;
    :class:`UserFileRejected` for anything else (a link, a FIFO, a directory, a device,
    more than ``max_bytes``, an error). Never blocks on a FIFO or device, never follows a
    link in the last component of ``path``, never reads more than ``max_bytes + 1``."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return None
        raise UserFileRejected(_open_cause(exc)) from None
    except ValueError:  # a NUL byte in the path
        raise UserFileRejected("its path holds a NUL byte") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserFileRejected(_kind(info.st_mode))
        if info.st_size > max_bytes:
            raise UserFileRejected(f"larger than {max_bytes} bytes")
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:  # the file may grow after fstat: read no more than this
            chunk = os.read(fd, max_bytes + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise UserFileRejected(f"cannot be read ({exc.strerror or exc.errno})") from None
    finally:
        os.close(fd)
    if got > max_bytes:
        raise UserFileRejected(f"larger than {max_bytes} bytes")
    return b"".join(chunks)

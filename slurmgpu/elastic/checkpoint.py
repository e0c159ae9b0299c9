"""Atomic files: write to a temporary file in the same directory, fsync, rename, fsync dir.

A reader (the resumed job, or the daemon reading an ack) sees either the old file or the
new one, never a torn one, even when the job is killed mid-write or the node loses power.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["load_pickle", "write_atomic", "write_pickle"]


def write_atomic(path: str | Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is; some filesystems (NFS,
    # some FUSE mounts) refuse fsync on a directory, which is harmless there.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_pickle(path: str | Path, state: Any) -> None:
    write_atomic(path, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


def load_pickle(path: str | Path) -> Any:
    """The job's own checkpoint (only the job that wrote it loads it; never the daemon)."""
    with open(path, "rb") as f:
        return pickle.load(f)  # noqa: S301 - the user's own file, read by the user's job

"""Damaged and starved stores for tests: corrupt pages in the middle, a tiny tmpfs, an ext4
loop image that fails.

A page overwritten in the middle of the file is what a bad disk or a torn copy leaves:
the header is fine, so the database opens and most queries work; only a query that
reaches the page (or ``PRAGMA quick_check``) finds it. A tmpfs of a few hundred KiB fills
up for real (ENOSPC), and can be remounted read-only (EROFS).
"""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurmgpu.daemon.observer import Observer
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, SampleBatch
from tests.fakes import FakeSlurm

T0 = datetime(2026, 1, 5, 8, tzinfo=UTC)
NODES = [Node("gpu1", "mixed", cpus=32, memory_mib=128000, gpus=4, partitions=("gpu",))]
RUNNING = 5000  # the running job whose samples fill many pages


def gpu_job(job_id: int, state: JobState = JobState.PENDING) -> Job:
    running = state is JobState.RUNNING
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=state,
        submit_time=T0 - timedelta(hours=4),
        start_time=T0 - timedelta(hours=4) if running else None,
        time_limit=timedelta(hours=12),
        cpus=4,
        node_count=1,
        nodes=("gpu1",) if running else (),
        gpus=GpuRequest(gpus=1, per_node=1, sources=("tres_per_node",)),
        gpu_allocations=((NodeGpuAllocation("gpu1", (0,)),) if running else ()),
    )


def listing(pending: int = 200) -> list[Job]:
    return [gpu_job(i) for i in range(1, pending + 1)] + [gpu_job(RUNNING, JobState.RUNNING)]


def samples(n: int, start: datetime | None = None) -> SampleBatch:
    """``n`` samples of the running job up to ``start`` (now: retention keeps them)."""
    start = start or datetime.now(UTC)
    return SampleBatch(
        node="gpu1",
        gpu=[
            GpuSampleIn(
                sample_uid=f"gpu1:{uuid.uuid4().hex}",
                at=(start - timedelta(seconds=10 * (n - i))).timestamp(),
                gpu_index=0,
                job_id=RUNNING,
                util_pct=0.0,
                memory_used_mib=100.0,
                processes=1,
                source="device",
            )
            for i in range(n)
        ],
    )


def populated(db: Path) -> FakeSlurm:
    """A store with one observed listing and 2,000 samples (many pages); its Slurm."""
    store = open_store(f"sqlite:///{db}")
    slurm = FakeSlurm(listing(), NODES)
    assert Observer(slurm, store, clock=lambda: T0).cycle().ok
    usage = UsageStore(store.engine)
    for _ in range(4):
        usage.ingest(samples(500))
    store.engine.dispose()
    return slurm


def corrupt_middle(db: Path, table: str = "samples", pages: int = 3) -> list[int]:
    """Overwrite leaf pages in the middle of ``table`` (not the header); return them."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        try:
            leaves = [
                int(p)
                for (p,) in conn.execute(
                    "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' "
                    "ORDER BY pageno",
                    (table,),
                )
            ]
        except sqlite3.OperationalError:
            pytest.skip("this SQLite has no dbstat table to find a table's pages")
    conn.close()
    middle = leaves[len(leaves) // 2 : len(leaves) // 2 + pages]
    assert middle and 1 not in middle
    junk = bytes(range(256)) * (size // 256)
    with db.open("r+b") as f:
        for page in middle:
            f.seek((page - 1) * size + 8)  # keep the page's type byte: a plausible page
            f.write(junk[: size - 16])
    return middle


def why_no_mounts() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    return None


class Tmpfs:
    """A mounted tmpfs that can be filled, emptied and remounted read-only."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        path.mkdir()
        run = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if run.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")

    def fill(self) -> None:
        """Take every free block (as a runaway log would)."""
        with (self.path / "filler").open("wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass

    def free(self) -> None:
        (self.path / "filler").unlink()

    def remount(self, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True, timeout=30)

    def close(self) -> None:
        gc.collect()  # engines a command left behind hold the database open
        if subprocess.run(["umount", str(self.path)], check=False, timeout=30).returncode:
            subprocess.run(["umount", "-l", str(self.path)], check=False, timeout=30)


@contextmanager
def tmpfs(path: Path, size: str = "16m") -> Iterator[Tmpfs]:
    fs = Tmpfs(path, size)
    try:
        yield fs
    finally:
        fs.close()


IMAGE_MIB = 32


def ext4_unavailable() -> str | None:
    """Why an ext4 loop image cannot be mounted here; None where it can."""
    if os.geteuid() != 0:
        return "needs root to mount an ext4 loop image"
    for tool in ("mount", "umount", "losetup", "mkfs.ext4", "e2fsck"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


class Ext4:
    """A mounted ext4 loop image that can be failed, filled, checked and remounted."""

    def __init__(self, tmp: Path) -> None:
        self.image = tmp / "disk.img"
        self.mnt = tmp / "mnt"
        self.mnt.mkdir()
        with self.image.open("wb") as f:
            f.truncate(IMAGE_MIB << 20)
        self._run("mkfs.ext4", "-q", "-F", str(self.image))
        self.mount()

    @staticmethod
    def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, check=check, capture_output=True, text=True, timeout=60)

    def mount(self) -> None:
        self._run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mnt))
        src = self._run("findmnt", "-n", "-o", "SOURCE", str(self.mnt)).stdout.strip()
        self.device = Path(src).name  # loopN

    def fail(self) -> None:
        """An ext4 error, as a failing disk raises it: the kernel remounts read-only."""
        Path(f"/sys/fs/ext4/{self.device}/trigger_fs_error").write_text("slurmgpu test\n")
        opts = self._run("findmnt", "-n", "-o", "OPTIONS", str(self.mnt)).stdout.strip()
        # "ro", or "emergency_ro" (Linux 6.x keeps "rw" and adds this flag).
        assert {"ro", "emergency_ro"} & set(opts.split(",")), opts
        with pytest.raises(OSError):
            (self.mnt / "probe").write_text("x")

    def repair(self) -> None:
        """What an operator does: unmount, fsck, mount again."""
        self._run("umount", str(self.mnt))
        fsck = self._run("e2fsck", "-fy", str(self.image), check=False)
        assert fsck.returncode in (0, 1), fsck.stdout + fsck.stderr  # 1: errors corrected
        self.mount()

    def close(self) -> None:
        mounted = self._run("findmnt", str(self.mnt), check=False).returncode == 0
        if mounted and self._run("umount", str(self.mnt), check=False).returncode != 0:
            self._run("umount", "-l", str(self.mnt), check=False)

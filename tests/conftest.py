"""Shared pytest fixtures.

``slurm_cluster`` brings up one real lab cluster (slurmctld + 4 slurmd, fake GPUs) for the
whole session. It uses ports 6917 (slurmctld) and 17101-17104 (slurmd) so that it does not
collide with a lab cluster on the default ports 6817/17001+ that may already be running.
Tiers (README "Test tiers"): tests under ``tests/slurm/`` are marked ``slurm``, those under
``tests/integration/`` and ``tests/bench/`` ``slow``, automatically; a slow test elsewhere is
marked by hand. The hypothesis profile is loaded from ``tests/hypothesis_profiles.py``.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from slurmgpu import userinput_stats
from slurmgpu.lab.cluster import LabCluster, LabClusterError, ensure_packages
from tests import (
    hypothesis_profiles,  # noqa: F401 - registers and loads the profile
    tier_guard,
    unselectable,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from slurmgpu.store import JobStore


def _xdist_worker_index() -> int:
    """0, 1, ... for pytest-xdist's workers gw0, gw1, ...; 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


# Two test sessions on one machine can use different ports with these variables; each
# xdist worker starts its own lab cluster 10 ports further on (slurmd uses base..base+3).
_PORT_OFFSET = 10 * _xdist_worker_index()
SESSION_CTLD_PORT = int(os.environ.get("SGPU_TEST_CTLD_PORT", "6917")) + _PORT_OFFSET
SESSION_SLURMD_PORT_BASE = int(os.environ.get("SGPU_TEST_SLURMD_PORT_BASE", "17101")) + _PORT_OFFSET
_TESTS = Path(__file__).parent
# Test tiers by directory (README "Test tiers"); a test elsewhere gets ``slow`` by hand.
_TIER_OF_DIR = {
    _TESTS / "slurm": pytest.mark.slurm,  # real slurmctld + slurmd
    _TESTS / "integration": pytest.mark.slow,  # real torch, the built wheel
    _TESTS / "bench": pytest.mark.slow,  # the bench scripts' smoke runs
}


@pytest.fixture(autouse=True)
def _user_input_refusals_logged_afresh() -> None:
    """Each test sees its first refusal of a job's input logged: which were logged is
    remembered for the whole process (slurmgpu.userinput_stats)."""
    userinput_stats.forget_logged()


def pytest_configure(config: pytest.Config) -> None:
    # A run that selected tests (-m, -k, paths) fails when all of them skipped, or when a
    # tier it asked for lacks a prerequisite (tests/tier_guard.py; README "Test tiers").
    tier_guard.pytest_configure(config)


_POSTGRES_FIXTURES = frozenset({"postgres_url", "empty_postgres_url"})


def _on_postgres(item: pytest.Item) -> bool:
    """The test runs against the session's PostgreSQL server (``store_url``'s postgresql
    case, or a PostgreSQL fixture of its own)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("store_url") == "postgresql":
        return True
    return bool(_POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out directories and modules ``-m`` can select nothing from: importing them
    costs seconds per worker (tests/unselectable.py)."""
    markexpr = str(config.getoption("markexpr", "") or "")
    if not markexpr:
        return None
    mark = _TIER_OF_DIR.get(collection_path)
    if mark is not None:
        return True if unselectable.selects_none(markexpr, {mark.name}) else None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    try:
        marks = unselectable.module_marks(collection_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None  # collected as usual: pytest reports what is wrong with it
    return True if unselectable.selects_none(markexpr, marks) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for directory, mark in _TIER_OF_DIR.items():
            if directory in item.path.parents:
                item.add_marker(mark)
        # The unit tier answers within a minute on SQLite; the same tests on PostgreSQL
        # (a server started for the session, a round trip per statement) run in the
        # slow tier, which CI runs too.
        if _on_postgres(item):
            item.add_marker(pytest.mark.slow)


def _skip(reason: str) -> NoReturn:
    """A missing prerequisite of the slurm and release tiers: ``-m slurm`` (or release)
    then fails naming it (tests/tier_guard.py), other runs skip these tests."""
    print(f"\nslurm_cluster: skipping: {reason}", file=sys.stderr)
    tier_guard.skip_missing(("slurm", "release"), reason)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[LabCluster]:
    """A running 4-node lab cluster; ``SLURM_CONF`` points at it for the whole session.

    Its directory (config, logs) is removed afterwards unless a test failed or
    ``SGPU_KEEP_LAB=1`` is set.
    """
    if os.geteuid() != 0:
        _skip("the lab Slurm cluster needs root (it starts slurmd and may apt-get install)")
    # SGPU_TEST_SLURM_ROOT: a chroot with another Slurm release (scripts/slurm_chroot.sh);
    # its client wrappers go first on PATH, so `sbatch` and CliSlurmClient() use them.
    slurm_root = os.environ.get("SGPU_TEST_SLURM_ROOT") or None
    try:
        if slurm_root is None:
            ensure_packages()
    except LabClusterError as exc:
        _skip(f"Slurm packages are missing and cannot be installed: {exc}")
    root = Path(tempfile.mkdtemp(prefix="sgpu-lab-", dir="/tmp"))
    lab = LabCluster(
        root,
        ctld_port=SESSION_CTLD_PORT,
        slurmd_port_base=SESSION_SLURMD_PORT_BASE,
        slurm_root=slurm_root,
        # SGPU_TEST_SLURM_ACCOUNTING=1: slurmdbd + MariaDB from the chroot too
        accounting=bool(slurm_root and os.environ.get("SGPU_TEST_SLURM_ACCOUNTING")),
    )
    saved = os.environ.get("SLURM_CONF")
    saved_path = os.environ.get("PATH", "")
    try:
        elapsed = lab.up(timeout_s=30.0)
        print(f"\nslurm_cluster: 4 nodes idle after {elapsed:.1f} s under {root}", file=sys.stderr)
        os.environ.update(lab.env())
        if lab.bin_dir is not None:
            os.environ["PATH"] = f"{lab.bin_dir}:{saved_path}"
        yield lab
    finally:
        lab.down(cancel_jobs=True)
        os.environ["PATH"] = saved_path
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        if request.session.testsfailed or os.environ.get("SGPU_KEEP_LAB"):
            print(f"\nslurm_cluster: kept {root} (logs in {lab.log_dir})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- site profile

# The site lab (16 nodes, slurmdbd + MariaDB on the two ports after the last slurmd) gets
# its own port range, clear of slurm_cluster's for up to 8 xdist workers.
SITE_CTLD_PORT = int(os.environ.get("SGPU_TEST_SITE_CTLD_PORT", "6990")) + _PORT_OFFSET
SITE_SLURMD_PORT_BASE = (
    int(os.environ.get("SGPU_TEST_SITE_SLURMD_PORT_BASE", "17300")) + 2 * _PORT_OFFSET
)


def _session_lab(
    request: pytest.FixtureRequest,
    name: str,
    ctld_port: int,
    slurmd_port_base: int,
    timeout_s: float,
    **options: Any,
) -> Iterator[LabCluster]:
    """A lab cluster of its own for the session (the host's Slurm or the chroot's of
    ``SGPU_TEST_SLURM_ROOT``), leaving ``SLURM_CONF`` alone; kept after a failure."""
    if os.geteuid() != 0:
        _skip(f"the {name.replace('_', ' ')} needs root (it starts slurmd)")
    slurm_root = os.environ.get("SGPU_TEST_SLURM_ROOT") or None
    try:
        if slurm_root is None:
            ensure_packages()
    except LabClusterError as exc:
        _skip(f"Slurm packages are missing and cannot be installed: {exc}")
    root = Path(tempfile.mkdtemp(prefix=f"sgpu-{name.split('_')[0]}-", dir="/tmp"))
    lab = LabCluster(
        root,
        ctld_port=ctld_port,
        slurmd_port_base=slurmd_port_base,
        slurm_root=slurm_root,
        **options,
    )
    try:
        elapsed = lab.up(timeout_s=timeout_s)
        print(
            f"\n{name}: {lab.nodes} nodes idle after {elapsed:.1f} s under {root}",
            file=sys.stderr,
        )
        yield lab
    finally:
        lab.down(cancel_jobs=True)
        if request.session.testsfailed or os.environ.get("SGPU_KEEP_LAB"):
            print(f"\n{name}: kept {root} (logs in {lab.log_dir})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def site_lab(request: pytest.FixtureRequest) -> Iterator[LabCluster]:
    """A running lab cluster with the site profile (slurmgpu/lab/cluster/site.py): 16 nodes,
    accounting, 3 accounts, 8 Unix users, fairshare, QOS preemption, two partitions.

    Session-wide but it does not touch ``SLURM_CONF``: ``slurm_cluster`` may be up in the
    same session. Tests take :func:`site_cluster`, which points ``SLURM_CONF`` at it.
    The tests written before the profile keep the 4-node ``slurm_cluster``: they assume
    its layout (4 nodes, one partition, no accounts, every job root's).
    """
    yield from _session_lab(
        request, "site_lab", SITE_CTLD_PORT, SITE_SLURMD_PORT_BASE, 120.0, profile="site"
    )


@pytest.fixture
def site_cluster(site_lab: LabCluster, monkeypatch: pytest.MonkeyPatch) -> LabCluster:
    """:func:`site_lab`, with ``SLURM_CONF`` (and a chroot's client commands on ``PATH``)
    pointing at it for this test."""
    for key, value in site_lab.env().items():
        monkeypatch.setenv(key, value)
    if site_lab.bin_dir is not None:
        monkeypatch.setenv("PATH", f"{site_lab.bin_dir}:{os.environ.get('PATH', '')}")
    return site_lab


# --------------------------------------------------------------------------- MIG and MPS

# The sharing lab (4 nodes: gpu2 MIG slices, gpu3 MPS) gets ports of its own too.
SHARING_CTLD_PORT = int(os.environ.get("SGPU_TEST_SHARING_CTLD_PORT", "7200")) + _PORT_OFFSET
SHARING_SLURMD_PORT_BASE = (
    int(os.environ.get("SGPU_TEST_SHARING_SLURMD_PORT_BASE", "17600")) + _PORT_OFFSET
)


@pytest.fixture(scope="session")
def sharing_lab(request: pytest.FixtureRequest) -> Iterator[LabCluster]:
    """A running lab cluster with the ``mig-mps`` layout (slurmgpu/lab/cluster/sharing.py):
    gpu1 and gpu4 whole GPUs and shards, gpu2 MIG slices, gpu3 MPS. Like :func:`site_lab`
    it leaves ``SLURM_CONF`` alone; tests take :func:`sharing_cluster`."""
    yield from _session_lab(
        request,
        "sharing_lab",
        SHARING_CTLD_PORT,
        SHARING_SLURMD_PORT_BASE,
        60.0,
        sharing="mig-mps",
    )


@pytest.fixture
def sharing_cluster(sharing_lab: LabCluster, monkeypatch: pytest.MonkeyPatch) -> LabCluster:
    """:func:`sharing_lab`, with ``SLURM_CONF`` (and a chroot's client commands on
    ``PATH``) pointing at it for this test."""
    for key, value in sharing_lab.env().items():
        monkeypatch.setenv(key, value)
    if sharing_lab.bin_dir is not None:
        monkeypatch.setenv("PATH", f"{sharing_lab.bin_dir}:{os.environ.get('PATH', '')}")
    return sharing_lab


# --------------------------------------------------------------------------- PostgreSQL

_PG_DB = "sgpu_test"
_PG_TIMEOUT_S = 60.0


def _pg_bin_dir() -> Path | None:
    """Where Debian's ``initdb``/``pg_ctl`` live (``/usr/lib/postgresql/N/bin``), or PATH."""
    versions = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file() and d.parent.name.isdigit():
            versions.append((int(d.parent.name), d))
    if versions:
        return max(versions)[1]
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_skip(reason: str) -> NoReturn:
    print(f"\npostgres_url: skipping: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL server for the session: ``postgresql+psycopg://`` URL.

    ``initdb`` into a temporary directory (as the ``postgres`` user when run as root),
    ``pg_ctl start`` on 127.0.0.1 and a free port with its unix socket in that directory,
    one database ``sgpu_test``; stopped and removed at the end. Skipped, with the reason
    printed, when Debian's ``postgresql`` binaries or the ``psycopg`` driver are missing.
    """
    bin_dir = _pg_bin_dir()
    if bin_dir is None:
        _pg_skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    if importlib.util.find_spec("psycopg") is None:
        _pg_skip("the psycopg driver is not installed (pip install 'psycopg[binary]')")
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            _pg_skip("running as root but there is no 'postgres' user for initdb")
        as_user = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="sgpu-pg-", dir="/tmp"))
    data, sock, logfile = root / "data", root / "sock", root / "postgres.log"
    sock.mkdir()
    if as_user:
        for p in (root, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*as_user, *map(str, argv)],
            capture_output=True,
            text=True,
            timeout=_PG_TIMEOUT_S,
            check=False,
            cwd=root,
        )

    port = _free_port()
    started = False
    try:
        init = run(
            bin_dir / "initdb",
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        if init.returncode != 0:
            _pg_skip(f"initdb failed: {(init.stderr or init.stdout).strip()[-300:]}")
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        start = run(
            bin_dir / "pg_ctl", "-D", data, "-l", logfile, "-w", "-t", "30", "-o", options, "start"
        )
        if start.returncode != 0:
            log_tail = logfile.read_text(errors="replace")[-600:] if logfile.exists() else ""
            pytest.fail(f"pg_ctl start failed: {start.stdout}{start.stderr}\n{log_tail}")
        started = True
        created = run(
            bin_dir / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", _PG_DB
        )
        if created.returncode != 0:
            pytest.fail(f"createdb failed: {created.stderr.strip()}")
        print(f"\npostgres_url: PostgreSQL ({bin_dir}) on 127.0.0.1:{port}", file=sys.stderr)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{_PG_DB}"
    finally:
        if started:
            run(bin_dir / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def empty_postgres_url(postgres_url: str) -> str:
    """The session's PostgreSQL database, emptied (every table and the Alembic version)
    for this test."""
    from sqlalchemy import create_engine, text

    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return postgres_url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database, once SQLite (in ``tmp_path``) and once the session's
    PostgreSQL (``empty_postgres_url``): a test that takes it runs on both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    url: str = request.getfixturevalue("empty_postgres_url")
    return url


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    """A migrated SQLite store of its own for the test (``tmp_path / 'state.db'``),
    disposed of after it."""
    from slurmgpu.store import open_store

    opened = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    yield opened
    opened.engine.dispose()

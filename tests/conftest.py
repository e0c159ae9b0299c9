"""Shared pytest fixtures.

``slurm_cluster`` brings up one real lab cluster (slurmctld + 4 slurmd, fake GPUs) for the
whole session. It uses ports 6917 (slurmctld) and 17101-17104 (slurmd) so that it does not
collide with a lab cluster on the default ports 6817/17001+ that may already be running.
Tests under ``tests/slurm/`` are marked ``slurm`` automatically (deselect: ``-m "not slurm"``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from slurmgpu.labcluster import LabCluster, LabClusterError, ensure_packages

if TYPE_CHECKING:
    from collections.abc import Iterator

# Two test sessions on one machine can use different ports with these variables.
SESSION_CTLD_PORT = int(os.environ.get("SGPU_TEST_CTLD_PORT", "6917"))
SESSION_SLURMD_PORT_BASE = int(os.environ.get("SGPU_TEST_SLURMD_PORT_BASE", "17101"))
_SLURM_TESTS_DIR = Path(__file__).parent / "slurm"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _SLURM_TESTS_DIR in item.path.parents:
            item.add_marker(pytest.mark.slurm)


def _skip(reason: str) -> NoReturn:
    print(f"\nslurm_cluster: skipping: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[LabCluster]:
    """A running 4-node lab cluster; ``SLURM_CONF`` points at it for the whole session.

    Its directory (config, logs) is removed afterwards unless a test failed or
    ``SGPU_KEEP_LAB=1`` is set.
    """
    if os.geteuid() != 0:
        _skip("the lab Slurm cluster needs root (it starts slurmd and may apt-get install)")
    try:
        ensure_packages()
    except LabClusterError as exc:
        _skip(f"Slurm packages are missing and cannot be installed: {exc}")
    root = Path(tempfile.mkdtemp(prefix="sgpu-lab-", dir="/tmp"))
    lab = LabCluster(root, ctld_port=SESSION_CTLD_PORT, slurmd_port_base=SESSION_SLURMD_PORT_BASE)
    saved = os.environ.get("SLURM_CONF")
    try:
        elapsed = lab.up(timeout_s=30.0)
        print(f"\nslurm_cluster: 4 nodes idle after {elapsed:.1f} s under {root}", file=sys.stderr)
        os.environ.update(lab.env())
        yield lab
    finally:
        lab.down(cancel_jobs=True)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        if request.session.testsfailed or os.environ.get("SGPU_KEEP_LAB"):
            print(f"\nslurm_cluster: kept {root} (logs in {lab.log_dir})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

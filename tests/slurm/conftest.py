"""Fixtures of the real-cluster tests (the ``slurm_cluster`` itself is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.lab.cluster import LabCluster
from tests.slurm.harness import Telemetry, running_stack


@pytest.fixture
def stack(slurm_cluster: LabCluster, tmp_path: Path) -> Iterator[Telemetry]:
    """The real stack (daemon, an agent per node, ``sgpu``) with the default config."""
    with running_stack(slurm_cluster, tmp_path) as t:
        yield t

"""Fixtures of the real-cluster tests (the ``slurm_cluster`` itself is in tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.lab.cluster import LabCluster, site
from tests.slurm.harness import Telemetry, running_stack
from tests.slurm.site_users import SiteWork, cancel_all, shared_dir, user_env, user_python


@pytest.fixture
def stack(slurm_cluster: LabCluster, tmp_path: Path) -> Iterator[Telemetry]:
    """The real stack (daemon, an agent per node, ``sgpu``) with the default config."""
    with running_stack(slurm_cluster, tmp_path) as t:
        yield t


@pytest.fixture
def site_work(site_cluster: LabCluster) -> Iterator[SiteWork]:
    """:class:`SiteWork` on the site lab; every job cancelled afterwards."""
    with shared_dir("sgpu-site-work-") as work:
        python = user_python(site_cluster, work)
        daemon_dir = work / "daemon"
        daemon_dir.mkdir()
        os.chown(daemon_dir, site.DAEMON_UID, site.GID)
        daemon_dir.chmod(0o700)
        config = work / "config.toml"
        config.write_text('[slurm]\ncommand_timeout = "20s"\n')
        env = user_env(
            {"SGPU_DB": f"sqlite:///{daemon_dir / 'state.db'}", "SGPU_CONFIG": str(config)}
        )
        try:
            yield SiteWork(work, python, env)
        finally:
            cancel_all()

"""bench/resize_path.py at its smoke size (one resize per path) on the session's lab cluster."""

from __future__ import annotations

import os
from pathlib import Path

from slurmgpu.lab.cluster import LabCluster
from tests.bench.smoke import run_smoke

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the bench's own lab, not started twice: 4 nodes, root's jobs"


def test_resize_path_bench_smoke(slurm_cluster: LabCluster, tmp_path: Path) -> None:
    assert os.environ.get("SLURM_CONF")
    proc, doc = run_smoke("resize_path", tmp_path, "--running-lab")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert doc["smoke"] is True
    assert doc["figures"]["fast_path_s"]["total"] > 0
    assert doc["baseline"]["slurm_requeue_path_s"]["total"] > 0

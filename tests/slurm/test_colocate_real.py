"""Co-location end to end on the real local cluster: daemon, four agents, fakeload jobs.

Jobs are submitted held (``--hold``) with ``sgpu submit --shareable --gpu-mem`` and a whole
GPU's shards (``--gres=shard:4``: Slurm 22.05 refuses to turn a pending gres/gpu request
into shards), so the daemon's co-location policy (enforce mode) narrows them while they
are pending; then they are released and Slurm places them. The simulated GPUs report 80
GiB each; ``device_memory`` is configured because no job runs when the first are packed.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.store.usage_query import GpuUsage
from tests.configs import QUICK_POLICY, config_toml, observing
from tests.polling import wait_for
from tests.slurm.harness import Telemetry, listed_job, running_stack

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the stack (harness.running_stack): one agent on each 4-node lab node, gpu1-gpu4"

CONFIG = config_toml(
    QUICK_POLICY,
    observing("rightsize", "idle_gpu"),
    {"policy.colocate": {"mode": "enforce", "device_memory": "80GiB"}},
)

_GRES_IDX = re.compile(r"GRES=shard:(\d+)\(IDX:(\d+)\)")


def colocate_actions(t: Telemetry, job_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(t.run("actions", "--json", "--job", str(job_id)))
    return [a for a in reversed(rows) if a["policy"] == "colocate"]


def done(t: Telemetry, job_id: int, kind: str) -> dict[str, Any] | None:
    return next(
        (a for a in colocate_actions(t, job_id) if a["kind"] == kind and a["outcome"] == "done"),
        None,
    )


def packed(t: Telemetry, job_id: int) -> Callable[[], dict[str, Any] | None]:
    return lambda: done(t, job_id, "update")


def slurm_shard_gpu(job_id: int) -> tuple[int, int] | None:
    """(shards, GPU index) from ``scontrol show job -d`` once the job runs there."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-d", str(job_id)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    m = _GRES_IDX.search(out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def shareable(t: Telemetry, node: str, gpu_mem: str, load: str, *extra: str) -> int:
    return t.submit(
        "--shareable",
        "--gpu-mem",
        gpu_mem,
        "--hold",
        "--requeue",
        "--gres=shard:4",
        "-w",
        node,
        *extra,
        "--wrap",
        load,
    )


def release(*job_ids: int) -> None:
    subprocess.run(["scontrol", "release", *map(str, job_ids)], check=True, timeout=30)


def test_two_light_jobs_share_one_gpu_and_the_heavy_one_keeps_a_whole_gpu(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        light_a = shareable(
            t, "gpu3", "8GiB", t.fakeload("--util", "30", "--mem", "6GiB", "--duration", "300s")
        )
        light_b = shareable(
            t, "gpu3", "8GiB", t.fakeload("--util", "20", "--mem", "3GiB", "--duration", "300s")
        )
        heavy = shareable(
            t, "gpu3", "60GiB", t.fakeload("--util", "90", "--mem", "50GiB", "--duration", "300s")
        )
        for job in (light_a, light_b):
            action = wait_for(f"job {job} packed", packed(t, job))
            assert action["mode"] == "enforce"
            assert action["fields"] == {"TresPerNode": "gres:shard:2"}
            assert action["numbers"]["shards_proposed"] == 2
            listed = listed_job(job)
            assert listed is not None and listed.gpus.shards_per_node == 2
        release(light_a, light_b)
        placed_a = wait_for("light job A on a GPU", lambda: slurm_shard_gpu(light_a))
        placed_b = wait_for("light job B on a GPU", lambda: slurm_shard_gpu(light_b))
        assert placed_a[1] == placed_b[1], "Slurm put both light jobs on one GPU index"
        assert placed_a[0] == placed_b[0] == 2

        def settled(job_id: int, util: float) -> Callable[[], list[GpuUsage] | None]:
            # Python starts slowly on a loaded host: wait until the window holds only
            # samples taken after the job declared its load.
            def check() -> list[GpuUsage] | None:
                rows = t.steady(job_id)
                ok = rows and all(abs((r.mean_util_pct or 0) - util) <= 1 for r in rows)
                return rows if ok else None

            return check

        (a,) = wait_for("steady samples of A at its own 30 %", settled(light_a, 30))
        (b,) = wait_for("steady samples of B at its own 20 %", settled(light_b, 20))
        assert (a.node, a.gpu_index) == (b.node, b.gpu_index) == ("gpu3", placed_a[1])
        assert a.shared and b.shared
        # Each job's usage is its own, not the device's 50 % / 9 GiB.
        assert a.mean_util_pct == pytest.approx(30, abs=1)
        assert b.mean_util_pct == pytest.approx(20, abs=1)
        assert a.max_memory_mib == pytest.approx(6144, abs=1)
        assert b.max_memory_mib == pytest.approx(3072, abs=1)
        eff_a = json.loads(t.run("eff", str(light_a), "--json"))
        (gpu_a,) = eff_a["gpus"]
        # The run's mean includes the first samples before fakeload declared (0 %); its
        # maximum is the job's own 30 %, never the shared device's 50 %.
        assert gpu_a["shared"] and gpu_a["util_pct_max"] == pytest.approx(30, abs=1)
        assert gpu_a["memory_max_mib"] == pytest.approx(6144, abs=1)

        # The heavy job was seen for as long as the light ones were packed: never packed.
        assert colocate_actions(t, heavy) == []
        listed = listed_job(heavy)
        assert listed is not None and listed.gpus.shards_per_node == 4
        # Nor is the light pair separated.
        assert all(
            x["kind"] != "requeue" for j in (light_a, light_b) for x in colocate_actions(t, j)
        )


def test_a_job_whose_memory_grows_is_separated_before_the_gpu_fills(
    slurm_cluster: LabCluster, tmp_path: Path
) -> None:
    with running_stack(slurm_cluster, tmp_path, CONFIG) as t:
        older = shareable(
            t, "gpu4", "8GiB", t.fakeload("--util", "20", "--mem", "8GiB", "--duration", "300s")
        )
        growing = shareable(
            t,
            "gpu4",
            "8GiB",
            t.fakeload(
                "--util",
                "20",
                "--mem",
                "8GiB",
                "--mem-max",
                "78GiB",
                "--pattern",
                "mem-growth:40s",
                "--duration",
                "300s",
            ),
        )
        for job in (older, growing):
            wait_for(f"job {job} packed", packed(t, job))
        release(older)
        first = wait_for("the older job on a GPU", lambda: slurm_shard_gpu(older))
        release(growing)
        second = wait_for("the growing job on a GPU", lambda: slurm_shard_gpu(growing))
        assert first[1] == second[1], "both on one GPU"
        wait_for("both jobs sampled together", lambda: t.gpus(older) and t.gpus(growing))

        action = wait_for(
            "the growing job separated", lambda: done(t, growing, "requeue"), timeout_s=120
        )
        n = action["numbers"]
        assert n["memory_fraction"] >= 0.9
        assert n["memory_used_mib"] < n["memory_total_mib"] == 81920, "separated before a full GPU"
        assert action["fields"]["TresPerNode"] == "gres:shard:4"
        requeued = wait_for(
            "the requeue in Slurm",
            lambda: j if (j := listed_job(growing)) is not None and j.restart_count >= 1 else None,
        )
        assert requeued.gpus.shards_per_node == 4, "requeued onto a whole GPU's shards"
        assert "sgpu:separated" in requeued.comment
        assert requeued.state.value == "PENDING"
        # The older job keeps running where it was, never separated.
        kept = listed_job(older)
        assert kept is not None and kept.state.value == "RUNNING"
        assert all(a["kind"] != "requeue" for a in colocate_actions(t, older))

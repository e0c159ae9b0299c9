"""MIG slices and MPS end to end on a real lab cluster: daemon, four agents, fakeload jobs.

The lab's ``mig-mps`` layout (slurmgpu/lab/cluster/sharing.py): gpu2's GPUs are MIG
slices (seven 1g.10gb each before Slurm 23.02, 3g.40gb + 2g.20gb + 2 x 1g.10gb from it),
gpu3's serve MPS (100 a GPU). Jobs are submitted held, shareable, with ``--gpu-mem``; the
daemon's co-location (enforce mode) narrows them while they are pending, then they are
released and Slurm places them. No job has history, so a shareable job counts at the
light ceiling (``max_util_pct``, 10 here).

What each release allows (tried, policy/slices.py): a whole GPU's MPS (``mps:100``) is
narrowed to a share on every release; ``gpu:1`` becomes a MIG slice from 23.02 only
(22.05's slurmctld refuses an untyped GPU request turning typed), so on 22.05 the light
GPU job keeps its request -- and still lands on a slice, the only GPUs gpu2 has.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.policy.colocate import converts_gpu_to_shards
from slurmgpu.slurm.update import gres_prefix
from tests.configs import QUICK_POLICY, config_toml, observing
from tests.polling import wait_for
from tests.slurm.harness import ROOT, Telemetry, listed_job, running_stack

CONFIG = config_toml(
    QUICK_POLICY,
    observing("rightsize", "idle_gpu"),
    {"policy.colocate": {"mode": "enforce", "device_memory": "80GiB", "max_util_pct": 10.0}},
)
_GRES = re.compile(r"GRES=(gpu:\S+?|mps:\d+)\((?:IDX:)?([^)]*)\)")


def _scontrol_gres(job_id: int) -> tuple[str, str] | None:
    """(GRES, its detail) from ``scontrol -d show job`` once the job runs."""
    out = subprocess.run(
        ["scontrol", "-d", "show", "job", str(job_id)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    if "JobState=RUNNING" not in out:
        return None
    m = _GRES.search(out)
    return (m.group(1), m.group(2)) if m else None


def _version() -> str:
    out = subprocess.run(
        ["sinfo", "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout.split()[-1]


def _colocate_done(t: Telemetry, job_id: int) -> dict[str, Any] | None:
    rows: list[dict[str, Any]] = json.loads(t.run("actions", "--json", "--job", str(job_id)))
    return next(
        (
            a
            for a in rows
            if a["policy"] == "colocate" and a["kind"] == "update" and a["outcome"] == "done"
        ),
        None,
    )


def _narrowed(t: Telemetry, job_id: int) -> Callable[[], dict[str, Any] | None]:
    return lambda: _colocate_done(t, job_id)


def _shareable(t: Telemetry, node: str, gres: str, gpu_mem: str, load: str) -> int:
    return t.submit(
        "--shareable", "--gpu-mem", gpu_mem, "--hold", "--requeue", f"--gres={gres}",
        "-w", node, "--wrap", load,
    )  # fmt: skip


def _release(*job_ids: int) -> None:
    subprocess.run(["scontrol", "release", *map(str, job_ids)], check=True, timeout=30)


def _eff_unknown(t: Telemetry, job_id: int) -> dict[str, Any] | None:
    doc: dict[str, Any] = json.loads(t.run("eff", str(job_id), "--json"))
    gpus = doc["gpus"]
    return doc if gpus and all(g["status"] == "util-unknown" for g in gpus) else None


def _unknown_in_eff(t: Telemetry, job_id: int) -> Callable[[], dict[str, Any] | None]:
    return lambda: _eff_unknown(t, job_id)


def _equivalents(port: int) -> dict[tuple[str, str], float]:
    """``sgpu_gpu_equivalents_*`` by (metric, sharing), summed over the partitions gpu2
    and gpu3 are in (the lab puts every node in one)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("sgpu_gpu_equivalents_"):
                key = (sample.name, sample.labels.get("sharing", ""))
                out[key] = out.get(key, 0.0) + sample.value
    return out


def test_mps_jobs_share_a_gpu_and_a_light_job_runs_on_a_mig_slice(
    sharing_cluster: LabCluster, tmp_path: Path
) -> None:
    version = _version()
    prefix = gres_prefix(version)
    # A Slurm chroot (26.05) runs the jobs' fakeload with this checkout and Python, and
    # they declare their load under tmp_path, where the agents read it.
    python = Path(sys.prefix)
    sharing_cluster.share(ROOT, python, python.resolve(), Path(sys.base_prefix), tmp_path)
    started = datetime.now(UTC) - timedelta(seconds=5)
    with running_stack(sharing_cluster, tmp_path, CONFIG) as t:
        duration = ("--duration", "300s")
        mps_a = _shareable(
            t, "gpu3", "mps:100", "8GiB", t.fakeload("--util", "20", "--mem", "6GiB", *duration)
        )
        mps_b = _shareable(
            t, "gpu3", "mps:100", "8GiB", t.fakeload("--util", "10", "--mem", "3GiB", *duration)
        )
        light = _shareable(
            t, "gpu2", "gpu:1", "4GiB", t.fakeload("--util", "8", "--mem", "3GiB", *duration)
        )
        # Both MPS jobs: half a GPU's SMs each, on every release.
        for job in (mps_a, mps_b):
            action = wait_for(f"job {job} narrowed", _narrowed(t, job))
            assert action["mode"] == "enforce"
            assert action["fields"] == {"TresPerNode": f"{prefix}mps:50"}
            assert action["numbers"]["slice_kind"] == "mps"
            listed = listed_job(job)
            assert listed is not None and listed.gpus.mps_per_node == 50
        # The light GPU job: a 1g.10gb slice where slurmctld takes the change.
        if converts_gpu_to_shards(version):  # from 23.02, as for shards
            action = wait_for(f"job {light} narrowed", lambda: _colocate_done(t, light))
            assert action["fields"] == {"TresPerNode": f"{prefix}gpu:1g.10gb:1"}
            assert "isolated" in action["reason"]
            listed = listed_job(light)
            assert listed is not None and listed.gpus.gpu_type == "1g.10gb"
        else:
            # seen as long as the MPS jobs took to be narrowed: left alone
            assert _colocate_done(t, light) is None
            listed = listed_job(light)
            assert listed is not None and listed.gpus.gpu_type is None
        _release(mps_a, mps_b, light)

        gres_a = wait_for("MPS job A running", lambda: _scontrol_gres(mps_a))
        gres_b = wait_for("MPS job B running", lambda: _scontrol_gres(mps_b))
        assert gres_a[0] == gres_b[0] == "mps:50"
        running_a, running_b = listed_job(mps_a), listed_job(mps_b)
        assert running_a is not None and running_b is not None
        (alloc_a,), (alloc_b,) = running_a.gpu_allocations, running_b.gpu_allocations
        assert alloc_a.mps_indices == alloc_b.mps_indices, "one GPU shared through MPS"
        assert not alloc_a.gpu_indices and alloc_a.mps == 50

        def own(job_id: int, memory_mib: float) -> list[Any] | None:
            rows = t.steady(job_id)
            ok = rows and all(r.max_memory_mib == pytest.approx(memory_mib, abs=1) for r in rows)
            return rows if ok else None

        # Each MPS job with its own memory on the shared GPU, and no util of its own:
        # NVML gives no per-process SM share under MPS (unknown, never the device's 30 %).
        (a,) = wait_for("A's own samples", lambda: own(mps_a, 6144))
        (b,) = wait_for("B's own samples", lambda: own(mps_b, 3072))
        assert (a.node, a.gpu_index) == (b.node, b.gpu_index) == ("gpu3", alloc_a.mps_indices[0])
        assert a.shared and b.shared
        assert a.mean_util_pct is None and b.mean_util_pct is None

        # The light job on one MIG instance: util and memory of its slice alone.
        slice_gres = wait_for("the light job running", lambda: _scontrol_gres(light))
        assert slice_gres[0] == "gpu:1g.10gb:1"
        (m,) = wait_for("the slice's own samples", lambda: own(light, 3072))
        assert m.node == "gpu2" and m.gpu_index == int(slice_gres[1])
        assert m.mean_util_pct == pytest.approx(8, abs=1)
        assert m.memory_total_mib == 10240  # the instance's memory, not the GPU's 80 GiB
        # sgpu eff: each MPS job holds half a GPU and its util is unknown, never idle
        # (its only known samples are the 0 % ones from before its process started).
        for job in (mps_a, mps_b):
            doc = wait_for(f"eff of {job}: util unknown", _unknown_in_eff(t, job))
            (gpu,) = doc["gpus"]
            assert gpu["shared"] and gpu["util_pct_mean"] is None and gpu["role"] == "shard"
            assert (doc["gpu"]["sharing"], doc["gpu"]["equivalents"]) == ("mps", 0.5)
            assert doc["gpu"]["diagnosis"] not in {"idle", "no-gpu-use"}
            assert not {"idle-gpu", "no-gpu-use"} & {n["kind"] for n in doc["notes"]}
        doc = json.loads(t.run("eff", str(mps_a), "--json"))
        assert doc["gpus"][0]["memory_max_mib"] == pytest.approx(6144, abs=1)
        # The light job's slice: 1/7 of a GPU where it asked for the slice (23.02 on); on
        # 22.05 it asked for an untyped GPU, which eff counts as asked (docs/metrics.md).
        light_doc = json.loads(t.run("eff", str(light), "--json"))
        slice_share = 1 / 7 if converts_gpu_to_shards(version) else 1.0
        assert light_doc["gpu"]["equivalents"] == pytest.approx(slice_share, abs=1e-3)
        assert light_doc["gpus"][0]["status"] != "util-unknown"  # GPM: the slice's own

        # /metrics in GPU-equivalents: both MPS shares (0.5 + 0.5) of unknown use once the
        # 0 % samples from before their processes left the 2-minute window; the slice
        # 1/7 of a GPU, busy, on every release (the node's GPUs are all 1g.10gb slices).
        def scraped() -> dict[tuple[str, str], float] | None:
            m = _equivalents(t.port)
            ok = m.get(("sgpu_gpu_equivalents_util_unknown", "mps")) == pytest.approx(1.0)
            return m if ok else None

        m = wait_for("the MPS shares' use unknown in /metrics", scraped, timeout_s=200)
        assert m[("sgpu_gpu_equivalents_allocated", "mps")] == pytest.approx(1.0)
        assert m[("sgpu_gpu_equivalents_idle", "mps")] == pytest.approx(0.0)
        assert m[("sgpu_gpu_equivalents_allocated", "mig")] == pytest.approx(1 / 7)
        assert m[("sgpu_gpu_equivalents_used", "mig")] == pytest.approx(1 / 7)

        # sgpu report over the three jobs once they ended: GPU-hours as equivalents, the
        # MPS jobs' use unknown (allocated, neither used nor idle).
        subprocess.run(["scancel", str(mps_a), str(mps_b), str(light)], check=True, timeout=30)
        usage = t.usage()
        wait_for(
            "the three jobs' summaries",
            lambda: all(usage.summary(j) is not None for j in (mps_a, mps_b, light)),
        )
        elapsed = {
            j: json.loads(t.run("eff", str(j), "--json"))["elapsed_s"]
            for j in (mps_a, mps_b, light)
        }
        until = (datetime.now(UTC) + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
        since = started.strftime("%Y-%m-%dT%H:%M:%S")
        report = json.loads(t.run("report", "--since", since, "--until", until, "--format", "json"))
        totals = report["totals"]
        assert totals["jobs"] == 3 and totals["jobs_with_usage"] == 1
        want = (0.5 * elapsed[mps_a] + 0.5 * elapsed[mps_b] + slice_share * elapsed[light]) / 3600
        assert totals["gpu_hours_allocated"] == pytest.approx(want, rel=1e-3)
        assert totals["gpu_hours_with_usage"] == pytest.approx(
            slice_share * elapsed[light] / 3600, rel=1e-3
        )

"""Captures of MIG-typed and MPS gres from real daemons parse to the plan.

``tests/golden/slurm-*/sharing_*`` were recorded by ``scripts/record_golden.py --sharing``
from the lab's ``mig-mps`` layout (slurmgpu/lab/cluster/sharing.py: gpu2 MIG slices, gpu3
MPS) running :func:`sharing_plan`: MIG slice jobs on gpu2, a half- and a quarter-GPU MPS
job and a whole GPU on gpu3, shards on gpu1, a held slice job. ``sharing_expected.json``
is the plan. What the releases do differently, as recorded:

* 22.05 splits each MIG GPU into one profile (``gpu:1g.10gb:14``; see sharing.py why);
* 22.05's node ``gres_used`` counts the GPUs holding MPS work (``mps:(null):1(IDX:0)``),
  as it does for shards; 26.05 counts the shares per GPU (``mps:75(75/100,-/100,...)``);
* 22.05 put the whole-GPU job on the GPU the MPS jobs share (IDX 0); 26.05 on another.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.model import JobState
from slurmgpu.slurm.jsonformat import (
    KNOWN_DATA_PARSERS,
    data_parser_version,
    decode_sinfo,
    decode_squeue,
)
from slurmgpu.slurm.parse import parse_gres
from slurmgpu.store.rows import job_to_row, node_to_row, row_to_job, row_to_node

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RELEASES = sorted(p.parent for p in GOLDEN.glob("slurm-*/sharing_expected.json"))
SQUEUE = sorted(GOLDEN.glob("slurm-*/sharing_squeue*.json"))
NODES = sorted(
    [
        *GOLDEN.glob("slurm-*/sharing_sinfo*.json"),
        *GOLDEN.glob("slurm-*/sharing_scontrol_nodes.json"),
    ]
)
TEXT = sorted(GOLDEN.glob("slurm-*/sharing_scontrol_show_node.txt"))


def _expected(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path.parent / "sharing_expected.json").read_text())
    return data


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_both_recorded_releases_have_sharing_captures() -> None:
    assert [p.name for p in RELEASES] == ["slurm-22.05", "slurm-26.05"]
    for folder in RELEASES:
        for name in ("sharing_squeue.json", "sharing_sinfo.json", "sharing_scontrol_show_node.txt"):
            assert (folder / name).exists(), folder / name
    assert _expected(RELEASES[0] / "x")["layout"] == ["1g.10gb"] * 7
    assert _expected(RELEASES[1] / "x")["layout"] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]


@pytest.mark.parametrize("path", SQUEUE, ids=_id)
def test_slice_and_mps_jobs_parse_to_the_plan(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = path.read_bytes()
    assert data_parser_version(data) in KNOWN_DATA_PARSERS
    plan = _expected(path)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs, release = decode_squeue(data)
    assert release.startswith(path.parent.name.removeprefix("slurm-"))
    assert "did not parse" not in caplog.text
    by_name = {j.name: j for j in jobs}
    assert sorted(by_name) == sorted(plan["jobs"])
    for name, want in plan["jobs"].items():
        job = by_name[name]
        assert job.state is JobState(want["state"]), name
        got = (job.gpus.gpus, job.gpus.gpu_type, job.gpus.shards, job.gpus.mps)
        assert got == (want["gpus"], want["gpu_type"], want["shards"], want["mps"]), name
        assert job.gpus.wants_gpu, name
        if want["state"] != "RUNNING":
            assert job.gpu_allocations == (), name
            continue
        (alloc,) = job.gpu_allocations
        assert alloc.node == want["node"], name
        assert len(alloc.gpu_indices) == want["gpus"], name  # a MIG slice is a GPU index
        assert alloc.mps == want["mps"], name
        assert len(alloc.mps_indices) == (1 if want["mps"] else 0), name
    # both MPS jobs share one GPU, each with a share of its own
    half, quarter = (
        by_name["mps_half"].gpu_allocations[0],
        by_name["mps_quarter"].gpu_allocations[0],
    )
    assert half.mps_indices == quarter.mps_indices
    assert not half.gpu_indices and not half.shard_indices
    # slices of one job are distinct instances, never a slice given twice
    slices = [
        i
        for n in plan["jobs"]
        if n.startswith("mig_") and by_name[n].gpu_allocations
        for i in by_name[n].gpu_allocations[0].gpu_indices
    ]
    assert (
        len(slices)
        == len(set(slices))
        == sum(
            w["gpus"]
            for n, w in plan["jobs"].items()
            if n.startswith("mig_") and w["state"] == "RUNNING"
        )
    )


@pytest.mark.parametrize("path", NODES, ids=_id)
def test_mig_and_mps_nodes_parse_to_the_plan(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plan = _expected(path)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        nodes = {n.name: n for n in decode_sinfo(path.read_bytes())}
    assert "did not parse" not in caplog.text
    assert sorted(nodes) == sorted(plan["nodes"])
    v22 = path.parent.name == "slurm-22.05"
    for name, want in plan["nodes"].items():
        node = nodes[name]
        assert (node.gpus, node.shards, node.mps) == (want["gpus"], want["shards"], want["mps"]), (
            name
        )
        assert dict(node.gpu_types) == want["gpu_types"], name
        assert node.gpus_used == want["gpus_used"], name
        if v22 and want["mps_used"]:
            assert node.mps_used == 1, name  # 22.05 counts the GPUs holding MPS work
        else:
            assert node.mps_used == want["mps_used"], name
    mig = nodes["gpu2"]
    assert mig.gpu_type == (mig.gpu_types[0][0] if len(mig.gpu_types) == 1 else None)


@pytest.mark.parametrize("path", TEXT, ids=_id)
def test_scontrol_show_node_text_declares_the_same_gres(path: Path) -> None:
    """``scontrol show node`` (text, every release) says what the JSON says."""
    plan = _expected(path)
    text = path.read_text()
    gres = dict(re.findall(r"^NodeName=(\S+).*?^\s+Gres=(\S+)", text, re.MULTILINE | re.DOTALL))
    assert sorted(gres) == sorted(plan["nodes"])
    for name, want in plan["nodes"].items():
        items = parse_gres(gres[name])
        typed = {it.type: it.count for it in items if it.name == "gpu" and it.type}
        assert typed == want["gpu_types"], name
        assert sum(it.count for it in items if it.name == "gpu") == want["gpus"], name
        assert sum(it.count for it in items if it.name == "mps") == want["mps"], name


@pytest.mark.parametrize("folder", RELEASES, ids=lambda p: p.name)
def test_the_store_keeps_mps_allocations_and_node_types(folder: Path) -> None:
    jobs, _ = decode_squeue((folder / "sharing_squeue.json").read_bytes())
    for job in jobs:
        back = row_to_job({**job_to_row(job), "job_row": 1})
        assert back.gpu_allocations == job.gpu_allocations, job.name
    for node in decode_sinfo((folder / "sharing_sinfo.json").read_bytes()):
        back_node = row_to_node(node_to_row(node))
        assert (back_node.gpu_types, back_node.mps) == (node.gpu_types, node.mps), node.name

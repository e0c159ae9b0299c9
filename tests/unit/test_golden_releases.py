"""Captures from real daemons of every tested Slurm release parse to the right counts.

``tests/golden/slurm-*/mixed_*.json`` were recorded by ``scripts/record_golden.py`` from
a lab cluster running its plan (``mixed_expected.json``): on gpu1 a 2-GPU job beside
2-shard and 3-shard jobs, a 4-GPU job on gpu2, a 4-shard job on gpu3, a 1-GPU job named
in invalid UTF-8 on gpu4, and a held 4-GPU job; ``squeue`` and ``sinfo --Node`` with
every data_parser the release has. Each capture must decode to the plan, per node and
per job, whatever the release and version.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.model import JobState
from slurmgpu.slurm import decode_stats
from slurmgpu.slurm.jsonformat import (
    KNOWN_DATA_PARSERS,
    data_parser_version,
    decode_sinfo,
    decode_squeue,
)
from slurmgpu.slurm.sacct import decode_sacct

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RELEASES = sorted(p.parent for p in GOLDEN.glob("slurm-*/mixed_expected.json"))
SQUEUE = sorted(GOLDEN.glob("slurm-*/mixed_squeue*.json"))
NODES = sorted([*GOLDEN.glob("slurm-*/mixed_sinfo*.json"), *GOLDEN.glob("slurm-*/mixed_scontrol*")])


def _expected(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path.parent / "mixed_expected.json").read_text())
    return data


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_every_release_has_its_captures() -> None:
    assert [p.name for p in RELEASES] == ["slurm-22.05", "slurm-24.11", "slurm-26.05"]
    for folder in RELEASES:
        assert (folder / "mixed_squeue.json").exists() and (folder / "mixed_sinfo.json").exists()


@pytest.mark.parametrize("path", SQUEUE, ids=_id)
def test_jobs_parse_to_the_plan(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = path.read_bytes()
    version = data_parser_version(data)
    assert version in KNOWN_DATA_PARSERS
    if path.stem.count(".") == 3:  # mixed_squeue.v0.0.43: recorded with --json=v0.0.43
        assert path.stem.split(".", 1)[1] == version
    plan = _expected(path)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs, release = decode_squeue(data)
    assert release.startswith(path.parent.name.removeprefix("slurm-"))
    assert "did not parse" not in caplog.text  # every value understood
    by_name = {j.name: j for j in jobs}
    bad = plan["bad_name"].encode("latin-1").decode("utf-8", "replace")
    assert bad == "bad\ufffd\ufffdname" and bad in by_name  # decoded with replacement
    for name, want in plan["jobs"].items():
        job = by_name[bad if name == "badname" else name]
        assert job.state is JobState(want["state"]), name
        assert (job.gpus.gpus, job.gpus.shards) == (want["gpus"], want["shards"]), name
        if want["state"] != "RUNNING":
            assert job.gpu_allocations == (), name
            continue
        (alloc,) = job.gpu_allocations
        assert alloc.node == want["node"], name
        assert len(alloc.gpu_indices) == want["gpus"], name
        assert alloc.shards == want["shards"], name
        if want["shards"]:
            assert len(alloc.shard_indices) == 1, name  # each fits on one GPU
    # on gpu1 the shards are on GPUs the 2-GPU job does not hold
    shard_gpus = {
        i for n in ("shard2", "shard3") for i in by_name[n].gpu_allocations[0].shard_indices
    }
    assert shard_gpus and not shard_gpus & set(by_name["whole2"].gpu_allocations[0].gpu_indices)


@pytest.mark.parametrize("path", SQUEUE, ids=_id)
def test_jobs_carry_slurms_priority(path: Path) -> None:
    """squeue's priority, a number (22.05) or a set/infinite/number record (24.11 on):
    a held job's is 0; 22.05's priority/basic counts down from 0xFFFF0000 by
    submission, so the first job submitted has the highest."""
    jobs, _ = decode_squeue(path.read_bytes())
    by_name = {j.name: j for j in jobs}
    assert by_name["held"].priority == 0
    listed = [j.priority for j in jobs if j.name != "held"]
    assert listed and all(isinstance(p, int) and p > 0 for p in listed), listed
    if path.parent.name == "slurm-22.05":
        assert by_name["whole2"].priority == 4294901759
        assert by_name["whole2"].priority > by_name["shard2"].priority  # type: ignore[operator]


@pytest.mark.parametrize("path", NODES, ids=_id)
def test_nodes_parse_to_the_plan(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plan = _expected(path)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        nodes = {n.name: n for n in decode_sinfo(path.read_bytes())}
    assert "did not parse" not in caplog.text
    assert sorted(nodes) == sorted(plan["nodes"])
    v22 = path.parent.name == "slurm-22.05"
    for name, want in plan["nodes"].items():
        node = nodes[name]
        assert (node.gpus, node.shards, node.gpus_used) == (
            want["gpus"],
            want["shards"],
            want["gpus_used"],
        ), name
        if v22 and want["shards_used"]:
            # 22.05 prints the GPUs holding shards there ("shard:(null):2(IDX:2-3)" for
            # 2 + 3 shards): a known 22.05 limit, docs/slurm.md
            assert node.shards_used == len({2, 3} if name == "gpu1" else {0}), name
        else:
            assert node.shards_used == want["shards_used"], name
        if not v22:  # 22.05's sinfo names no GPU index in gres_used
            assert len(node.gpu_indices_used) == want["gpus_used"], name


def test_26_05_prints_a_dash_for_gpus_held_whole_and_it_still_counts() -> None:
    text = (GOLDEN / "slurm-26.05" / "mixed_sinfo.json").read_text()
    used = [r["gres"]["used"] for r in json.loads(text)["sinfo"] if r["nodes"]["nodes"] == ["gpu1"]]
    # what dropped gpu1's whole GPU usage before (parse_gres: "bad detail '-/4'")
    assert used == ["gpu:2(IDX:0-1),shard:5(-/4,-/4,2/4,3/4)"]
    gpu1 = next(n for n in decode_sinfo(text) if n.name == "gpu1")
    assert (gpu1.gpus_used, gpu1.shards_used) == (2, 5)


def test_a_version_newer_than_known_is_decoded_warned_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = (GOLDEN / "slurm-26.05" / "mixed_squeue.json").read_text(errors="replace")
    doc = json.loads(text)
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.77"
    data = json.dumps(doc)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        first, _ = decode_squeue(data)
        second, _ = decode_squeue(data)
    assert len(first) == len(second) == 7
    assert caplog.text.count("data_parser v0.0.77 is not one slurmgpu was tested with") == 1
    assert decode_stats.snapshot().data_parsers["v0.0.77"] is False


SACCT = sorted(GOLDEN.glob("slurm-*/mixed_sacct*.json"))


@pytest.mark.parametrize("path", SACCT, ids=_id)
def test_accounting_parses_to_the_plan(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """sacct of real slurmdbd + MariaDB (24.11, 26.05 chroot labs), every data_parser."""
    plan = _expected(path)
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        jobs, release = decode_sacct(path.read_bytes())
    assert release.startswith(path.parent.name.removeprefix("slurm-"))
    assert "did not parse" not in caplog.text and "skipped" not in caplog.text
    by_name = {j.name: j for j in jobs}
    for name, want in plan["finished"].items():
        job = by_name[name]
        assert job.state is JobState(want["state"]), name
        assert job.exit_code == want["exit_code"], name
        assert (job.gpus.gpus, job.gpus.shards) == (want["gpus"], want["shards"]), name
    # MariaDB stored the invalid UTF-8 name as "bad??name" (its own replacement)
    (odd,) = [n for n in by_name if n.startswith("bad") and n.endswith("name")]
    assert odd == "bad??name"
    for name, want in plan["jobs"].items():  # the running plan, as accounting sees it
        if want["state"] != "RUNNING":
            continue  # a held job: accounting may not list it yet
        job = by_name[odd if name == "badname" else name]
        assert job.state is JobState.RUNNING, name
        assert (job.gpus.gpus, job.gpus.shards) == (want["gpus"], want["shards"]), name


def test_accounting_captures_exist_where_the_lab_had_slurmdbd() -> None:
    assert sorted({p.parent.name for p in SACCT}) == ["slurm-24.11", "slurm-26.05"]

"""Malleable PyTorch Lightning on the real lab cluster: an ordinary LightningModule with the
three lines (tests/integration/lightning_worker.py) submitted with ``sgpu submit
--malleable 1:2 --wrap "torchrun ..."`` shrinks from 2 ranks to 1 when a rigid 1-GPU job
waits on a full cluster and grows back to 2 after it, and checkpoints on scancel's
SIGTERM, through the daemon's own
MalleableActuator (tests/slurm/resize_driver.py, as test_malleable_torch_real.py does for
our own loop): the rigid job starts; every optimizer step once across the three runs, each
on a global batch of 8 (2 x 4 at 2 ranks, accumulated 2 x 4 at 1); every sample at most
once per epoch and exactly once in each finished epoch; the acks the daemon saw are the
runtime's; no process of an earlier run left. The losses against an uninterrupted run are
tests/integration/test_elastic_lightning.py's (the same code without Slurm).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from slurmgpu.lab.cluster import LabCluster
from tests.polling import wait_for
from tests.slurm.harness import ROOT, Lab, driven_lab, lab_dir
from tests.slurm.train_log import read_jsonl
from tests.tier_guard import skip_missing

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "fills the 4-node lab's 16 GPUs for the resize (16 nodes: 15 fillers, not 3)"

WORKER = ROOT / "tests" / "integration" / "lightning_worker.py"
TORCHRUN = f"{sys.executable} -m torch.distributed.run --standalone"
SAMPLES, GLOBAL_BATCH = 96, 8


@pytest.fixture
def lab(slurm_cluster: LabCluster) -> Iterator[Lab]:
    if importlib.util.find_spec("lightning") is None:
        skip_missing("slurm", "lightning is not installed (pip install 'slurmgpu[lightning]')")
    with driven_lab(lab_dir(slurm_cluster, "lightning-"), {"OMP_NUM_THREADS": "1"}) as it:
        yield it


def _records(lab: Lab) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for path in sorted((lab.tmp / "out").glob("pl.rank*.jsonl")):
        recs += read_jsonl(path)
    return recs


@pytest.mark.slow
def test_a_lightning_job_shrinks_for_a_rigid_job_and_grows_back(lab: Lab) -> None:
    out = lab.tmp / "out"
    out.mkdir()
    job = int(
        lab.sgpu(
            "submit",
            "--parsable",
            "-o",
            str(lab.tmp / "pl.out"),
            "--malleable",
            "1:2",
            "--checkpoint-grace",
            "60s",
            "--elastic-dir",
            str(lab.tmp / "state"),
            "--gres=gpu:2",
            "-t",
            "30",
            "-J",
            "pl",
            "--wrap",
            "env WORKER_RUN=pl WORKER_EPOCHS=1000 WORKER_STEP_SLEEP=0.1 "
            f"{TORCHRUN} --nproc-per-node=$SGPU_GPUS {WORKER} {out}",
        )
        .strip()
        .split(";")[0]
    )
    wait_for("the job at 2 GPUs", lambda: lab.running(job, 2))
    wait_for("5 steps at 2 ranks", lambda: len(_records(lab)) >= 10, timeout_s=180)
    first_run = lab.processes(job)
    fillers = [lab.sbatch("--gres=gpu:4", "--wrap", "sleep 600") for _ in range(3)]
    fillers.append(lab.sbatch("--gres=gpu:2", "--wrap", "sleep 600"))
    wait_for("the fillers running", lambda: all(lab.running(f) for f in fillers))
    rigid = lab.sbatch("--gres=gpu:1", "-t", "1", "--wrap", "sleep 15")
    wait_for("the rigid job blocked", lambda: (j := lab.job(rigid)) and j.reason == "Resources")

    lab.drive("--start", f"{job}:2:1")  # returns once it runs at 1 GPU
    started = lab.job(rigid)
    assert started is not None and started.start_time is not None
    assert not [p for p in first_run if p.is_running() and p.status() != "zombie"]
    wait_for("steps at 1 rank", lambda: any(r["world"] == 1 for r in _records(lab)), timeout_s=180)
    wait_for(
        "the rigid job done", lambda: (j := lab.job(rigid)) and j.state.is_terminal, timeout_s=90
    )
    second_run = lab.processes(job)
    lab.drive("--start", f"{job}:1:2")
    resized = wait_for("the job at 2 GPUs again", lambda: lab.running(job, 2))
    assert resized.restart_count == 2
    assert not [p for p in second_run if p.is_running() and p.status() != "zombie"]
    wait_for(
        "5 steps at 2 ranks after the grow",
        lambda: (
            max(r["step"] for r in _records(lab) if r["world"] == 2)
            > max(r["step"] for r in _records(lab) if r["world"] == 1) + 5
        ),
        timeout_s=180,
    )
    # The daemon's acks were the runtime's: one per resize.
    ack_path = lab.tmp / "state" / str(job) / "ack.json"
    assert json.loads(ack_path.read_text())["acks"] == 2
    lab.slurm.cancel(job)
    wait_for("the job gone", lambda: (j := lab.job(job)) is None or j.state.is_terminal)
    wait_for("no process of the job left", lambda: not lab.processes(job), timeout_s=30)

    records = _records(lab)
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_step[r["step"]].append(r)
    last = max(by_step)
    complete = dict(by_step)
    assert sorted(complete) == list(range(last + 1)), "an optimizer step was lost"
    worlds: list[set[tuple[int, int]]] = []
    for step, recs in sorted(complete.items()):
        assert len([i for r in recs for i in r["indices"]]) == GLOBAL_BATCH, step
        world = {(r["world"], r["accumulate"]) for r in recs}
        assert world in ({(2, 1)}, {(1, 2)}), (step, world)
        assert len(recs) == 2  # two ranks of one micro-batch, or one rank of two
        if not worlds or worlds[-1] != world:
            worlds.append(world)
    assert worlds == [{(2, 1)}, {(1, 2)}, {(2, 1)}]
    seen: dict[int, Counter[int]] = defaultdict(Counter)
    for recs in complete.values():
        seen[recs[0]["epoch"]].update(i for r in recs for i in r["indices"])
    for epoch, counts in seen.items():
        assert set(counts.values()) == {1}, f"epoch {epoch}: a sample twice"
        if epoch < max(seen):
            assert counts == Counter(range(SAMPLES)), f"epoch {epoch}: a sample skipped"
    # scancel's SIGTERM is a checkpoint request too (preemption sends only SIGTERM): the
    # last run checkpointed at a step boundary and acknowledged before it ended.
    ack = json.loads(ack_path.read_text())
    assert ack["acks"] == 3 and ack["job_id"] == job and ack["step"] == last + 1
    output = (lab.tmp / "pl.out").read_text()
    assert output.count("sgpu launch: start") == 3

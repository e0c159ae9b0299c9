"""Malleable Hugging Face Accelerate on the real lab cluster: examples/accelerate_elastic.py
(a plain Accelerate loop with the ``# sgpu`` lines) submitted with ``sgpu submit
--malleable 1:2 --wrap "torchrun ..."`` shrinks from 2 ranks to 1 when a rigid 1-GPU job
waits on a full cluster and grows back to 2 after it, through the daemon's own
MalleableActuator (tests/slurm/resize_driver.py), and checkpoints on scancel's SIGTERM:
the rigid job starts; every optimizer step once across the three runs, each on a global
batch of 8 (2 x 2 x accumulation 2 at 2 ranks, 2 x 4 at 1); every sample at most once per
epoch and exactly once in each finished epoch; the loss and learning rate of every step
those of an uninterrupted 2-rank run of the same seed (torchrun without Slurm, in this
test); the acks the daemon saw are the runtime's; no process of an earlier run left; the
three runs' output appended to one log.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from slurmgpu.lab.cluster import LabCluster
from tests.lab_processes import job_processes
from tests.polling import wait_for
from tests.slurm.harness import Lab, framework_lab
from tests.slurm.train_log import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_elastic.py"
TORCHRUN = f"{sys.executable} -m torch.distributed.run --standalone"
SAMPLES, GLOBAL_BATCH, EPOCHS = 96, 8, 200  # 12 steps per epoch; the test stops it early
PER_EPOCH = SAMPLES // GLOBAL_BATCH


@pytest.fixture
def lab(slurm_cluster: LabCluster) -> Iterator[Lab]:
    with framework_lab(
        slurm_cluster,
        "acc",
        ("torch", "accelerate"),
        "pip install torch==2.13.0 'slurmgpu[huggingface]'",
        "slurm",
    ) as lab:
        yield lab


def _example_args(out: Path, name: str) -> list[str]:
    return [
        str(EXAMPLE),
        "--epochs",
        str(EPOCHS),
        "--samples",
        str(SAMPLES),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--per-device-batch",
        "2",
        "--train-log",
        str(out / f"{name}.train.jsonl"),
        "--index-log",
        str(out / f"{name}.idx.jsonl"),
    ]


def _losses(path: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if "loss" in r]


def _worlds(path: Path) -> set[int]:
    return {int(r["world"]) for r in _losses(path)}


def _reference(lab: Lab, out: Path, last: int) -> dict[int, dict[str, Any]]:
    """The same training uninterrupted at 2 ranks (torchrun, no Slurm) up to ``last``."""
    log = out / "ref.train.jsonl"
    env = {**lab.env, "SLURM_JOB_ID": "1", "SGPU_ELASTIC_DIR": str(lab.tmp / "ref-state")}
    argv = [*TORCHRUN.split(), "--nproc-per-node=2", *_example_args(out, "ref")]
    with (lab.tmp / "ref.out").open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)

        def reached() -> bool:
            assert proc.poll() is None, (lab.tmp / "ref.out").read_text()[-4000:]
            return len(_losses(log)) >= last

        try:
            wait_for(f"the reference run at step {last}", reached, timeout_s=300)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return {int(r["step"]): r for r in _losses(log)}


@pytest.mark.slow
def test_an_accelerate_job_shrinks_for_a_rigid_job_and_grows_back(lab: Lab) -> None:
    out = lab.tmp / "out"
    out.mkdir()
    log = out / "run.train.jsonl"
    job = int(
        lab.sgpu(
            "submit",
            "--parsable",
            "-o",
            str(lab.tmp / "acc.out"),
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
            "acc",
            "--wrap",
            f"{TORCHRUN} --nproc-per-node=$SGPU_GPUS "
            + " ".join(_example_args(out, "run"))
            + " --step-time 0.1",
        )
        .strip()
        .split(";")[0]
    )
    wait_for("the job at 2 GPUs", lambda: lab.running(job, 2))
    wait_for("5 steps at 2 ranks", lambda: len(_losses(log)) >= 5, timeout_s=180)
    first_run = job_processes(job, lab.env["SLURM_CONF"])
    fillers = [lab.sbatch("--gres=gpu:4", "--wrap", "sleep 600") for _ in range(3)]
    fillers.append(lab.sbatch("--gres=gpu:2", "--wrap", "sleep 600"))
    wait_for("the fillers running", lambda: all(lab.running(f) for f in fillers))
    rigid = lab.sbatch("--gres=gpu:1", "-t", "1", "--wrap", "sleep 15")
    wait_for("the rigid job blocked", lambda: (j := lab.job(rigid)) and j.reason == "Resources")

    lab.drive("--start", f"{job}:2:1")  # returns once it runs at 1 GPU
    started = lab.job(rigid)
    assert started is not None and started.start_time is not None
    assert not _alive(first_run)
    wait_for("steps at 1 rank", lambda: 1 in _worlds(log), timeout_s=180)
    wait_for(
        "the rigid job done", lambda: (j := lab.job(rigid)) and j.state.is_terminal, timeout_s=90
    )
    second_run = job_processes(job, lab.env["SLURM_CONF"])
    lab.drive("--start", f"{job}:1:2")
    resized = wait_for("the job at 2 GPUs again", lambda: lab.running(job, 2))
    assert resized.restart_count == 2
    assert not _alive(second_run)

    def grown() -> bool:
        recs = _losses(log)
        after = [r for r in recs if r["world"] == 2 and r["step"] > _last_at(recs, 1)]
        return len(after) >= 5

    wait_for("5 steps at 2 ranks after the grow", grown, timeout_s=180)
    ack_path = lab.tmp / "state" / str(job) / "ack.json"
    assert json.loads(ack_path.read_text())["acks"] == 2  # the daemon's: one per resize
    lab.slurm.cancel(job)
    wait_for("the job gone", lambda: (j := lab.job(job)) is None or j.state.is_terminal)
    wait_for(
        "no process of the job left",
        lambda: not job_processes(job, lab.env["SLURM_CONF"]),
        timeout_s=30,
    )

    records = _losses(log)
    steps = [int(r["step"]) for r in records]
    last = steps[-1]
    assert steps == list(range(1, last + 1)), "an optimizer step lost or repeated"
    runs: list[tuple[int, int]] = []
    for r in records:
        shape = (int(r["world"]), int(r["accumulation"]))
        assert shape in ((2, 2), (1, 4)), (r["step"], shape)
        if not runs or runs[-1] != shape:
            runs.append(shape)
    assert runs == [(2, 2), (1, 4), (2, 2)]
    starts = [r for r in read_jsonl(log) if r.get("event") == "start"]
    assert [s["restart"] for s in starts] == [0, 1, 2]
    assert starts[0]["resume_from"] is None and all(s["resume_from"] for s in starts[1:])

    by_step: dict[int, list[int]] = defaultdict(list)
    for rec in read_jsonl(out / "run.idx.jsonl"):
        by_step[int(rec["step"])].extend(rec["idx"])
    assert sorted(by_step) == steps
    seen: dict[int, Counter[int]] = defaultdict(Counter)
    for step, indices in by_step.items():
        assert len(indices) == GLOBAL_BATCH, step
        seen[(step - 1) // PER_EPOCH].update(indices)
    for epoch, counts in seen.items():
        assert set(counts.values()) == {1}, f"epoch {epoch}: a sample twice"
        if epoch < max(seen):
            assert counts == Counter(range(SAMPLES)), f"epoch {epoch}: a sample skipped"

    # Loss continuous: every step's loss and learning rate are the uninterrupted run's (the
    # same samples and schedule step; only the float summation order differs).
    reference = _reference(lab, out, last)
    for r in records:
        ref = reference[int(r["step"])]
        assert r["lr"] == pytest.approx(ref["lr"], rel=1e-12), r["step"]
        assert math.isclose(r["loss"], ref["loss"], rel_tol=1e-4, abs_tol=1e-6), (r, ref)

    # scancel's SIGTERM is a checkpoint request too: the last run saved at a step boundary
    # and acknowledged before it ended.
    ack = json.loads(ack_path.read_text())
    assert ack["acks"] == 3 and ack["job_id"] == job and ack["step"] == last
    ckpt = lab.tmp / "state" / str(job) / "accelerate" / f"checkpoint-{last}"
    mark = json.loads((ckpt / "sgpu-elastic.json").read_text())
    assert (mark["world_size"], mark["samples_seen"]) == (2, last * GLOBAL_BATCH)
    output = (lab.tmp / "acc.out").read_text()
    assert output.count("sgpu launch: start") == 3


def _last_at(records: list[dict[str, Any]], world: int) -> int:
    return max((int(r["step"]) for r in records if r["world"] == world), default=0)


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

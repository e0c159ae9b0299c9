"""A malleable example training (Accelerate, the HF Trainer) on the real lab: submitted
with ``sgpu submit --malleable 1:2 --wrap "torchrun ..."``, shrunk 2 -> 1 rank for a
blocked rigid 1-GPU job and grown back through the daemon's own MalleableActuator
(tests/slurm/resize_driver.py), then cancelled; and every check both frameworks share.

The example writes a train log (``<name>.train.jsonl``: a start line per run, a line per
optimizer step with its loss, learning rate, world size and accumulation) and an index
log (``<name>.idx.jsonl``: the sample indices of each step).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.lab_processes import job_processes
from tests.polling import wait_for
from tests.slurm.harness import Lab
from tests.slurm.train_log import read_jsonl

TORCHRUN = f"{sys.executable} -m torch.distributed.run --standalone"
SAMPLES, GLOBAL_BATCH = 96, 8  # 12 steps per epoch
PER_EPOCH = SAMPLES // GLOBAL_BATCH


@dataclass(frozen=True)
class ExampleRun:
    """What :func:`shrink_and_grow` leaves for a framework's own checks."""

    job: int
    out: Path  # the example's output directory
    last: int  # the last optimizer step trained


def _losses(path: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if "loss" in r]


def _last_at(records: list[dict[str, Any]], world: int) -> int:
    return max((int(r["step"]) for r in records if r["world"] == world), default=0)


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _reference(
    lab: Lab, out: Path, last: int, example_args: Callable[[Path, str], list[str]]
) -> dict[int, dict[str, Any]]:
    """The same training uninterrupted at 2 ranks (torchrun, no Slurm) up to ``last``."""
    log = out / "ref.train.jsonl"
    env = {**lab.env, "SLURM_JOB_ID": "1", "SGPU_ELASTIC_DIR": str(lab.tmp / "ref-state")}
    argv = [*TORCHRUN.split(), "--nproc-per-node=2", *example_args(out, "ref")]
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


def shrink_and_grow(
    lab: Lab,
    name: str,
    example_args: Callable[[Path, str], list[str]],
    env_prefix: str = "",
) -> ExampleRun:
    """Run the example ``name`` through a shrink, a grow and scancel; check what both
    frameworks promise (steps, batch shapes, runs, samples, losses, acks, one log)."""
    out = lab.tmp / "out"
    out.mkdir()
    log = out / "run.train.jsonl"
    job = int(
        lab.sgpu(
            "submit",
            "--parsable",
            "-o",
            str(lab.tmp / f"{name}.out"),
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
            name,
            "--wrap",
            f"{env_prefix}{TORCHRUN} --nproc-per-node=$SGPU_GPUS "
            + " ".join(example_args(out, "run"))
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
    wait_for("steps at 1 rank", lambda: any(r["world"] == 1 for r in _losses(log)), timeout_s=180)
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
    # The step in flight at the final SIGTERM may have drawn its samples (the index log is
    # written as a step's batches are drawn) without finishing: past the last checkpoint,
    # it is not part of the training.
    beyond = [step for step in by_step if step > last]
    assert beyond in ([], [last + 1]), beyond
    for step in beyond:
        del by_step[step]
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
    reference = _reference(lab, out, last, example_args)
    for r in records:
        ref = reference[int(r["step"])]
        assert r["lr"] == pytest.approx(ref["lr"], rel=1e-12), r["step"]
        assert math.isclose(r["loss"], ref["loss"], rel_tol=1e-4, abs_tol=1e-6), (r, ref)

    # scancel's SIGTERM is a checkpoint request too: the last run saved at a step boundary
    # and acknowledged before it ended.
    ack = json.loads(ack_path.read_text())
    assert ack["acks"] == 3 and ack["job_id"] == job and ack["step"] == last
    assert (lab.tmp / f"{name}.out").read_text().count("sgpu launch: start") == 3
    return ExampleRun(job, out, last)


def assert_marked_at(checkpoint: Path, last: int) -> None:
    """The last checkpoint is marked complete at 2 ranks with every step's samples."""
    mark = json.loads((checkpoint / "sgpu-elastic.json").read_text())
    assert (mark["world_size"], mark["samples_seen"]) == (2, last * GLOBAL_BATCH)

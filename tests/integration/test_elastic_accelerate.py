"""slurmgpu.elastic.accelerate with real Accelerate on CPU: examples/accelerate_elastic.py
under ``sgpu launch -- torchrun`` (gloo) on 2 ranks is signalled mid-training, saves at the
next step boundary and acknowledges; it resumes at 1 rank (accumulation 2 -> 4), is
signalled again past an epoch boundary, and finishes at 2 ranks. Against an uninterrupted
2-rank run: the global step carries on, the global batch stays 8, every step trains on the
same samples (each sample once per epoch across the pieces), and the losses, learning
rates and final weights agree."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("accelerate", reason="pip install 'slurmgpu[huggingface]'")

import torch

from tests.elastic_piece import jsonl, run_piece

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_elastic.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
JOB = "78"
EPOCHS, SAMPLES, GLOBAL = 3, 80, 8  # 10 steps per epoch, 30 in all
PER_EPOCH = SAMPLES // GLOBAL
STEPS = EPOCHS * PER_EPOCH

pytestmark = pytest.mark.slow


def _env(tmp: Path, job: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "SLURM_JOB_ID": job,
        "SGPU_ELASTIC_DIR": str(tmp / "state"),
        "SGPU_CHECKPOINT_HOLD": "120",
    }


def _command(tmp: Path, out: str, world: int, step_time: float) -> list[str]:
    return [
        str(TORCHRUN),
        "--standalone",
        f"--nproc-per-node={world}",
        str(EXAMPLE),
        "--epochs",
        str(EPOCHS),
        "--samples",
        str(SAMPLES),
        "--global-batch",
        str(GLOBAL),
        "--per-device-batch",
        "2",
        "--step-time",
        str(step_time),
        "--out",
        str(tmp / f"{out}.final.pt"),
        "--train-log",
        str(tmp / f"{out}.train.jsonl"),
        "--index-log",
        str(tmp / f"{out}.idx.jsonl"),
    ]


def _piece(tmp: Path, world: int, signal_after: int | None) -> dict[str, Any]:
    """One run of the example under ``sgpu launch`` (tests/elastic_piece.py)."""
    return run_piece(
        cwd=tmp,
        command=_command(tmp, "run", world, 0.25),
        env=_env(tmp, JOB),
        log=tmp / "run.train.jsonl",
        job=JOB,
        world=world,
        signal_after=signal_after,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("acc")
    ref = subprocess.run(
        _command(tmp, "ref", 2, 0.0),
        cwd=tmp,
        env=_env(tmp, "1"),  # its own state directory: nothing to resume from
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert ref.returncode == 0, (ref.stdout + ref.stderr).decode()[-4000:]
    a = _piece(tmp, 2, signal_after=4)
    b = _piece(tmp, 1, signal_after=a["ack"]["step"] + 8)  # past the epoch boundary (10)
    c = _piece(tmp, 2, signal_after=None)
    return {"tmp": tmp, "pieces": [a, b, c]}


def _steps(log: list[dict[str, Any]]) -> list[int]:
    return [d["step"] for d in log if "loss" in d]


def test_checkpoint_after_the_signal_at_a_step_boundary(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    for piece, world in zip(runs["pieces"][:2], (2, 1), strict=True):
        step = piece["ack"]["step"]
        # The example logs a step before the loop counts it: the signal came after step
        # ``signalled_after`` was trained, and the save is at that boundary or the next.
        assert step in (piece["signalled_after"], piece["signalled_after"] + 1)
        assert piece["steps_while_held"] == step  # nothing trained after the checkpoint
        assert _steps(piece["log"])[-1] == step
        ckpt = tmp / "state" / JOB / "accelerate" / f"checkpoint-{step}"
        mark = json.loads((ckpt / "sgpu-elastic.json").read_text())
        assert mark["step"] == step and mark["world_size"] == world
        assert mark["global_batch"] == GLOBAL and mark["samples_seen"] == step * GLOBAL
        assert (mark["epoch"], mark["steps_in_epoch"]) == divmod(step, PER_EPOCH)
    a, b = runs["pieces"][0]["ack"], runs["pieces"][1]["ack"]
    assert (a["acks"], b["acks"]) == (1, 2)
    assert b["step"] > PER_EPOCH  # the 1-rank piece crossed an epoch boundary


def test_global_step_continues_and_the_global_batch_is_kept(runs: dict[str, Any]) -> None:
    a, b, c = runs["pieces"]
    starts = [p["log"][0] for p in (a, b, c)]
    assert [s["event"] for s in starts] == ["start"] * 3
    assert [(s["world"], s["accumulation"]) for s in starts] == [(2, 2), (1, 4), (2, 2)]
    assert starts[0]["resume_from"] is None
    assert starts[1]["resume_from"].endswith(f"checkpoint-{a['ack']['step']}")
    assert starts[2]["resume_from"].endswith(f"checkpoint-{b['ack']['step']}")
    steps = _steps(a["log"]) + _steps(b["log"]) + _steps(c["log"])
    assert steps == list(range(1, STEPS + 1))  # none lost, none repeated
    assert _steps(b["log"])[0] == a["ack"]["step"] + 1


def _indices(path: Path) -> dict[int, list[int]]:
    by_step: dict[int, list[int]] = {}
    for rec in jsonl(path):
        by_step.setdefault(rec["step"], []).extend(rec["idx"])
    return by_step


def test_every_sample_exactly_once_per_epoch_across_the_pieces(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    run, ref = _indices(tmp / "run.idx.jsonl"), _indices(tmp / "ref.idx.jsonl")
    assert sorted(run) == list(range(1, STEPS + 1))
    seen: dict[int, Counter[int]] = {}
    for step, indices in run.items():
        assert len(indices) == GLOBAL  # the global batch, at 2 and at 1 rank
        assert sorted(indices) == sorted(ref[step])  # the uninterrupted run's samples
        seen.setdefault((step - 1) // PER_EPOCH, Counter()).update(indices)
    for epoch in range(EPOCHS):
        assert seen[epoch] == Counter(range(SAMPLES))


def test_losses_and_weights_match_the_uninterrupted_run(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    ref = {d["step"]: d for d in jsonl(tmp / "ref.train.jsonl") if "loss" in d}
    resumed = [d for p in runs["pieces"] for d in p["log"] if "loss" in d]
    assert len(resumed) == STEPS
    for rec in resumed:
        # Same samples, the scheduler at the same step, the gradient the mean over the
        # same 8 samples: only the order of the float sums differs.
        assert rec["lr"] == pytest.approx(ref[rec["step"]]["lr"], rel=1e-12)
        assert math.isclose(rec["loss"], ref[rec["step"]]["loss"], rel_tol=1e-5, abs_tol=1e-7)
    final = torch.load(tmp / "run.final.pt")
    expected = torch.load(tmp / "ref.final.pt")
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-5, atol=1e-6)


def test_a_shuffling_loader_without_the_seedable_sampler_is_refused(tmp_path: Path) -> None:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from slurmgpu.elastic import accelerate as eacc
    from slurmgpu.elastic import init

    run = init(env={"SLURM_JOB_ID": "5"}, install_handlers=False, state_dir=tmp_path)
    accelerator = Accelerator(cpu=True)
    data = TensorDataset(torch.arange(16.0))
    loader = accelerator.prepare(DataLoader(data, batch_size=2, shuffle=True))
    with pytest.raises(ValueError, match="use_seedable_sampler=True"):
        eacc.attach(accelerator, run, loader, global_batch=8)
    ordered = accelerator.prepare(DataLoader(data, batch_size=2))
    with pytest.raises(ValueError, match="global batch 7 is not a multiple"):
        eacc.attach(accelerator, run, ordered, global_batch=7)
    loop = eacc.attach(accelerator, run, ordered, global_batch=8)
    assert accelerator.gradient_accumulation_steps == 4 and loop.resumed_from is None

"""slurmgpu.elastic.huggingface with real transformers on CPU: examples/hf_trainer_elastic.py
under ``sgpu launch -- torchrun`` (gloo) on 2 ranks is signalled mid-training, saves at the
next step boundary and acknowledges; it resumes at 1 rank (accumulation 2 -> 4), is
signalled again, and finishes at 2 ranks. Against an uninterrupted 2-rank run: the global
step carries on, the global batch stays 8, every step trains on the same samples (each
sample once per epoch across the pieces), and the losses and final weights agree."""

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
pytest.importorskip("transformers", reason="pip install 'slurmgpu[huggingface]'")

import torch

from tests.elastic_piece import jsonl, run_piece

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_trainer_elastic.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
JOB = "77"
STEPS, SAMPLES, GLOBAL = 30, 96, 8  # 12 steps per epoch: the pieces cross epochs
PER_EPOCH = SAMPLES // GLOBAL

pytestmark = pytest.mark.slow


def _env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "SLURM_JOB_ID": JOB,
        "SGPU_ELASTIC_DIR": str(tmp / "state"),
        "SGPU_CHECKPOINT_HOLD": "120",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def _command(tmp: Path, out: str, world: int, step_time: float) -> list[str]:
    return [
        str(TORCHRUN),
        "--standalone",
        f"--nproc-per-node={world}",
        str(EXAMPLE),
        "--output-dir",
        str(tmp / out),
        "--max-steps",
        str(STEPS),
        "--samples",
        str(SAMPLES),
        "--global-batch",
        str(GLOBAL),
        "--per-device-batch",
        "2",
        "--step-time",
        str(step_time),
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
        env=_env(tmp),
        log=tmp / "run.train.jsonl",
        job=JOB,
        world=world,
        signal_after=signal_after,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hf")
    ref = subprocess.run(
        _command(tmp, "ref", 2, 0.0),
        cwd=tmp,
        env=_env(tmp),
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert ref.returncode == 0, (ref.stdout + ref.stderr).decode()[-4000:]
    a = _piece(tmp, 2, signal_after=4)
    b = _piece(tmp, 1, signal_after=a["ack"]["step"] + 9)  # past the epoch boundary (12)
    c = _piece(tmp, 2, signal_after=None)
    return {"tmp": tmp, "pieces": [a, b, c]}


def _steps(log: list[dict[str, Any]]) -> list[int]:
    return [d["step"] for d in log if "loss" in d]


def test_checkpoint_after_the_signal_at_a_step_boundary(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    for piece, world in zip(runs["pieces"][:2], (2, 1), strict=True):
        step = piece["ack"]["step"]
        assert step > piece["signalled_after"]  # the step under way when signalled, or later
        assert piece["steps_while_held"] == step  # nothing trained after the checkpoint
        assert _steps(piece["log"])[-1] == step
        mark = json.loads((tmp / "run" / f"checkpoint-{step}" / "sgpu-elastic.json").read_text())
        assert mark["step"] == step and mark["world_size"] == world
        assert mark["global_batch"] == GLOBAL and mark["samples_seen"] == step * GLOBAL
    a, b = runs["pieces"][0]["ack"], runs["pieces"][1]["ack"]
    assert (a["acks"], b["acks"]) == (1, 2)


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
    """Step -> the sample indices all ranks trained on in it."""
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
    assert seen[0] == Counter(range(SAMPLES)) and seen[1] == Counter(range(SAMPLES))
    assert set(seen[2].values()) == {1} and len(seen[2]) == (STEPS - 2 * PER_EPOCH) * GLOBAL


def test_losses_and_weights_match_the_uninterrupted_run(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    ref = {d["step"]: d for d in jsonl(tmp / "ref.train.jsonl") if "loss" in d}
    resumed = [d for p in runs["pieces"] for d in p["log"] if "loss" in d]
    assert len(resumed) == STEPS
    for rec in resumed:
        # Same samples per step, same lr (the schedule is at the same global step), the
        # gradient the mean over the same 8 samples: only the order of the float sums
        # differs (accumulation over 4 micro-batches vs 2 + all-reduce), ~1e-7 relative
        # per step, compounded over 30 steps.
        assert rec["lr"] == pytest.approx(ref[rec["step"]]["lr"], rel=1e-12)
        assert math.isclose(rec["loss"], ref[rec["step"]]["loss"], rel_tol=1e-5, abs_tol=1e-7)
    final = torch.load(tmp / "run" / "final.pt")
    expected = torch.load(tmp / "ref" / "final.pt")
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-5, atol=1e-6)


def _tiny_trainer(tmp: Path) -> Any:
    """A one-process Trainer over the example's model (loaded from its file)."""
    import importlib.util

    from transformers import Trainer, TrainingArguments

    spec = importlib.util.spec_from_file_location("hf_trainer_elastic", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = TrainingArguments(
        output_dir=str(tmp / "out"),
        per_device_train_batch_size=2,
        seed=3,
        use_cpu=True,
        report_to="none",
    )
    model = example.TinyModel(example.TinyConfig())
    return Trainer(model=model, args=args, train_dataset=example.Synthetic(8, 8, 0))


def test_rng_files_are_loaded_only_at_the_size_that_wrote_them(tmp_path: Path) -> None:
    from slurmgpu.elastic import huggingface as ehf
    from slurmgpu.elastic import init

    trainer = _tiny_trainer(tmp_path)
    run = init(env={"SLURM_JOB_ID": "5"}, install_handlers=False, state_dir=tmp_path / "s")
    assert ehf.attach(trainer, run) is None  # nothing saved yet: a fresh start
    torch.manual_seed(1234)
    saved = torch.get_rng_state()
    for world in (1, 2):  # the checkpoint's size; this process is a world of 1
        ckpt = tmp_path / "out" / f"checkpoint-{world}0"
        ckpt.mkdir(parents=True)
        trainer._save_rng_state(str(ckpt))  # what the Trainer writes at a world of 1
        (ckpt / "trainer_state.json").write_text("{}")
        mark = {"step": world * 10, "world_size": world, "devices": 0, "global_batch": 2}
        (ckpt / ehf.CHECKPOINT_MARK).write_text(json.dumps(mark))
    torch.manual_seed(99)
    trainer._load_rng_state(str(tmp_path / "out" / "checkpoint-10"))
    assert torch.equal(torch.get_rng_state(), saved)  # same size: the Trainer's restore
    ehf.seed_everything(3, 20, 0)
    expected = torch.get_rng_state()
    torch.manual_seed(99)
    trainer._load_rng_state(str(tmp_path / "out" / "checkpoint-20"))
    assert torch.equal(torch.get_rng_state(), expected)  # another size: seed, step, rank
    assert not torch.equal(expected, saved)
    # The newest checkpoint is picked, and one at another global batch is refused.
    assert ehf.attach(_tiny_trainer(tmp_path), run) == str(tmp_path / "out" / "checkpoint-20")
    (tmp_path / "out" / "checkpoint-20" / ehf.CHECKPOINT_MARK).write_text(
        json.dumps({"step": 20, "world_size": 2, "global_batch": 16})
    )
    with pytest.raises(ValueError, match="global batch 16"):
        ehf.attach(_tiny_trainer(tmp_path), run)

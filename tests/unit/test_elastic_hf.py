"""slurmgpu.elastic.huggingface without transformers: the accumulation rule and which
checkpoint a resumed run picks (the Trainer itself: tests/integration/test_elastic_hf.py)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmgpu.elastic import huggingface as ehf


@pytest.mark.parametrize(("world", "steps"), [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_accumulation_keeps_the_global_batch(world: int, steps: int) -> None:
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=1)
    plan = ehf.keep_global_batch(args, 32, world_size=world)
    assert args.gradient_accumulation_steps == steps == plan.gradient_accumulation_steps
    assert 4 * steps * world == 32 == plan.global_batch


def test_accumulation_defaults_to_the_arguments_world_size() -> None:
    args = SimpleNamespace(
        per_device_train_batch_size=2, gradient_accumulation_steps=1, world_size=3
    )
    assert ehf.keep_global_batch(args, 12).gradient_accumulation_steps == 2


@pytest.mark.parametrize(("batch", "world"), [(30, 4), (4, 2), (0, 1)])
def test_a_global_batch_that_does_not_split_is_refused(batch: int, world: int) -> None:
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=1)
    with pytest.raises(ValueError, match="not a multiple"):
        ehf.keep_global_batch(args, batch, world_size=world)
    assert args.gradient_accumulation_steps == 1


@pytest.fixture
def handlers_restored() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_init_makes_the_signals_flags_and_plans_the_batch(
    handlers_restored: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"SLURM_JOB_ID": "41", "SGPU_ELASTIC_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    args = SimpleNamespace(
        per_device_train_batch_size=2, gradient_accumulation_steps=1, world_size=2
    )
    run = ehf.init(args, global_batch=16)
    assert (run.job_id, args.gradient_accumulation_steps) == (41, 4)
    signal.raise_signal(signal.SIGUSR2)  # a flag now, not the default death
    assert run.checkpoint_requested and not run.stop_requested
    ehf.init(args)  # no global batch: the arguments' accumulation stays
    assert args.gradient_accumulation_steps == 4
    with pytest.raises(ValueError, match="not a multiple"):
        ehf.init(args, global_batch=6)


def _checkpoint(base: Path, step: int, *, marked: bool = True, state: bool = True) -> Path:
    path = base / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if marked:
        (path / ehf.CHECKPOINT_MARK).write_text(json.dumps({"step": step, "world_size": 2}))
    return path


def test_the_newest_complete_checkpoint_by_step_not_by_name(tmp_path: Path) -> None:
    assert ehf.latest_checkpoint(tmp_path / "missing") is None
    assert ehf.latest_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 9)
    newest = _checkpoint(tmp_path, 10)  # "checkpoint-10" < "checkpoint-9" as strings
    _checkpoint(tmp_path, 12, marked=False)  # a save killed before every rank finished
    _checkpoint(tmp_path, 13, state=False)  # rank 0's trainer_state.json never written
    (tmp_path / "checkpoint-14.tmp").mkdir()
    assert ehf.latest_checkpoint(tmp_path) == str(newest)
    assert ehf.read_mark(newest) == {"step": 10, "world_size": 2}
    assert ehf.read_mark(tmp_path / "checkpoint-12") is None

"""slurmgpu.elastic.torch with real torch on CPU: a DDP training on 4 gloo processes saves
one checkpoint; resumed at 4 it goes on bit-identically (dropout's RNG included), resumed
at 2 it loads the same tensors and follows the uninterrupted run's losses; the elastic
sampler trains on every sample exactly once per epoch across the resize; the batch/LR
rule and its re-application after loading an optimizer and scheduler."""

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

from slurmgpu.elastic import init
from slurmgpu.elastic.scaling import scaled_lr
from tests.ports import free_port

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

from slurmgpu.elastic import torch as etorch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _ddp(world: int, scenario: str, state_dir: Path, out: Path) -> dict[str, Any]:
    """Run ``scenario`` on ``world`` gloo ranks; return rank 0's record."""
    codes, outputs = _ddp_once(world, scenario, state_dir, out)
    for rank, (code, text) in enumerate(zip(codes, outputs, strict=True)):
        assert code == 0, f"rank {rank} of {scenario} exited {code}:\n{text}"
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _ddp_once(world: int, scenario: str, state_dir: Path, out: Path) -> tuple[list[int], list[str]]:
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "SLURM_JOB_ID": "41",
            "SGPU_ELASTIC_DIR": str(state_dir),
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.elastic_torch_worker",
                    scenario,
                    str(out),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = [p.communicate(timeout=300)[0].decode() for p in procs]
    return [p.returncode for p in procs], outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ddp")
    ref = _ddp(4, "reference", tmp, tmp / "ref.json")
    at2 = _ddp(2, "resume", tmp, tmp / "at2.json")
    return {"ref": ref, "at2": at2}


def _flat(shares: list[list[int]]) -> list[int]:
    return [i for share in shares for i in share]


def _steps(record: dict[str, Any], after: int = 0) -> dict[int, dict[str, Any]]:
    return {int(k): v for k, v in record["steps"].items() if int(k) > after}


@pytest.mark.slow
def test_saved_at_4_resumed_at_4_is_bit_identical(runs: dict[str, Any]) -> None:
    ref = runs["ref"]
    assert ref["resumed_at"] and ref["resumed_step"] == 6
    original, resumed = _steps(ref["dropout"], 6), _steps(ref["dropout_resumed"])
    assert sorted(resumed) == list(range(7, 17))  # no step lost or repeated
    for step, rec in resumed.items():
        assert rec["loss"] == original[step]["loss"]  # exactly, dropout masks included
        assert rec["indices"] == original[step]["indices"]
        assert rec["lr"] == original[step]["lr"]
        assert rec["params"] == original[step]["params"]
    assert ref["dropout_resumed"]["params"] == ref["dropout"]["params"]


@pytest.mark.slow
def test_saved_at_4_resumed_at_2_continues_the_same_run(runs: dict[str, Any]) -> None:
    ref, at2 = runs["ref"]["plain"], runs["at2"]
    assert at2["resumed_at"] and at2["resumed_step"] == 6
    assert at2["loaded_equal"]  # the tensors loaded are the tensors saved, bit for bit
    original, resumed = _steps(ref, 6), _steps(at2["plain"])
    assert sorted(resumed) == list(range(7, 17))
    for step, rec in resumed.items():
        # Same global batch, same samples, same lr: only the all-reduce's summation order
        # differs between 4 and 2 ranks.
        assert rec["lr"] == original[step]["lr"]
        assert math.isclose(rec["loss"], original[step]["loss"], rel_tol=1e-4, abs_tol=1e-6)
        assert sorted(_flat(rec["indices"])) == sorted(_flat(original[step]["indices"]))
    for a, b in zip(at2["plain"]["params"], ref["params"], strict=True):
        close = (math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5) for x, y in zip(a, b, strict=True))
        assert all(close)


@pytest.mark.slow
def test_every_sample_exactly_once_per_epoch_across_the_resize(runs: dict[str, Any]) -> None:
    before = _steps(runs["ref"]["plain"])
    after = _steps(runs["at2"]["plain"])
    seen: dict[int, Counter[int]] = {}
    for steps, world in ((range(1, 7), 4), (range(7, 17), 2)):
        for step in steps:
            rec = before[step] if world == 4 else after[step]
            assert len(rec["indices"]) == world
            assert all(len(share) == 8 // world for share in rec["indices"])
            seen.setdefault(rec["epoch"], Counter()).update(_flat(rec["indices"]))
    assert seen[0] == Counter(range(96))  # epoch 0: 6 steps at 4 ranks, 6 at 2
    assert set(seen[1].values()) == {1}  # epoch 1 so far: nothing twice


def test_resumed_is_true_for_a_torch_checkpoint(tmp_path: Path) -> None:
    run = init({"SLURM_JOB_ID": "3", "SGPU_ELASTIC_DIR": str(tmp_path)}, install_handlers=False)
    assert not run.resumed
    model = torch.nn.Linear(2, 1)
    state = etorch.TrainingState(run, model=model)
    state.step = 5
    assert state.save()
    assert run.resumed and (tmp_path / "3" / "checkpoint.pt").exists()
    again = etorch.TrainingState(run, model=torch.nn.Linear(2, 1))
    assert again.load() and again.step == 5
    assert torch.equal(again.model.weight, model.weight)


def test_sampler_resumes_mid_epoch_at_any_size_without_repeats() -> None:
    n, g = 50, 6  # the last global batch is short (50 = 8 * 6 + 2)
    first = [etorch.ElasticSampler(n, g, rank=r, world_size=3, seed=9) for r in range(3)]
    seen: Counter[int] = Counter()
    for _ in range(4):
        for s in first:
            seen.update(next(iter(s)))
        for s in first:
            s.advance()
    saved = first[0].state_dict()
    assert saved["consumed"] == 24
    second = [etorch.ElasticSampler(n, g, rank=r, world_size=2, seed=9) for r in range(2)]
    for s in second:
        s.load_state_dict(saved)
    batches = [list(s) for s in second]
    assert len(second[0]) == len(batches[0]) == 5
    for share in zip(*batches, strict=True):
        seen.update(share[0] + share[1])
    assert seen == Counter(range(n))
    assert [len(b) for b in batches[0]] == [3, 3, 3, 3, 1]
    assert second[0].permutation() == first[0].permutation()  # same epoch, same order
    for s in second:
        s.advance(5)
    assert second[0].epoch_done
    second[0].set_epoch(1)
    assert second[0].consumed == 0 and second[0].permutation() != first[0].permutation()
    with pytest.raises(ValueError, match="seed"):
        etorch.ElasticSampler(n, g, seed=10).load_state_dict(saved)


def test_batch_plan_rules() -> None:
    kept = etorch.plan_batch(2, base_lr=0.1, global_batch=64)
    assert (kept.global_batch, kept.local_batch, kept.lr, kept.lr_scale) == (64, 32, 0.1, 1.0)
    with pytest.raises(ValueError, match="evenly"):
        etorch.plan_batch(3, base_lr=0.1, global_batch=64)
    with pytest.raises(ValueError, match="exactly one"):
        etorch.plan_batch(2, base_lr=0.1)
    grown = etorch.plan_batch(4, base_lr=0.1, per_rank_batch=16, base_world_size=2, rule="sqrt")
    assert (grown.global_batch, grown.local_batch) == (64, 16)
    assert math.isclose(grown.lr, 0.1 * math.sqrt(2))
    lin = etorch.plan_batch(1, base_lr=0.1, per_rank_batch=16, base_world_size=2, rule="linear")
    assert math.isclose(lin.lr, 0.05) and math.isclose(lin.lr_scale, 0.5)
    ada = etorch.plan_batch(4, base_lr=0.1, per_rank_batch=16, rule="adascale", var=1.0, sqr=1.0)
    assert math.isclose(ada.lr, scaled_lr(0.1, 16, 64, "adascale", var=1.0, sqr=1.0))


def test_lr_is_rescaled_after_loading_optimizer_and_scheduler(tmp_path: Path) -> None:
    """Saved at 4 ranks (sqrt rule), loaded at 2: the optimizer's and scheduler's state
    dicts bring the old rate back; load() then applies the new size's rule to both."""
    run = init({"SLURM_JOB_ID": "4", "SGPU_ELASTIC_DIR": str(tmp_path)}, install_handlers=False)

    def parts(world: int) -> tuple[Any, Any, Any, etorch.TrainingState]:
        plan = etorch.plan_batch(world, base_lr=0.1, per_rank_batch=8, rule="sqrt")
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=plan.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** (step // 2))
        return (
            model,
            opt,
            sched,
            etorch.TrainingState(run, model=model, optimizer=opt, scheduler=sched, plan=plan),
        )

    _, opt4, sched4, state4 = parts(4)
    for _ in range(3):
        opt4.step()
        sched4.step()
    assert math.isclose(opt4.param_groups[0]["lr"], 0.1 * 2 * 0.5)  # sqrt(4) * 0.5^1
    state4.save()
    _, opt2, sched2, state2 = parts(2)
    assert state2.load()
    assert math.isclose(opt2.param_groups[0]["lr"], 0.1 * math.sqrt(2) * 0.5)
    opt2.step()
    sched2.step()  # step 4: the schedule goes on at the new scale
    assert math.isclose(opt2.param_groups[0]["lr"], 0.1 * math.sqrt(2) * 0.25)
    assert math.isclose(sched2.get_last_lr()[0], 0.1 * math.sqrt(2) * 0.25)


def test_after_the_checkpoint_the_process_exits_at_once_without_teardown(tmp_path: Path) -> None:
    """SIGTERM after a durable checkpoint ends the process with os._exit(0): atexit hooks
    (and torch's teardown) do not run, and the checkpoint is complete."""
    marker = tmp_path / "atexit-ran"
    code = f"""
import atexit, pathlib, torch
from slurmgpu import elastic
from slurmgpu.elastic import torch as etorch
atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text("x"))
run = elastic.init(install_handlers=False)
state = etorch.TrainingState(run, model=torch.nn.Linear(4, 4))
state.step = 3
run.request_checkpoint(stop=True)
state.checkpoint()
print("not reached")
"""
    env = {**os.environ, "SLURM_JOB_ID": "5", "SGPU_ELASTIC_DIR": str(tmp_path)}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "not reached" not in proc.stdout
    assert not marker.exists()
    loaded = torch.load(tmp_path / "5" / "checkpoint.pt", weights_only=False)
    assert loaded["step"] == 3
    ack = json.loads((tmp_path / "5" / "ack.json").read_text())
    assert ack["step"] == 3


def test_a_signal_during_agree_all_reduce_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks wait for each other inside agree()'s all-reduce, so that is where a signal
    usually lands; its handler runs right after the collective returns. It must not be
    overwritten by the (older) agreed value: the next step's agree() sees it."""
    dist = torch.distributed
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        run = init({"SLURM_JOB_ID": "6", "SGPU_ELASTIC_DIR": str(tmp_path)}, install_handlers=False)
        real = dist.all_reduce

        def all_reduce_then_signal(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            run.request_checkpoint()  # what the handler does when the collective returns
            return out

        monkeypatch.setattr(dist, "all_reduce", all_reduce_then_signal)
        assert etorch.agree(run) is False  # nobody had asked when the flags were read
        assert run.checkpoint_requested
        monkeypatch.setattr(dist, "all_reduce", real)
        assert etorch.agree(run) is True  # the next step: every rank checkpoints
    finally:
        dist.destroy_process_group()

"""slurmgpu.elastic.lightning with real Lightning on CPU (gloo): an ordinary LightningModule
(tests/integration/lightning_worker.py, three added lines) runs under ``sgpu launch`` +
torchrun at 2 ranks, is signalled mid-epoch and requeued, resumes at 1 rank (gradient
accumulation keeps the global batch), is signalled and requeued again, and finishes at 2
ranks. Compared with an uninterrupted 2-rank run of the same seed:

- each checkpoint was written at the first optimizer-step boundary after the signal (the
  step in flight finished; nothing trained after it; Lightning's loop state is the one of
  ``on_train_batch_end``), and ``ack.json`` names that step;
- every sample of each epoch was trained on exactly once across the three runs, each
  step on the same 8 samples as the reference's step (2 x 4 at 2 ranks, 2 micro-batches of
  4 at 1 rank);
- the learning rate of every step and its loss (mean over the step's 8 samples, before the
  update) match the reference: rel. 1e-4, see ``test_losses_follow_the_uninterrupted_run``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

# Not imported here: collecting this module in the unit tier (where it is deselected) must
# not pay for importing lightning and torch.
if importlib.util.find_spec("lightning") is None or importlib.util.find_spec("torch") is None:
    pytest.skip(
        "lightning is not installed (pip install 'slurmgpu[lightning]')", allow_module_level=True
    )

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "lightning_worker.py"
STEPS_PER_EPOCH = 12  # 96 samples / global batch 8
LAUNCH = "import sys; from slurmgpu.elastic.launcher import main; sys.exit(main(sys.argv[1:]))"


def _start(world: int, label: str, out: Path, state: Path, job: int, sleep: float) -> Any:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SLURM_JOB_ID": str(job),
        "SGPU_ELASTIC_DIR": str(state),
        "SGPU_CHECKPOINT_HOLD": "120",
        "WORKER_RUN": label,
        "WORKER_STEP_SLEEP": str(sleep),
        "OMP_NUM_THREADS": "1",
    }
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [sys.executable, "-c", LAUNCH, torchrun, "--standalone"]
    cmd += [f"--nproc-per-node={world}", str(WORKER), str(out)]
    log = (out / f"{label}.out").open("w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _records(out: Path, label: str) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for path in sorted(out.glob(f"{label}.rank*.jsonl")):
        recs += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return recs


def _wait(pred: Any, what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _resized_piece(
    world: int, label: str, out: Path, state: Path, signal_after_step: int
) -> dict[str, Any]:
    """Run until step ``signal_after_step`` is under way, signal the launcher (as the
    daemon's ``scancel --full`` would), wait for the ack, then SIGTERM it (the requeue)."""
    ack_path = state / "51" / "ack.json"
    acks_before = json.loads(ack_path.read_text())["acks"] if ack_path.exists() else 0
    proc = _start(world, label, out, state, 51, sleep=0.3)
    try:
        _wait(
            lambda: any(r["step"] >= signal_after_step for r in _records(out, label)),
            f"{label} to reach step {signal_after_step}",
        )
        signalled_at = time.time()
        proc.send_signal(signal.SIGUSR2)

        def acked() -> bool:
            try:
                return bool(json.loads(ack_path.read_text())["acks"] > acks_before)
            except (OSError, ValueError, KeyError):
                return False

        _wait(acked, f"{label}'s ack")
        ack = json.loads(ack_path.read_text())
        time.sleep(1.0)  # holding: nothing may train now
        held = _records(out, label)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The workers leave by themselves (os._exit(0) after the durable checkpoint); the
    # launcher then kills torchrun at once rather than wait for its teardown, as in a
    # real requeue, so its own status is 0 or torchrun's 137.
    text = (out / f"{label}.out").read_text()
    assert code in (0, 137), text[-4000:]
    launched = [json.loads(x) for x in (state / "51" / "launch.jsonl").read_text().splitlines()]
    this_run = launched[max(i for i, e in enumerate(launched) if e["event"] == "start") :]
    kills = [e for e in this_run if e["event"] == "killed"]
    assert all(e["why"] == "the training processes have exited" for e in kills), this_run
    assert "lightning_worker.py" not in text.split("stop_signal", 1)[-1], text[-4000:]
    import torch

    ckpt = torch.load(state / "51" / "lightning.ckpt", map_location="cpu", weights_only=False)
    return {
        "signalled_at": signalled_at,
        "ack": ack,
        "held": held,
        "records": _records(out, label),
        "ckpt_step": int(ckpt["global_step"]),
        "progress": ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"],
        "sgpu": ckpt["callbacks"][next(k for k in ckpt["callbacks"] if "ElasticCallback" in k)],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("lightning")
    state = out / "state"
    ref = _start(2, "ref", out, state, 52, sleep=0.0)
    assert ref.wait(timeout=300) == 0, (out / "ref.out").read_text()[-4000:]
    a = _resized_piece(2, "a", out, state, signal_after_step=3)
    b = _resized_piece(1, "b", out, state, signal_after_step=a["ckpt_step"] + 2)
    last = _start(2, "c", out, state, 51, sleep=0.0)
    assert last.wait(timeout=300) == 0, (out / "c.out").read_text()[-4000:]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return {"ref": _records(out, "ref"), "a": a, "b": b, "c": _records(out, "c"), "events": events}


def _by_step(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    steps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        steps[r["step"]].append(r)
    return steps


def _all_steps(runs: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    return _by_step(runs["a"]["records"] + runs["b"]["records"] + runs["c"])


def test_checkpoints_are_taken_at_the_next_step_boundary_after_the_signal(
    runs: dict[str, Any],
) -> None:
    for piece, accumulate in ((runs["a"], 1), (runs["b"], 2)):
        steps = _by_step(piece["records"])
        started_before = max(s for s, rs in steps.items() if rs[0]["at"] < piece["signalled_at"])
        # The step in flight when the signal came finished, and then the run checkpointed:
        # no later step was started, none while holding for the requeue either.
        assert piece["ckpt_step"] == piece["ack"]["step"]
        assert piece["ckpt_step"] in (started_before + 1, started_before + 2)
        assert max(steps) == piece["ckpt_step"] - 1
        assert len(piece["held"]) == len(piece["records"])
        # Lightning's loop state is the one of on_train_batch_end after an optimizer step.
        progress = piece["progress"]
        assert progress["ready"] == progress["processed"] == progress["completed"] + 1
        assert progress["ready"] % accumulate == 0
        assert piece["sgpu"]["accumulate"] == accumulate
    assert runs["b"]["ack"]["acks"] == runs["a"]["ack"]["acks"] + 1
    assert runs["a"]["ckpt_step"] < runs["b"]["ckpt_step"] < STEPS_PER_EPOCH  # mid-epoch


def test_every_sample_exactly_once_per_epoch_and_the_global_batch_is_kept(
    runs: dict[str, Any],
) -> None:
    steps = _all_steps(runs)
    assert sorted(steps) == list(range(2 * STEPS_PER_EPOCH))  # no step lost or repeated
    seen: dict[int, Counter[int]] = defaultdict(Counter)
    ref = _by_step(runs["ref"])
    b_steps = set(_by_step(runs["b"]["records"]))
    for step, recs in steps.items():
        indices = [i for r in recs for i in r["indices"]]
        assert len(indices) == 8  # the global batch, at 2 ranks and at 1 (4 + 4)
        assert sorted(indices) == sorted(i for r in ref[step] for i in r["indices"])
        if step in b_steps:
            assert {(r["world"], r["accumulate"]) for r in recs} == {(1, 2)} and len(recs) == 2
        else:
            assert {(r["world"], r["accumulate"]) for r in recs} == {(2, 1)} and len(recs) == 2
        seen[recs[0]["epoch"]].update(indices)
    assert seen[0] == Counter(range(96)) and seen[1] == Counter(range(96))


def test_losses_follow_the_uninterrupted_run(runs: dict[str, Any]) -> None:
    """Same samples per step, same learning rate, the gradient the mean over the same 8
    samples (DDP's average of two means of 4 = accumulation's two means of 4 divided by 2):
    only the summation order differs, a float rounding (~1e-7) per step, grown over 24
    steps of momentum SGD to well under 1e-4 relative. A sample repeated or skipped, a
    wrong lr, a gradient not divided by the accumulation or a lost optimizer/scheduler
    state each changes the loss at the 1e-2 level."""
    steps, ref = _all_steps(runs), _by_step(runs["ref"])
    for step, recs in steps.items():
        loss = sum(r["loss"] for r in recs) / len(recs)
        want = sum(r["loss"] for r in ref[step]) / len(ref[step])
        assert math.isclose(loss, want, rel_tol=1e-4, abs_tol=1e-6), (step, loss, want)
        assert recs[0]["lr"] == pytest.approx(ref[step][0]["lr"], rel=1e-12)
    assert ref[23][0]["lr"] == pytest.approx(0.1 * 0.5**2)  # the schedule did step


def test_resumes_report_the_size_they_came_from(runs: dict[str, Any]) -> None:
    resumed = [e for e in runs["events"] if e.get("event") == "resumed" and e["rank"] == 0]
    assert [(e["run"], e["from_world"], e["step"]) for e in resumed] == [
        ("b", 2, runs["a"]["ckpt_step"]),
        ("c", 1, runs["b"]["ckpt_step"]),
    ]


def test_a_checkpoint_at_an_epochs_last_step_resumes_with_the_next_epoch(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """Signalled during the epoch's last step, the run checkpoints with the epoch used up:
    the next run starts the next epoch's permutation (before the fix it found the sampler
    empty and trained nothing more). One rank, no launcher: the worker is signalled
    directly, as srun would relay it. The last step sleeps 1 s after its record is written,
    so the signal lands inside it even on a loaded host."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SLURM_JOB_ID": "61",
        "SGPU_ELASTIC_DIR": str(tmp_path / "state"),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, str(WORKER), str(tmp_path)]
    first = subprocess.Popen(cmd, env={**env, "WORKER_RUN": "x", "WORKER_STEP_SLEEP": "1.0"})
    try:
        last = STEPS_PER_EPOCH - 1
        _wait(lambda: any(r["step"] >= last for r in _records(tmp_path, "x")), "the last step")
        first.send_signal(signal.SIGUSR2)
        ack = tmp_path / "state" / "61" / "ack.json"
        _wait(ack.exists, "the ack")
        assert json.loads(ack.read_text())["step"] == STEPS_PER_EPOCH
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 0
    finally:
        if first.poll() is None:
            first.kill()
    second = subprocess.run(cmd, env={**env, "WORKER_RUN": "y"}, timeout=300, check=False)
    assert second.returncode == 0
    steps = _by_step(_records(tmp_path, "x") + _records(tmp_path, "y"))
    ref = _by_step(runs["ref"])
    assert sorted(steps) == list(range(2 * STEPS_PER_EPOCH))
    for step, recs in steps.items():
        assert recs[0]["epoch"] == step // STEPS_PER_EPOCH
        mine = sorted(i for r in recs for i in r["indices"])
        assert mine == sorted(i for r in ref[step] for i in r["indices"])


def test_a_run_that_began_at_an_epoch_boundary_checkpoints_at_the_next_one(
    tmp_path: Path,
) -> None:
    """Twice at an epoch's last step: the second run itself began at an epoch boundary and
    checkpoints at the end of its first epoch. Seen on the lab (2 -> 1 -> 2 ranks, a
    resize at steps 48 and 84 of 12-step epochs): Lightning restored the second
    checkpoint without counting the saved epoch as finished, and the third run trained
    that epoch's samples again. Every step of three epochs once, each sample once per
    epoch."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SLURM_JOB_ID": "62",
        "SGPU_ELASTIC_DIR": str(tmp_path / "state"),
        "OMP_NUM_THREADS": "1",
        "WORKER_EPOCHS": "3",
    }
    cmd = [sys.executable, str(WORKER), str(tmp_path)]
    ack = tmp_path / "state" / "62" / "ack.json"
    for run, last in (("x", STEPS_PER_EPOCH - 1), ("y", 2 * STEPS_PER_EPOCH - 1)):
        proc = subprocess.Popen(cmd, env={**env, "WORKER_RUN": run, "WORKER_STEP_SLEEP": "1.0"})
        try:
            _wait(lambda r=run, s=last: any(x["step"] >= s for x in _records(tmp_path, r)), run)
            proc.send_signal(signal.SIGUSR2)
            _wait(lambda s=last: ack.exists() and json.loads(ack.read_text())["step"] == s + 1, run)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    third = subprocess.run(cmd, env={**env, "WORKER_RUN": "z"}, timeout=300, check=False)
    assert third.returncode == 0
    steps = _by_step(_records(tmp_path, "x") + _records(tmp_path, "y") + _records(tmp_path, "z"))
    assert sorted(steps) == list(range(3 * STEPS_PER_EPOCH))
    for step, recs in steps.items():
        assert recs[0]["epoch"] == step // STEPS_PER_EPOCH, step
    for epoch in range(3):
        seen = [
            i
            for step in range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH)
            for r in steps[step]
            for i in r["indices"]
        ]
        assert sorted(seen) == list(range(96)), f"epoch {epoch}"


def test_per_rank_plans_scale_the_learning_rate_and_rescale_it_on_resume(tmp_path: Path) -> None:
    """``per_rank_batch=`` with the linear rule: a fresh run's optimizer starts at the
    plan's scale of the module's rate; resumed under another plan (another size) the rate
    Lightning restores is multiplied by new/saved, the scheduler's base rates too. In one
    process (world 1, the size change stands in by another ``base_world_size``); hold 0,
    so after its ack the run trains on instead of waiting for a requeue. With validation,
    and a SIGTERM-free sanity check: Lightning's own handler must not be left in place."""
    import lightning.pytorch as pl
    import torch

    from slurmgpu.elastic.lightning import ElasticLightning
    from tests.integration import lightning_worker as w

    env = {"SLURM_JOB_ID": "71", "SGPU_ELASTIC_DIR": str(tmp_path), "SGPU_CHECKPOINT_HOLD": "0"}

    class Module(w.Regression):
        lrs: list[float]
        request: bool
        handlers: list[Any]

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
            self.handlers.append(signal.getsignal(signal.SIGTERM))
            if self.trainer.global_step == 3 and self.request:
                self.request = False
                elastic.run.request_checkpoint()
            return super().training_step(batch, batch_idx)

        # Validation too: Lightning's sanity check and epoch-end validation around the
        # checkpoint and the resume (the callback's handlers go in before the sanity check).
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            _, x, y = batch
            self.handlers.append(signal.getsignal(signal.SIGTERM))
            return torch.nn.functional.mse_loss(self.net(x), y)

        def val_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(w.Indexed(), batch_size=16)

    def fit(base_world: int, epochs: int) -> Any:
        model = Module(tmp_path / "log.jsonl", 0.0)
        model.lrs, model.request, model.handlers = [], True, []
        trainer = pl.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            **elastic.trainer_kwargs(),
        )
        trainer.fit(model)
        # In the sanity check and in every step SIGTERM was the runtime's, never Lightning's.
        assert model.handlers and all(h == elastic.run._on_term for h in model.handlers)
        return model, trainer

    elastic = ElasticLightning(per_rank_batch=4, base_world_size=2, rule="linear", env=env)
    assert elastic.plan.lr_scale == 0.5
    first, _ = fit(2, epochs=1)
    assert first.lrs[0] == pytest.approx(0.1 * 0.5)  # 1 rank of the 2 it was tuned at
    assert json.loads((tmp_path / "71" / "ack.json").read_text())["step"] == 4
    elastic = ElasticLightning(per_rank_batch=4, base_world_size=4, rule="linear", env=env)
    second, trainer = fit(4, epochs=2)
    # Resumed at step 4 (StepLR: 10 steps, not yet decayed): 0.05 * 0.25 / 0.5.
    assert second.lrs[0] == pytest.approx(0.1 * 0.25)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.base_lrs == [pytest.approx(0.1 * 0.25)]
    # Steps 4..47 (2 epochs of 24 at 4 samples): step 47's rate has decayed 4 times.
    assert len(second.lrs) == 44 and second.lrs[-1] == pytest.approx(0.1 * 0.25 * 0.5**4)

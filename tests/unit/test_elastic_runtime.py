"""slurmgpu.elastic inside a job: identity from the environment, signals as flags,
atomic checkpoints, acknowledgements the daemon can read (and cannot be fooled by), and
the example training continuing across a resize as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmgpu.elastic import init
from slurmgpu.elastic.spec import parse_range, read_ack, read_progress
from slurmgpu.tokens import Malleable, malleable_token, parse
from tests.polling import wait_for
from tests.signal_storm import storm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_train.py"


def test_init_reads_job_rank_world_and_gpus_from_slurm_and_torchrun(tmp_path: Path) -> None:
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_RESTART_COUNT": "2",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "8",
        "SLURM_JOB_NUM_NODES": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SGPU_ELASTIC_DIR": str(tmp_path),
        "SGPU_CHECKPOINT_SIGNAL": "USR1",
    }
    run = init(env, install_handlers=False)
    assert (run.job_id, run.restart_count, run.rank, run.world_size) == (77, 2, 3, 8)
    assert (run.local_gpus, run.nodes, run.gpus) == (2, 2, 4)
    assert run.checkpoint_signal is signal.SIGUSR1
    assert run.dir == tmp_path / "77"
    assert not run.is_rank0
    torch_env = {**env, "RANK": "0", "WORLD_SIZE": "4"}
    assert init(torch_env, install_handlers=False).rank == 0
    bare = init({"SLURM_SUBMIT_DIR": str(tmp_path)}, install_handlers=False)
    assert bare.state_dir == tmp_path / ".sgpu-elastic"
    assert bare.restart_count == 0 and bare.world_size == 1


def test_checkpoint_resume_and_the_ack_counter_across_runs(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "5", "SGPU_ELASTIC_DIR": str(tmp_path), "SGPU_CHECKPOINT_HOLD": "0"}
    run = init(env, install_handlers=False)
    assert run.resume(default="fresh") == "fresh"
    assert run.checkpoint({"step": 3, "w": [1.0]})  # no request: saved, no ack
    assert read_ack(tmp_path, 5) is None
    run.request_checkpoint()
    assert run.checkpoint({"step": 4, "w": [2.0]})  # answered; nobody requeued: go on
    ack = read_ack(tmp_path, 5)
    assert ack is not None and (ack.acks, ack.step, ack.restart_count) == (1, 4, 0)
    again = init({**env, "SLURM_RESTART_COUNT": "1"}, install_handlers=False)
    assert again.resume() == {"step": 4, "w": [2.0]}
    again.request_checkpoint()
    again.checkpoint({"step": 9})
    ack = read_ack(tmp_path, 5)
    assert ack is not None and (ack.acks, ack.restart_count, ack.step) == (2, 1, 9)
    assert not list((tmp_path / "5").glob(".*.tmp"))  # no temporary files left


def test_sigterm_after_the_checkpoint_ends_the_run_cleanly(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "6", "SGPU_ELASTIC_DIR": str(tmp_path)}
    run = init(env, install_handlers=False)
    run.exit_process = sys.exit  # the real one is os._exit, which would end pytest
    run.request_checkpoint(stop=True)
    with pytest.raises(SystemExit) as stop:
        run.checkpoint({"step": 1})
    assert stop.value.code == 0
    assert read_ack(tmp_path, 6) is not None


HOLDING = """
import sys
from slurmgpu.elastic import init
run = init()
run.request_checkpoint()
print("holding", flush=True)
run.checkpoint({"step": 1})  # acknowledges, holds until the requeue's SIGTERM
sys.exit(3)  # the hold ran out: nobody requeued
"""


@pytest.mark.slow  # a 1.5 s storm
def test_signal_storms_in_the_hold_never_wedge_the_run(tmp_path: Path) -> None:
    # torchrun and sgpu launch each send the requeue's SIGTERM; a handler that took a lock
    # (threading.Event.set) deadlocked when the second one landed inside the first's.
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SLURM_JOB_ID": "12",
        "SGPU_ELASTIC_DIR": str(tmp_path),
        "SGPU_CHECKPOINT_HOLD": "60",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDING], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        wait_for("the acknowledgement", lambda: read_ack(tmp_path, 12), 20.0)
        storm(proc, signal.SIGUSR2)  # a checkpoint signal cannot end the hold
        for _ in range(200):
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_only_rank_zero_writes(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "8", "SLURM_PROCID": "1", "SGPU_ELASTIC_DIR": str(tmp_path)}
    run = init({**env, "SGPU_CHECKPOINT_HOLD": "0"}, install_handlers=False)
    run.request_checkpoint()
    assert run.checkpoint({"step": 1})
    assert not (tmp_path / "8").exists()


def test_the_daemon_reads_only_well_formed_acks_of_the_right_job(tmp_path: Path) -> None:
    d = tmp_path / "9"
    d.mkdir()
    (d / "ack.json").write_text("{not json")
    assert read_ack(tmp_path, 9) is None
    (d / "ack.json").write_text(
        json.dumps({"version": 1, "job_id": 10, "acks": 1, "restart_count": 0, "at": 1.0})
    )
    assert read_ack(tmp_path, 9) is None  # another job's file
    (d / "ack.json").unlink()
    secret = tmp_path / "secret"
    secret.write_text(
        json.dumps({"version": 1, "job_id": 9, "acks": 1, "restart_count": 0, "at": 1.0})
    )
    os.symlink(secret, d / "ack.json")
    assert read_ack(tmp_path, 9) is None  # never followed
    (d / "ack.json").unlink()
    (d / "ack.json").write_bytes(b" " * 70000)
    assert read_ack(tmp_path, 9) is None  # too big
    (d / "progress.json").write_text(
        json.dumps({"version": 1, "job_id": 9, "throughput": {"2": 10.5, "x": 3, "4": -1}})
    )
    progress = read_progress(tmp_path, 9)
    assert progress is not None and progress.throughput == {2: 10.5}


def test_opt_in_tokens() -> None:
    assert parse("x sgpu:malleable=2:4 y").malleable == Malleable(2, 4, False)
    assert parse("sgpu:pool=1:8,other").malleable == Malleable(1, 8, True)
    assert parse("sgpu:malleable=4:2").malleable is None
    assert parse("sgpu:malleable=0:2").malleable is None
    assert parse("sgpu:malleable=2").malleable is None
    assert malleable_token(2, 4) == "sgpu:malleable=2:4"
    assert parse_range(" 1 : 3 ") == (1, 3)
    with pytest.raises(ValueError, match="MIN:MAX"):
        parse_range("two")


def _steps(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
def test_the_example_continues_its_steps_and_loss_across_a_resize(tmp_path: Path) -> None:
    log = tmp_path / "train.jsonl"
    base = {
        **os.environ,
        "SLURM_JOB_ID": "31",
        "SGPU_ELASTIC_DIR": str(tmp_path / "state"),
        "SGPU_CHECKPOINT_HOLD": "30",
        "PYTHONPATH": str(ROOT),
    }
    argv = [
        sys.executable,
        str(EXAMPLE),
        "--steps",
        "400",
        "--step-time",
        "0.02",
        "--log",
        str(log),
    ]
    first = subprocess.Popen(argv, env={**base, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    try:
        wait_for("150 steps", lambda: log.exists() and len(log.read_text().splitlines()) > 150)
        first.send_signal(signal.SIGUSR2)
        ack = wait_for("the ack", lambda: read_ack(tmp_path / "state", 31), timeout_s=30)
        time.sleep(0.3)  # it waits to be requeued: no more steps
        steps_at_ack = [r for r in _steps(log) if "step" in r and "event" not in r]
        assert steps_at_ack[-1]["step"] == ack.step
        first.send_signal(signal.SIGTERM)  # the requeue's kill
        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
    second = subprocess.run(
        argv,
        env={**base, "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_RESTART_COUNT": "1"},
        timeout=120,
        check=False,
    )
    assert second.returncode == 0
    records = _steps(log)
    starts = [r for r in records if r.get("event") == "start"]
    assert [(s["gpus"], s["restart"], s["resumed_step"]) for s in starts] == [
        (4, 0, 0),
        (2, 1, ack.step),
    ]
    steps = [r for r in records if "event" not in r]
    assert ack.step is not None
    assert [r["step"] for r in steps] == list(range(1, 401))  # none lost, none repeated
    before = next(r for r in steps if r["step"] == ack.step)
    after = next(r for r in steps if r["step"] == ack.step + 1)
    first_loss = steps[0]["loss"]
    assert isinstance(before["loss"], float) and isinstance(after["loss"], float)
    assert isinstance(first_loss, float)
    # The loss goes on from where it was, not from the untrained start.
    assert after["loss"] < 0.8 * first_loss
    assert abs(after["loss"] - before["loss"]) < 0.5 * first_loss
    progress = read_progress(tmp_path / "state", 31)
    assert progress is not None and 4 in progress.throughput and 2 in progress.throughput
    assert progress.throughput[4] > progress.throughput[2]  # more GPUs, more samples/s

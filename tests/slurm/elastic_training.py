"""The example training (examples/elastic_train.py) under the real daemon stack on the lab
cluster: the jobs beside it, its submission, its JSONL log, and the check that its steps
carry on across resizes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.polling import wait_for
from tests.slurm.harness import EXAMPLE, SLURM, Telemetry, running_job
from tests.slurm.train_log import last_step_per_run, read_jsonl


def sbatch(t: Telemetry, *args: str) -> int:
    return SLURM.submit(["-o", "/dev/null", *args], env=t.env)


def trainer(
    t: Telemetry,
    log: Path,
    *extra: str,
    gpus: int = 4,
    malleable: str = "2:4",
    name: str = "elastic",
) -> int:
    return t.submit(
        *extra,
        "--malleable",
        malleable,
        "--checkpoint-grace",
        "30s",
        "--elastic-dir",
        str(t.tmp / "state"),
        f"--gres=gpu:{gpus}",
        "-J",
        name,
        "--wrap",
        f"{sys.executable} {EXAMPLE} --steps 100000 --step-time 0.2 --sim-util 80 "
        f"--sim-dir {t.sim_dir} --log {log}",
    )


def steps(log: Path) -> list[int]:
    return [int(r["step"]) for r in read_jsonl(log) if "event" not in r]


def starts(log: Path) -> list[tuple[Any, Any, Any]]:
    return [
        (r["gpus"], r["restart"], r["resumed_step"])
        for r in read_jsonl(log)
        if r.get("event") == "start"
    ]


def assert_continuous(log: Path) -> None:
    s = steps(log)
    assert s == list(range(1, len(s) + 1)), "a step was lost or repeated across the resizes"
    runs = starts(log)
    for (_, _, resumed), prev_last in zip(
        runs[1:], last_step_per_run(read_jsonl(log)), strict=True
    ):
        assert resumed == prev_last  # each run resumed where the previous one checkpointed
    losses = {int(r["step"]): float(r["loss"]) for r in read_jsonl(log) if "event" not in r}

    def mean_from(first: int) -> float:
        # one batch's loss is noisy (26.0 at step 1, 26.9 at step 44 after 11.1 at 43 in a
        # run that had trained on): compare means over the next five steps
        window = [losses[k] for k in range(first, first + 5) if k in losses]
        return sum(window) / len(window)

    for _, _, resumed in runs[1:]:
        assert mean_from(resumed + 1) < 0.8 * mean_from(1)  # trained on, not from scratch


def fill_cluster(t: Telemetry) -> list[int]:
    fillers = [sbatch(t, "--gres=gpu:4", "--wrap", "sleep 600") for _ in range(3)]
    wait_for("the fillers running", lambda: all(running_job(f) for f in fillers))
    return fillers

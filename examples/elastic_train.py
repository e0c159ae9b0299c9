#!/usr/bin/env python3
"""A small, real data-parallel training job that survives resizes (numpy, no GPU needed).

Linear regression on a synthetic stream: each step draws a global batch of
``per_gpu_batch * gpus`` examples (data seeded by the step number, so a resumed run sees
exactly the data it would have seen), splits it across the run's GPUs as replicas,
averages their gradients and takes one SGD step with the learning rate scaled by
``--lr-rule`` (``adascale`` uses the replicas' gradient spread). ``--step-time`` sleeps
``step_time * (base_gpus / gpus + sync_share * log2(gpus))`` per step to stand in for
compute and the gradient all-reduce on the lab cluster's fake GPUs, so more GPUs really
are faster, sublinearly. The throughput it reports (``progress.json``, what the
malleable policy fits its speedup curve to) is the base batch per step's time: training
progress per second, the figure a resize changes. ``--sim-util PCT`` also declares that
utilisation on the job's GPUs for the simulated probe (``sgpu fakeload``'s declarations in
``$SGPU_SIMGPU_DIR``), so node agents see a busy training job, as on real GPUs.

Every step appends one JSON line to ``--log`` (``step``, ``loss``, ``gpus``, ``restart``,
``lr``); each run starts with an ``event: start`` line. Submit it malleable::

    sgpu submit --malleable 2:4 --gres=gpu:4 --wrap "python examples/elastic_train.py \\
        --steps 2000 --log train.jsonl"
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

try:
    import numpy as np
except ImportError:  # pragma: no cover
    sys.exit("elastic_train.py needs numpy (pip install numpy)")

from slurmgpu import elastic
from slurmgpu.elastic.scaling import RULES, GradientNoise, scaled_lr
from slurmgpu.lab.fakeload import FakeloadError, run_fakeload
from slurmgpu.telemetry.simgpu import default_state_dir
from slurmgpu.units import parse_size_mib

DIM = 32


def _true_weights(seed: int) -> Any:
    return np.random.default_rng([seed, 0]).normal(size=DIM)


def _batch(seed: int, step: int, size: int) -> tuple[Any, Any]:
    rng = np.random.default_rng([seed, 1, step])
    x = rng.normal(size=(size, DIM))
    y = x @ _true_weights(seed) + rng.normal(scale=0.5, size=size)
    return x, y


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--per-gpu-batch", type=int, default=16)
    p.add_argument("--base-gpus", type=int, default=1, help="GPU count the lr was tuned at")
    p.add_argument("--lr", type=float, default=0.002, help="learning rate at --base-gpus")
    p.add_argument("--lr-rule", choices=RULES, default="sqrt")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds per step at base")
    p.add_argument(
        "--sync-share", type=float, default=0.05, help="all-reduce per log2(GPUs), of step time"
    )
    p.add_argument("--save-every", type=int, default=0, help="periodic checkpoint (0: none)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--sim-util", type=float, default=0.0, help="declare this GPU util (%%)")
    p.add_argument("--sim-mem", default="8GiB", help="memory declared with --sim-util")
    p.add_argument("--sim-dir", type=Path, default=None, help="default $SGPU_SIMGPU_DIR")
    args = p.parse_args(argv)
    stop = threading.Event()
    load = None
    if args.sim_util > 0:
        load = _declare_load(args.sim_util, args.sim_mem, args.sim_dir or default_state_dir(), stop)
    try:
        return _train(args)
    finally:
        stop.set()
        if load is not None:
            load.join(timeout=5)  # removes its declarations


def _declare_load(
    util: float, mem: str, state_dir: Path, stop: threading.Event
) -> threading.Thread:
    """Declare ``util`` on this run's GPUs until ``stop`` (the probe drops a dead pid's)."""

    def declare() -> None:
        try:
            run_fakeload(
                util, parse_size_mib(mem), "constant", None, state_dir, None, 1.0, stop=stop
            )
        except FakeloadError as exc:
            print(f"elastic_train: no simulated load: {exc}", file=sys.stderr)

    thread = threading.Thread(target=declare, name="sim-load", daemon=True)
    thread.start()
    return thread


def _train(args: argparse.Namespace) -> int:
    run = elastic.init()
    gpus = max(run.gpus, 1)
    fresh = {"step": 0, "w": np.zeros(DIM), "noise": GradientNoise()}
    state = run.resume(default=fresh)
    noise: GradientNoise = state["noise"]
    base_batch = args.per_gpu_batch * args.base_gpus
    batch = args.per_gpu_batch * gpus
    log = args.log.open("a", buffering=1)

    def emit(record: dict[str, Any]) -> None:
        if run.is_rank0:
            log.write(json.dumps(record) + "\n")

    emit(
        {
            "event": "start",
            "job_id": run.job_id,
            "restart": run.restart_count,
            "gpus": gpus,
            "resumed_step": state["step"],
            "at": time.time(),
        }
    )
    w = state["w"]
    while state["step"] < args.steps:
        step = state["step"] + 1
        x, y = _batch(args.seed, step, batch)
        grads = []
        for xs, ys in zip(np.array_split(x, gpus), np.array_split(y, gpus), strict=True):
            grads.append(2.0 * xs.T @ (xs @ w - ys) / len(ys))
        mean = np.mean(grads, axis=0)
        noise.update([float(g @ g) for g in grads], float(mean @ mean))
        # The replicas' spread is the variance at one replica's batch; at the base batch
        # (base_gpus replicas) it is that much smaller.
        var = noise.var / args.base_gpus
        lr = scaled_lr(args.lr, base_batch, batch, args.lr_rule, var=var, sqr=noise.sqr)
        w = w - lr * mean
        loss = float(np.mean((x @ w - y) ** 2))
        time.sleep(args.step_time * (args.base_gpus / gpus + args.sync_share * math.log2(gpus)))
        state = {"step": step, "w": w, "noise": noise}
        emit(
            {
                "step": step,
                "loss": round(loss, 6),
                "gpus": gpus,
                "restart": run.restart_count,
                "lr": lr,
                "at": round(time.time(), 3),
            }
        )
        # Progress, not the (growing) batch: a step's work at the base size. Counting the
        # batch would report the larger batches on top of the shorter steps.
        run.step_done(samples=base_batch, step=step)
        if run.checkpoint_requested or run.stop_requested:
            run.checkpoint(state, step=step)  # answers the request; exits when requeued
            emit({"event": "resumed_in_place", "step": step, "at": time.time()})
        elif args.save_every and step % args.save_every == 0:
            run.save(state)
    run.save(state)
    run.close()
    emit({"event": "done", "step": state["step"], "at": time.time()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

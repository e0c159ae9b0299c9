"""The training stand-in of a replayed trace job (``python -m slurmgpu.lab.replayload``).

It must do ``--work`` units; on ``g`` GPUs it does ``rate(g)`` units a second
(``--rates 1:0.5,2:0.93,...``, the job's profile compressed: slurmgpu.sim.replayplan),
in steps of ``--tick`` seconds, so its completion time depends on its size and on every
resize. It runs on :mod:`slurmgpu.elastic`: it reports its throughput (what the malleable
policy fits its speed-up to), answers the daemon's checkpoint request with a checkpoint
of the work done, and a requeued run resumes from it. Each run appends an ``event:
start`` line to ``--log`` (JSON lines), and ``event: done`` at the end.

It declares ``--util`` % GPU use on its GPUs to the lab's simulated probe (as
``sgpu fakeload`` does) while it runs, so node agents see a busy training job.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from slurmgpu import elastic
from slurmgpu.lab.fakeload import FakeloadError, run_fakeload
from slurmgpu.telemetry.simgpu import default_state_dir

__all__ = ["main", "parse_rates", "rate_at"]


def parse_rates(text: str) -> dict[int, float]:
    """``"1:0.5,2:0.9"`` → ``{1: 0.5, 2: 0.9}``; ValueError with a one-line reason."""
    out: dict[int, float] = {}
    for part in text.split(","):
        gpus, sep, rate = part.partition(":")
        try:
            g, r = int(gpus), float(rate)
        except ValueError:
            raise ValueError(f"--rates: {part!r} is not GPUS:RATE") from None
        if not sep or g < 1 or not r > 0:
            raise ValueError(f"--rates: {part!r} needs GPUS >= 1 and RATE > 0")
        out[g] = r
    if not out:
        raise ValueError("--rates is empty")
    return out


def rate_at(rates: dict[int, float], gpus: int) -> float:
    """The rate at ``gpus``: the table's, else that of the largest size below it (or the
    smallest size, below the table)."""
    below = [g for g in rates if g <= gpus]
    return rates[max(below)] if below else rates[min(rates)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--work", type=float, required=True, help="units of work to do")
    p.add_argument("--rates", required=True, help="GPUS:UNITS_PER_S,...")
    p.add_argument("--tick", type=float, default=0.5, help="seconds per step")
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--util", type=float, default=0.0, help="declare this GPU util (%%)")
    p.add_argument("--mem-mib", type=float, default=8192.0)
    args = p.parse_args(argv)
    try:
        rates = parse_rates(args.rates)
    except ValueError as exc:
        print(f"replayload: {exc}", file=sys.stderr)
        return 2
    if not args.work > 0 or not args.tick > 0:
        print("replayload: --work and --tick must be > 0", file=sys.stderr)
        return 2
    stop = threading.Event()
    load = _declare(args.util, args.mem_mib, stop) if args.util > 0 else None
    try:
        return _run(args, rates)
    finally:
        stop.set()
        if load is not None:
            load.join(timeout=5)


def _declare(util: float, mem_mib: float, stop: threading.Event) -> threading.Thread:
    def declare() -> None:
        try:
            run_fakeload(
                util, int(mem_mib), "constant", None, default_state_dir(), None, 1.0, stop=stop
            )
        except FakeloadError as exc:
            print(f"replayload: no simulated load: {exc}", file=sys.stderr)

    thread = threading.Thread(target=declare, name="sim-load", daemon=True)
    thread.start()
    return thread


def _run(args: argparse.Namespace, rates: dict[int, float]) -> int:
    run = elastic.init()
    gpus = max(run.gpus, 1)
    rate = rate_at(rates, gpus)
    state: dict[str, Any] = run.resume(default={"step": 0, "done": 0.0})
    log = args.log.open("a", buffering=1)

    def emit(record: dict[str, Any]) -> None:
        log.write(json.dumps({**record, "at": round(time.time(), 3)}) + "\n")

    emit(
        {
            "event": "start",
            "job_id": run.job_id,
            "restart": run.restart_count,
            "gpus": gpus,
            "rate": rate,
            "resumed_done": state["done"],
        }
    )
    while state["done"] < args.work:
        left = (args.work - state["done"]) / rate
        dt = min(args.tick, left)
        time.sleep(dt)
        state = {"step": state["step"] + 1, "done": min(args.work, state["done"] + rate * dt)}
        run.step_done(samples=rate * dt, step=state["step"])
        if run.checkpoint_requested or run.stop_requested:
            run.checkpoint(state, step=state["step"])  # exits when requeued
            emit({"event": "resumed_in_place", "done": state["done"]})
    run.save(state)
    run.close()
    emit({"event": "done", "done": state["done"], "gpus": gpus})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Per-job energy query cost against the per-GPU usage aggregate, on one long job.

    .venv/bin/python bench/energy_query.py [--gpus 8] [--samples 20000] [--repeat 5] \
        [--other-samples 5000] [--smoke] [--json-out PATH]

Fills a fresh SQLite store with one job's samples (``--gpus`` GPUs x ``--samples``
samples each, 10 s apart, with power and an energy counter) plus 20 other jobs'
samples (``--other-samples`` each),
then times ``UsageStore.gpu_usage`` (the baseline: the GROUP BY the daemon and ``sgpu
eff`` already run) and ``UsageStore.gpu_energy`` (the windowed energy query, run once per
job at its end and by ``sgpu eff``). Prints both medians and their ratio; no target is
set (the energy query runs once per job, not per cycle).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.store import open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import GpuSampleIn, SampleBatch

T0 = 1_790_000_000.0


def _fill(usage: UsageStore, gpus: int, samples: int, other_samples: int) -> None:
    for g in range(gpus):
        for start in range(0, samples, 10_000):
            batch = [
                GpuSampleIn(
                    sample_uid=f"{g}-{i}",
                    at=T0 + 10 * i,
                    gpu_index=g,
                    job_id=7,
                    util_pct=float(i % 100),
                    power_w=100.0 + i % 300,
                    energy_mj=200_000 * i,
                    processes=1,
                    source="process",
                )
                for i in range(start, min(samples, start + 10_000))
            ]
            usage.ingest(SampleBatch(node="n1", gpu=batch))
    for j in range(20):  # other jobs' rows, so the queries must pick the job's out
        other = [
            GpuSampleIn(
                sample_uid=f"x{j}-{i}",
                at=T0 + 10 * i,
                gpu_index=0,
                job_id=100 + j,
                util_pct=50.0,
                power_w=200.0,
                processes=1,
            )
            for i in range(other_samples)
        ]
        usage.ingest(SampleBatch(node="n2", gpu=other))


def _median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--other-samples", type=int, default=5000, help="per other job (20)")
    add_arguments(parser, "2 GPUs x 2,000 samples, 20 x 200 other samples, 3 repeats")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.samples, args.other_samples, args.repeat = 2, 2000, 200, 3
    run = BenchRun.from_args("energy_query", args)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'bench.db'}")
        usage = UsageStore(store.engine)
        _fill(usage, args.gpus, args.samples, args.other_samples)
        base = _median_s(lambda: usage.gpu_usage(7), args.repeat)
        energy = _median_s(lambda: usage.gpu_energy(7), args.repeat)
        store.engine.dispose()
    rows = args.gpus * args.samples
    print(
        f"one job, {rows:,} GPU samples: gpu_usage (baseline) median {base * 1000:.0f} ms, "
        f"gpu_energy median {energy * 1000:.0f} ms, ratio {energy / base:.2f}"
    )
    run.baseline = {"gpu_usage_s": base}
    run.figures = {"gpu_samples_of_the_job": rows, "gpu_energy_s": energy, "ratio": energy / base}
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What one bad record costs a squeue listing: the per-record fallback against the fast path.

Builds a ``squeue --json`` document of N jobs (default 5,000) in Slurm 26.05's format
from the real capture ``tests/golden/slurm-26.05/mixed_squeue.json`` (its running jobs
repeated under new ids), then times, in one process, the median of R runs of:

- baseline: ``json.loads`` of the same bytes;
- clean: ``decode_squeue`` of the document (the one typed pass);
- bad shape: the same with one record of a wrong shape (``job_id`` a string), which makes
  the decoder go record by record and skip it;
- bad bytes: the same with one job name in invalid UTF-8, repaired with U+FFFD first.

Each decode is checked (N, N-1, N jobs). The target (issue 2's, for every listing): parse
+ normalise within 3x ``json.loads``; this shows whether a hostile record keeps it there.
Run: ``.venv/bin/python bench/decode_records.py [--jobs 5000 --runs 5]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.slurm.jsonformat import decode_squeue

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "slurm-26.05"


def _document(jobs: int) -> tuple[bytes, bytes, bytes]:
    raw = (GOLDEN / "mixed_squeue.json").read_bytes().decode("utf-8", "replace")
    doc: dict[str, Any] = json.loads(raw)
    templates = [j for j in doc["jobs"] if j["job_state"] == ["RUNNING"] and "bad" not in j["name"]]
    out = []
    for i in range(jobs):
        job = dict(templates[i % len(templates)])
        job["job_id"] = 1000 + i
        job["name"] = f"job{i}"
        out.append(job)
    doc["jobs"] = out
    clean = json.dumps(doc, indent=2).encode()
    i = jobs // 2  # the hostile record, mid-listing
    bad_shape = clean.replace(
        f'"job_id": {1000 + i},'.encode(), f'"job_id": "{1000 + i}",'.encode(), 1
    )
    bad_bytes = clean.replace(f'"name": "job{i}"'.encode(), b'"name": "job\xff\xfe%d"' % i, 1)
    assert bad_shape != clean and bad_bytes != clean
    return clean, bad_shape, bad_bytes


def _median(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5_000)
    ap.add_argument("--runs", type=int, default=5)
    add_arguments(ap, "500 jobs, 3 runs")
    args = ap.parse_args(argv)
    if args.smoke:
        args.jobs, args.runs = 500, 3
    run = BenchRun.from_args("decode_records", args)
    logging.disable(logging.WARNING)  # the skipped-record warnings, once per decode
    clean, bad_shape, bad_bytes = _document(args.jobs)
    assert len(decode_squeue(clean)[0]) == args.jobs
    assert len(decode_squeue(bad_shape)[0]) == args.jobs - 1
    assert len(decode_squeue(bad_bytes)[0]) == args.jobs
    base = _median(lambda: json.loads(clean), args.runs)
    print(f"{args.jobs} jobs, {len(clean) / 1e6:.1f} MB, median of {args.runs} runs")
    print(f"  baseline json.loads          {base * 1000:8.1f} ms   1.00x")
    run.baseline = {"json_loads_s": base, "document_mb": len(clean) / 1e6}
    for label, key, data in (
        ("clean", "clean", clean),
        ("one bad shape", "bad_shape", bad_shape),
        ("one bad UTF-8", "bad_utf8", bad_bytes),
    ):
        t = _median(lambda d=data: decode_squeue(d), args.runs)  # type: ignore[misc]
        print(f"  decode_squeue {label:<14} {t * 1000:8.1f} ms   {t / base:.2f}x")
        run.figures[f"decode_{key}_s"] = t
        run.figures[f"decode_{key}_vs_json_loads"] = t / base
        ratio = t / base
        run.target(f"{key}_vs_json_loads", ratio, "<= 3", ratio <= 3)
    run.write(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

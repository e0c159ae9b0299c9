"""Check a real GPU's NVML energy counter against its integrated power, idle and under load.

Needs only ``nvidia-ml-py`` (``import pynvml``) and the standard library; torch with CUDA
is optional (the load phase)::

    python bench/gpu_check_energy.py [--gpu 0] [--idle 5] [--load 10] [--step 0.1] \
        [--smoke] [--json-out PATH]

Phases: ``idle`` (nothing started), then ``load`` (a child process runs bf16 matrix
products on the GPU when torch with CUDA imports; skipped otherwise). In each phase the
script reads ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver was loaded,
Volta and newer) and ``nvmlDeviceGetPowerUsage`` (mW) every ``--step`` s and prints, per
phase: the counter's delta (J), the trapezoid integral of the power readings at
``--step`` and at the coarser intervals an agent uses (1 s, 5 s, 10 s: what
slurmgpu's fallback would integrate on a board without a counter), the differences in %,
how often the counter's value changed (its update period), and whether it ever went
back. The figures are what slurmgpu's per-job energy relies on (report/energy.py):
"counter" is a measurement, "power" an estimate.

Measured on an NVIDIA H200 (driver 580.159.04), 2026-12-04, with a compact version of
this script (same readings, 0.1 s step): the counter updates every 0.100 s and never went
back. Idle 10 s (81 W): counter 814.0 J; power integral +0.57 % (0.1 s), +1.06 % (1 s),
+4.01 % (5 s). bf16 8192x8192 products 20 s (692 W): counter 13,852 J; +0.07 % (0.1 s),
-0.32 % (1 s), -1.95 % (5 s), -4.18 % (10 s). The 6 s after the load was killed: counter
645 J, power integral 932 J (+44 %; a second run +52 %): the reported power lags a
changing load, so the integral is only an estimate, worst around a job's edges.

One JSON document on stdout; with ``--json-out`` also the bench record of
slurmgpu/lab/benchrun.py (through it when slurmgpu imports, else the same shape written here):
figures the power integrals, baseline the counter's delta, target the idle agreement.
``--smoke``: 1 s idle, no load. Exit codes: 0 the counter works, never decreased, and
agrees with the fine power integral within ``--tolerance`` % (default 5) while idle;
1 the counter is missing, went back, or disagrees while idle; 2 NVML cannot start.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LOAD = """
import sys, time, torch
x = torch.randn(8192, 8192, device="cuda:%d", dtype=torch.bfloat16)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
"""

COARSE_S = (1.0, 5.0, 10.0)


def _start_load(gpu: int, seconds: float) -> tuple[subprocess.Popen[str] | None, str]:
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed: no load phase"
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD % gpu, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until CUDA is initialised, or the child failed
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        return None, f"load did not start: {err.strip()[-300:]}"
    return proc, ""


def _trapezoid(points: list[tuple[float, float]]) -> float:
    return sum((p0 + p1) / 2 * (t1 - t0) for (t0, p0), (t1, p1) in itertools.pairwise(points))


def _every(points: list[tuple[float, float]], step_s: float) -> list[tuple[float, float]]:
    """The readings an agent sampling every ``step_s`` would have seen (plus the last)."""
    if not points:
        return []
    out = [points[0]]
    for t, p in points[1:]:
        if t - out[-1][0] >= step_s - 1e-6:
            out.append((t, p))
    if out[-1] != points[-1]:
        out.append(points[-1])
    return out


def _pct(a: float, b: float) -> float | None:
    return None if b == 0 else round(100.0 * (a / b - 1.0), 2)


def measure(nvml: Any, handle: Any, seconds: float, step_s: float) -> dict[str, Any]:
    """Read counter and power every ``step_s`` for ``seconds``; return the comparison."""
    power: list[tuple[float, float]] = []
    energy: list[tuple[float, int]] = []
    read_s: list[float] = []
    end = time.monotonic() + seconds
    while True:
        t0 = time.monotonic()
        mj = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        mw = int(nvml.nvmlDeviceGetPowerUsage(handle))
        t1 = time.monotonic()
        read_s.append(t1 - t0)
        now = (t0 + t1) / 2
        energy.append((now, mj))
        power.append((now, mw / 1000.0))
        if now >= end:
            break
        time.sleep(max(0.0, step_s - (time.monotonic() - t0)))
    counter_j = (energy[-1][1] - energy[0][1]) / 1000.0
    window = power[-1][0] - power[0][0]
    changes = [t for (_, prev), (t, v) in itertools.pairwise(energy) if v != prev]
    fine = _trapezoid(power)
    out: dict[str, Any] = {
        "seconds": round(window, 3),
        "readings": len(power),
        "counter_j": round(counter_j, 1),
        "counter_mean_power_w": round(counter_j / window, 1) if window > 0 else None,
        "power_integral_j": round(fine, 1),
        "power_integral_vs_counter_pct": _pct(fine, counter_j),
        "power_w": {
            "min": min(p for _, p in power),
            "median": statistics.median(p for _, p in power),
            "max": max(p for _, p in power),
        },
        "counter_went_back": any(v < prev for (_, prev), (_, v) in itertools.pairwise(energy)),
        "counter_update_period_s": (
            round(statistics.median(b - a for a, b in itertools.pairwise(changes)), 4)
            if len(changes) > 2
            else None
        ),
        "read_ms_median": round(1000 * statistics.median(read_s), 3),
        "coarse": {},
    }
    for step in COARSE_S:
        if step * 2 <= window:
            coarse = _trapezoid(_every(power, step))
            out["coarse"][f"{step:g}s"] = {
                "integral_j": round(coarse, 1),
                "vs_counter_pct": _pct(coarse, counter_j),
            }
    return out


def _write_record(
    path: Path | None,
    args: argparse.Namespace,
    started: float,
    figures: dict[str, Any],
    baseline: dict[str, Any],
    targets: dict[str, tuple[float, str, bool]],
) -> None:
    """The bench record (slurmgpu/lab/benchrun.py's shape); without slurmgpu, written here."""
    if path is None:
        return
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from slurmgpu.lab.benchrun import BenchRun
    except ImportError:  # a bare GPU machine: nvidia-ml-py and this file only
        pass
    else:
        run = BenchRun.from_args("gpu_check_energy", args)
        run.started, run.figures, run.baseline = started, figures, baseline
        for name, (value, target, met) in targets.items():
            run.target(name, value, target, met)
        run.write(path)
        return
    doc = {
        "bench": "gpu_check_energy",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "commit": "",
        "smoke": bool(args.smoke),
        "seconds": round(time.time() - started, 3),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "memory_gib": round(
                os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1
            ),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "params": {k: v for k, v in vars(args).items() if k not in ("json_out", "smoke")},
        "figures": figures,
        "baseline": baseline,
        "targets": {k: {"value": v, "target": t, "met": m} for k, (v, t, m) in targets.items()},
    }
    if path.is_dir():
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        path = path / f"gpu_check_energy-{stamp}-{os.getpid()}.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"figures written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML device index")
    parser.add_argument("--idle", type=float, default=5.0, help="idle phase, seconds")
    parser.add_argument("--load", type=float, default=10.0, help="load phase, seconds (0: none)")
    parser.add_argument("--step", type=float, default=0.1, help="reading interval, seconds")
    parser.add_argument("--tolerance", type=float, default=5.0, help="idle agreement, %%")
    parser.add_argument("--smoke", action="store_true", help="smoke size (seconds): 1 s idle")
    parser.add_argument(
        "--json-out",
        type=Path,
        metavar="PATH",
        help="write the bench record to PATH (a dir: new file)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.idle, args.load = 1.0, 0.0
    started = time.time()

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
        why = f"NVML cannot start: {exc}"
        print(json.dumps({"problems": [why]}))
        _write_record(args.json_out, args, started, {"skipped": why}, {}, {})
        return 2
    problems: list[str] = []
    result: dict[str, Any] = {"problems": problems}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
        name = pynvml.nvmlDeviceGetName(handle)
        result["device"] = {
            "index": args.gpu,
            "name": name.decode() if isinstance(name, bytes) else name,
            "driver": str(pynvml.nvmlSystemGetDriverVersion()),
            "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
        }
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as exc:
            problems.append(f"no total-energy counter on this board ({exc}): pre-Volta?")
            print(json.dumps(result, indent=2))
            _write_record(args.json_out, args, started, {"problems": problems}, {}, {})
            return 1
        phases: dict[str, Any] = {"idle": measure(pynvml, handle, args.idle, args.step)}
        if args.load > 0:
            load, why = _start_load(args.gpu, args.load + 30.0)
            if load is None:
                phases["load"] = {"skipped": why}
            else:
                try:
                    time.sleep(1.0)  # past the ramp-up: clocks and power settle
                    phases["load"] = measure(pynvml, handle, args.load, args.step)
                finally:
                    load.kill()
                    load.wait()
        result["phases"] = phases
    finally:
        pynvml.nvmlShutdown()

    for phase, figures in result["phases"].items():
        if figures.get("counter_went_back"):
            problems.append(f"{phase}: the counter decreased")
    idle = result["phases"]["idle"]
    diff = idle["power_integral_vs_counter_pct"]
    if diff is None or abs(diff) > args.tolerance:
        problems.append(f"idle: power integral differs from the counter by {diff} %")
    print(json.dumps(result, indent=2))
    record: dict[str, Any] = {"device": result["device"], "problems": problems}
    baseline: dict[str, Any] = {}
    for phase, f in result["phases"].items():
        if "skipped" in f:
            record[f"{phase}_skipped"] = f["skipped"]
            continue
        baseline[f"{phase}_counter_j"] = f["counter_j"]
        record[f"{phase}_power_integral_j"] = f["power_integral_j"]
        record[f"{phase}_vs_counter_pct"] = f["power_integral_vs_counter_pct"]
        record[f"{phase}_counter_update_period_s"] = f["counter_update_period_s"]
        record[f"{phase}_coarse"] = f["coarse"]
    targets: dict[str, tuple[float, str, bool]] = {}
    if diff is not None:
        met = abs(diff) <= args.tolerance
        targets["idle_integral_vs_counter_pct"] = (diff, f"|x| <= {args.tolerance:g}", met)
    _write_record(args.json_out, args, started, record, baseline, targets)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

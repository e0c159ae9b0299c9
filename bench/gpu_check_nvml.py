"""Check NvmlProbe on a real GPU machine: 3 samples 1 s apart, under a small load if possible.

Run from the repository root (nvidia-ml-py installed, ``pip install -e '.[nvml]'``)::

    .venv/bin/python bench/gpu_check_nvml.py [--samples 3] [--interval 1] [--no-load]

When torch with CUDA is importable, a child process runs matrix multiplications on GPU 0
while the samples are taken, so per-process memory and SM utilization can be checked;
otherwise the GPUs are only sampled. Prints one JSON document (samples, checks, problems)
on stdout.

MIG: the check only reads. Under "mig" it says, per GPU, whether MIG is on (current and
pending mode), whether GPM answers, and for a MIG-enabled GPU each instance's profile,
memory and GPM SM utilization (None on the first sample: GPM needs two). It never
changes a device's MIG mode; on a GPU with MIG off it says so and that no instance could
be read. With MIG on, the torch load runs on the first MIG instance CUDA exposes.

Exit codes: 0 every device sample is complete; 1 a device sample has an error, or lacks its
index, uuid, minor number or PCI bus id; 2 the probe cannot start (no driver, no
nvidia-ml-py). Observations that depend on the environment (the load's pid is invisible
inside a container's pid namespace, say) are reported under "checks" without failing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmgpu.lab.benchrun import BenchRun, add_arguments
from slurmgpu.telemetry.nvml import NvmlProbe
from slurmgpu.telemetry.probe import GpuDeviceSample, ProbeUnavailableError

LOAD = """
import time, torch
x = torch.randn(4096, 4096, device="cuda:0")
print("ready", flush=True)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
"""


def _start_load(seconds: float) -> subprocess.Popen[str] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until CUDA is initialised, or the child failed
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        print(f"load did not start: {err.strip()[-500:]}", file=sys.stderr)
        return None
    return proc


def _problems(sample: GpuDeviceSample, round_no: int) -> list[str]:
    where = f"sample {round_no}, device {sample.index}"
    found = []
    if sample.error is not None:
        found.append(f"{where}: error {sample.error!r}")
    for name in ("uuid", "minor_number", "pci_bus_id"):
        if getattr(sample, name) is None:
            found.append(f"{where}: {name} missing")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--no-load", action="store_true")
    add_arguments(parser, "2 samples 0.2 s apart, no load")
    args = parser.parse_args(argv)
    if args.smoke:
        args.samples, args.interval, args.no_load = 2, 0.2, True
    run = BenchRun.from_args("gpu_check_nvml", args)

    try:
        probe = NvmlProbe()
    except ProbeUnavailableError as exc:
        print(json.dumps({"problems": [str(exc)]}))
        run.figures = {"skipped": str(exc)}
        run.write(args.json_out)
        return 2

    load = None if args.no_load else _start_load(args.samples * args.interval + 4.0)
    rounds: list[list[dict[str, Any]]] = []
    problems: list[str] = []
    sample_s: list[float] = []
    load_seen: list[dict[str, Any]] = []
    try:
        for round_no in range(args.samples):
            if round_no:
                time.sleep(args.interval)
            t0 = time.perf_counter()
            samples = probe.sample()
            sample_s.append(round(time.perf_counter() - t0, 4))
            rounds.append([dataclasses.asdict(s) for s in samples])
            for s in samples:
                problems.extend(_problems(s, round_no))
                for p in s.processes:
                    if load is not None and p.pid == load.pid:
                        load_seen.append(
                            {
                                "round": round_no,
                                "device": s.index,
                                "used_memory_mib": p.used_memory_mib,
                                "sm_util_pct": p.sm_util_pct,
                                "device_util_pct": s.util_pct,
                            }
                        )
            if not samples:
                problems.append(f"sample {round_no}: NVML reported no GPU")
    finally:
        probe.close()
        if load is not None:
            load.kill()
            load.wait()

    last = rounds[-1] if rounds else []
    checks: dict[str, Any] = {
        "devices": len(last),
        "sample_seconds": sample_s,
        "torch_load": load is not None,
        "load_pid": load.pid if load is not None else None,
        "load_seen_in_processes": load_seen,
        "own_pid_namespace_matches_nvml": bool(load_seen) if load is not None else None,
        "dev_nvidia_minor_exists": {
            str(d["index"]): (
                d["minor_number"] is not None and os.path.exists(f"/dev/nvidia{d['minor_number']}")
            )
            for d in last
        },
        "ordinal_equals_minor": {str(d["index"]): d["index"] == d["minor_number"] for d in last},
        "mig_instances": {str(d["index"]): len(d["mig_instances"]) for d in last},
        "mig": _mig_status(rounds),
        "per_process_util_known": any(
            p["sm_util_pct"] is not None for r in rounds[1:] for d in r for p in d["processes"]
        ),
    }
    print(json.dumps({"samples": rounds, "checks": checks, "problems": problems}, indent=2))
    run.baseline = {"bare_nvml_round_s": _bare_nvml_round_s()}
    run.figures = {
        "probe_sample_s": statistics.median(sample_s) if sample_s else None,
        "devices": len(last),
        "problems": problems,
    }
    run.write(args.json_out)
    return 1 if problems else 0


def _mig_status(rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per GPU: MIG mode and GPM support read with bare pynvml (never set), and what the
    probe's last sample read of each MIG instance."""
    import pynvml

    status: dict[str, Any] = {}
    last = rounds[-1] if rounds else []
    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            entry: dict[str, Any] = {}
            try:
                current, pending = pynvml.nvmlDeviceGetMigMode(handle)
                entry["mode"] = {"current": int(current), "pending": int(pending)}
                on = int(current) == pynvml.NVML_DEVICE_MIG_ENABLE
                entry["says"] = (
                    "MIG on: instances below"
                    if on
                    else "MIG off on this GPU: no MIG instance to read (mode left as it is)"
                )
            except pynvml.NVMLError as exc:
                entry["says"] = f"MIG not supported on this GPU ({exc})"
            try:
                support = pynvml.nvmlGpmQueryDeviceSupport(handle)
                entry["gpm_supported"] = bool(support.isSupportedDevice)
            except pynvml.NVMLError as exc:
                entry["gpm_supported"] = f"no ({exc})"
            device = next((d for d in last if d["index"] == i), None)
            entry["instances"] = [
                {
                    k: m[k]
                    for k in (
                        "uuid",
                        "profile",
                        "gpu_instance_id",
                        "memory_used_mib",
                        "memory_total_mib",
                        "util_pct",
                        "sm_occupancy_pct",
                    )
                }
                for m in (device["mig_instances"] if device else [])
            ]
            status[str(i)] = entry
    finally:
        pynvml.nvmlShutdown()
    return status


def _bare_nvml_round_s(repeats: int = 5) -> float:
    """The floor a probe sample is measured against: utilisation and memory of every
    device read with bare pynvml calls (median of ``repeats``)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                with contextlib.suppress(pynvml.NVMLError):  # NotSupported under MIG
                    pynvml.nvmlDeviceGetUtilizationRates(handle)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
            times.append(time.perf_counter() - t0)
    finally:
        pynvml.nvmlShutdown()
    return statistics.median(times)


if __name__ == "__main__":
    raise SystemExit(main())

"""Check malleable PyTorch on a real GPU machine: the example with NCCL under ``sgpu launch``.

Run from the repository root (torch with CUDA and slurmgpu importable)::

    python bench/gpu_check_torch.py [--gpus N] [--steps 300] [--signal-at 80] \
        [--smoke] [--json-out PATH]

No Slurm is needed: the job's environment is set as Slurm would (SLURM_JOB_ID, the state
directory). examples/torch_ddp_elastic.py runs under ``python -m slurmgpu launch --
torchrun --nproc-per-node=N`` (NCCL when CUDA is available, else gloo on the CPU); after
``--signal-at`` steps (80) the launcher gets the checkpoint signal, the ranks checkpoint at
one step and acknowledge, then SIGTERM (what the requeue sends) ends every process. A second run
resumes at ``N // 2`` ranks when N >= 2 (else at N) and trains to the end; an
uninterrupted run of the same seed is the baseline. Prints one JSON document: signal →
ack and SIGTERM → gone seconds, processes left, steps continuous, the largest loss
difference from the baseline. With ``--json-out`` the same as a bench record
(slurmgpu/lab/benchrun.py): baseline the uninterrupted run (its seconds, final loss), figures
the interrupted one; targets: every process gone <= 1 s after SIGTERM, losses within
1e-3 (relative) of the baseline's. ``--smoke``: 2 ranks, 40 steps, signal after 20 (CPU
torch: gloo; about three torchrun start-ups of work).

Exit codes: 0 all checks passed; 1 a check failed; 2 torch is missing (the record says
"skipped").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmgpu.lab.benchrun import BenchRun, add_arguments

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torch_ddp_elastic.py"


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _wait(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def _torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--gpus", type=int, default=0, help="ranks (default: every visible GPU)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--signal-at", type=int, default=80, help="checkpoint signal after N steps")
    add_arguments(p, "2 ranks, 40 steps, the signal after 20")
    args = p.parse_args(argv)
    if args.smoke:
        args.gpus, args.steps, args.signal_at = 2, 40, 20
    if not 0 < args.signal_at < args.steps:
        p.error("--signal-at must lie between 0 and --steps")
    run = BenchRun.from_args("gpu_check_torch", args)
    try:
        import torch
    except ImportError:
        print(json.dumps({"problem": "torch is not importable"}))
        run.figures = {"skipped": "torch is not importable"}
        run.write(args.json_out)
        return 2
    cuda = torch.cuda.is_available()
    gpus = args.gpus or (torch.cuda.device_count() if cuda else 2)
    tmp = Path(tempfile.mkdtemp(prefix="sgpu-gpu-torch-"))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "4",
        "SGPU_ELASTIC_DIR": str(tmp / "state"),
        "SGPU_CHECKPOINT_HOLD": "60",
        "SGPU_LAUNCH_TERM_WAIT": "10",
    }
    if cuda:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    example = [str(EXAMPLE), "--steps", str(args.steps), "--step-time", "0.01"]
    log = tmp / "run.jsonl"
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "ranks": gpus,
        "backend": "nccl" if cuda else "gloo",
    }
    launcher = subprocess.Popen(
        [sys.executable, "-m", "slurmgpu", "launch", "--", *_torchrun(gpus), *example,
         "--train-log", str(log)],
        env={**env, "SLURM_JOB_ID": "5"},
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "run1.err").open("wb"),
    )  # fmt: skip
    if not _wait(lambda: sum("event" not in r for r in _records(log)) >= args.signal_at, 300):
        launcher.kill()
        report["problem"] = f"the first run did not train (see {tmp / 'run1.err'})"
        print(json.dumps(report, indent=1))
        run.figures = {"problem": report["problem"]}
        run.write(args.json_out)
        return 1
    tree = psutil.Process(launcher.pid).children(recursive=True)
    ack = tmp / "state" / "5" / "ack.json"
    signalled = time.monotonic()
    launcher.send_signal(signal.SIGUSR2)
    acked = _wait(ack.exists, 60)
    report["signal_to_ack_s"] = round(time.monotonic() - signalled, 3) if acked else None
    termed = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=60)
    report["sigterm_to_gone_s"] = round(time.monotonic() - termed, 3)
    report["processes_left"] = [
        q.pid for q in tree if q.is_running() and q.status() != psutil.STATUS_ZOMBIE
    ]
    second = max(gpus // 2, 1)
    if cuda:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(second))
    t0 = time.monotonic()
    subprocess.run(
        [*_torchrun(second), *example, "--train-log", str(log)],
        env={**env, "SLURM_JOB_ID": "5"},
        check=True,
        capture_output=True,
        timeout=600,
    )
    resumed_s = time.monotonic() - t0
    ref = tmp / "ref.jsonl"
    t0 = time.monotonic()
    subprocess.run(
        [*_torchrun(second), *example, "--train-log", str(ref)],
        env={**env, "SLURM_JOB_ID": "6"},
        check=True,
        capture_output=True,
        timeout=600,
    )
    uninterrupted_s = time.monotonic() - t0
    records = _records(log)
    starts = [(r["world"], r["resumed_step"]) for r in records if r.get("event") == "start"]
    steps = [r for r in records if "event" not in r]
    baseline = {r["step"]: r["loss"] for r in _records(ref) if "event" not in r}
    diffs = [abs(r["loss"] - baseline[r["step"]]) for r in steps if r["step"] in baseline]
    report.update(
        {
            "runs": starts,
            "steps_continuous": [r["step"] for r in steps] == list(range(1, len(steps) + 1)),
            "steps": len(steps),
            "max_loss_diff_vs_uninterrupted": max(diffs) if diffs else None,
            "max_relative_loss_diff": max(
                (
                    d / max(abs(baseline[r["step"]]), 1e-12)
                    for d, r in zip(diffs, steps, strict=True)
                ),
                default=None,
            ),
            "state_dir": str(tmp),
        }
    )
    ok = (
        acked
        and not report["processes_left"]
        and report["steps_continuous"]
        and len(starts) == 2
        and starts[1][1] > 0
        and len(steps) == args.steps
        and (report["max_relative_loss_diff"] or 0) < 1e-3
    )
    report["ok"] = bool(ok)
    print(json.dumps(report, indent=1))
    run.baseline = {
        "uninterrupted_run_s": uninterrupted_s,
        "uninterrupted_steps": len(baseline),
        "uninterrupted_final_loss": baseline[max(baseline)] if baseline else None,
    }
    run.figures = {
        k: report[k]
        for k in (
            *("torch", "cuda", "device", "ranks", "backend", "signal_to_ack_s"),
            *("sigterm_to_gone_s", "processes_left", "runs", "steps", "steps_continuous"),
            *("max_loss_diff_vs_uninterrupted", "max_relative_loss_diff", "ok"),
        )
    }
    run.figures["resumed_run_s"] = resumed_s
    gone = report["sigterm_to_gone_s"]
    run.target("sigterm_to_gone_s", gone, "<= 1", gone <= 1.0)
    rel = report["max_relative_loss_diff"]
    if rel is not None:
        run.target("max_relative_loss_diff", rel, "< 0.001", rel < 1e-3)
    run.write(args.json_out)
    if ok and args.smoke:
        shutil.rmtree(tmp, ignore_errors=True)  # CI's runs leave nothing behind when all is well
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

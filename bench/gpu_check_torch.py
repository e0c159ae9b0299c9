"""Check malleable PyTorch on a real GPU machine: the example with NCCL under ``sgpu launch``.

Run from the repository root (torch with CUDA and slurmgpu importable)::

    python bench/gpu_check_torch.py [--framework torch|lightning|hf|accelerate|all] \
        [--gpus N] [--steps 300] [--signal-at 80] [--smoke] [--json-out PATH]

``--framework`` picks the example (default torch): examples/torch_ddp_elastic.py (plain
DDP), lightning_elastic.py (Lightning), hf_trainer_elastic.py (Hugging Face Trainer),
accelerate_elastic.py (Accelerate); ``all`` runs the four one after the other, one record
each. Each runs the same way (its flags: ``FRAMEWORKS``); its ``event: start`` lines name
the process group's backend, which must be NCCL on CUDA and gloo on the CPU.

No Slurm is needed: the job's environment is set as Slurm would (SLURM_JOB_ID, the state
directory). The example runs under ``python -m slurmgpu launch --
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
torch: gloo; about three torchrun start-ups of work, 20-30 s per framework here).

Exit codes: 0 all checks passed; 1 a check failed; 2 torch, or a framework's package, is
missing (the record says "skipped").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmgpu.lab.benchrun import BenchRun, add_arguments

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


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


def _per_step(steps: int, global_batch: int) -> list[str]:
    """Two epochs of ``steps // 2`` optimizer steps (the epoch-driven examples)."""
    return ["--epochs", "2", "--samples", str(steps // 2 * global_batch)]


# framework -> (example, its arguments for ``steps`` optimizer steps with output dir ``out``);
# every example also takes --step-time and --train-log, and logs the same JSON lines.
FRAMEWORKS: dict[str, tuple[str, Callable[[int, Path], list[str]]]] = {
    "torch": ("torch_ddp_elastic.py", lambda steps, out: ["--steps", str(steps)]),
    "lightning": (
        "lightning_elastic.py",
        lambda steps, out: [
            *_per_step(steps, 128),
            *("--global-batch", "128", "--per-gpu-batch", "64", "--dropout", "0"),
        ],
    ),
    "hf": (
        "hf_trainer_elastic.py",
        lambda steps, out: [
            *("--max-steps", str(steps), "--output-dir", str(out)),
            *("--global-batch", "16", "--per-device-batch", "2"),
        ],
    ),
    "accelerate": (
        "accelerate_elastic.py",
        lambda steps, out: [
            *_per_step(steps, 16),
            *("--global-batch", "16", "--per-device-batch", "2"),
        ],
    ),
}


# framework -> the package its example needs beyond torch
PACKAGES = {"lightning": "lightning", "hf": "transformers", "accelerate": "accelerate"}


def _resumed(start: dict[str, Any]) -> bool:
    """Whether a run's ``event: start`` line says it resumed from a checkpoint."""
    return bool(start.get("resumed_step") or start.get("resume_from"))


def check(framework: str, args: argparse.Namespace, torch: Any) -> bool:
    """Interrupt, resume at half the ranks and compare one framework's example; write its
    record. True when every check passed."""
    run = BenchRun.from_args("gpu_check_torch", args)
    run.params["framework"] = framework
    cuda = torch.cuda.is_available()
    gpus = args.gpus or (torch.cuda.device_count() if cuda else 2)
    tmp = Path(tempfile.mkdtemp(prefix=f"sgpu-gpu-{framework}-"))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "4",
        "SGPU_ELASTIC_DIR": str(tmp / "state"),
        "SGPU_CHECKPOINT_HOLD": "60",
        "SGPU_LAUNCH_TERM_WAIT": "10",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if cuda:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    script, flags = FRAMEWORKS[framework]

    def example(job: int, log: Path) -> list[str]:
        out = tmp / f"out-{job}"
        out.mkdir(exist_ok=True)
        return [str(EXAMPLES / script), *flags(args.steps, out), "--step-time", "0.01",
                "--train-log", str(log)]  # fmt: skip

    log = tmp / "run.jsonl"
    report: dict[str, Any] = {
        "framework": framework,
        "torch": torch.__version__,
        "cuda": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "ranks": gpus,
        "expected_backend": "nccl" if cuda else "gloo",
    }
    launcher = subprocess.Popen(
        [sys.executable, "-m", "slurmgpu", "launch", "--", *_torchrun(gpus), *example(5, log)],
        env={**env, "SLURM_JOB_ID": "5"},
        cwd=tmp,  # Lightning's default logger writes ./lightning_logs
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "run1.err").open("wb"),
    )
    if not _wait(lambda: sum("event" not in r for r in _records(log)) >= args.signal_at, 300):
        launcher.kill()
        report["problem"] = f"the first run did not train (see {tmp / 'run1.err'})"
        print(json.dumps(report, indent=1))
        run.figures = {"framework": framework, "problem": report["problem"]}
        run.write(args.json_out)
        return False
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
    seconds = {}
    for job, path in ((5, log), (6, tmp / "ref.jsonl")):  # resumed, then the baseline
        t0 = time.monotonic()
        done = subprocess.run(
            [*_torchrun(second), *example(job, path)],
            env={**env, "SLURM_JOB_ID": str(job)},
            cwd=tmp,
            capture_output=True,
            timeout=600,
            check=False,
        )
        seconds[job] = time.monotonic() - t0
        if done.returncode != 0:
            report["problem"] = f"job {job} exited {done.returncode}: {done.stderr[-2000:]!r}"
    records = _records(log)
    starts = [r for r in records if r.get("event") == "start"]
    steps = [r for r in records if "event" not in r]
    ref = [r for r in _records(tmp / "ref.jsonl") if "event" not in r]
    baseline = {r["step"]: r["loss"] for r in ref}
    diffs = [abs(r["loss"] - baseline[r["step"]]) for r in steps if r["step"] in baseline]
    # the backend each multi-rank run's process group used (a 1-rank Lightning run has none)
    backends = sorted({str(r.get("backend")) for r in starts if r["world"] > 1})
    report.update(
        {
            "runs": [(r["world"], _resumed(r), r.get("backend")) for r in starts],
            "backend": backends[0] if len(backends) == 1 else backends,
            "steps_continuous": [r["step"] for r in steps] == list(range(1, len(steps) + 1)),
            "steps": len(steps),
            "max_loss_diff_vs_uninterrupted": max(diffs) if diffs else None,
            "max_relative_loss_diff": max(
                (
                    abs(r["loss"] - baseline[r["step"]]) / max(abs(baseline[r["step"]]), 1e-12)
                    for r in steps
                    if r["step"] in baseline
                ),
                default=None,
            ),
            "state_dir": str(tmp),
        }
    )
    ok = (
        acked
        and "problem" not in report
        and not report["processes_left"]
        and backends == [report["expected_backend"]]
        and report["steps_continuous"]
        and len(starts) == 2
        and not _resumed(starts[0])
        and _resumed(starts[1])
        and len(steps) == args.steps
        and len(ref) == args.steps
        and (report["max_relative_loss_diff"] or 0) < 1e-3
    )
    report["ok"] = bool(ok)
    print(json.dumps(report, indent=1))
    run.baseline = {
        "uninterrupted_run_s": seconds[6],
        "uninterrupted_steps": len(baseline),
        "uninterrupted_final_loss": baseline[max(baseline)] if baseline else None,
    }
    run.figures = {
        k: report[k]
        for k in (
            *("framework", "torch", "cuda", "device", "ranks", "backend", "signal_to_ack_s"),
            *("sigterm_to_gone_s", "processes_left", "runs", "steps", "steps_continuous"),
            *("max_loss_diff_vs_uninterrupted", "max_relative_loss_diff", "ok"),
        )
    }
    run.figures["resumed_run_s"] = seconds[5]
    gone = report["sigterm_to_gone_s"]
    run.target("sigterm_to_gone_s", gone, "<= 1", gone <= 1.0)
    rel = report["max_relative_loss_diff"]
    if rel is not None:
        run.target("max_relative_loss_diff", rel, "< 0.001", rel < 1e-3)
    run.write(args.json_out)
    if ok and args.smoke:
        shutil.rmtree(tmp, ignore_errors=True)  # CI's runs leave nothing behind when all is well
    return bool(ok)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--gpus", type=int, default=0, help="ranks (default: every visible GPU)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (even)")
    p.add_argument("--signal-at", type=int, default=80, help="checkpoint signal after N steps")
    p.add_argument(
        "--framework", choices=(*FRAMEWORKS, "all"), default="torch", help="which example"
    )
    add_arguments(p, "2 ranks, 40 steps, the signal after 20")
    args = p.parse_args(argv)
    if args.smoke:
        args.gpus, args.steps, args.signal_at = 2, 40, 20
    if not 0 < args.signal_at < args.steps:
        p.error("--signal-at must lie between 0 and --steps")
    if args.steps % 2:
        p.error("--steps must be even (the epoch-driven examples train two epochs)")
    frameworks = list(FRAMEWORKS) if args.framework == "all" else [args.framework]
    try:
        import torch
    except ImportError:
        print(json.dumps({"problem": "torch is not importable"}))
        run = BenchRun.from_args("gpu_check_torch", args)
        run.figures = {"skipped": "torch is not importable"}
        run.write(args.json_out)
        return 2
    missing = [f for f in frameworks if f in PACKAGES and not importlib.util.find_spec(PACKAGES[f])]
    for framework in missing:
        print(json.dumps({"framework": framework, "problem": f"{PACKAGES[framework]} is absent"}))
        run = BenchRun.from_args("gpu_check_torch", args)
        run.params["framework"] = framework
        run.figures = {"framework": framework, "skipped": f"{PACKAGES[framework]} is absent"}
        run.write(args.json_out)
    results = [check(f, args, torch) for f in frameworks if f not in missing]
    return 1 if not all(results) else 2 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())

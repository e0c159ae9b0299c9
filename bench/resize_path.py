"""Decision → running at the new size on the real lab cluster (22.05; others: --slurm-root).

Starts a lab cluster (ports --ctld-port / --slurmd-port-base), submits the example
training (examples/elastic_train.py) with ``sgpu submit --malleable 2:4`` on 4 fake
GPUs and resizes it 4 → 2 → 4 … with the daemon's ResizeExecutor, observing every
second like the daemon does while a resize is in flight. Each resize is split into

- checkpoint: signal → acknowledgement seen by the daemon,
- stop: requeue → job pending again (killed, epilog done),
- requeue delay: requeue → the begin time Slurm gave the job,
- scheduling: the later of release and begin time → Slurm's start time,
- start-up: Slurm's start time → the first training step of the new run,
- total: decision → the daemon saw it running at the new size (plus start-up: first step).

Two paths, in the same run: ``fast`` (StartTime=now+1 with the update, release 1.5 s
later; the default) and the baseline ``slurm`` (Slurm's own requeue delay, cred_expire
+ 1 s = 11 s here, then the next scheduling pass). Prints medians and the ratio.

    .venv/bin/python bench/resize_path.py --resizes 3

``--torch`` then measures a PyTorch job the same way, in the same run: the example
examples/torch_ddp_elastic.py under torchrun (4 / 2 gloo ranks on the fake GPUs),
submitted with ``sgpu submit --malleable 2:4`` (so it runs under ``sgpu launch``), on the
fast path. For it and for the toy runtime's fast-path resizes the run's
``launch.jsonl`` and ``ack.json`` add: ``ckpt_durable`` (decision → the checkpoint durable,
the ack's time), ``exit_after_term`` (the requeue's SIGTERM reaching the launcher → the
launcher gone, every process of the run with it) and ``exit_after_ckpt`` (checkpoint durable
→ gone, which includes the daemon seeing the ack and requeueing). Target: the run gone
within 1 s of the checkpoint being durable and of the SIGTERM; whole resize < 30 s.

``--frameworks torch,accelerate,multinode`` measures each the same way after the toy
runtime, in the same run, and prints each beside the toy runtime's fast-path figure:
``accelerate`` is examples/accelerate_elastic.py (a plain Accelerate loop, 4 / 2 ranks),
``multinode`` the PyTorch example over 2 nodes x 2 GPUs (a launcher per node under srun,
c10d rendezvous on the first node) shrunk to 1 node in place (``NumNodes=`` on the running
job) and grown back by node count through the requeue; ``multinode-requeue`` the same with
``shrink_in_place = false`` (both ways through the requeue: the shrink's baseline);
``lightning`` is examples/lightning_elastic.py and ``hf`` examples/hf_trainer_elastic.py
(the Hugging Face Trainer, offline), each under torchrun at 4 / 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmgpu.cycle.resize import (  # noqa: E402
    CLOSED,
    RUNNING,
    ResizeExecutor,
    ResizeSettings,
    durations,
)
from slurmgpu.daemon.malleable import MalleableDirectory  # noqa: E402
from slurmgpu.elastic.spec import read_ack  # noqa: E402
from slurmgpu.lab.benchrun import BenchRun, add_arguments  # noqa: E402
from slurmgpu.lab.cluster import LabCluster  # noqa: E402
from slurmgpu.model import ClusterSnapshot, Job, JobState  # noqa: E402
from slurmgpu.policy.base import resize_action  # noqa: E402
from slurmgpu.slurm.cli import CliSlurmClient  # noqa: E402
from slurmgpu.store import open_store  # noqa: E402
from slurmgpu.store.transactions import TransactionStore  # noqa: E402

PHASES = ("checkpoint", "stop", "requeue_delay", "scheduling", "startup", "total")


def _log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _wait(what: str, check: Any, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def _job(slurm: CliSlurmClient, job_id: int) -> Job | None:
    return next((j for j in slurm.jobs() if j.job_id == job_id), None)


def resize_once(
    slurm: CliSlurmClient,
    store: TransactionStore,
    directory: MalleableDirectory,
    settings: ResizeSettings,
    job_id: int,
    to: int,
    log: Path,
) -> dict[str, float]:
    executor = ResizeExecutor(slurm, store, settings)
    snap = ClusterSnapshot(datetime.now(UTC), tuple(slurm.jobs()), (), slurm.version())
    job = next(j for j in snap.jobs if j.job_id == job_id)
    spec = directory.specs(snap)[job_id]
    frm = job.allocated_gpus
    action = resize_action("bench", job, frm, to, "bench")
    row = executor.start(
        action, job, spec, at=snap.taken_at, slurm_version=snap.slurm_version, to_gpus=to
    )
    while row.state not in CLOSED:
        time.sleep(1.0)  # the daemon's cycle while a resize is in flight
        snap = ClusterSnapshot(datetime.now(UTC), tuple(slurm.jobs()), (), slurm.version())
        executor.advance(snap, snap.taken_at)
        row = store.recent(["resize"], job_id=job_id, limit=1)[0]
    if row.state != RUNNING:
        raise SystemExit(f"resize ended {row.state}: {row.error}")
    phases = durations(row)
    # A shrink in place keeps the job's run (no requeue): its command starts again after
    # the update, which stands in for Slurm's start time.
    in_place = bool(row.payload.get("in_place"))
    restart = row.payload["restart_before"] + (0 if in_place else 1)
    t = row.payload["t"]
    started = datetime.fromisoformat(t["updated"] if in_place else t["started"])
    decided = datetime.fromisoformat(t["decided"])

    def first_step() -> float | None:
        steps = [
            r
            for r in _log(log)
            if "event" not in r
            and r.get("restart") == restart
            and float(r["at"]) > started.timestamp()
        ]
        return float(steps[0]["at"]) if steps else None

    first = _wait("the first step of the new run", first_step, 60)
    phases["startup"] = max(first - started.timestamp(), 0.0)
    phases["total"] = first - decided.timestamp()
    return phases


EXIT_PHASES = ("ckpt_durable", "exit_after_term", "exit_after_ckpt")


def exit_phases(state_dir: Path, job_id: int, decided_at: float) -> dict[str, float]:
    """The ended run's checkpoint and exit times (its launch.jsonl and ack.json)."""
    out: dict[str, float] = {}
    ack = read_ack(state_dir, job_id)
    events = _log(state_dir / str(job_id) / "launch.jsonl")
    since = [e for e in events if float(e["at"]) >= decided_at]
    term = next((float(e["at"]) for e in since if e["event"] == "stop_signal"), None)
    gone = next((float(e["at"]) for e in since if e["event"] == "exit"), None)
    if ack is not None and ack.at >= decided_at:
        out["ckpt_durable"] = ack.at - decided_at
        if gone is not None:
            out["exit_after_ckpt"] = gone - ack.at
    if term is not None and gone is not None:
        out["exit_after_term"] = gone - term
    return out


def resize_with_exit(
    slurm: CliSlurmClient,
    store: TransactionStore,
    directory: MalleableDirectory,
    job_id: int,
    to: int,
    log: Path,
    state_dir: Path,
    settings: ResizeSettings | None = None,
) -> dict[str, float]:
    decided = time.time()
    phases = resize_once(slurm, store, directory, settings or ResizeSettings(), job_id, to, log)
    phases.update(exit_phases(state_dir, job_id, decided))
    return phases


@dataclass(frozen=True)
class Framework:
    """A training submitted with ``sgpu submit --malleable`` and resized on the fast path."""

    name: str
    malleable: str  # MIN:MAX GPUs
    shape: tuple[str, ...]  # the job's size options (GPUs per node, nodes)
    sizes: tuple[int, int]  # shrink to, grow back to
    wrap: str  # the command; {log}: its training log (lines with restart and at), {out}: a dir
    settings: ResizeSettings = field(default_factory=ResizeSettings)  # how the executor resizes


def frameworks() -> dict[str, Framework]:
    torchrun = f"{sys.executable} -m torch.distributed.run"
    ddp = f"{ROOT / 'examples/torch_ddp_elastic.py'} --steps 1000000 --step-time 0.1"
    acc = f"{ROOT / 'examples/accelerate_elastic.py'} --epochs 100000 --step-time 0.1"
    light = f"{ROOT / 'examples/lightning_elastic.py'} --epochs 100000 --step-time 0.1"
    hf = (
        f"{ROOT / 'examples/hf_trainer_elastic.py'} --max-steps 1000000 --step-time 0.1 "
        "--output-dir {out}"
    )
    standalone = f"{torchrun} --standalone --nproc-per-node=$SGPU_GPUS"
    port = 29000 + os.getpid() % 20000
    per_node = (
        f"srun --ntasks-per-node=1 {sys.executable} -m slurmgpu launch -- {torchrun} "
        "--nnodes=$SLURM_NNODES --nproc-per-node=$SGPU_GPUS --rdzv-backend=c10d "
        f"--rdzv-endpoint=$SGPU_HEAD_ADDR:{port} --rdzv-id=$SLURM_JOB_ID"
    )
    return {
        "torch": Framework(
            "torch",
            "2:4",
            ("--gres=gpu:4",),
            (2, 4),
            f"{torchrun} --standalone --nproc-per-node=$SGPU_GPUS {ddp} --train-log {{log}}",
        ),
        "accelerate": Framework(
            "accelerate",
            "2:4",
            ("--gres=gpu:4",),
            (2, 4),
            f"{torchrun} --standalone --nproc-per-node=$SGPU_GPUS {acc} --train-log {{log}}",
        ),
        "multinode": Framework(  # 2 nodes x 2 GPUs <-> 1 node, by node count
            "multinode",
            "2:4",
            ("-N", "2", "--gres=gpu:2"),
            (2, 4),
            f"{per_node} {ddp} --train-log {{log}}",
        ),
        # The same by the requeue path (the baseline of the shrink in place), same run.
        "multinode-requeue": Framework(
            "multinode-requeue",
            "2:4",
            ("-N", "2", "--gres=gpu:2"),
            (2, 4),
            f"{per_node} {ddp} --train-log {{log}}",
            ResizeSettings(shrink_in_place=False),
        ),
        "lightning": Framework(
            "lightning",
            "2:4",
            ("--gres=gpu:4",),
            (2, 4),
            f"{standalone} {light} --train-log {{log}}",
        ),
        "hf": Framework(
            "hf",
            "2:4",
            ("--gres=gpu:4",),
            (2, 4),
            f"env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 {standalone} {hf} --train-log {{log}}",
        ),
    }


def run_framework(
    fw: Framework,
    env: dict[str, str],
    tmp: Path,
    slurm: CliSlurmClient,
    store: TransactionStore,
    directory: MalleableDirectory,
    resizes: int,
) -> list[dict[str, float]]:
    """``fw``'s training resized down and up ... on the fast path."""
    log = tmp / f"{fw.name}.jsonl"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmgpu",
            "submit",
            "--parsable",
            "-o",
            str(tmp / f"{fw.name}.out"),
            "--malleable",
            fw.malleable,
            "--checkpoint-grace",
            "60s",
            "--elastic-dir",
            str(tmp / "state"),
            *fw.shape,
            "--wrap",
            fw.wrap.format(log=log, out=tmp / f"{fw.name}-out"),
        ],
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    job_id = int(out.stdout.strip().split(";")[0])
    _wait(f"the {fw.name} job training", lambda: len(_log(log)) > 5, 180)
    results = []
    for i in range(resizes):
        to = fw.sizes[i % 2]
        phases = resize_with_exit(
            slurm, store, directory, job_id, to, log, tmp / "state", fw.settings
        )
        results.append({**phases, "to": float(to)})
        print(
            f"{fw.name} -> {to} GPUs: "
            + ", ".join(f"{k} {phases.get(k, float('nan')):.2f}s" for k in PHASES + EXIT_PHASES),
            flush=True,
        )
        time.sleep(2)
    steps = [int(r["step"]) for r in _log(log) if "event" not in r]
    assert steps == list(range(1, len(steps) + 1)), f"{fw.name}: steps lost or repeated"
    slurm.cancel(job_id)
    _wait(
        f"the {fw.name} job ended",
        lambda: (j := _job(slurm, job_id)) is None or j.state.is_terminal,
        60,
    )
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resizes", type=int, default=3, help="resizes per path")
    p.add_argument("--ctld-port", type=int, default=6931)
    p.add_argument("--slurmd-port-base", type=int, default=17201)
    p.add_argument(
        "--running-lab",
        action="store_true",
        help="use the lab cluster SLURM_CONF points at instead of starting one (CI's smoke run)",
    )
    p.add_argument(
        "--slurm-root",
        type=Path,
        help="run the lab on the Slurm of this chroot (scripts/slurm_chroot.sh build "
        "trixie|sid): the phases per release",
    )
    p.add_argument("--torch", action="store_true", help="also a PyTorch job (torchrun, fast path)")
    p.add_argument(
        "--frameworks",
        default="",
        help="comma-separated, each also measured on the fast path: torch (as --torch), "
        "accelerate (examples/accelerate_elastic.py), multinode (torchrun over 2 nodes x "
        "2 GPUs, resized by node count, shrunk in place), multinode-requeue (the same "
        "through the requeue both ways), lightning (examples/lightning_elastic.py), hf "
        "(examples/hf_trainer_elastic.py, the Hugging Face Trainer)",
    )
    add_arguments(p, "one resize per path")
    args = p.parse_args()
    if args.smoke:
        args.resizes = 1
    run = BenchRun.from_args("resize_path", args)
    tmp = Path(tempfile.mkdtemp(prefix="sgpu-bench-resize-"))
    lab: LabCluster | None = None
    if not args.running_lab:
        lab = LabCluster(
            # apart from tmp, which a chroot's jobs get bound in whole (below)
            Path(tempfile.mkdtemp(prefix="sgpu-bench-resize-lab-")),
            ctld_port=args.ctld_port,
            slurmd_port_base=args.slurmd_port_base,
            slurm_root=args.slurm_root,
        )
        lab.up(timeout_s=60)
        os.environ.update(lab.env())
        if lab.bin_dir is not None:  # a chroot's client commands (sbatch, scontrol...) first
            os.environ["PATH"] = f"{lab.bin_dir}:{os.environ.get('PATH', '')}"
        # Jobs in a chroot see the checkout, this Python and the run's files where they are.
        lab.share(ROOT, Path(sys.prefix), Path(sys.base_prefix), tmp)
    elif not os.environ.get("SLURM_CONF"):
        p.error("--running-lab needs SLURM_CONF set to a running lab cluster")
    job_id: int | None = None
    db = f"sqlite:///{tmp / 'state.db'}"
    env = {**os.environ, "SGPU_DB": db, "PYTHONPATH": str(ROOT)}
    try:
        jobstore = open_store(db)
        store = TransactionStore(jobstore.engine)
        slurm = CliSlurmClient(timeout_s=20)
        print(f"Slurm {slurm.version()} lab", flush=True)
        directory = MalleableDirectory(jobstore)
        log = tmp / "train.jsonl"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "slurmgpu",
                "submit",
                "--parsable",
                "-o",
                "/dev/null",
                "--malleable",
                "2:4",
                "--checkpoint-grace",
                "60s",
                "--elastic-dir",
                str(tmp / "state"),
                "--gres=gpu:4",
                "--wrap",
                f"{sys.executable} {ROOT / 'examples/elastic_train.py'} --steps 1000000 "
                f"--step-time 0.1 --log {log}",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        job_id = int(out.stdout.strip().split(";")[0])
        _wait("the job training", lambda: len(_log(log)) > 5)
        results: dict[str, list[dict[str, float]]] = {"fast": [], "slurm": []}
        sizes = [2, 4]
        for path, settings in (
            ("fast", ResizeSettings()),
            ("slurm", ResizeSettings(fast_start=False)),
        ):
            for i in range(args.resizes):
                to = sizes[i % 2] if _job(slurm, job_id) else 2
                current = _job(slurm, job_id)
                assert current is not None and current.state is JobState.RUNNING
                if current.allocated_gpus == to:
                    to = 4 if to == 2 else 2
                decided = time.time()
                phases = resize_once(slurm, store, directory, settings, job_id, to, log)
                phases.update(exit_phases(tmp / "state", job_id, decided))
                results[path].append(phases)
                print(
                    f"{path:5s} -> {to} GPUs: "
                    + ", ".join(f"{k} {phases.get(k, float('nan')):.1f}s" for k in PHASES),
                    flush=True,
                )
                time.sleep(2)
        steps = [int(r["step"]) for r in _log(log) if "event" not in r]
        assert steps == list(range(1, len(steps) + 1)), "steps lost or repeated"
        print()
        print(f"{'phase':14s} {'fast (s)':>9s} {'slurm (s)':>10s}")
        med: dict[str, dict[str, float]] = {}
        for path in results:
            med[path] = {
                k: statistics.median(r[k] for r in results[path] if k in r) for k in PHASES
            }
        for k in PHASES:
            print(f"{k:14s} {med['fast'][k]:9.1f} {med['slurm'][k]:10.1f}")
        ratio = med["slurm"]["total"] / med["fast"]["total"]
        print(
            f"\ndecision -> first step at the new size: fast {med['fast']['total']:.1f} s, "
            f"Slurm's own requeue path {med['slurm']['total']:.1f} s ({ratio:.1f}x slower); "
            f"{len(steps)} steps, none lost or repeated"
        )
        run.baseline = {"slurm_requeue_path_s": med["slurm"]}
        run.figures = {"fast_path_s": med["fast"], "slurm_vs_fast": ratio, "steps": len(steps)}
        names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
        if args.torch and "torch" not in names:
            names.insert(0, "torch")
        known = frameworks()
        unknown = [n for n in names if n not in known]
        if unknown:
            p.error(f"unknown --frameworks {unknown}: choose from {sorted(known)}")
        if names:
            slurm.cancel(job_id)
            _wait(
                "the toy job ended",
                lambda: (j := _job(slurm, job_id)) is None or j.state.is_terminal,
                60,
            )
        measured: dict[str, list[dict[str, float]]] = {}
        for name in names:
            measured[name] = run_framework(
                known[name], env, tmp, slurm, store, directory, args.resizes
            )
        if measured:
            toy = results["fast"]
            head = " ".join(f"{n + ' (s)':>14s}" for n in measured)
            print(f"\n{'phase':16s} {head} {'toy (s)':>8s}   (fast path, medians)")
            for k in PHASES + EXIT_PHASES:
                cells = []
                for rows in [*measured.values(), toy]:
                    values = [r[k] for r in rows if k in r]
                    cells.append(statistics.median(values) if values else float("nan"))
                body = " ".join(f"{c:14.2f}" for c in cells[:-1])
                print(f"{k:16s} {body} {cells[-1]:8.2f}")
            toy_total = statistics.median(r["total"] for r in toy)
            for name, rows in measured.items():
                total = statistics.median(r["total"] for r in rows)
                worst = max((r.get("exit_after_term", float("nan")) for r in rows), default=0)
                print(
                    f"{name}: decision -> first step at the new size {total:.1f} s "
                    f"(target < 30 s; the elastic runtime's {toy_total:.1f} s); SIGTERM -> "
                    f"every process gone at most {worst:.2f} s"
                )
                run.figures[f"{name}_s"] = {
                    k: statistics.median([r[k] for r in rows if k in r])
                    for k in PHASES + EXIT_PHASES
                    if any(k in r for r in rows)
                }
                run.target(f"{name}_total_s", total, "< 30", total < 30)
                if name == "torch":
                    run.target("torch_exit_after_term_s", worst, "<= 1", worst <= 1)
        if {"multinode", "multinode-requeue"} <= measured.keys():
            shrink = known["multinode"].sizes[0]

            def shrink_total(rows: list[dict[str, float]]) -> float:
                return statistics.median(r["total"] for r in rows if r["to"] == shrink)

            in_place = shrink_total(measured["multinode"])
            requeue = shrink_total(measured["multinode-requeue"])
            print(
                f"multinode shrink 2 -> 1 node, decision -> first step: in place "
                f"{in_place:.1f} s, by the requeue {requeue:.1f} s (same run; "
                f"{requeue / in_place:.2f}x)"
            )
            run.figures["multinode_shrink_in_place_s"] = in_place
            run.baseline["multinode_shrink_requeue_s"] = requeue
        run.write(args.json_out)
    finally:
        if lab is not None:
            lab.down(cancel_jobs=True)
        elif job_id is not None:
            subprocess.run(["scancel", str(job_id)], check=False, timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

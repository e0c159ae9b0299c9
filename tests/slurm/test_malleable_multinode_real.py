"""Multi-node malleable torchrun on the real lab cluster (4 slurmd on 127.0.0.1 as nodes).

``sgpu submit -N 2 --gres=gpu:2 --malleable 2:4 --wrap "srun --ntasks-per-node=1 sgpu
launch -- torchrun --nnodes=$SLURM_NNODES --rdzv-backend=c10d
--rdzv-endpoint=$SGPU_HEAD_ADDR:PORT ..."``: one launcher per node under srun, the batch
launcher in front of srun (added by submit), torchrun's c10d store on the first node.
The daemon's resize path (tests/slurm/resize_driver.py: MalleableActuator and
ResizeExecutor) shrinks it by node count in place, 2 nodes x 2 GPUs -> 1 node
(``NumNodes=1`` on the running job, TERM to its steps: no requeue, the batch launcher
starts the command again on the node kept), and grows it back to 2 nodes through the
requeue (``NumNodes=2`` in the held job's update): 4 -> 2 -> 4 ranks, every step once,
each run resuming at the step the last one checkpointed, the loss following an
uninterrupted run's, no process of an earlier run left on any node (but the batch
launcher, which the shrink keeps), one appended log.
In the ``release`` set too (scripts/test.sh runs it on 24.11 and 26.05).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from slurmgpu.lab.cluster import LabCluster
from tests.lab_processes import job_processes
from tests.polling import wait_for
from tests.ports import free_port
from tests.slurm.harness import Lab, framework_lab
from tests.slurm.torch_reference import torch_reference

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "fills the 4-node lab's 16 GPUs for the resize (16 nodes: 15 fillers, not 3)"

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_ddp_elastic.py"
PY = sys.executable


@pytest.fixture
def lab(slurm_cluster: LabCluster) -> Iterator[Lab]:
    with framework_lab(
        slurm_cluster, "multinode", ("torch",), "pip install torch==2.13.0", "release"
    ) as lab:
        yield lab


def _records(lab: Lab) -> list[dict[str, Any]]:
    path = lab.tmp / "mn.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _steps(lab: Lab) -> list[dict[str, Any]]:
    return [r for r in _records(lab) if "event" not in r]


def _starts(lab: Lab) -> list[dict[str, Any]]:
    return [r for r in _records(lab) if r.get("event") == "start"]


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _launch_events(lab: Lab, job: int) -> list[dict[str, Any]]:
    path = lab.tmp / "state" / str(job) / "launch.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.release
def test_a_two_node_torchrun_job_shrinks_to_one_node_and_grows_back(lab: Lab) -> None:
    port = free_port()
    log = lab.tmp / "mn.jsonl"
    wrap = (
        f"srun --ntasks-per-node=1 {PY} -m slurmgpu launch -- "
        f"{PY} -m torch.distributed.run --nnodes=$SLURM_NNODES --nproc-per-node=$SGPU_GPUS "
        f"--rdzv-backend=c10d --rdzv-endpoint=$SGPU_HEAD_ADDR:{port} --rdzv-id=$SLURM_JOB_ID "
        f"{EXAMPLE} --steps 100000 --step-time 0.1 --train-log {log}"
    )
    out = lab.sgpu(
        "submit",
        "--parsable",
        "-o",
        str(lab.tmp / "mn.out"),
        "--malleable",
        "2:4",
        "--checkpoint-grace",
        "60s",
        "--elastic-dir",
        str(lab.tmp / "state"),
        "-N",
        "2",
        "--gres=gpu:2",
        "-t",
        "30",
        "-J",
        "mn",
        "--wrap",
        wrap,
    )
    job = int(out.strip().split(";")[0])
    first = wait_for("the job on 2 nodes", lambda: lab.running(job, 4), timeout_s=60)
    assert first.node_count == 2
    wait_for("10 steps at 4 ranks", lambda: len(_steps(lab)) >= 10, timeout_s=180)
    first_run = job_processes(job, lab.env["SLURM_CONF"])
    # Two launchers in the job step (one per node) besides the batch one.
    starts = [e for e in _launch_events(lab, job) if e["event"] == "start"]
    assert len(starts) == 3

    batch_launcher = starts[0]["pid"]
    driven = lab.drive("--start", f"{job}:4:2")  # returns once it runs at 2 GPUs
    shrunk = lab.running(job, 2)
    assert shrunk is not None and shrunk.node_count == 1, (driven, lab.job(job))
    assert shrunk.restart_count == 0, "shrunk in place, not requeued"
    wait_for(
        "the first run's processes gone (but the batch launcher)",
        lambda: [p.pid for p in _alive(first_run)] == [batch_launcher],
        timeout_s=30,
    )
    shrink = wait_for(
        "the batch launcher's restart on the node kept",
        lambda: [e for e in _launch_events(lab, job) if e["event"] == "shrunk_in_place"],
        timeout_s=60,
    )
    assert [(e["pid"], e["nodes"], e["was"]) for e in shrink] == [(batch_launcher, 1, 2)]
    wait_for("steps at 2 ranks", lambda: any(s["world"] == 2 for s in _steps(lab)))
    second_run = job_processes(job, lab.env["SLURM_CONF"])
    lab.drive("--start", f"{job}:2:4")
    grown = wait_for("the job on 2 nodes again", lambda: lab.running(job, 4))
    assert grown.node_count == 2 and grown.restart_count == 1
    assert not _alive(second_run)
    wait_for(
        "5 steps after the grow",
        lambda: (
            len(_starts(lab)) == 3
            and _steps(lab)[-1]["step"] > _starts(lab)[-1]["resumed_step"] + 5
        ),
        timeout_s=180,
    )
    lab.slurm.cancel(job)
    wait_for("the job gone", lambda: (j := lab.job(job)) is None or j.state.is_terminal)
    wait_for(
        "no process of the job left on any node",
        lambda: not job_processes(job, lab.env["SLURM_CONF"]),
        timeout_s=30,
    )

    runs = _starts(lab)
    assert [(r["world"], r["restart"], r["gpus"]) for r in runs] == [
        (4, 0, 4),
        (2, 0, 2),  # in place: the same run of the job, its command started again
        (4, 1, 4),
    ]
    records = _records(lab)
    steps = [int(s["step"]) for s in _steps(lab)]
    assert steps == list(range(1, len(steps) + 1)), "a step was lost or repeated"
    last_before: list[int] = []
    previous = 0
    for r in records:
        if r.get("event") == "start" and previous:
            last_before.append(previous)
        elif "event" not in r:
            previous = int(r["step"])
    assert [r["resumed_step"] for r in runs[1:]] == last_before
    # Every run's launchers: the batch one and one per node of that run; after the
    # shrink in place the batch launcher (the same process) starts srun again, and srun
    # the node's launcher.
    events = _launch_events(lab, job)
    assert len([e for e in events if e["event"] == "start"]) == 3 + 2 + 3
    ack = json.loads((lab.tmp / "state" / str(job) / "ack.json").read_text())
    assert ack["acks"] >= 2
    # The loss follows an uninterrupted run's up to 20 steps past the first resize (the
    # global batch is kept; later the summation orders part ways, as the torchrun test says).
    losses = {int(s["step"]): float(s["loss"]) for s in _steps(lab)}
    exact_until = min(runs[1]["resumed_step"] + 20, max(losses))
    reference = torch_reference(lab, exact_until)
    for step in range(1, exact_until + 1):
        assert math.isclose(losses[step], reference[step], rel_tol=1e-3, abs_tol=1e-6), step
    output = (lab.tmp / "mn.out").read_text()
    assert output.count("sgpu launch: start") == 3 + 2 + 3

"""Malleable Hugging Face Trainer on the real lab cluster: examples/hf_trainer_elastic.py (an
ordinary Trainer script with the four lines) submitted with ``sgpu submit --malleable 1:2
--wrap "torchrun ..."`` shrinks from 2 ranks to 1 when a rigid 1-GPU job waits on a full
cluster and grows back to 2 after it, through the daemon's own MalleableActuator
(tests/slurm/resize_driver.py), and checkpoints on scancel's SIGTERM: the rigid job
starts; every optimizer step once across the three runs, each on a global batch of 8
(2 x 2 x accumulation 2 at 2 ranks, 2 x 4 at 1); every sample at most once per epoch and
exactly once in each finished epoch; the loss of every step that of an uninterrupted
2-rank run of the same seed (torchrun without Slurm, in this test); the acks the daemon
saw are the runtime's; no process of an earlier run left; the three runs' output
appended to one log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.lab.cluster import LabCluster
from tests.slurm.example_resize import GLOBAL_BATCH, SAMPLES, assert_marked_at, shrink_and_grow
from tests.slurm.harness import ROOT, Lab, framework_lab

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "fills the 4-node lab's 16 GPUs for the resize (16 nodes: 15 fillers, not 3)"

EXAMPLE = ROOT / "examples" / "hf_trainer_elastic.py"
MAX_STEPS = 2000  # the test stops it early


@pytest.fixture
def lab(slurm_cluster: LabCluster) -> Iterator[Lab]:
    with framework_lab(
        slurm_cluster,
        "hf",
        ("torch", "transformers"),
        "pip install torch==2.13.0 'slurmgpu[huggingface]'",
        "slurm",
    ) as lab:
        yield lab


def _example_args(out: Path, name: str) -> list[str]:
    return [
        str(EXAMPLE),
        "--output-dir",
        str(out / name),
        "--max-steps",
        str(MAX_STEPS),
        "--samples",
        str(SAMPLES),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--per-device-batch",
        "2",
        "--train-log",
        str(out / f"{name}.train.jsonl"),
        "--index-log",
        str(out / f"{name}.idx.jsonl"),
    ]


@pytest.mark.slow
def test_a_trainer_job_shrinks_for_a_rigid_job_and_grows_back(lab: Lab) -> None:
    run = shrink_and_grow(lab, "hf", _example_args, "env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ")
    assert_marked_at(run.out / "run" / f"checkpoint-{run.last}", run.last)

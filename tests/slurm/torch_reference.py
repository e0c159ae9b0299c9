"""The uninterrupted torchrun reference the malleable torch tests compare a resized run
with (examples/torch_ddp_elastic.py, 2 ranks, outside Slurm, same seed)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.slurm.harness import ROOT, Lab

TORCH_EXAMPLE = ROOT / "examples" / "torch_ddp_elastic.py"
TORCHRUN = f"{sys.executable} -m torch.distributed.run --standalone"


def torch_reference(lab: Lab, steps: int) -> dict[int, float]:
    """The same training uninterrupted (2 ranks, outside Slurm, same seed), ``steps`` long:
    step → loss."""
    ref = lab.tmp / "reference"
    ref.mkdir()
    env = {k: v for k, v in lab.env.items() if not k.startswith("SLURM_")}
    env["SGPU_ELASTIC_DIR"] = str(ref / "state")
    done = subprocess.run(
        [
            *TORCHRUN.split(),
            "--nproc-per-node=2",
            str(TORCH_EXAMPLE),
            "--steps",
            "100000",
            "--stop-at",
            str(steps),
            "--train-log",
            str(ref / "ref.jsonl"),
        ],
        cwd=ref,
        env=env,
        check=False,
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"reference run exited {done.returncode}:\n{done.stderr[-3000:]}"
    records = [json.loads(x) for x in (ref / "ref.jsonl").read_text().splitlines()]
    return {int(r["step"]): float(r["loss"]) for r in records if "event" not in r}

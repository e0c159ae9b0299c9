"""sgpu submit --malleable / --pool: what reaches sbatch and what is recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgpu.cli.launchwrap import check_script, launch_prefix
from slurmgpu.cli.submit import (
    MALLEABLE_OPTIONS,
    array_task_count,
    malleable_args,
    malleable_request,
    split_sgpu_options,
    take_values,
)


def _prepare(args: tuple[str, ...]) -> list[str]:
    values, rest = take_values(args, MALLEABLE_OPTIONS)
    flags, sbatch = split_sgpu_options(rest)
    req = malleable_request(values, "--pool" in flags, sbatch)
    return malleable_args(req, sbatch)


def test_malleable_adds_the_token_requeue_signal_and_keeps_the_script_args(
    tmp_path: Path,
) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    out = _prepare(
        (
            "--malleable",
            "2:4",
            "--checkpoint-grace=90s",
            "--gres=gpu:4",
            str(script),
            "--malleable",
            "x",
        )
    )
    assert out[:2] == ["--requeue", "--signal=B:USR2@90"]
    comment = next(a for a in out if a.startswith("--comment="))
    assert comment.split("=", 1)[1].split()[:2] == ["sgpu:malleable=2:4", "sgpu:ckpt=USR2:90"]
    assert out[-3:] == [str(script), "--malleable", "x"]  # the script's own arguments


def test_a_wrap_runs_under_the_launcher_so_the_signal_reaches_the_program() -> None:
    launch = launch_prefix()
    # the checkpoint signal ignored until the launcher catches it (a resize signalled
    # while the interpreter starts must not kill the job)
    assert launch.startswith("trap '' USR2; exec ") and launch.endswith(" -m slurmgpu launch --")
    out = _prepare(("--malleable=1:2", "--wrap", "python train.py --steps 5"))
    assert out[out.index("--wrap") + 1] == f"{launch} python train.py --steps 5"
    assert "--open-mode=append" in out  # the log carries on across requeues
    out = _prepare(("--malleable=1:2", "--wrap=python a.py; python b.py"))
    assert f"--wrap={launch} /bin/sh -c 'python a.py; python b.py'" in out  # shell syntax
    out = _prepare(("--malleable=1:2", "--signal=USR2@60", "--wrap=srun python a.py"))
    assert not any(a.startswith("--signal=B:") for a in out)  # the user's own --signal
    assert f"--wrap={launch} srun python a.py" in out
    out = _prepare(("--malleable=1:2", "--open-mode=truncate", "--wrap=exec sgpu launch -- x"))
    assert "--open-mode=append" not in out and "--wrap=exec sgpu launch -- x" in out


@pytest.mark.parametrize(
    ("body", "verdict"),
    [
        ("exec sgpu launch -- torchrun --nproc-per-node=4 train.py", None),
        ("exec torchrun --nproc-per-node=4 train.py", "starts torchrun directly"),
        ("python -m torch.distributed.run train.py", "starts torchrun directly"),
        ("sgpu launch -- torchrun train.py", "without `exec`"),
        ("exec python train.py", "note"),
    ],
)
def test_a_malleable_script_must_run_under_exec_sgpu_launch(
    tmp_path: Path, body: str, verdict: str | None
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --gres=gpu:4\n# torchrun in a comment\n{body}\n")
    got = check_script(script)
    if verdict is None:
        assert got.error is None and got.note is None
    elif verdict == "note":
        assert got.error is None and got.note is not None and "sgpu launch" in got.note
    else:
        assert got.error is not None and verdict in got.error and "line 4" in got.error
        assert "exec sgpu launch --" in got.error


def test_pool_needs_an_array_and_defaults_to_its_task_count() -> None:
    values, rest = take_values(("--array=0-7%2", "--wrap=true"), MALLEABLE_OPTIONS)
    req = malleable_request(values, True, list(rest))
    assert (req.lo, req.hi, req.pool) == (1, 8, True)
    comment = next(a for a in malleable_args(req, list(rest)) if a.startswith("--comment="))
    assert comment.startswith("--comment=sgpu:pool=1:8 sgpu:ckpt=USR2:120 sgpu:edir=/")
    with pytest.raises(ValueError, match="--pool needs --array"):
        malleable_request({}, True, ["--wrap=true"])
    assert array_task_count("1,3,5-7") == 5
    assert array_task_count("0-15:4%2") == 4


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"--malleable": "4:2"}, "MIN <= MAX"),
        ({"--malleable": "2:4", "--checkpoint-signal": "US R2"}, "signal name"),
        ({"--malleable": "2:4", "--checkpoint-grace": "soon"}, "duration"),
        ({"--checkpoint-grace": "10s"}, "need --malleable"),
    ],
)
def test_bad_malleable_options_get_one_clear_line(values: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        malleable_request(values, False, ["--wrap=true"])


def test_sgpu_submit_refuses_exec_torchrun_before_calling_sbatch(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nexec torchrun --nproc-per-node=4 train.py\n")
    env = {**os.environ, "SGPU_DB": f"sqlite:///{tmp_path / 'db'}", "PATH": "/nonexistent"}
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgpu", "submit", "--malleable", "2:4", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "torchrun dies of the checkpoint signal" in err and len(err.splitlines()) == 1
    assert "exec sgpu launch -- torchrun --nproc-per-node=4 train.py" in err


def test_a_launcher_per_node_under_srun_gets_the_batch_launcher_in_front() -> None:
    launch = launch_prefix()
    per_node = (
        "srun --ntasks-per-node=1 sgpu launch -- torchrun --nnodes=$SLURM_NNODES "
        "--rdzv-endpoint=$SGPU_HEAD_ADDR:29400 train.py"
    )
    out = _prepare(("--malleable=2:4", "-N", "2", f"--wrap={per_node}"))
    assert f"--wrap={launch} /bin/sh -c '{per_node}'" in out  # $VARs: through a shell
    plain = "srun --ntasks-per-node=1 sgpu launch -- torchrun train.py"
    assert f"--wrap={launch} {plain}" in _prepare(("--malleable=2:4", f"--wrap={plain}"))
    outer = f"exec sgpu launch -- {plain}"  # already in front: kept
    assert f"--wrap={outer}" in _prepare(("--malleable=2:4", f"--wrap={outer}"))


@pytest.mark.parametrize(
    ("body", "verdict"),
    [
        ("exec sgpu launch -- srun sgpu launch -- torchrun --nnodes=2 train.py", None),
        ("srun --ntasks-per-node=1 sgpu launch -- torchrun train.py", "per node under srun"),
    ],
)
def test_a_script_with_a_launcher_per_node_needs_the_batch_launcher(
    tmp_path: Path, body: str, verdict: str | None
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -N 2\n{body}\n")
    got = check_script(script)
    if verdict is None:
        assert got.error is None and got.note is None
    else:
        assert got.error is not None and verdict in got.error
        assert f"`exec sgpu launch -- {body}`" in got.error


def test_the_multinode_example_script_passes_the_check() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "torch_multinode.sh"
    got = check_script(example)
    assert got.error is None and got.note is None

"""sgpu submit --malleable / --pool: what reaches sbatch and what is recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_a_plain_wrap_is_execed_so_the_signal_reaches_the_program() -> None:
    out = _prepare(("--malleable=1:2", "--wrap", "python train.py --steps 5"))
    assert out[out.index("--wrap") + 1] == "exec python train.py --steps 5"
    out = _prepare(("--malleable=1:2", "--wrap=python a.py; python b.py"))
    assert "--wrap=python a.py; python b.py" in out  # shell syntax: left alone
    out = _prepare(("--malleable=1:2", "--signal=USR2@60", "--wrap=srun python a.py"))
    assert not any(a.startswith("--signal=B:") for a in out)  # the user's own --signal
    assert "--wrap=srun python a.py" in out


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

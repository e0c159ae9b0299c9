"""sgpu submit's own options are taken out before the script; sbatch gets the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.checkpoint_signal import CATCHABLE
from slurmgpu.cli.main import main
from slurmgpu.cli.submit import (
    add_comment_token,
    malleable_args,
    malleable_request,
    split_sgpu_options,
)
from slurmgpu.tokens import CHECKPOINT_SIGNALS, parse


def test_rightsize_flag_is_removed_and_script_arguments_are_untouched(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n")
    flags, rest = split_sgpu_options(("--rightsize", "-J", "x", str(script), "--rightsize", "a b"))
    assert flags == {"--rightsize"}
    assert rest == ["-J", "x", str(script), "--rightsize", "a b"]


def test_comment_token_is_appended_to_an_existing_comment(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("")
    assert add_comment_token(["--comment=hi", str(script)], "sgpu:rightsize") == [
        "--comment=hi sgpu:rightsize",
        str(script),
    ]
    assert add_comment_token(["--comment", "hi", str(script)], "t") == [
        "--comment",
        "hi t",
        str(script),
    ]


def test_comment_token_is_added_when_there_is_no_comment(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("")
    assert add_comment_token(["-J", "x", str(script), "--comment=arg"], "t") == [
        "--comment=t",
        "-J",
        "x",
        str(script),
        "--comment=arg",
    ]


# ---- the checkpoint signal (issue 36, finding 6): one a process can catch, or one line


@pytest.mark.parametrize(
    "given", ["KILL", "kill", "SIGKILL", "9", " 9 ", "STOP", "SIGSTOP", "sigstop", "19"]
)
def test_an_uncatchable_checkpoint_signal_is_refused_in_one_line(given: str) -> None:
    with pytest.raises(ValueError, match=r"^--checkpoint-signal: SIG(KILL|STOP) cannot be caught"):
        malleable_request({"--malleable": "2:4", "--checkpoint-signal": given}, False, ["--wrap=x"])


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("0", "not a signal number"),
        ("65", "not a signal number"),
        ("0000009", "signal number"),
        ("USR3", "not a signal name"),
        ("SIG", "not a signal name"),
        ("", "not a signal name"),
    ],
)
def test_a_checkpoint_signal_that_is_no_signal_is_refused(given: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        malleable_request({"--malleable": "2:4", "--checkpoint-signal": given}, False, ["--wrap=x"])


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("USR1", "USR1"),
        ("sigusr2", "USR2"),
        ("TERM", "TERM"),
        ("INT", "INT"),
        ("HUP", "HUP"),
        ("10", "USR1"),
        ("SIGIOT", "ABRT"),
    ],
)
def test_a_catchable_checkpoint_signal_reaches_sbatch_and_the_token_by_name(
    given: str, name: str
) -> None:
    req = malleable_request(
        {"--malleable": "2:4", "--checkpoint-signal": given, "--checkpoint-grace": "90s"},
        False,
        ["--wrap=x"],
    )
    out = malleable_args(req, ["--wrap=x"])
    assert f"--signal=B:{name}@90" in out
    assert parse(next(a for a in out if a.startswith("--comment="))).ckpt_signal == name


def test_sgpu_submit_with_kill_stops_before_sbatch_with_one_line(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec sgpu launch -- python train.py\n")
    result = CliRunner().invoke(
        main, ["submit", "--malleable", "2:4", "--checkpoint-signal", "KILL", str(script)]
    )
    assert result.exit_code == 2
    assert result.output.strip() == (
        "sgpu: --checkpoint-signal: SIGKILL cannot be caught, so it cannot ask for a "
        "checkpoint (use e.g. USR2)"
    )


@pytest.mark.parametrize("given", ["KILL", "SIGSTOP", "9"])
def test_sgpu_launch_refuses_an_uncatchable_signal_in_one_line(given: str) -> None:
    result = CliRunner().invoke(
        main, ["launch", "--", "true"], env={"SGPU_CHECKPOINT_SIGNAL": given, "SLURM_JOB_ID": ""}
    )
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "SGPU_CHECKPOINT_SIGNAL: SIG" in lines[0]
    assert "cannot be caught" in lines[0]


def test_the_job_runtime_refuses_an_uncatchable_signal() -> None:
    from slurmgpu.elastic import init

    with pytest.raises(ValueError, match="SGPU_CHECKPOINT_SIGNAL: SIGKILL cannot be caught"):
        init({"SGPU_CHECKPOINT_SIGNAL": "KILL"}, install_handlers=False)


def test_the_comment_token_takes_the_same_signals() -> None:
    assert CHECKPOINT_SIGNALS == CATCHABLE
    assert {"USR1", "USR2", "TERM", "INT", "HUP"} <= CATCHABLE
    assert not {"KILL", "STOP"} & CATCHABLE


@pytest.mark.parametrize("given", ["B:KILL@60", "KILL@60", "9", "R:SIGSTOP@30", "X:USR1@60"])
def test_a_malleable_jobs_own_sbatch_signal_must_be_catchable_too(given: str) -> None:
    with pytest.raises(ValueError, match=r"^--signal '.*' of a malleable job: "):
        malleable_request({"--malleable": "2:4"}, False, [f"--signal={given}", "--wrap=x"])


@pytest.mark.parametrize("given", ["B:USR1@60", "USR1@60", "R:TERM", "10@30"])
def test_a_malleable_jobs_own_catchable_sbatch_signal_is_kept(given: str) -> None:
    req = malleable_request({"--malleable": "2:4"}, False, [f"--signal={given}", "--wrap=x"])
    out = malleable_args(req, [f"--signal={given}", "--wrap=x"])
    assert f"--signal={given}" in out and not [a for a in out if a.startswith("--signal=B:USR2")]

"""sgpu submit's own options are taken out before the script; sbatch gets the rest."""

from __future__ import annotations

from pathlib import Path

from slurmgpu.cli.submit import add_comment_token, split_sgpu_options


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

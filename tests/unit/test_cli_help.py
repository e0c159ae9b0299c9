"""What a new user finds from --help: every sgpu option, an example for every command, and a
misspelt sgpu option refused with a suggestion instead of reaching sbatch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurmgpu.cli import sbatch_options as sb
from slurmgpu.cli.main import main
from slurmgpu.cli.submit import SGPU_OPTIONS, misspelt_sgpu_option


def _tree() -> Iterator[tuple[list[str], click.Command]]:
    def walk(
        cmd: click.Command, path: list[str], ctx: click.Context
    ) -> Iterator[tuple[list[str], click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, [*path, name], click.Context(sub, parent=ctx, info_name=name))

    yield from walk(main, [], click.Context(main, info_name="sgpu"))


COMMAND_PATHS = [path for path, _ in _tree()]


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(p) or "sgpu")
def test_every_command_help_ends_with_examples_of_that_command(path: list[str]) -> None:
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output
    examples = result.output.split("Examples:", 1)[1].splitlines()
    runs = [
        line.strip() for line in examples if line.strip().startswith(("sgpu", "eval", "exec sgpu"))
    ]
    assert runs, result.output
    if path:  # each example runs this very command (sgpu's own shows several)
        assert all(" ".join(path) in run for run in runs), runs


def test_submit_help_lists_each_sgpu_option_on_one_line_then_sbatch() -> None:
    result = CliRunner().invoke(main, ["submit", "--help"], terminal_width=80)
    assert result.exit_code == 0
    out = result.output
    ours = out.split("sgpu options:", 1)[1].split("sbatch options:", 1)[0]
    lines = [line for line in ours.splitlines() if line.strip()]
    assert [line.split()[0] for line in lines] == [name for name, _, _ in SGPU_OPTIONS] + ["-h,"], (
        "one line per option, nothing wrapped"
    )
    assert all(len(line) <= 80 for line in lines)
    assert "Every other option goes to sbatch unchanged" in out
    assert "sgpu submit --malleable 2:4" in out.split("Examples:", 1)[1]


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("--maleable", "--malleable"),
        ("--malleble=2:4", "--malleable"),
        ("--rightsise", "--rightsize"),
        ("--sharable", "--shareable"),
        ("--gpu-memory", "--gpu-mem"),
        ("--checkpoint-grase", "--checkpoint-grace"),
        ("--checkpoint-sig", "--checkpoint-signal"),
        ("--elastic-directory", "--elastic-dir"),
        ("--pools", "--pool"),
    ],
)
def test_a_misspelt_sgpu_option_is_named_with_what_was_meant(given: str, meant: str) -> None:
    name = given.split("=", 1)[0]
    assert misspelt_sgpu_option(("-N", "1", given, "2:4", "job.sh")) == (name, meant)


def test_every_sbatch_option_passes_in_each_form() -> None:
    for opt in sorted(sb.LONG_WITH_VALUE):
        assert misspelt_sgpu_option((opt, "x", "--maleable")) == ("--maleable", "--malleable")
        assert misspelt_sgpu_option((f"{opt}=x", "job.sh")) is None
    for opt in sorted(sb.LONG_WITHOUT_VALUE):
        assert misspelt_sgpu_option((opt, "job.sh")) is None, opt
    for letter in sorted(sb.SHORT_WITH_VALUE):
        assert misspelt_sgpu_option((f"-{letter}", "--maleable", "job.sh")) is None, letter
        assert misspelt_sgpu_option((f"-{letter}1", "job.sh")) is None, letter
    for letter in sorted(sb.SHORT_WITHOUT_VALUE):
        assert misspelt_sgpu_option((f"-{letter}", "--maleable")) is not None, letter


def test_sgpu_options_and_their_values_are_not_typos() -> None:
    args = ("--malleable", "2:4", "--gpu-mem=8GiB", "--checkpoint-signal", "--USR2", "--pool")
    assert misspelt_sgpu_option((*args, "--rightsize", "--shareable", "job.sh")) is None


def test_getopt_prefixes_of_sbatch_options_pass_and_the_script_arguments_are_its_own() -> None:
    assert misspelt_sgpu_option(("--parsab", "--gpus-per-n=1", "--wrap", "--maleable")) is None
    assert misspelt_sgpu_option(("-N", "1", "train.sh", "--maleable", "--sharable")) is None
    assert misspelt_sgpu_option(("--", "--maleable")) is None


def test_an_unknown_option_close_to_no_sgpu_option_goes_to_sbatch() -> None:
    # A newer sbatch may know options this list does not: sbatch itself judges them.
    assert misspelt_sgpu_option(("--frobnicate-nodes=3", "job.sh")) is None


FAKE_SBATCH = """#!{python}
import json, sys
with open({record!r}, "w") as f:
    json.dump(sys.argv[1:], f)
print("4242")
"""


def _run_submit(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "sbatch.json"
    record.unlink(missing_ok=True)
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH.format(python=sys.executable, record=str(record)))
    sbatch.chmod(0o755)
    config = tmp_path / "c.toml"
    config.write_text('[slurm]\nbackend = "cli"\n')
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SGPU_DB": f"sqlite:///{tmp_path / 'none' / 's.db'}",
        "SGPU_CONFIG": str(config),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgpu", "submit", *argv],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    return proc, record


def test_submit_refuses_a_misspelt_option_before_sbatch_runs(tmp_path: Path) -> None:
    proc, record = _run_submit(tmp_path, "--maleable", "2:4", "--gres=gpu:2", "--wrap", "true")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "sgpu: no such option --maleable; did you mean --malleable? (see sgpu submit --help)"
    ]
    assert not record.exists(), "sbatch must not have been called"


def test_submit_passes_real_sbatch_options_unchanged(tmp_path: Path) -> None:
    argv = ["--gpus-per-node=1", "--mail-type", "END", "-J", "--maleable", "--wrap", "true"]
    proc, record = _run_submit(tmp_path, *argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "Submitted batch job 4242"
    # The client adds --parsable to read the job id back; the rest is the user's, unchanged.
    assert [a for a in json.loads(record.read_text()) if a != "--parsable"] == argv

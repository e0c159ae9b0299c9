"""Shell completion (click's) for bash and zsh: commands, options, and sgpu submit's own
options, which its pass-through argument list would otherwise hide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every completion starts sgpu as a new process (and bash, zsh)


def _complete(shell: str, words: str) -> list[str]:
    env = {
        **os.environ,
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
        "_SGPU_COMPLETE": f"{shell}_complete",
    }
    out = subprocess.run(
        [sys.executable, "-c", "from slurmgpu.cli.main import main; main(prog_name='sgpu')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    if shell == "bash":  # "type,value" per line
        return [line.split(",", 1)[1] for line in out.stdout.splitlines()]
    lines = out.stdout.splitlines()  # zsh: type, value, help (or "_") per item
    return [lines[i + 1] for i in range(0, len(lines), 3)]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_commands_and_their_options_complete(shell: str) -> None:
    assert _complete(shell, "sgpu ac") == ["actions"]
    assert _complete(shell, "sgpu jobs --wa") == ["--watch"]
    assert "up" in _complete(shell, "sgpu cluster u")


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_submit_completes_sgpu_options_first_then_sbatch_ones(shell: str) -> None:
    assert _complete(shell, "sgpu submit --mal") == ["--malleable"]
    assert _complete(shell, "sgpu submit -J x --checkpoint-") == [
        "--checkpoint-signal",
        "--checkpoint-grace",
    ]
    gpu = _complete(shell, "sgpu submit --gpu")
    assert gpu[0] == "--gpu-mem" and {"--gpus", "--gpus-per-node", "--gpu-bind"} <= set(gpu)


def test_zsh_shows_the_help_of_sgpu_options() -> None:
    env = {
        **os.environ,
        "COMP_WORDS": "sgpu submit --sha",
        "COMP_CWORD": "2",
        "_SGPU_COMPLETE": "zsh_complete",
    }
    out = subprocess.run(
        [sys.executable, "-c", "from slurmgpu.cli.main import main; main(prog_name='sgpu')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.splitlines() == [
        "plain",
        "--shareable",
        "May share a GPU with light jobs (co-location).",
    ]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_completion_script_is_what_the_docs_say_to_source(shell: str) -> None:
    env = {**os.environ, "_SGPU_COMPLETE": f"{shell}_source"}
    out = subprocess.run(
        [sys.executable, "-c", "from slurmgpu.cli.main import main; main(prog_name='sgpu')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "_sgpu_completion" in out.stdout
    if shell == "bash":  # and bash accepts it
        subprocess.run(["bash", "-n"], input=out.stdout, text=True, check=True, timeout=30)

"""The sgpu command group imports each subcommand on first use: the map must be right."""

from __future__ import annotations

import subprocess
import sys

import click

from slurmgpu.cli.main import COMMANDS, main


def test_every_lazy_command_resolves_to_the_command_of_that_name() -> None:
    ctx = click.Context(main)
    assert main.list_commands(ctx) == sorted(COMMANDS)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name, name
    assert main.get_command(ctx, "no-such-command") is None


def test_starting_sgpu_imports_no_subcommand_module() -> None:
    code = (
        "import sys; import slurmgpu.cli.main; "
        "print(sorted(m for m in sys.modules if m.startswith('slurmgpu.cli.') "
        "and m not in ('slurmgpu.cli.main', 'slurmgpu.cli.context', 'slurmgpu.cli.logs')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

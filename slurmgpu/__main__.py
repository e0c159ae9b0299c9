"""``python -m slurmgpu`` is ``sgpu``."""

from __future__ import annotations

from slurmgpu.cli.main import main

main(prog_name="sgpu")

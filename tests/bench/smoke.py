"""A bench script run at its smoke size as an admin would (its own process, ``--smoke
--json-out DIR``), and the one JSON record it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def run_smoke(
    name: str, out: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The finished run of ``bench/<name>.py`` and its record; fails unless it wrote one."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--smoke", "--json-out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    records = sorted(out.glob(f"{name}-*.json"))
    assert len(records) == 1, (
        f"{name}: expected one JSON record in {out}, found {records}; exit {proc.returncode}\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    doc: dict[str, Any] = json.loads(records[0].read_text())
    return proc, doc

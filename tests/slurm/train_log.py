"""A training's JSONL log as the lab tests read it: its records, and where each run stopped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of ``path``, one JSON object a line; none while it does not exist yet."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_step_per_run(records: list[dict[str, Any]]) -> list[int]:
    """The last step each run logged before the next run's ``start`` record (the last run,
    still going, is left out)."""
    out: list[int] = []
    last = 0
    for r in records:
        if r.get("event") == "start" and last:
            out.append(last)
        elif "event" not in r:
            last = int(r["step"])
    return out

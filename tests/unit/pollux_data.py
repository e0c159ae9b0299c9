"""The Pollux traces and profiles under /work/shared/data (read from there, never copied),
and the mark that skips a test, saying why, where they are absent."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path("/work/shared/data/pollux")
needs_data = pytest.mark.skipif(
    not (DATA / "profiles").is_dir(), reason=f"Pollux data not found under {DATA}"
)

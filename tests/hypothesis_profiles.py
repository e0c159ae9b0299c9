"""Hypothesis profiles: how many inputs a property test draws, and whether they change.

``ci`` (scripts/test.sh's properties tier) draws each test's full number of examples, the
same ones every run (derandomize), so a submission's CI result does not depend on the luck
of the draw. ``quick`` (scripts/test.sh's unit tier) draws a quarter of them, also the same
every run, so the unit tier answers within a minute. ``dev`` (the default: pytest run by
hand) draws a quarter, new ones every run: fast, and many runs by hand still find new
bugs. A failure in any prints the input and the ``@reproduce_failure`` blob. Choose with
``SGPU_HYPOTHESIS_PROFILE=ci|quick|dev``.

A test that needs another size than the default writes ``max_examples=examples(N)``, N
being its CI size.
"""

from __future__ import annotations

import os

from hypothesis import settings

__all__ = ["DEV_SHARE", "PROFILE", "examples"]

PROFILE = os.environ.get("SGPU_HYPOTHESIS_PROFILE", "dev")
if PROFILE not in {"ci", "quick", "dev"}:
    raise ValueError(f"SGPU_HYPOTHESIS_PROFILE must be ci, quick or dev, not {PROFILE!r}")
DEV_SHARE = 4  # dev draws 1/DEV_SHARE of the CI examples, at least _DEV_MIN
_DEV_MIN = 10


def examples(ci_examples: int) -> int:
    """``max_examples`` of a test whose CI run draws ``ci_examples``, under this profile."""
    if PROFILE == "ci":
        return ci_examples
    return max(_DEV_MIN, ci_examples // DEV_SHARE)


settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("quick", max_examples=examples(100), derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=examples(100), print_blob=True)
settings.load_profile(PROFILE)

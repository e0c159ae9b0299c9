"""What slurmgpu ships for the Prometheus that scrapes its daemon (docs/metrics.md).

- ``rules.yml``: recording rules (efficiency, idle GPU-hours, power and energy) and alerts
  (daemon down, cycles failing, Slurm unreachable, store unhealthy, agents silent,
  transactions stuck, ingest refusals, node usage disagreeing with allocations), checked
  by ``promtool`` in the tests; ``sgpu monitoring rules`` prints or writes it.
"""

from __future__ import annotations

from importlib.resources import files

__all__ = ["RULES_FILE", "rules_text"]

RULES_FILE = "rules.yml"


def rules_text() -> str:
    """The shipped Prometheus rule file, as installed with the package."""
    return files(__name__).joinpath(RULES_FILE).read_text(encoding="utf-8")

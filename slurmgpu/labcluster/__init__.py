"""labcluster: a real multi-node Slurm cluster with fake GPUs, for tests and demos.

``LabCluster`` starts slurmctld + one slurmd per node natively on this host;
``slurmgpu.labcluster.render`` renders the shared templates in ``docker-slurm/conf`` for
both that and the docker-compose cluster.

Names are imported lazily so that ``python -m slurmgpu.labcluster.render`` runs cleanly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmgpu.labcluster.launcher import (
        LabCluster,
        LabClusterError,
        ensure_munge,
        ensure_packages,
        packages_present,
    )
    from slurmgpu.labcluster.render import ClusterConfig, RenderError, find_templates

_EXPORTS = {
    "LabCluster": "launcher",
    "LabClusterError": "launcher",
    "ensure_munge": "launcher",
    "ensure_packages": "launcher",
    "packages_present": "launcher",
    "ClusterConfig": "render",
    "RenderError": "render",
    "find_templates": "render",
}

__all__ = [
    "ClusterConfig",
    "LabCluster",
    "LabClusterError",
    "RenderError",
    "ensure_munge",
    "ensure_packages",
    "find_templates",
    "packages_present",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

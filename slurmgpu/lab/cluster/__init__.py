"""A real multi-node Slurm cluster with fake GPUs, for tests and demos.

:class:`LabCluster` starts slurmctld + one slurmd per node natively on this host;
:mod:`slurmgpu.lab.cluster.render` renders its config from the templates shipped with the
package (``templates/``), for that and for the docker-compose cluster
(``python -m slurmgpu.lab.cluster --mode docker --out DIR``).
"""

from __future__ import annotations

from slurmgpu.lab.cluster.host_setup import (
    LabClusterError,
    ensure_munge,
    ensure_packages,
    packages_present,
)
from slurmgpu.lab.cluster.launcher import LabCluster
from slurmgpu.lab.cluster.render import ClusterConfig, RenderError, find_templates

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

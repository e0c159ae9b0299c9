"""/metrics in GPU-equivalents: a MIG slice and an MPS share count as the part of a GPU
they are (slurmgpu/daemon/equivalent_metrics.py), figures worked out by hand."""

from __future__ import annotations

import pytest
from prometheus_client.core import Metric

from slurmgpu.daemon.equivalent_metrics import equivalent_families, node_equivalents
from slurmgpu.model import GpuRequest, Job, JobState, Node, NodeGpuAllocation

# gpu2: 2 boards as 3g.40gb + 2g.20gb + 2 x 1g.10gb (8 slices, 2 GPU-equivalents);
# gpu3: 4 whole GPUs serving 400 mps (100 a GPU); gpu9: 2 boards as 7 x 1g.10gb (22.05).
MIG = Node(
    "gpu2",
    "mixed",
    gpus=8,
    gpu_types=(("3g.40gb", 2), ("2g.20gb", 2), ("1g.10gb", 4)),
    partitions=("gpu",),
)
MPS = Node("gpu3", "mixed", gpus=4, mps=400, partitions=("gpu",))
MIG_22 = Node("gpu9", "mixed", gpus=14, gpu_types=(("1g.10gb", 14),), partitions=("old",))


def _job(job_id: int, alloc: NodeGpuAllocation, gpu_type: str | None = None) -> Job:
    return Job(
        job_id=job_id,
        name="j",
        user="alice",
        state=JobState.RUNNING,
        gpus=GpuRequest(gpus=len(alloc.gpu_indices), gpu_type=gpu_type, mps=alloc.mps),
        gpu_allocations=(alloc,),
    )


def _values(families: list[Metric]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, tuple(s.labels.values())): s.value for f in families for s in f.samples}


def test_nodes_count_their_boards_not_their_slices() -> None:
    assert node_equivalents(MIG) == pytest.approx(2.0)  # 2 x (3 + 2 + 1 + 1) / 7
    assert node_equivalents(MPS) == 4.0
    assert node_equivalents(MIG_22) == pytest.approx(2.0)


def test_slices_and_mps_shares_are_counted_as_their_part_of_a_gpu() -> None:
    jobs = [
        _job(1, NodeGpuAllocation("gpu2", gpu_indices=(0,)), "3g.40gb"),  # busy
        _job(2, NodeGpuAllocation("gpu2", gpu_indices=(6,)), "1g.10gb"),  # idle
        _job(3, NodeGpuAllocation("gpu3", mps_indices=(1,), mps=50)),  # util unknown
        _job(4, NodeGpuAllocation("gpu3", mps_indices=(1,), mps=25)),  # util unknown
        _job(5, NodeGpuAllocation("gpu9", gpu_indices=(3,))),  # untyped, on a slice
    ]
    busy = {("gpu2", 0)}
    unknown = {("gpu3", 1)}
    m = _values(list(equivalent_families([MIG, MPS, MIG_22], jobs, busy, unknown)))
    assert m[("sgpu_gpu_equivalents", ("gpu",))] == pytest.approx(6.0)
    assert m[("sgpu_gpu_equivalents", ("old",))] == pytest.approx(2.0)
    mig, mps = ("gpu", "mig"), ("gpu", "mps")
    assert abs(m[("sgpu_gpu_equivalents_allocated", mig)] - 4 / 7) < 1e-9
    assert abs(m[("sgpu_gpu_equivalents_used", mig)] - 3 / 7) < 1e-9
    assert abs(m[("sgpu_gpu_equivalents_idle", mig)] - 1 / 7) < 1e-9
    assert m[("sgpu_gpu_equivalents_allocated", mps)] == 0.75
    assert m[("sgpu_gpu_equivalents_util_unknown", mps)] == 0.75
    assert m[("sgpu_gpu_equivalents_idle", mps)] == 0.0  # unknown is not idle
    assert abs(m[("sgpu_gpu_equivalents_allocated", ("old", "mig"))] - 1 / 7) < 1e-9

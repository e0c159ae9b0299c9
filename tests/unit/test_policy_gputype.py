"""The malleable policy's type_aware option: grow and start jobs on their fastest GPU type."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurmgpu.intent import Resize, SetGpus, resize_of
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, MalleableSpec, Node
from slurmgpu.policy.base import Action, PolicySnapshot, resize_sizes
from slurmgpu.policy.gputype import slowest, speeds_for
from slurmgpu.policy.malleable import MalleablePolicy, _Free
from slurmgpu.policy.settings import MalleableSettings, PolicyConfigError
from tests.unit.policy_builders import HOUR, T0, pending_job, running_job

TABLE = (
    ("ncf*", (("p100", 2.0), ("v100", 1.0))),
    ("*", (("p100", 0.5), ("v100", 1.0))),
)
AWARE = MalleableSettings(type_aware=True, type_speed=TABLE)


def cluster(jobs: list[Job], malleable: dict[int, tuple[int, int]]) -> PolicySnapshot:
    """gpu1: 4 V100, gpu2: 4 P100; what the running jobs hold is used."""
    used: dict[str, int] = {}
    for j in jobs:
        for a in j.gpu_allocations:
            used[a.node] = used.get(a.node, 0) + len(a.gpu_indices)
    nodes = (
        Node("gpu1", "mixed", gpus=4, gpu_type="v100", gpus_used=used.get("gpu1", 0)),
        Node("gpu2", "mixed", gpus=4, gpu_type="p100", gpus_used=used.get("gpu2", 0)),
    )
    return PolicySnapshot(
        at=T0,
        cluster=ClusterSnapshot(T0, tuple(jobs), nodes),
        malleable={j: MalleableSpec(j, lo, hi) for j, (lo, hi) in malleable.items()},
        throughput={1: {2: 100.0, 4: 190.0, 8: 360.0}},
    )


def on_two_v100(name: str, gpu_type: str | None = None) -> Job:
    job = running_job(1, name=name, gpus={"gpu1": (0, 1)}, started=2 * HOUR)
    return replace(job, gpus=GpuRequest(gpus=2, per_job=2, gpu_type=gpu_type))


def grown(actions: list[Action]) -> tuple[int, int, str | None]:
    (a,) = actions
    frm, to = resize_sizes(a)
    return frm, to, moved_to(a)


def moved_to(a: Action) -> str | None:
    """The GPU type a resize moves the job to (None: it keeps its own)."""
    sized = resize_of(a.intents)
    return sized.gpu_type if isinstance(sized, Resize) else None


def gpu_requests(actions: list[Action]) -> list[SetGpus]:
    """The GPU requests of the ``update`` actions (start smaller)."""
    return [i for a in actions if a.kind == "update" for i in a.intents if isinstance(i, SetGpus)]


def test_an_untyped_job_grows_on_the_type_where_it_gains_most() -> None:
    # ncf runs twice as fast on P100: 4 P100 beat growing over the V100s.
    ncf = MalleablePolicy(AWARE).propose(cluster([on_two_v100("ncf-1")], {1: (1, 8)}))
    assert grown(ncf) == (2, 4, "p100")
    assert ncf[0].numbers["gpu_type"] == "p100"
    assert ncf[0].numbers["throughput_after"] == pytest.approx(380.0)  # 190 x 2.0
    # bert runs at half speed on P100: it grows on the V100s it is on (its own 2 + 2 free).
    bert = MalleablePolicy(AWARE).propose(cluster([on_two_v100("bert")], {1: (1, 8)}))
    assert grown(bert) == (2, 4, "v100")


def test_type_blind_by_default_and_without_a_speed_table() -> None:
    snap = cluster([on_two_v100("ncf-1")], {1: (1, 8)})
    for policy in (MalleablePolicy(), MalleablePolicy(MalleableSettings(type_aware=True))):
        frm, to, gpu_type = grown(policy.propose(snap))
        assert gpu_type is None  # wherever Slurm puts it
        assert (frm, to) == (2, 8)  # blind: all 6 free GPUs count


def test_a_job_that_asked_for_a_type_is_never_moved_off_it() -> None:
    snap = cluster([on_two_v100("ncf-1", gpu_type="v100")], {1: (1, 8)})
    actions = MalleablePolicy(AWARE).propose(snap)
    assert all(moved_to(a) in (None, "v100") for a in actions)
    assert all(resize_sizes(a)[1] <= 4 for a in actions)  # only the V100 node's GPUs


def test_a_job_typed_by_the_policy_may_be_moved_again() -> None:
    policy = MalleablePolicy(AWARE)
    assert grown(policy.propose(cluster([on_two_v100("ncf-1")], {1: (1, 8)})))[2] == "p100"
    # it now runs on 4 P100 and its request names p100; 8 would need another type
    moved = running_job(1, name="ncf-1", gpus={"gpu2": (0, 1, 2, 3)}, started=HOUR)
    moved = replace(moved, gpus=GpuRequest(gpus=4, per_job=4, gpu_type="p100"))
    snap = replace(cluster([moved], {1: (1, 8)}), throughput={1: {4: 190.0, 8: 360.0}})
    assert policy._type_speeds(moved, _free(snap)) is not None
    assert MalleablePolicy(AWARE)._type_speeds(moved, _free(snap)) is None  # user-typed


def _free(snap: PolicySnapshot) -> _Free:
    return _Free(snap.cluster.nodes)


def test_a_waiting_untyped_job_starts_smaller_on_its_fastest_type() -> None:
    # 2 V100 held by a long rigid job; 2 V100 and 4 P100 free; ncf wants 8 GPUs.
    rigid = running_job(5, user="bob", gpus={"gpu1": (0, 1)}, started=3 * HOUR)
    waiting = pending_job(
        7, name="ncf-2", gpus_per_node=None, gpus_per_job=8, time_limit=timedelta(hours=1)
    )
    snap = cluster([rigid, waiting], {7: (1, 8)})
    blind = MalleablePolicy().propose(snap)
    aware = MalleablePolicy(AWARE).propose(snap)
    assert gpu_requests(blind) == [SetGpus(6, per_node=False)]
    # 4 P100 at 2x beat 6 GPUs of which some are V100 (at the slower V100 pace: 1x)
    assert gpu_requests(aware) == [SetGpus(4, "p100", per_node=False)]


def test_speed_table_lookup_and_config() -> None:
    assert speeds_for(TABLE, "ncf-9") == {"p100": 2.0, "v100": 1.0}
    assert speeds_for(TABLE, "bert") == {"p100": 0.5, "v100": 1.0}
    assert speeds_for(TABLE[:1], "bert") == {}
    assert slowest({"p100": 0.5, "v100": 1.0}, ["v100", "p100"]) == 0.5
    assert slowest({"v100": 1.0}, ["k80"]) is None
    s = MalleableSettings.from_mapping(
        {"type_aware": True, "type_speed": {"ncf*": {"P100": 2, "v100": 1}}}
    )
    assert s.type_aware and s.type_speed == (("ncf*", (("p100", 2.0), ("v100", 1.0))),)
    assert not MalleableSettings.from_mapping({}).type_aware
    with pytest.raises(PolicyConfigError, match="must be a number > 0"):
        MalleableSettings.from_mapping({"type_speed": {"x": {"v100": "fast"}}})
    with pytest.raises(PolicyConfigError, match="must map GPU types"):
        MalleableSettings.from_mapping({"type_speed": {"x": 2}})

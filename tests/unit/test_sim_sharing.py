"""MIG slices and MPS shares in the simulator (issue 39 item 5).

The speeds are worked out by hand from the policy's model
(slurmgpu/policy/interference.py): a MIG slice of k of 7 compute slices caps a job at
100 k / 7 % of a GPU (a 16 % job on a 1g slice runs at 14.2857 / 16 = 0.892857 of its
speed alone, a 10 % job at full speed) and no neighbour slows it; two 20 % jobs on MPS
shares of 50 each run at the contention terms only:

    0.701555 - 0.093307 * 0.2 - 0.494136 * 0.2 * 0.2 + 0.326203 = 0.98933116

Then the parity check: the narrowing the simulator carries out is the daemon's own
(ColocatePolicy through the shared cycle, the same intents), fed to the daemon's wiring
(the Actuator on a FakeSlurm) cycle by cycle, as tests/unit/test_cycle_parity.py does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.actuate.actuator import Actuator
from slurmgpu.cli.main import main
from slurmgpu.daemon.policy_cycle import PolicyCycle
from slurmgpu.intent import NarrowToMps, SetGpus
from slurmgpu.model import ClusterSnapshot
from slurmgpu.policy.base import Decision, JobUsage, Mode, PolicySnapshot
from slurmgpu.policy.colocate import ColocatePolicy
from slurmgpu.policy.engine import PolicyEngine
from slurmgpu.policy.interference import COEFFICIENTS, slowdown_with
from slurmgpu.policy.settings import ColocateSettings, EngineSettings
from slurmgpu.policy.slices import MigProfile, partition_offers
from slurmgpu.sim.lucid import model_interference
from slurmgpu.sim.policysets import SimPolicies
from slurmgpu.sim.run import ClusterShape, SimOptions, SimRun, simulate
from slurmgpu.sim.sharing import (
    SHARING_SLURM_VERSION,
    mig_speed,
    mps_speed,
    parse_mig_layout,
    parse_sharing,
)
from slurmgpu.sim.sharingreport import narrowed
from slurmgpu.sim.slurm import SimJob, SimSlurm
from slurmgpu.sim.workload import RigidJob, TraceJob
from slurmgpu.slurm.client import SlurmCommandError
from slurmgpu.store import JobStore
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from tests.fakes import FakeSlurm

ONE_G = MigProfile(1, 10, "1g.10gb")
SPEED_20_20 = 0.98933116
SHARE_4G = "sgpu:shareable sgpu:gpu-mem=4096"
LUCID = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "lucid" / "colocate_info.csv"
)
SLOWDOWN = model_interference()  # sharers slow each other (else they run at full speed)


# ---- the speed model -------------------------------------------------------------------


def test_a_mig_slice_caps_a_job_at_its_sm_share_and_nothing_else() -> None:
    assert mig_speed(10.0, ONE_G) == 1.0
    assert mig_speed(16.0, ONE_G) == pytest.approx((100 / 7) / 16)  # 0.892857
    assert mig_speed(100.0, MigProfile(3, 40, "3g.40gb")) == pytest.approx(3 / 7)


def test_an_mps_share_is_capped_and_slowed_by_contention_but_never_time_sliced() -> None:
    assert mps_speed(20.0, 50.0, []) == 1.0
    assert mps_speed(20.0, 50.0, [20.0]) == pytest.approx(SPEED_20_20)
    assert mps_speed(60.0, 50.0, []) == pytest.approx(50 / 60)  # its share caps it
    # Two busy jobs: shards time-slice (a + b > 1), MPS only contends -- faster.
    shard = 1.0 / slowdown_with(60.0, [60.0], COEFFICIENTS)
    assert shard < mps_speed(60.0, 100.0, [60.0]) < 1.0


def test_sharing_modes_and_mig_layouts_are_checked_with_one_clear_error() -> None:
    assert parse_sharing("shards, mig,shards") == ("shards", "mig")
    with pytest.raises(ValueError, match="unknown sharing mode 'vgpu'"):
        parse_sharing("mig,vgpu")
    assert [p.name for p in parse_mig_layout("3g.40gb,2g.20gb,1g.10gb,1g.10gb", 81920)] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]
    with pytest.raises(ValueError, match="8 compute slices"):
        parse_mig_layout("4g.40gb,4g.40gb", 81920)
    with pytest.raises(ValueError, match="no MIG profile"):
        parse_mig_layout("a100", 81920)
    with pytest.raises(ValueError, match="mig GPUs per node must be 1 to 1"):
        ClusterShape(1, 2, 0).with_sharing("mig", mig_gpus=2)


# ---- SimSlurm: what it lists and what it takes -----------------------------------------


def _light(name: str, at: float, run_s: float, util: float, comment: str = "") -> TraceJob:
    return TraceJob(
        submit_s=at,
        name=name,
        user="bob",
        model=RigidJob(run_s, 1, util_pct=util, memory_mib=4096),
        gpus=1,
        gpus_per_node=1,  # --gres=gpu:1
        comment=comment,
        time_limit_s=6 * 3600,
    )


def _mig_sim(version: str) -> SimSlurm:
    layout = parse_mig_layout("3g.40gb,2g.20gb,1g.10gb,1g.10gb", 81920)
    return SimSlurm(
        1, 2, mig_gpus=1, mig_layout=layout, slurm_version=version, interference=SLOWDOWN
    )


def test_mig_slices_are_listed_as_typed_gpus_the_policy_sees_as_its_offer() -> None:
    sim = _mig_sim(SHARING_SLURM_VERSION)
    (node,) = sim.nodes()
    assert node.gpus == 5  # one whole GPU and the four slices of the other
    assert dict(node.gpu_types) == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    offer = partition_offers([node])["gpu"]
    assert [p.name for p in offer.mig_profiles] == ["1g.10gb", "2g.20gb", "3g.40gb"]
    assert offer.mps_per_gpu == 0 and offer.shards_per_gpu == 0


def test_slurm_22_05_refuses_a_gpu_becoming_a_slice_or_an_mps_share_later_ones_take_it() -> None:
    old = _mig_sim("22.05.8")
    old.submit_job(_light("busy", 0.0, 3600.0, 90.0))
    jid = old.submit_job(_light("light", 0.0, 3600.0, 10.0))
    old.run_until(1.0)
    with pytest.raises(SlurmCommandError, match="Invalid generic resource"):
        old.update_job(jid, [SetGpus(1, "1g.10gb")])
    new = _mig_sim(SHARING_SLURM_VERSION)
    new.submit_job(_light("busy", 0.0, 3600.0, 90.0))
    jid = new.submit_job(_light("light", 0.0, 3600.0, 10.0))
    new.run_until(1.0)
    new.update_job(jid, [SetGpus(1, "1g.10gb")])
    new.run_until(2.0)
    (record,) = [j for j in new.jobs() if j.job_id == jid]
    assert record.state.value == "RUNNING"
    assert record.gpus.gpu_type == "1g.10gb" and record.gpus.gpus == 1
    # Slurm numbers the slices after the whole GPU: 1 3g, 2 2g, 3 and 4 the 1g ones.
    assert record.gpu_allocations[0].gpu_indices == (3,)
    mps = SimSlurm(1, 1, mps_per_gpu=100, slurm_version="22.05.8")
    mps.submit_job(_light("busy", 0.0, 3600.0, 90.0))
    jid = mps.submit_job(_light("light", 0.0, 3600.0, 10.0))
    mps.run_until(1.0)
    with pytest.raises(SlurmCommandError, match="Invalid generic resource"):
        mps.update_job(jid, [NarrowToMps(50)])


def test_two_mps_jobs_share_one_gpu_and_are_listed_as_mps() -> None:
    sim = SimSlurm(
        1, 1, mps_per_gpu=100, slurm_version=SHARING_SLURM_VERSION, interference=SLOWDOWN
    )
    sim.submit_job(_light("blocker", 0.0, 100.0, 90.0))
    a = sim.submit_job(_light("a", 0.0, 3600.0, 20.0))
    b = sim.submit_job(_light("b", 0.0, 3600.0, 20.0))
    sim.run_until(1.0)
    sim.update_job(a, [NarrowToMps(50)])
    sim.update_job(b, [NarrowToMps(50)])
    sim.run_until(200.0)
    (node,) = sim.nodes()
    assert (node.mps, node.mps_used, node.shards, node.shards_used) == (100, 100, 0, 0)
    for jid in (a, b):
        (record,) = [j for j in sim.jobs() if j.job_id == jid]
        assert (record.gpus.mps, record.gpus.gpus) == (50, 0)
        (alloc,) = record.gpu_allocations
        assert (alloc.mps_indices, alloc.mps, alloc.gpu_indices) == ((0,), 50, ())
    sim.run_until(10 * 3600.0)
    ja, jb = sim.job(a), sim.job(b)
    assert ja.first_start_s == jb.first_start_s == pytest.approx(100.0)
    assert ja.end_s - ja.first_start_s == pytest.approx(3600.0 / SPEED_20_20, abs=0.01)
    assert (ja.runs[-1].kind, ja.runs[-1].gpus) == ("mps", 0.5)


# ---- the daemon's policy narrows, SimSlurm runs the slices -----------------------------


def _history_then_light() -> list[TraceJob]:
    """History of each light job's own name (3 runs alone), a blocker on the whole GPU,
    then the two light jobs (10 % and 16 % util, 4 GiB) that wait behind it."""
    history = [_light(name, 0.0, 100.0, util) for name, util in (("l10", 10.0), ("l16", 16.0))]
    return [
        *(history * 3),
        _light("blocker", 1000.0, 2000.0, 90.0),
        _light("l10", 1001.0, 3600.0, 10.0),
        _light("l16", 1001.0, 3600.0, 16.0),
    ]


def _sharing_run(trace: list[TraceJob], shape: ClusterShape, policy_set: str) -> SimRun:
    options = SimOptions(
        interference=SLOWDOWN,
        record_decisions=True,
        slurm_version=SHARING_SLURM_VERSION,
        policies=SimPolicies(device_memory_mib=shape.device_memory_mib),
    )
    return simulate(trace, shape, policy_set, options)


def _last(run: SimRun, name: str) -> SimJob:
    return max((j for j in run.jobs if j.name == name), key=lambda j: j.submit_s)


def test_the_colocate_set_narrows_light_jobs_onto_mig_slices_that_run_isolated() -> None:
    shape = ClusterShape(1, 2, 0).with_sharing("mig", mig_gpus=1)
    result = _sharing_run(_history_then_light(), shape, "colocate")
    l10, l16 = _last(result, "l10"), _last(result, "l16")
    fields = {d.job_id: dict(d.fields) for d in result.decisions if d.outcome == "done"}
    assert fields == {
        l10.job_id: {"TresPerNode": "gres/gpu:1g.10gb:1"},
        l16.job_id: {"TresPerNode": "gres/gpu:1g.10gb:1"},  # 16/14.3 = 1.12x <= 1.25x
    }
    # They start on the two 1g slices at the first cycle after they arrive, not after
    # the blocker, and each runs at its slice's cap alone -- neighbours do not matter.
    assert l10.first_start_s == l16.first_start_s < 3000.0
    assert l10.end_s - l10.first_start_s == pytest.approx(3600.0)
    assert l16.end_s - l16.first_start_s == pytest.approx(3600.0 * 16 / (100 / 7))
    assert l10.runs[-1].kind == "mig" and l10.runs[-1].gpus == pytest.approx(1 / 7)
    assert l10.runs[-1].used_gpu_s == pytest.approx(0.10 * 3600.0)
    assert l16.runs[-1].used_gpu_s == pytest.approx((1 / 7) * 3600.0 * 16 / (100 / 7))
    assert narrowed(result.jobs) == {"mig": 2, "mps": 0, "shard": 0}
    # No sharing: they wait for the whole GPU, one after the other.
    plain = _sharing_run(_history_then_light(), shape, "slurm")
    assert _last(plain, "l16").end_s > 3000.0 + 2 * 3600.0 - 1
    assert narrowed(plain.jobs) == {"mig": 0, "mps": 0, "shard": 0}


def test_the_colocate_set_narrows_to_mps_shares_on_an_mps_cluster() -> None:
    shape = ClusterShape(1, 1, 0).with_sharing("mps")
    trace = [
        _light("blocker", 0.0, 2000.0, 90.0),
        _light("a", 1.0, 3600.0, 20.0, SHARE_4G),
        _light("b", 1.5, 3600.0, 20.0, SHARE_4G),
    ]
    result = _sharing_run(trace, shape, "colocate")
    a, b = _last(result, "a"), _last(result, "b")
    fields = {d.job_id: dict(d.fields) for d in result.decisions if d.outcome == "done"}
    # Declared shareable, no history: at the 40 % ceiling, so half the GPU's SMs.
    assert fields == {j.job_id: {"TresPerNode": "gres/mps:50"} for j in (a, b)}
    assert a.first_start_s == b.first_start_s == pytest.approx(2000.0)
    # The 20 % jobs run side by side at the model's contention speed.
    assert a.end_s - a.first_start_s == pytest.approx(3600.0 / SPEED_20_20, abs=0.01)
    assert narrowed(result.jobs) == {"mig": 0, "mps": 2, "shard": 0}


# ---- parity: the daemon's wiring decides the same from the same listings ---------------

Seen = tuple[object, ClusterSnapshot, dict[int, JobUsage], list[Decision]]


class RecordingEngine(PolicyEngine):
    """The real engine over the colocate policy the simulator's set builds; every
    decide() is kept with what it saw."""

    def __init__(self, device_mib: int) -> None:
        settings = ColocateSettings(
            mode=Mode.ENFORCE, convert_gpu_requests="always", device_memory_mib=device_mib
        )
        super().__init__([(ColocatePolicy(settings), Mode.ENFORCE)], EngineSettings())
        self.seen: list[Seen] = []

    def decide(self, snapshot: PolicySnapshot) -> list[Decision]:
        out = super().decide(snapshot)
        self.seen.append((snapshot.at, snapshot.cluster, dict(snapshot.usage), out))
        return out


class ReplayedUsage(PolicyCycle):
    by_at: dict[object, dict[int, JobUsage]]

    def job_usage(self, cluster: ClusterSnapshot, at: object) -> dict[int, JobUsage]:
        return self.by_at[at]


@pytest.mark.parametrize(
    ("mode", "intent"), [("mig", SetGpus(1, "3g.40gb")), ("mps", NarrowToMps(50))]
)
def test_the_daemon_narrows_the_same_jobs_with_the_same_intents(
    store: JobStore, mode: str, intent: object
) -> None:
    shape = (
        ClusterShape(1, 2, 0).with_sharing("mig", mig_gpus=1)
        if mode == "mig"
        else ClusterShape(1, 1, 0).with_sharing("mps")
    )
    trace = [
        _light("blocker", 0.0, 2000.0, 90.0),
        _light("a", 1.0, 3600.0, 20.0, SHARE_4G),
        _light("b", 1.5, 3600.0, 20.0, SHARE_4G),
    ]
    sim_engine = RecordingEngine(shape.device_memory_mib)
    options = SimOptions(slurm_version=SHARING_SLURM_VERSION)
    run = simulate(trace, shape, "colocate", options, engine=sim_engine)
    assert run.executed >= 2, "the scenario must narrow for the check to mean much"

    audit = AuditStore(store.engine)
    slurm = FakeSlurm()
    daemon_engine = RecordingEngine(shape.device_memory_mib)
    daemon = ReplayedUsage(daemon_engine, UsageStore(store.engine), audit, Actuator(slurm, audit))
    daemon.by_at = {at: usage for at, _, usage, _ in sim_engine.seen}
    for at, cluster, _, _ in sim_engine.seen:
        slurm.set_jobs(cluster.jobs)
        daemon.run(cluster, at)  # type: ignore[arg-type]

    def key(decisions: list[Decision]) -> list[tuple[object, ...]]:
        return [
            (d.action.kind, d.action.job_id, d.action.intents, d.execute, d.suppressed)
            for d in decisions
        ]

    assert len(daemon_engine.seen) == len(sim_engine.seen)
    narrowing: list[tuple[object, ...]] = []
    for (at, _, _, sim_out), (_, _, _, daemon_out) in zip(
        sim_engine.seen, daemon_engine.seen, strict=True
    ):
        assert key(daemon_out) == key(sim_out), f"decisions differ at {at}"
        narrowing += [d.action.intents for d in sim_out if d.execute]
    assert narrowing.count((intent,)) >= 2, narrowing
    # The daemon's audit holds the updates it sent, as slurmctld would get them.
    done = [r for r in audit.list() if r.kind == "update" and r.outcome == "done"]
    assert len(done) == len(narrowing)
    a, b = (_last(run, n) for n in ("a", "b"))
    assert {a.runs[-1].kind, b.runs[-1].kind} == {mode}
    assert not math.isnan(a.end_s) and not math.isnan(b.end_s)


# ---- sgpu simulate --sharing -----------------------------------------------------------


def test_sgpu_simulate_refuses_an_unknown_sharing_mode_or_layout(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("submit_s,duration_s,gpus\n0,60,1\n")
    bad = CliRunner().invoke(main, ["simulate", str(path), "--sharing", "vgpu"])
    assert bad.exit_code == 2 and "unknown sharing mode 'vgpu'" in bad.output
    args = ["simulate", str(path), "--sharing", "mig", "--mig-layout", "4g.40gb,4g.40gb"]
    bad = CliRunner().invoke(main, args)
    assert bad.exit_code == 2 and "8 compute slices" in bad.output
    bad = CliRunner().invoke(main, ["simulate", str(path), "--mig-gpus", "1"])
    assert bad.exit_code == 2 and "--mig-gpus needs --sharing with mig" in bad.output
    # A 4-GPU job on 1x4 with 3 GPUs split: one whole GPU left, one clear error.
    path.write_text("submit_s,duration_s,gpus\n0,60,4\n")
    args = ["simulate", str(path), "--cluster", "1x4", "--sharing", "mig", "--mig-gpus", "3"]
    bad = CliRunner().invoke(main, args)
    assert bad.exit_code == 2, bad.output
    assert "--sharing mig: job" in bad.output and "give --mig-gpus fewer" in bad.output


@pytest.mark.slow
def test_sgpu_simulate_compares_the_sharing_modes_on_a_lucid_workload(tmp_path: Path) -> None:
    if not LUCID.is_file():
        pytest.skip(f"Lucid pairs not found at {LUCID} (shared/data, see ATTRIBUTION.md)")
    out = tmp_path / "cmp.json"
    args = ["simulate", str(LUCID), "--policies", "slurm,colocate", "--cluster", "2x4"]
    result = CliRunner().invoke(
        main, [*args, "--load", "1.3", "--sharing", "none,shards,mps,mig", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "sharing modes" in result.output and "narrowed" in result.output
    doc = json.loads(out.read_text())
    modes = ("none", "shards", "mps", "mig")
    rows = {(r["mode"], r["policy_set"]): r for r in doc["sharing"]}
    assert set(rows) == {(m, s) for m in modes for s in ("slurm", "colocate")}
    assert all(rows[(m, "slurm")]["jobs_narrowed"] == 0 for m in modes)
    assert rows[("none", "colocate")]["jobs_narrowed"] == 0
    # Each sharing mode narrows light jobs onto its own kind of share, and only that.
    for mode, kind in (("shards", "shard"), ("mps", "mps"), ("mig", "mig")):
        share = rows[(mode, "colocate")]
        assert share["narrowed"][kind] == share["jobs_narrowed"] > 0, share
        assert share["figures"]["avg_jct_s"] < rows[(mode, "slurm")]["figures"]["avg_jct_s"]
    assert any("nobody measured MPS pairs" in n for n in doc["notes"])

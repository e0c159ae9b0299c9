"""slurm/update.py: typed intents spelt as each Slurm release takes them, and read back."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.intent import (
    Intent,
    NarrowToShards,
    Preempt,
    Resize,
    SetAdminComment,
    SetComment,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetNice,
    SetNodes,
    SetTimeLimit,
    StartSoon,
)
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.slurm.jsonformat import decode_squeue
from slurmgpu.slurm.parse import SlurmValueError
from slurmgpu.slurm.update import (
    UpdateFieldError,
    audit_fields,
    gres_prefix,
    parse_fields,
    update_fields,
)
from slurmgpu.store import open_store
from slurmgpu.store.audit import AuditStore

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RELEASES = ("22.05.8", "24.11.5", "26.05.5")

# (intent, its field on 22.05, its field from 23.02 on: 24.11 and 26.05)
TABLE: list[tuple[Intent, tuple[str, str], tuple[str, str]]] = [
    (SetTimeLimit(5400), ("TimeLimit", "01:30:00"), ("TimeLimit", "01:30:00")),
    (SetTimeLimit(90_061), ("TimeLimit", "1-01:01:01"), ("TimeLimit", "1-01:01:01")),
    (SetTimeLimit(None), ("TimeLimit", "UNLIMITED"), ("TimeLimit", "UNLIMITED")),
    (SetMemoryPerNode(9728), ("MinMemoryNode", "9728"), ("MinMemoryNode", "9728")),
    (SetCpus(12), ("NumCPUs", "12"), ("NumCPUs", "12")),
    (SetCpusPerNode(6), ("MinCPUsNode", "6"), ("MinCPUsNode", "6")),
    (SetGpus(2), ("TresPerNode", "gres:gpu:2"), ("TresPerNode", "gres/gpu:2")),
    (
        SetGpus(1, "a100"),
        ("TresPerNode", "gres:gpu:a100:1"),
        ("TresPerNode", "gres/gpu:a100:1"),
    ),
    (
        SetGpus(4, "p100", per_node=False),
        ("TresPerJob", "gres:gpu:p100:4"),
        ("TresPerJob", "gres/gpu:p100:4"),
    ),
    (NarrowToShards(2), ("TresPerNode", "gres:shard:2"), ("TresPerNode", "gres/shard:2")),
    (SetNodes(3), ("NumNodes", "3"), ("NumNodes", "3")),
    (
        SetComment("x sgpu:separated"),
        ("Comment", "x sgpu:separated"),
        ("Comment", "x sgpu:separated"),
    ),
    (
        SetAdminComment("sgpu-eff:v1 gpu=12%"),
        ("AdminComment", "sgpu-eff:v1 gpu=12%"),
        ("AdminComment", "sgpu-eff:v1 gpu=12%"),
    ),
    (SetNice(200_000), ("Nice", "200000"), ("Nice", "200000")),
    (StartSoon(1), ("StartTime", "now+1"), ("StartTime", "now+1")),
]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("intent", "old", "new"), TABLE, ids=lambda v: type(v).__name__)
def test_each_intent_is_spelt_for_the_release(
    release: str, intent: Intent, old: tuple[str, str], new: tuple[str, str]
) -> None:
    key, value = old if release.startswith("22.") else new
    assert update_fields((intent,), release) == {key: value}


def test_the_gres_spelling_changes_at_23_02_and_an_unknown_release_gets_the_current() -> None:
    assert [gres_prefix(v) for v in ("22.05.9", "23.02.0", "24.11.1", "")] == [
        "gres:",
        "gres/",
        "gres/",
        "gres/",
    ]


def _golden_listings() -> list[tuple[str, str]]:
    """(release, TRES string) of every GPU or shard request real daemons listed."""
    out: set[tuple[str, str]] = set()
    for path in sorted(GOLDEN.glob("slurm-*/*squeue*.json")):
        raw = path.read_bytes()
        if b"slurm_load_jobs" in raw:
            continue  # a capture of slurmctld down: no jobs
        _jobs, release = decode_squeue(raw)
        for job in json.loads(raw.decode("utf-8", "replace")).get("jobs", []):
            for key in ("tres_per_node", "tres_per_job"):
                text = job.get(key) or ""
                if text and "," not in text:
                    out.add((release, f"{key}={text}"))
    return sorted(out)


GOLDEN_TRES = _golden_listings()


def test_golden_captures_cover_every_release() -> None:
    assert {r.rsplit(".", 1)[0] for r, _ in GOLDEN_TRES} == {"22.05", "24.11", "26.05"}


@pytest.mark.parametrize(("release", "listed"), GOLDEN_TRES)
def test_the_spelling_is_the_one_the_release_itself_lists(release: str, listed: str) -> None:
    # What slurmctld printed, read into an intent and spelt again for that release,
    # is the same string: the update names the GRES the way that release knows it.
    key, _, text = listed.partition("=")
    field = "TresPerNode" if key == "tres_per_node" else "TresPerJob"
    intents, left = parse_fields({field: text})
    assert left == {} and len(intents) == 1
    assert update_fields(intents, release) == {field: text}


def test_a_resize_is_no_update_but_the_audit_records_it_after_the_update_fields() -> None:
    with pytest.raises(UpdateFieldError, match="Resize is not an scontrol update field"):
        update_fields((Resize(4, 2),), "24.11.5")
    grow = (SetTimeLimit(3600), Resize(2, 4, "p100"))
    assert list(audit_fields(grow, "22.05.8").items()) == [
        ("TimeLimit", "01:00:00"),
        ("gpu_type", "p100"),
        ("from_gpus", "2"),
        ("to_gpus", "4"),
    ]
    assert audit_fields((SetNice(200), Preempt(4)), "") == {
        "Nice": "200",
        "from_gpus": "4",
        "to_gpus": "4",
        "preempt": "1",
    }


_names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
_counts = st.integers(min_value=0, max_value=1 << 20)
INTENTS = st.one_of(
    st.builds(SetTimeLimit, st.none() | st.integers(min_value=0, max_value=10**8)),
    st.builds(SetMemoryPerNode, st.integers(min_value=0, max_value=1 << 40)),
    st.builds(SetCpus, _counts),
    st.builds(SetCpusPerNode, _counts),
    st.builds(SetGpus, _counts, st.none() | _names, st.booleans()),
    st.builds(NarrowToShards, _counts),
    st.builds(SetNodes, _counts),
    st.builds(SetComment, st.text(max_size=40)),
    st.builds(SetAdminComment, st.text(max_size=40)),
    st.builds(SetNice, st.integers(min_value=-(1 << 31), max_value=1 << 31)),
    st.builds(StartSoon, _counts),
)
SIZED = st.one_of(
    st.builds(Resize, _counts, _counts, st.none() | _names),
    st.builds(Preempt, _counts),
)


@given(INTENTS, st.sampled_from(RELEASES))
@settings(max_examples=400, deadline=None)
def test_every_intent_round_trips_through_its_update_field(intent: Intent, release: str) -> None:
    assert parse_fields(update_fields((intent,), release)) == ((intent,), {})


@given(st.lists(INTENTS, max_size=4), st.none() | SIZED, st.sampled_from(RELEASES))
@settings(max_examples=300, deadline=None)
def test_an_actions_intents_round_trip_through_the_audit_fields(
    intents: list[Intent], sized: Resize | Preempt | None, release: str
) -> None:
    # One field per kind of change: later intents of a kind replace earlier ones.
    by_field: dict[str, Intent] = {}
    for i in intents:
        (key,) = update_fields((i,), release)
        by_field[key] = i
    unique = tuple(by_field.values()) + ((sized,) if sized is not None else ())
    assert parse_fields(audit_fields(unique, release)) == (unique, {})


def test_fields_that_do_not_read_back_are_refused_or_left_with_their_reason() -> None:
    with pytest.raises(UpdateFieldError, match=r"unknown update field Gres='gpu:1'"):
        parse_fields({"Gres": "gpu:1"})
    with pytest.raises(SlurmValueError, match="soon"):
        parse_fields({"TimeLimit": "soon"})
    intents, left = parse_fields(
        {"TimeLimit": "soon", "NumCPUs": "8", "TresPerNode": "gres/gpu:1,gres/shard:2"},
        strict=False,
    )
    assert intents == (SetCpus(8),)
    assert set(left) == {"TimeLimit", "TresPerNode"} and "not one GRES" in left["TresPerNode"]
    with pytest.raises(UpdateFieldError, match="resize fields"):
        parse_fields({"from_gpus": "4"})
    with pytest.raises(UpdateFieldError, match="preemption of 4 -> 2"):
        parse_fields({"from_gpus": "4", "to_gpus": "2", "preempt": "1"})


def test_the_audit_stores_the_rendered_fields_and_they_read_back_to_the_intents(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'audit.db'}")
    audit = AuditStore(store.engine)
    update = Action(
        "rightsize",
        "update",
        7,
        "bob",
        "shorter",
        intents=(SetTimeLimit(4800), SetMemoryPerNode(9728), SetGpus(1, "a100")),
    )
    resize = Action("malleable", "resize", 8, "bob", "grow", intents=(Resize(2, 4),))
    at = datetime(2026, 1, 1, tzinfo=UTC)
    audit.record(
        [Decision(a, Mode.ENFORCE, execute=True, notify=False) for a in (update, resize)],
        at,
        slurm_version="22.05.8",
    )
    rows = {r.job_id: r for r in audit.list()}
    assert rows[7].fields == {
        "TimeLimit": "01:20:00",
        "MinMemoryNode": "9728",
        "TresPerNode": "gres:gpu:a100:1",
    }
    assert rows[8].fields == {"from_gpus": "2", "to_gpus": "4"}  # the format rows always had
    assert parse_fields(rows[7].fields) == (update.intents, {})
    assert parse_fields(rows[8].fields) == (resize.intents, {})

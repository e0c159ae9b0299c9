"""Property tests for Slurm's JSON of each version we read: squeue, sinfo and scontrol
(slurm/jsonformat.py) and sacct (slurm/sacct.py), 22.05 and 24.11 golden files.

Each recorded document is damaged (props_json: wrong types, huge numbers, deleted or
unknown keys, truncated or flipped bytes) and decoded: the result is jobs/nodes or a
``SlurmError`` in one line, never another exception. The observer is then fed damaged
listings after a good one: a cycle that fails must leave the database exactly as it
was (no partial state), and the next good listing must be stored. Counts print at the
end of the module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from slurmgpu.daemon.observer import Observer
from slurmgpu.slurm.client import SlurmError
from slurmgpu.slurm.jsonformat import decode_sinfo, decode_squeue
from slurmgpu.slurm.replay import ReplaySlurmClient
from slurmgpu.slurm.sacct import decode_sacct
from slurmgpu.store import JobStore, open_store, schema
from tests.hypothesis_profiles import examples
from tests.unit.props_json import damaged_json
from tests.unit.props_tally import Tally, report

TALLY = Tally()
tally_report = report(TALLY)
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SETTINGS = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)

SQUEUE = sorted(GOLDEN.glob("slurm-*/squeue*.json"))
SINFO = sorted([*GOLDEN.glob("slurm-*/sinfo*.json"), *GOLDEN.glob("slurm-*/scontrol_nodes.json")])
SACCT = sorted(GOLDEN.glob("slurm-*/sacct*.json"))


def _doc(path: Path) -> Any:
    return json.loads(path.read_text())


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def test_every_golden_document_is_covered() -> None:
    assert len(SQUEUE) >= 5 and len(SINFO) >= 4 and len(SACCT) >= 2
    assert {p.parent.name for p in SQUEUE} == {"slurm-22.05", "slurm-24.11"}


@pytest.mark.parametrize("path", SQUEUE, ids=_name)
def test_damaged_squeue_json_decodes_or_raises_slurm_error(path: Path) -> None:
    doc = _doc(path)

    @given(damaged_json(doc))
    @SETTINGS
    def check(raw: bytes) -> None:
        TALLY.run(f"decode_squeue {_name(path)}", lambda: decode_squeue(raw), SlurmError)

    check()


@pytest.mark.parametrize("path", SINFO, ids=_name)
def test_damaged_sinfo_and_scontrol_json_decode_or_raise_slurm_error(path: Path) -> None:
    doc = _doc(path)

    @given(damaged_json(doc))
    @SETTINGS
    def check(raw: bytes) -> None:
        TALLY.run(f"decode_sinfo {_name(path)}", lambda: decode_sinfo(raw), SlurmError)

    check()


@pytest.mark.parametrize("path", SACCT, ids=_name)
def test_damaged_sacct_json_decodes_or_raises_slurm_error(path: Path) -> None:
    doc = _doc(path)

    @given(damaged_json(doc))
    @SETTINGS
    def check(raw: bytes) -> None:
        TALLY.run(f"decode_sacct {_name(path)}", lambda: decode_sacct(raw), SlurmError)

    check()


@given(st.binary(max_size=2000) | st.text(max_size=500).map(str.encode))
@settings(max_examples=examples(300), deadline=None)
def test_any_bytes_decode_or_raise_slurm_error(raw: bytes) -> None:
    TALLY.run("decode_squeue (any bytes)", lambda: decode_squeue(raw), SlurmError)
    TALLY.run("decode_sinfo (any bytes)", lambda: decode_sinfo(raw), SlurmError)
    TALLY.run("decode_sacct (any bytes)", lambda: decode_sacct(raw), SlurmError)


# --------------------------------------------------------------------------- observer


class DocumentSlurm(ReplaySlurmClient):
    """A SlurmClient whose listings are decoded from the bytes it holds (real decoders)."""


def state_digest(store: JobStore) -> str:
    """A hash of every row the observer writes."""
    h = hashlib.sha256()
    with store.engine.connect() as conn:
        for table in (schema.jobs, schema.job_events, schema.nodes, schema.gpus):
            for row in conn.execute(select(table).order_by(*table.primary_key.columns)):
                h.update(repr(tuple(row)).encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Observer, DocumentSlurm]]:
    good = DocumentSlurm(
        (GOLDEN / "slurm-22.05" / "squeue.json").read_bytes(),
        (GOLDEN / "slurm-22.05" / "sinfo.json").read_bytes(),
    )
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('props-obs') / 's.db'}")
    observer = Observer(good, store)
    assert observer.cycle().ok
    yield observer, good


_GOOD_SQUEUE = _doc(GOLDEN / "slurm-22.05" / "squeue.json")
_GOOD_SINFO = _doc(GOLDEN / "slurm-22.05" / "sinfo.json")


@given(
    st.sampled_from(["squeue", "sinfo"]).flatmap(
        lambda which: st.tuples(
            st.just(which), damaged_json(_GOOD_SQUEUE if which == "squeue" else _GOOD_SINFO)
        )
    )
)
@settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
def test_a_failed_cycle_on_damaged_output_leaves_the_database_as_it_was(
    observed: tuple[Observer, DocumentSlurm], case: tuple[str, bytes]
) -> None:
    observer, good = observed
    which, raw = case
    before = state_digest(observer.store)
    damaged = DocumentSlurm(
        raw if which == "squeue" else good.squeue, raw if which == "sinfo" else good.sinfo
    )
    observer.slurm = damaged
    result = observer.cycle()
    if result.ok:
        TALLY.accept(f"observer cycle ({which} damaged)")
    else:
        TALLY.refuse(f"observer cycle ({which} damaged)", ValueError(result.error))
        assert state_digest(observer.store) == before, "a failed cycle wrote something"
    observer.slurm = good
    assert observer.cycle().ok, "the next good listing must be stored again"

"""Property test: hostile job records never cost the rest of a listing (issue 22).

A real capture of each release (``tests/golden/slurm-*/mixed_squeue.json``, 22.05,
24.11 and 26.05) gets hostile job records slipped in at random places: names and other
strings of arbitrary bytes (invalid UTF-8, lone surrogate escapes, control characters,
quotes), fields of the wrong type, job ids that are not numbers, huge numbers, odd GRES
and state values, whole records that are not objects. ``decode_squeue`` must return every
job of the capture exactly as it decodes alone, skip or read each hostile record, and
raise nothing. The same for ``sacct`` (22.05 and 24.11 captures) and for node records.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu.slurm.jsonformat import decode_sinfo, decode_squeue
from slurmgpu.slurm.sacct import decode_sacct
from tests.hypothesis_profiles import examples
from tests.unit.hostile_records import ANY_JSON, ODD_VALUES, with_hostile

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SETTINGS = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SQUEUE = sorted(GOLDEN.glob("slurm-*/mixed_squeue.json"))
SINFO = sorted(GOLDEN.glob("slurm-*/mixed_sinfo.json"))
SACCT = sorted(GOLDEN.glob("slurm-*/sacct.json"))


@SETTINGS
@given(data=st.data())
def test_hostile_job_records_never_cost_the_good_jobs(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(SQUEUE), label="capture")
    alone = {j.job_id: j for j in decode_squeue(path.read_bytes())[0]}
    raw, _ = with_hostile(path, data, "jobs")
    jobs, _ = decode_squeue(raw)
    got = {j.job_id: j for j in jobs}
    for job_id, job in alone.items():
        assert got[job_id] == job, f"job {job_id} changed by a hostile neighbour"
    for job_id in set(got) - set(alone):
        assert isinstance(got[job_id].name, str)  # read with replacement, never raw bytes


@SETTINGS
@given(data=st.data())
def test_hostile_node_records_never_cost_the_good_nodes(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(SINFO), label="capture")
    key = "sinfo" if b'"sinfo"' in path.read_bytes() else "nodes"
    alone = {n.name: n for n in decode_sinfo(path.read_bytes())}
    doc = json.loads(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4), label="n")):
        junk = data.draw(st.one_of(ANY_JSON, st.fixed_dictionaries({"name": ODD_VALUES})))
        doc[key].insert(data.draw(st.integers(0, len(doc[key])), label="at"), junk)
    got = {n.name: n for n in decode_sinfo(json.dumps(doc))}
    for name, node in alone.items():
        assert got[name] == node


@SETTINGS
@given(data=st.data())
def test_hostile_sacct_records_never_cost_the_good_jobs(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(SACCT), label="capture")
    alone = {j.job_id: j for j in decode_sacct(path.read_bytes())[0]}
    raw, _ = with_hostile(path, data, "jobs")
    got = {j.job_id: j for j in decode_sacct(raw)[0]}
    for job_id, job in alone.items():
        assert got[job_id] == job

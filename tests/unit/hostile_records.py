"""Hostile Slurm JSON records (odd bytes, wrong types, non-objects) mixed into a real capture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

HOSTILE_ID = 10**7  # hostile records get ids no capture uses

# raw bytes a JSON string may carry from Slurm: invalid UTF-8 as is, or escapes
_ODD_BYTES = st.lists(
    st.sampled_from(
        [b"\xff", b"\xfe", b"\xc3", b"\xed\xa0\x80", b"\\ud800", b"\\udfff", b"\\u0000",
         b"\\\"", b"\\\\", b"\x1b[31m", b"[/bold]", b"\xe2\x80\xae", b"a", b"\\n", b"%n"]
    ),
    max_size=12,
).map(b"".join)  # fmt: skip

ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)

_FIELDS = [
    "job_id", "name", "user_name", "job_state", "tres_per_node", "gres_detail", "nodes",
    "time_limit", "cpus", "node_count", "exit_code", "array_job_id", "submit_time",
    "memory_per_node", "tres_alloc_str", "comment", "state_reason", "requeue",
]  # fmt: skip

ODD_VALUES = st.sampled_from(
    [
        "gpu:4(IDX:0-3),shard:2(-/4,?/4)", "gpu:(((", "shard:99999999999999999999",
        "gpu[1-99999999999]", "RUNNING_IN_THE_FUTURE", 2**70, -1, {"set": True, "number": 1e300},
        {"set": True, "infinite": True}, ["FUTURE_STATE", "RUNNING"], [], {}, "", None,
    ]
)  # fmt: skip


@st.composite
def _hostile(draw: st.DrawFn, n: int) -> tuple[Any, bytes | None]:
    """A hostile record (a JSON value) and, maybe, raw bytes to put in its name."""
    kind = draw(st.sampled_from(["fields", "bytes", "not_an_object"]))
    if kind == "not_an_object":
        return draw(
            st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3))
        ), None
    record: dict[str, Any] = {"job_id": HOSTILE_ID + n, "name": f"@@NAME{n}@@"}
    for field in draw(st.lists(st.sampled_from(_FIELDS), max_size=5)):
        record[field] = draw(st.one_of(ODD_VALUES, ANY_JSON))
    return record, draw(_ODD_BYTES) if kind == "bytes" else None


def with_hostile(path: Path, data: st.DataObject, key: str) -> tuple[bytes, None]:
    doc = json.loads(path.read_bytes().decode("utf-8", "replace"))
    good = doc[key]
    hostile = data.draw(st.lists(_hostile(len(good)), min_size=1, max_size=6), label="hostile")
    records = list(good)
    taken = {json.dumps(r.get("job_id")) for r in good}
    for i, (record, _) in enumerate(hostile):
        if isinstance(record, dict):
            record["name"] = f"@@NAME{i}@@"
            # a record of another job's id is not hostile, it is that job: keep ids apart
            if (
                record.get("job_id") == HOSTILE_ID + len(good)
                or json.dumps(record.get("job_id")) in taken
                or isinstance(record.get("job_id"), bool | int | float)
            ):
                record["job_id"] = HOSTILE_ID + i
        records.insert(data.draw(st.integers(0, len(records)), label="at"), record)
    doc[key] = records
    raw = json.dumps(doc).encode()
    for i, (_, name) in enumerate(hostile):
        raw = raw.replace(f'"@@NAME{i}@@"'.encode(), b'"' + (name or b"x") + b'"')
    return raw, None

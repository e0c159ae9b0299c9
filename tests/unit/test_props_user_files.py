"""Property test: whatever a user leaves in a malleable job's state directory, the
daemon's readers return (issue 36, finding 1).

Each example puts one hostile thing where ``ack.json`` and ``progress.json`` belong:
arbitrary bytes, JSON nested up to 70,000 deep (bare or inside a valid-looking record),
files around the 64 KiB bound, invalid UTF-8, NaN and Infinity, values of the wrong
type, a FIFO (a plain open would block for ever), a directory, a symbolic link to
``/dev/zero``, to a valid record or to nothing. ``read_ack`` and ``read_progress`` must
return None or a well-formed record, and raise nothing. A second property checks the
nesting scan of :mod:`slurmgpu.boundedjson` against the depth of the decoded value.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu.boundedjson import JsonRejected, depth_exceeds, loads
from slurmgpu.elastic.spec import MAX_DEPTH, MAX_FILE_BYTES, Ack, Progress, read_ack, read_progress

SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
JOB = 9
RECORD = b'{"version": 1, "job_id": 9, "acks": 1, "restart_count": 0, "at": 1.0, "throughput": '

_TEXT = st.text(alphabet=st.sampled_from('ab[]{}"\\/:,\u00e9\U0001f600\x00\n'), max_size=12)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()  # NaN and Infinity included: json.dumps writes them
    | _TEXT
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_RECORD_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from([1, 1, 2, "1", True]),
        "job_id": st.sampled_from([JOB, JOB, 8, str(JOB), 9.0]),
        "acks": _JSON,
        "restart_count": _JSON,
        "at": _JSON,
        "step": _JSON,
        "gpus": _JSON,
        "throughput": _JSON | st.dictionaries(_TEXT, _JSON, max_size=6),
    },
)


def _nested(depth: int, opener: str) -> bytes:
    return (opener * depth).encode()


_CONTENT = st.one_of(
    st.binary(max_size=512),
    _JSON.map(lambda v: json.dumps(v).encode()),
    _RECORD_FIELDS.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda d, o, wrapped: (RECORD if wrapped else b"") + _nested(d, o),
        st.integers(min_value=1, max_value=70_000),
        st.sampled_from(["[", '{"a":', '[{"a":', '["[",']),
        st.booleans(),
    ),
    st.builds(  # around the size bound: spaces around a valid record
        lambda n: b" " * n + RECORD + b'{"1": 2.0}}',
        st.integers(min_value=MAX_FILE_BYTES - 100, max_value=MAX_FILE_BYTES + 10),
    ),
    st.builds(  # invalid UTF-8 inside a valid record
        lambda junk: RECORD + b'{"1": 2.0}, "x": "' + junk + b'"}',
        st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80abc"]),
    ),
)
_KINDS = st.sampled_from(["fifo", "directory", "dev_zero", "link_to_valid", "dangling_link"])


def _valid(target: Path) -> None:
    target.write_bytes(RECORD + b'{"1": 2.0}}')


def _make(path: Path, thing: bytes | str) -> None:
    if isinstance(thing, bytes):
        path.write_bytes(thing)
    elif thing == "fifo":
        os.mkfifo(path)
    elif thing == "directory":
        path.mkdir()
    elif thing == "dev_zero":
        path.symlink_to("/dev/zero")
    elif thing == "link_to_valid":
        _valid(path.parent / f"real-{path.name}")
        path.symlink_to(path.parent / f"real-{path.name}")
    else:
        path.symlink_to(path.parent / "nowhere")


def _well_formed_ack(ack: Ack | None) -> bool:
    if ack is None:
        return True
    return ack.job_id == JOB and ack.acks >= 0 and math.isfinite(ack.at)


def _well_formed_progress(progress: Progress | None) -> bool:
    return progress is None or (
        progress.job_id == JOB
        and all(0 <= k <= 999_999 for k in progress.throughput)
        and all(math.isfinite(v) and v >= 0 for v in progress.throughput.values())
    )


@SETTINGS
@given(thing=_CONTENT | _KINDS)
def test_the_readers_return_a_record_or_none_for_anything_a_user_leaves(
    thing: bytes | str,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        (state / str(JOB)).mkdir()
        for name in ("ack.json", "progress.json"):
            _make(state / str(JOB) / name, thing)
        ack, progress = read_ack(state, JOB), read_progress(state, JOB)
    assert _well_formed_ack(ack) and _well_formed_progress(progress)
    # Not a regular file, behind a link, too large or too deep: refused.
    if isinstance(thing, str) or len(thing) > MAX_FILE_BYTES or depth_exceeds(thing, MAX_DEPTH):
        assert ack is None and progress is None


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


_FINITE_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=16,
)


@SETTINGS
@given(value=_FINITE_JSON, bound=st.integers(min_value=0, max_value=6), ascii_only=st.booleans())
def test_the_nesting_scan_measures_the_depth_of_the_value(
    value: Any, bound: int, ascii_only: bool
) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode()
    deeper = _depth(value) > bound
    assert depth_exceeds(data, bound) == deeper
    if deeper:
        try:
            loads(data, max_depth=bound)
        except JsonRejected as exc:
            assert exc.cause == f"nested deeper than {bound}"
        else:
            raise AssertionError("a document deeper than the bound was decoded")
    else:
        assert loads(data, max_depth=bound) == value

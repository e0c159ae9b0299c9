"""Table and property tests of the pure Slurm string parsers."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.model import JobState
from slurmgpu.slurm.parse import (
    GresItem,
    GresStringError,
    HostlistError,
    IndexListError,
    JobStateError,
    MemoryStringError,
    SlurmValueError,
    TimeStringError,
    TresStringError,
    compress_hostlist,
    expand_hostlist,
    format_time_limit,
    gres_count,
    parse_gres,
    parse_gres_lenient,
    parse_index_list,
    parse_job_state,
    parse_memory_mib,
    parse_time_limit,
    parse_tres,
)
from tests.hypothesis_profiles import examples

# --------------------------------------------------------------------------- hostlists


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("", ()),
        ("(null)", ()),
        ("gpu1", ("gpu1",)),
        ("gpu1,gpu7", ("gpu1", "gpu7")),
        ("gpu[2-3]", ("gpu2", "gpu3")),
        ("gpu[1-3,7]", ("gpu1", "gpu2", "gpu3", "gpu7")),
        ("node[001-003]", ("node001", "node002", "node003")),
        ("b1,a[1-2]", ("b1", "a1", "a2")),  # group order kept (allocation order)
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("gpu1,gpu1", ("gpu1",)),
        (" gpu1 , gpu2 ", ("gpu1", "gpu2")),
    ],
)
def test_expand_hostlist(expr: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("expr", ["gpu[1-", "gpu]1", "a[3-1]", "a@b", "@group", "a[1-2]@x", "a!b"])
def test_expand_hostlist_rejects(expr: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand_hostlist(expr)
    assert "\n" not in str(info.value)
    assert repr(expr) in str(info.value)


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        ([], ""),
        (["gpu1"], "gpu1"),
        (["gpu1", "gpu2", "gpu3", "gpu7"], "gpu[1-3,7]"),
        (["node002", "node001"], "node[001-002]"),
        (["a1", "b1"], "a1,b1"),
    ],
)
def test_compress_hostlist(names: list[str], expr: str) -> None:
    assert compress_hostlist(names) == expr


def test_compress_hostlist_rejects_operators() -> None:
    with pytest.raises(HostlistError):
        compress_hostlist(["@all"])


_host = st.from_regex(r"[a-z]{1,4}(-?[0-9]{1,3})?", fullmatch=True)


@given(st.lists(_host, max_size=30))
@settings(max_examples=examples(200), deadline=None)
def test_hostlist_round_trip(names: list[str]) -> None:
    folded = compress_hostlist(names)
    assert set(expand_hostlist(folded)) == set(names)
    assert len(expand_hostlist(folded)) == len(set(names))


@given(st.text(max_size=40))
@settings(max_examples=examples(300), deadline=None)
def test_hostlist_garbage_parses_or_raises_ours(text: str) -> None:
    with contextlib.suppress(HostlistError):
        expand_hostlist(text)


# --------------------------------------------------------------------------- times


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("unlimited", None),
        (None, None),
        ("60", timedelta(minutes=60)),
        (90, timedelta(minutes=90)),
        (0, timedelta(0)),
        ("1:30", timedelta(minutes=1, seconds=30)),
        ("01:02:03", timedelta(hours=1, minutes=2, seconds=3)),
        ("1-2", timedelta(days=1, hours=2)),
        ("1-02:03", timedelta(days=1, hours=2, minutes=3)),
        ("1-02:03:04", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("365-00:00:00", timedelta(days=365)),
        ("48:00:00", timedelta(hours=48)),
    ],
)
def test_parse_time_limit(text: str | int | None, limit: timedelta | None) -> None:
    assert parse_time_limit(text) == limit


@pytest.mark.parametrize(
    "text", ["", "abc", "-5", "1-", "1:2:3:4", "1-2-3", "1.5", -1, "9" * 40, 10**30, True]
)
def test_parse_time_limit_rejects(text: object) -> None:
    with pytest.raises(TimeStringError) as info:
        parse_time_limit(text)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("limit", "text"),
    [
        (None, "UNLIMITED"),
        (timedelta(minutes=5), "00:05:00"),
        (timedelta(hours=26, minutes=3, seconds=4), "1-02:03:04"),
        (timedelta(days=2), "2-00:00:00"),
        (timedelta(seconds=0.5), "00:00:01"),  # rounded up, never shortened
    ],
)
def test_format_time_limit(limit: timedelta | None, text: str) -> None:
    assert format_time_limit(limit) == text


def test_format_time_limit_rejects_negative() -> None:
    with pytest.raises(TimeStringError):
        format_time_limit(timedelta(seconds=-1))


@given(st.integers(min_value=0, max_value=10_000 * 86400))
def test_time_round_trip(seconds: int) -> None:
    limit = timedelta(seconds=seconds)
    assert parse_time_limit(format_time_limit(limit)) == limit


@given(st.one_of(st.none(), st.text(max_size=20), st.integers()))
@settings(max_examples=examples(300))
def test_time_garbage_parses_or_raises_ours(value: str | int | None) -> None:
    try:
        result = parse_time_limit(value)
    except TimeStringError:
        return
    assert result is None or result >= timedelta(0)


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("256M", 256),
        ("4G", 4096),
        ("1T", 1024 * 1024),
        ("512K", 1),  # below 1 MiB rounds up
        ("2048K", 2),
        ("1.5G", 1536),
        ("100", 100),
        ("4g", 4096),
        ("8GB", 8192),
        (512, 512),
    ],
)
def test_parse_memory_mib(text: str | int, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize("text", ["", "G", "4X", "-1G", "4B", "1e3M", -5, "9" * 400 + "P"])
def test_parse_memory_rejects(text: str | int) -> None:
    with pytest.raises(MemoryStringError):
        parse_memory_mib(text)


# --------------------------------------------------------------------------- TRES


def test_parse_tres_full() -> None:
    t = parse_tres("cpu=4,mem=8G,node=1,billing=4,gres/gpu=2,gres/gpu:a100=2,gres/shard=2")
    assert (t.cpu, t.mem_mib, t.node, t.billing) == (4, 8192, 1, 4.0)
    assert dict(t.gres) == {"gpu": 2, "gpu:a100": 2, "shard": 2}
    assert (t.gpus, t.gpu_type, t.shards) == (2, "a100", 2)


@pytest.mark.parametrize(
    ("text", "gpus", "gpu_type", "mem"),
    [
        ("cpu=1,mem=256M,node=1,billing=1", 0, None, 256),
        (
            "cpu=2,mem=4G,node=1,billing=2,gres/gpu=1,gres/gpu:l40s=1,gres/tmpsize=10737418240",
            1,
            "l40s",
            4096,
        ),
        ("gres/gpu:a100=2,gres/gpu:v100=1", 3, None, None),  # typed only: summed, 2 types
        ("", 0, None, None),
        (None, 0, None, None),
        ("cpu=4,license/matlab=1,fs/disk=10G", 0, None, None),
    ],
)
def test_parse_tres_table(
    text: str | None, gpus: int, gpu_type: str | None, mem: int | None
) -> None:
    t = parse_tres(text)
    assert (t.gpus, t.gpu_type, t.mem_mib) == (gpus, gpu_type, mem)


def test_parse_tres_keeps_other_keys() -> None:
    assert dict(parse_tres("cpu=4,license/matlab=1").other) == {"license/matlab": "1"}


@pytest.mark.parametrize(
    "text", ["cpu", "cpu=", "=4", "cpu=x", "mem=lots", "gres/=2", "billing=inf"]
)
def test_parse_tres_rejects(text: str) -> None:
    with pytest.raises(TresStringError) as info:
        parse_tres(text)
    assert repr(text) in str(info.value)


# --------------------------------------------------------------------------- GRES


def G(
    name: str,
    type: str | None = None,
    count: int = 0,
    indices: tuple[int, ...] = (),
    shares: tuple[tuple[int, int], ...] = (),
) -> GresItem:
    return GresItem(name, type, count, indices, shares)


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("gres:gpu:2", (G("gpu", count=2),)),
        ("gres/gpu:2", (G("gpu", count=2),)),
        ("gres/gpu=2", (G("gpu", count=2),)),
        ("gres/gpu:a100=2", (G("gpu", "a100", 2),)),
        ("gpu:a100:2", (G("gpu", "a100", 2),)),
        ("gres:gpu:a100:2", (G("gpu", "a100", 2),)),
        ("gpu", (G("gpu", count=1),)),
        ("gpu:a100", (G("gpu", "a100", 1),)),
        ("gpu:2(IDX:0-1)", (G("gpu", count=2, indices=(0, 1)),)),
        ("shard:2(IDX:3)", (G("shard", count=2, indices=(3,)),)),
        ("gpu:a100:2(IDX:0,2)", (G("gpu", "a100", 2, (0, 2)),)),
        ("gpu:4,shard:16", (G("gpu", count=4), G("shard", count=16))),
        ("gpu:a100:4(S:0-1),shard:16", (G("gpu", "a100", 4), G("shard", count=16))),
        ("gpu:4,shard:(null):1(IDX:3)", (G("gpu", count=4), G("shard", count=1, indices=(3,)))),
        ("gpu:3,shard:(null):0(IDX:N/A)", (G("gpu", count=3), G("shard", count=0))),
        (
            "gpu:2(IDX:0-1),shard:0(0/4,0/4,0/4,0/4)",
            (G("gpu", count=2, indices=(0, 1)), G("shard", count=0, shares=((0, 4),) * 4)),
        ),
        ("gpu:a100:3(IDX:0-1,3)", (G("gpu", "a100", 3, (0, 1, 3)),)),
        ("gpu:1g.10gb:2", (G("gpu", "1g.10gb", 2),)),
        ("cpu=2,gres/gpu:1", (G("cpu", count=2), G("gpu", count=1))),
        ("tmpsize:7T", (G("tmpsize", count=7 * 1024**4),)),
        ("", ()),
        ("N/A", ()),
        ("(null)", ()),
        (None, ()),
    ],
)
def test_parse_gres(text: str | None, items: tuple[GresItem, ...]) -> None:
    assert parse_gres(text) == items


@pytest.mark.parametrize(
    "text",
    ["gpu:2(IDX:0-1", "gpu:a:b:2", ":2", "gpu:2(IDX:x)", "gpu:2(foo)", "gpu:2(IDX:3-1)", "g pu:1"],
)
def test_parse_gres_rejects(text: str) -> None:
    with pytest.raises(GresStringError) as info:
        parse_gres(text)
    assert "\n" not in str(info.value)


def test_gres_count() -> None:
    items = parse_gres("gpu:a100:2,gpu:a100:1,shard:4")
    assert gres_count(items, "gpu") == (3, "a100")
    assert gres_count(items, "shard") == (4, None)
    assert gres_count(parse_gres("gpu:a100:1,gpu:v100:1"), "gpu") == (2, None)


@pytest.mark.parametrize(
    ("text", "indices"),
    [("0-1,3", (0, 1, 3)), ("2", (2,)), ("N/A", ()), ("", ()), ("0-3", (0, 1, 2, 3))],
)
def test_parse_index_list(text: str, indices: tuple[int, ...]) -> None:
    assert parse_index_list(text) == indices


@pytest.mark.parametrize("text", ["a", "1-", "3-1", "0-99999999", "1,,2"])
def test_parse_index_list_rejects(text: str) -> None:
    with pytest.raises(IndexListError):
        parse_index_list(text)


# --------------------------------------------------------------------------- job states


@pytest.mark.parametrize(
    ("value", "state", "flags"),
    [
        ("PENDING", JobState.PENDING, set()),
        ("RUNNING", JobState.RUNNING, set()),
        (["PENDING", "REQUEUED"], JobState.PENDING, {"REQUEUED"}),
        (["RUNNING", "COMPLETING"], JobState.RUNNING, {"COMPLETING"}),
        (["COMPLETED", "COMPLETING"], JobState.COMPLETED, {"COMPLETING"}),
        ("COMPLETING", JobState.RUNNING, {"COMPLETING"}),  # 22.05 prints the flag alone
        ("CG", JobState.RUNNING, {"COMPLETING"}),
        ("REQUEUE_HOLD", JobState.PENDING, {"REQUEUE_HOLD"}),
        ("REQUEUED", JobState.PENDING, {"REQUEUED"}),
        ("CONFIGURING", JobState.RUNNING, {"CONFIGURING"}),
        ("SPECIAL_EXIT", JobState.PENDING, {"SPECIAL_EXIT"}),
        ("STAGE_OUT", JobState.COMPLETED, {"STAGE_OUT"}),
        ("RUNNING+SIGNALING", JobState.RUNNING, {"SIGNALING"}),
        ("PD", JobState.PENDING, set()),
        ("OOM", JobState.OUT_OF_MEMORY, set()),
        ("CANCELED", JobState.CANCELLED, set()),
        ("cancelled", JobState.CANCELLED, set()),
        ("TIMEOUT", JobState.TIMEOUT, set()),
        (["UNKNOWN"], JobState.UNKNOWN, set()),
    ],
)
def test_parse_job_state(value: str | list[str], state: JobState, flags: set[str]) -> None:
    assert parse_job_state(value) == (state, frozenset(flags))


@pytest.mark.parametrize("value", ["", [], "BOGUS", ["RUNNING", "PENDING"], ["RUNNING", 3]])
def test_parse_job_state_rejects(value: object) -> None:
    with pytest.raises(JobStateError):
        parse_job_state(value)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- garbage

_PARSERS = [
    expand_hostlist,
    parse_time_limit,
    parse_memory_mib,
    parse_tres,
    parse_gres,
    parse_index_list,
    parse_job_state,
]
_alphabet = st.sampled_from(list("gpu:shard()IDX,=-/[]0123456789aN/A%+_.KMGT ")) | st.characters()


@pytest.mark.parametrize("parser", _PARSERS, ids=lambda p: p.__name__)
@given(text=st.text(alphabet=_alphabet, max_size=40))
@settings(max_examples=examples(300), deadline=None)
def test_garbage_parses_or_raises_ours(parser: object, text: str) -> None:
    try:
        parser(text)  # type: ignore[operator]
    except SlurmValueError as exc:
        assert isinstance(exc, ValueError)
        assert "\n" not in str(exc)


# --------------------------------------------------------------------------- 26.05 and lenient


def test_26_05_dash_share_is_a_gpu_held_whole() -> None:
    (gpu, shard) = parse_gres("gpu:2(IDX:0-1),shard:6(-/4,-/4,2/4,4/4)")
    assert (gpu.count, gpu.indices) == (2, (0, 1))
    assert shard.count == 6
    assert shard.shares == ((None, 4), (None, 4), (2, 4), (4, 4))


@pytest.mark.parametrize(
    ("text", "gpus", "idx", "shards", "left_out"),
    [
        ("gpu:4(IDX:0-3),shard:2(?/4,2/4)", 4, (0, 1, 2, 3), 2, 1),  # a new spelling
        ("gpu:2(IDX:0-1,7x),shard:1(1/4)", 2, (), 1, 1),  # bad index list
        ("gpu:2(IDX:0-1),sh@rd:1(1/4)", 2, (0, 1), 0, 1),  # bad item
        ("gpu:2(IDX:0-1),shard:1(1/4", 2, (0, 1), 1, 1),  # unclosed detail
        ("gpu:2(IDX:0-1),shard:5(-/4,-/4,2/4,3/4)", 2, (0, 1), 5, 0),
    ],
)
def test_lenient_gres_keeps_what_parses(
    text: str, gpus: int, idx: tuple[int, ...], shards: int, left_out: int
) -> None:
    items, skipped = parse_gres_lenient(text)
    by_name = {i.name: i for i in items}
    assert by_name["gpu"].count == gpus and by_name["gpu"].indices == idx
    assert (by_name["shard"].count if "shard" in by_name else 0) == shards
    assert len(skipped) == left_out
    if left_out:
        with pytest.raises(SlurmValueError):
            parse_gres(text)  # the strict parser still refuses it


# MIG-typed and MPS GRES, hand-written in the spellings each release prints for typed
# GPUs (golden files from daemons with real MIG/MPS gres are still missing).
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gres:gpu:1g.10gb:1", [("gpu", "1g.10gb", 1, ())]),  # 22.05 tres_per_node
        ("gres/gpu:1g.10gb:2", [("gpu", "1g.10gb", 2, ())]),  # 23.x+ tres_per_node
        ("gres/gpu:3g.40gb=1", [("gpu", "3g.40gb", 1, ())]),  # TRES string
        ("gpu:1g.10gb+me:1(IDX:4)", [("gpu", "1g.10gb+me", 1, (4,))]),  # gres_detail
        (
            "gpu:3g.40gb:1(IDX:0),gpu:1g.10gb:2(IDX:1-2)",  # node gres_used, two profiles
            [("gpu", "3g.40gb", 1, (0,)), ("gpu", "1g.10gb", 2, (1, 2))],
        ),
        ("gres/mps:50", [("mps", None, 50, ())]),
        ("mps:100(IDX:0)", [("mps", None, 100, (0,))]),
        ("mps:200(S:0-1)", [("mps", None, 200, ())]),  # node gres with socket affinity
    ],
)
def test_mig_typed_and_mps_gres_parse(
    text: str, expected: list[tuple[str, str | None, int, tuple[int, ...]]]
) -> None:
    assert [(i.name, i.type, i.count, i.indices) for i in parse_gres(text)] == expected

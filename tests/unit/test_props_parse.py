"""Property tests for Slurm's string formats (slurm/parse.py): hostlists, time limits,
memory sizes, TRES, GRES, index lists and job states.

Two kinds of input per parser: *generated valid* strings whose meaning is known (the
parse must give it back), and *hostile* strings (random text, valid strings with a
mutation, huge numbers) that must either parse or raise that parser's own
``SlurmValueError`` subclass in one line. Counts print at the end of the module.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu.slurm.parse import (
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
    parse_gres,
    parse_index_list,
    parse_job_state,
    parse_memory_mib,
    parse_time_limit,
    parse_tres,
)
from tests.hypothesis_profiles import examples
from tests.unit.props_tally import Tally, report

TALLY = Tally()
tally_report = report(TALLY)
MANY = settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# A hostile alphabet: the characters these formats give meaning to, digits, units, and
# anything else Unicode has (including newlines, NUL and right-to-left marks).
_SYNTAX = list("[](),:=-+/%_.@!&^ \t\n\x00") + list("0123456789") + list("KMGTPkmgtp")
_WORDS = ["gpu", "shard", "IDX:", "gres/", "cpu", "mem", "node", "billing", "N/A", "(null)"]
hostile = st.one_of(
    st.text(alphabet=st.sampled_from(_SYNTAX) | st.characters(), max_size=60),
    st.lists(st.sampled_from(_SYNTAX + _WORDS), max_size=20).map("".join),
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),  # int() digit limits
)


def _mutate(text: str, data: st.DataObject) -> str:
    """A valid string with one character inserted, deleted or replaced."""
    if not text:
        return data.draw(st.sampled_from(_SYNTAX))
    i = data.draw(st.integers(0, len(text) - 1))
    how = data.draw(st.sampled_from(["insert", "delete", "replace", "repeat"]))
    c = data.draw(st.sampled_from(_SYNTAX) | st.characters())
    if how == "insert":
        return text[:i] + c + text[i:]
    if how == "delete":
        return text[:i] + text[i + 1 :]
    if how == "repeat":
        return text[:i] + text[i:] * data.draw(st.integers(2, 50))
    return text[:i] + c + text[i + 1 :]


# --------------------------------------------------------------------------- hostlists

_prefix = st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z]", fullmatch=True)
_ranges = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20)), min_size=1, max_size=4).map(
    lambda rs: sorted({(lo, lo + span) for lo, span in rs})
)


@st.composite
def hostlists(draw: st.DrawFn) -> tuple[str, set[str]]:
    """A Slurm hostlist with bracket ranges and the set of names it means."""
    groups: list[str] = []
    names: set[str] = set()
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(_prefix)
        ranges = draw(_ranges)
        width = draw(st.sampled_from([0, 2, 3]))
        parts = []
        for lo, hi in ranges:
            a, b = f"{lo:0{width}d}", f"{hi:0{width}d}"
            parts.append(a if lo == hi else f"{a}-{b}")
            names.update(f"{prefix}{n:0{width}d}" for n in range(lo, hi + 1))
        groups.append(f"{prefix}[{','.join(parts)}]")
    return ",".join(groups), names


@given(hostlists())
@MANY
def test_generated_hostlists_expand_to_their_names(case: tuple[str, set[str]]) -> None:
    expr, names = case
    got = TALLY.run("expand_hostlist (valid)", lambda: expand_hostlist(expr), ())
    assert got is not None and set(got) == names and len(got) == len(names)
    folded = compress_hostlist(sorted(names))
    assert set(expand_hostlist(folded)) == names


@given(st.one_of(hostile, hostlists().flatmap(lambda c: st.just(c[0]))), st.data())
@MANY
def test_hostile_hostlists_parse_or_raise_hostlist_error(text: str, data: st.DataObject) -> None:
    for candidate in (text, _mutate(text, data)):
        TALLY.run("expand_hostlist", partial(expand_hostlist, candidate), HostlistError)


@given(st.integers(100_001, 10**9))
@settings(max_examples=examples(30), deadline=None)
def test_hostlists_naming_absurdly_many_hosts_are_refused_quickly(n: int) -> None:
    got = TALLY.run("expand_hostlist", lambda: expand_hostlist(f"gpu[0-{n}]"), HostlistError)
    assert got is None, "a hostlist of more than 100000 names must be refused"


# --------------------------------------------------------------------------- time limits


@given(st.integers(0, 10**6 * 86400))
@MANY
def test_formatted_time_limits_read_back_exactly(seconds: int) -> None:
    text = format_time_limit(timedelta(seconds=seconds))
    got = TALLY.run("parse_time_limit (valid)", lambda: parse_time_limit(text), ())
    assert got == timedelta(seconds=seconds)


@given(
    st.one_of(
        st.tuples(st.integers(0, 99), st.integers(0, 23), st.integers(0, 59)).map(
            lambda t: f"{t[0]}-{t[1]:02d}:{t[2]:02d}"
        ),
        st.integers(0, 10**7).map(str),
    )
)
@MANY
def test_sbatch_time_spellings_parse(text: str) -> None:
    got = TALLY.run("parse_time_limit (valid)", lambda: parse_time_limit(text), ())
    assert got is not None and got >= timedelta(0)


@given(st.one_of(hostile, st.integers(-(10**30), 10**30)), st.data())
@MANY
def test_hostile_time_limits_parse_or_raise_time_string_error(
    value: str | int, data: st.DataObject
) -> None:
    TALLY.run("parse_time_limit", lambda: parse_time_limit(value), TimeStringError)
    if isinstance(value, str):
        text = _mutate(value, data)
        TALLY.run("parse_time_limit", lambda: parse_time_limit(text), TimeStringError)


# --------------------------------------------------------------------------- memory


@given(st.integers(0, 10**9), st.sampled_from(["", "M", "G", "T", "MiB", "GB", "K"]))
@MANY
def test_memory_sizes_convert_to_mib(number: int, unit: str) -> None:
    factor = {"": 1, "M": 1, "MiB": 1, "G": 1024, "GB": 1024, "T": 1024**2}
    got = TALLY.run("parse_memory_mib (valid)", lambda: parse_memory_mib(f"{number}{unit}"), ())
    if unit == "K":
        assert got == -(-number // 1024)
    else:
        assert got == number * factor[unit]


@given(st.one_of(hostile, st.integers(-(10**30), -1)), st.data())
@MANY
def test_hostile_memory_sizes_parse_or_raise_memory_string_error(
    value: str | int, data: st.DataObject
) -> None:
    TALLY.run("parse_memory_mib", lambda: parse_memory_mib(value), MemoryStringError)
    if isinstance(value, str):
        text = _mutate(value, data)
        TALLY.run("parse_memory_mib", lambda: parse_memory_mib(text), MemoryStringError)


# --------------------------------------------------------------------------- TRES


@st.composite
def tres_strings(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    want = {
        "cpu": draw(st.integers(0, 10**6)),
        "node": draw(st.integers(0, 10**4)),
        "gres/gpu": draw(st.integers(0, 4096)),
        "gres/shard": draw(st.integers(0, 4096)),
    }
    mem_mib = draw(st.integers(0, 10**8))
    items = [f"{k}={v}" for k, v in want.items()] + [f"mem={mem_mib}M", "billing=4"]
    items = draw(st.permutations(items))
    return ",".join(items), {**want, "mem": mem_mib}


@given(tres_strings())
@MANY
def test_generated_tres_strings_give_their_counts(case: tuple[str, dict[str, int]]) -> None:
    text, want = case
    tres = TALLY.run("parse_tres (valid)", lambda: parse_tres(text), ())
    assert tres is not None
    assert (tres.cpu, tres.node, tres.mem_mib) == (want["cpu"], want["node"], want["mem"])
    assert tres.gpus == want["gres/gpu"] and tres.shards == want["gres/shard"]


@given(st.one_of(hostile, tres_strings().map(lambda c: c[0])), st.data())
@MANY
def test_hostile_tres_parse_or_raise_tres_string_error(text: str, data: st.DataObject) -> None:
    for candidate in (text, _mutate(text, data)):
        TALLY.run("parse_tres", partial(parse_tres, candidate), TresStringError)


# --------------------------------------------------------------------------- GRES, indices


@st.composite
def gres_strings(draw: st.DrawFn) -> tuple[str, int, tuple[int, ...]]:
    gpus = sorted(set(draw(st.lists(st.integers(0, 63), min_size=1, max_size=8))))
    gtype = draw(st.sampled_from(["", "a100:", "h100:", "(null):"]))
    return f"gpu:{gtype}{len(gpus)}(IDX:{','.join(map(str, gpus))})", len(gpus), tuple(gpus)


@given(gres_strings())
@MANY
def test_generated_gres_give_count_and_indices(case: tuple[str, int, tuple[int, ...]]) -> None:
    text, count, indices = case
    items = TALLY.run("parse_gres (valid)", lambda: parse_gres(text), ())
    assert items is not None
    (item,) = items
    assert (item.name, item.count, item.indices) == ("gpu", count, indices)


@given(st.one_of(hostile, gres_strings().map(lambda c: c[0])), st.data())
@MANY
def test_hostile_gres_parse_or_raise_gres_string_error(text: str, data: st.DataObject) -> None:
    for candidate in (text, _mutate(text, data)):
        TALLY.run("parse_gres", partial(parse_gres, candidate), GresStringError)
        TALLY.run("parse_index_list", partial(parse_index_list, candidate), IndexListError)


# --------------------------------------------------------------------------- job states

_STATES = ["PENDING", "RUNNING", "COMPLETED", "REQUEUED", "COMPLETING", "CG", "PD", "R"]


@given(st.one_of(hostile, st.lists(st.sampled_from(_STATES) | hostile, max_size=4)))
@MANY
def test_hostile_job_states_parse_or_raise_job_state_error(value: str | list[str]) -> None:
    TALLY.run("parse_job_state", lambda: parse_job_state(value), JobStateError)


def test_every_error_type_is_a_slurm_value_error() -> None:
    for err in (
        HostlistError,
        TimeStringError,
        MemoryStringError,
        TresStringError,
        GresStringError,
        IndexListError,
        JobStateError,
    ):
        assert issubclass(err, SlurmValueError) and issubclass(err, ValueError)

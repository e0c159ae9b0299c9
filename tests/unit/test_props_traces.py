"""Property tests for the simulator's trace loaders (sim/loaders.py).

Every format gets generated *valid* traces whose meaning is known (each row must come
back as the job it describes, with the file line it is on, blank lines and CR / CRLF
line ends included) and *hostile* ones: one field of one row replaced by a value that
must be refused (the error must name that row's line), rows of random text over the
format's own syntax, any bytes as a file, and damaged ``sacct --json`` documents. A
refusal must be :class:`TraceError` in one line; anything else (a traceback, a hang, a
list missing rows) fails. Counts print at the end (docs/reliability.md quotes them).
"""

from __future__ import annotations

import csv
import io
import json
import string
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgpu.sim.loaders import (
    TraceError,
    load_generic_csv,
    load_philly,
    load_pollux,
    load_sacct_json,
    load_sacct_parsable,
    load_trace,
)
from slurmgpu.sim.profiles import ThroughputProfile, load_profiles
from slurmgpu.sim.workload import ProfiledJob, RigidJob, TraceJob
from slurmgpu.slurm.parse import format_time_limit
from slurmgpu.slurm.sacct import decode_sacct
from tests.hypothesis_profiles import examples
from tests.unit.pollux_data import DATA
from tests.unit.props_json import damaged_json
from tests.unit.props_tally import Tally, report

TALLY = Tally()
tally_report = report(TALLY)
SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
EPOCH = datetime(2017, 10, 1, tzinfo=UTC)


def _profiles() -> dict[str, ThroughputProfile] | None:
    return load_profiles(DATA / "profiles") if (DATA / "profiles").is_dir() else None


PROFILES = _profiles()
needs_profiles = pytest.mark.skipif(
    PROFILES is None, reason=f"Pollux throughput profiles not found under {DATA / 'profiles'}"
)
# Batch sizes the Pollux workloads use with each application.
BATCHES = {
    "bert": [384],
    "cifar10": [2048, 4096],
    "deepspeech2": [320, 640],
    "imagenet": [3200, 6400],
    "ncf": [32768],
    "yolov3": [64],
}

# --------------------------------------------------------------------------- documents


@dataclass(frozen=True)
class Doc:
    """A generated trace: its text and, per data row, the line it starts on."""

    text: str
    lines: tuple[int, ...]


@st.composite
def layout(
    draw: st.DrawFn, header: Sequence[str], rows: Sequence[Sequence[str]], delimiter: str = ","
) -> Doc:
    """Header and rows as CSV, with blank lines here and there and one kind of line end."""
    end = draw(st.sampled_from(["\n", "\r\n", "\r"]))

    def line(values: Sequence[str]) -> str:
        if delimiter == "|":  # parsable2 does not quote
            return "|".join(values)
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow(values)
        return out.getvalue()

    parts = [line(header)]
    lines: list[int] = []
    for values in rows:
        for _ in range(draw(st.integers(0, 2)) if draw(st.booleans()) else 0):
            parts.append("")
        parts.append(line(values))
        lines.append(len(parts))
    text = end.join(parts) + (end if draw(st.booleans()) else "")
    return Doc(text, tuple(lines))


def _by_line(jobs: Sequence[TraceJob]) -> dict[int, TraceJob]:
    return {j.line: j for j in jobs}


def _sorted_from_zero(jobs: Sequence[TraceJob]) -> None:
    assert jobs[0].submit_s == 0
    keys = [(j.submit_s, j.line) for j in jobs]
    assert keys == sorted(keys)
    assert all(j.time_limit_s is None or j.time_limit_s > 0 for j in jobs)


def _refused_at(target: str, call: Callable[[], object], name: str, line: int) -> None:
    """``call`` must raise TraceError in one line naming ``name, line N``."""
    try:
        call()
    except TraceError as exc:
        TALLY.refuse(target, exc)
        assert f"{name}, line {line}:" in str(exc), (line, str(exc))
        return
    raise AssertionError(f"{target}: a bad value on line {line} was accepted")


def _either(target: str, call: Callable[[], list[TraceJob]]) -> list[TraceJob] | None:
    jobs = TALLY.run(target, call, TraceError)
    if jobs is not None:
        assert jobs, "a loader returned no jobs instead of refusing"
        _sorted_from_zero(jobs)
    return jobs


# Values a field must refuse, by kind.
BAD_SECONDS = st.sampled_from(
    ["", "abc", "-1", "nan", "inf", "-inf", "1e400", "9" * 5000, "1e10", "0x10", "1,5", "\x00"]
)
# Submit times may be Unix times (the loaders allow up to MAX_SUBMIT, 1e11 s): past that.
BAD_SUBMIT = st.sampled_from(
    ["", "abc", "-1", "nan", "inf", "-inf", "1e400", "9" * 5000, "1e12", "0x10", "1,5", "\x00"]
)
BAD_COUNT = st.sampled_from(["", "0", "-2", "1.5", "abc", "1e5", "nan", "9" * 5000, "2 gpus"])
BAD_STAMP = st.sampled_from(
    ["", "abc", "2017-13-01 00:00:00", "2017-10-09 25:00:00", "9" * 5000, "10/09/2017"]
)
seconds = st.floats(0, 1e6, allow_nan=False).map(lambda x: round(x, 3))
label = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=12)
# Random text over the formats' own syntax: separators, quotes, line ends, digits.
syntax = st.lists(
    st.sampled_from([*',|"\r\n\x00 .-:e+0123456789abcT/=', "gres/gpu", "nan", "1e400"]),
    max_size=120,
).map("".join)

# --------------------------------------------------------------------------- Philly

PHILLY = ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"]


@st.composite
def philly_rows(draw: st.DrawFn) -> list[list[str]]:
    rows = []
    for _ in range(draw(st.integers(1, 12))):
        stamp = EPOCH + timedelta(seconds=draw(st.integers(0, 400 * 86400)))
        duration = draw(seconds)
        gpus = draw(st.integers(1, 64))
        cluster = draw(st.one_of(st.just(""), label))
        rows.append([stamp.strftime("%Y-%m-%d %H:%M:%S"), repr(duration), str(gpus), "0", cluster])
    return rows


@SETTINGS
@given(st.data())
def test_valid_philly_rows_come_back_exactly(data: st.DataObject) -> None:
    rows = data.draw(philly_rows())
    doc = data.draw(layout(PHILLY, rows))
    jobs = TALLY.run("load_philly (valid)", lambda: load_philly(doc.text, "philly.csv"), ())
    assert jobs is not None and len(jobs) == len(rows)
    _sorted_from_zero(jobs)
    t0 = min(datetime.fromisoformat(r[0]).replace(tzinfo=UTC) for r in rows)
    got = _by_line(jobs)
    for line, (stamp, duration, gpus, _, cluster) in zip(doc.lines, rows, strict=True):
        job = got[line]
        when = datetime.fromisoformat(stamp).replace(tzinfo=UTC)
        assert job.submit_s == (when - t0).total_seconds()
        assert isinstance(job.model, RigidJob)
        assert job.model.duration_s == max(1.0, float(duration))
        assert job.gpus == int(gpus) and job.name == f"philly-{gpus}g"
        assert job.user == job.account == (cluster or "philly")


@SETTINGS
@given(st.data())
def test_a_bad_philly_field_is_refused_with_its_line(data: st.DataObject) -> None:
    rows = data.draw(philly_rows())
    k = data.draw(st.integers(0, len(rows) - 1))
    column = data.draw(st.sampled_from([0, 1, 2]))
    rows[k][column] = data.draw([BAD_STAMP, BAD_SECONDS, BAD_COUNT][column])
    doc = data.draw(layout(PHILLY, rows))
    _refused_at(
        "load_philly (one bad field)",
        lambda: load_philly(doc.text, "philly.csv"),
        "philly.csv",
        doc.lines[k],
    )


@SETTINGS
@given(philly_rows(), syntax)
def test_random_philly_text_is_loaded_or_refused(rows: list[list[str]], junk: str) -> None:
    text = ",".join(PHILLY) + "\n" + "\n".join(",".join(r) for r in rows) + "\n" + junk
    _either("load_philly (random rows)", lambda: load_philly(text, "philly.csv"))


# --------------------------------------------------------------------------- generic CSV

OPTIONAL = ["user", "name", "time_limit_s", "util_pct", "memory_mib", "malleable", "shards"]


@st.composite
def generic_doc(draw: st.DrawFn) -> tuple[list[str], list[dict[str, str]]]:
    chosen = draw(st.lists(st.sampled_from(OPTIONAL), unique=True))
    header = ["submit_s", "duration_s", "gpus"]
    for c in chosen:
        header += ["min_gpus", "max_gpus"] if c == "malleable" else [c]
    header = draw(st.permutations(header))
    rows = []
    for _ in range(draw(st.integers(1, 10))):
        row = {"submit_s": repr(draw(seconds)), "duration_s": repr(draw(seconds))}
        if "shards" in chosen and draw(st.booleans()):
            row["shards"], row["gpus"] = str(draw(st.integers(1, 8))), "0"
        else:
            row["gpus"] = str(draw(st.integers(1, 64)))
        for c in chosen:
            if c in ("user", "name"):
                row[c] = draw(label)
            elif c == "time_limit_s":
                row[c] = str(draw(st.integers(60, 10**6)))
            elif c == "util_pct":
                row[c] = repr(draw(st.floats(0, 100).map(lambda x: round(x, 2))))
            elif c == "memory_mib":
                row[c] = str(draw(st.integers(0, 10**6)))
            elif c == "malleable":
                lo = draw(st.integers(1, 8))
                row["min_gpus"], row["max_gpus"] = str(lo), str(draw(st.integers(lo, 64)))
        rows.append(row)
    return list(header), rows


def _cells(header: Sequence[str], rows: Sequence[dict[str, str]]) -> list[list[str]]:
    return [[r.get(c, "") for c in header] for r in rows]


@SETTINGS
@given(st.data())
def test_valid_generic_csv_rows_come_back_exactly(data: st.DataObject) -> None:
    header, rows = data.draw(generic_doc())
    doc = data.draw(layout(header, _cells(header, rows)))
    jobs = TALLY.run("load_generic_csv (valid)", lambda: load_generic_csv(doc.text, "t.csv"), ())
    assert jobs is not None and len(jobs) == len(rows)
    _sorted_from_zero(jobs)
    t0 = min(float(r["submit_s"]) for r in rows)
    got = _by_line(jobs)
    for line, row in zip(doc.lines, rows, strict=True):
        job = got[line]
        assert job.submit_s == float(row["submit_s"]) - t0
        assert job.gpus == int(row["gpus"]) and job.shards == int(row.get("shards") or 0)
        assert isinstance(job.model, RigidJob)
        assert job.model.duration_s == max(1.0, float(row["duration_s"]))
        assert job.user == row.get("user", "user1")
        assert job.name == row.get("name", f"job-{row['gpus']}g")
        if "time_limit_s" in row:
            assert job.time_limit_s == float(row["time_limit_s"])
        if "util_pct" in row:
            assert job.model.util_pct == float(row["util_pct"])
        if "memory_mib" in row:
            assert job.model.memory_mib == float(row["memory_mib"])
        if "min_gpus" in row:
            assert job.malleable is not None
            assert (job.malleable.min_gpus, job.malleable.max_gpus) == (
                int(row["min_gpus"]),
                int(row["max_gpus"]),
            )
            assert job.comment == f"sgpu:malleable={row['min_gpus']}:{row['max_gpus']}"
        else:
            assert job.malleable is None


@SETTINGS
@given(st.data())
def test_a_bad_generic_csv_field_is_refused_with_its_line(data: st.DataObject) -> None:
    header, rows = data.draw(generic_doc())
    k = data.draw(st.integers(0, len(rows) - 1))
    bad = {"submit_s": BAD_SUBMIT, "duration_s": BAD_SECONDS, "time_limit_s": BAD_SECONDS}
    bad |= {"util_pct": st.sampled_from(["101", "-1", "nan", "x", "1e400"])}
    bad |= {"memory_mib": st.sampled_from(["-1", "lots", "inf", "1e12"])}
    bad |= {"min_gpus": BAD_COUNT, "max_gpus": BAD_COUNT}
    if rows[k]["gpus"] != "0":
        bad["gpus"] = BAD_COUNT
    column = data.draw(st.sampled_from(sorted(c for c in bad if c in header)))
    value = data.draw(bad[column])
    if column == "time_limit_s" and value == "":
        value = "never"  # empty means "draw one"
    rows[k][column] = value
    if column in ("min_gpus", "max_gpus") and value == "":
        rows[k]["min_gpus" if column == "max_gpus" else "max_gpus"] = "2"  # one of the two
    doc = data.draw(layout(header, _cells(header, rows)))
    _refused_at(
        "load_generic_csv (one bad field)",
        lambda: load_generic_csv(doc.text, "t.csv"),
        "t.csv",
        doc.lines[k],
    )


@SETTINGS
@given(syntax, st.sampled_from(["submit_s,duration_s,gpus", "submit_s,gpus,shards,min_gpus"]))
def test_random_generic_csv_text_is_loaded_or_refused(junk: str, header: str) -> None:
    first = "0,5,1" if header.endswith("gpus") else "0,1,,"
    text = header + "\n" + first + "\n" + junk
    _either("load_generic_csv (random rows)", lambda: load_generic_csv(text, "t.csv"))


# --------------------------------------------------------------------------- Pollux

POLLUX = ["name", "time", "application", "num_replicas", "batch_size"]


@st.composite
def pollux_rows(draw: st.DrawFn) -> list[list[str]]:
    rows = []
    for i in range(draw(st.integers(1, 8))):
        app = draw(st.sampled_from(sorted(BATCHES)))
        rows.append(
            [
                f"{app}-{i}",
                str(draw(st.integers(0, 10**5))),
                app,
                str(draw(st.integers(1, 16))),
                str(draw(st.sampled_from(BATCHES[app]))),
            ]
        )
    return rows


@needs_profiles
@SETTINGS
@given(st.data())
def test_valid_pollux_rows_come_back_exactly(data: st.DataObject) -> None:
    assert PROFILES is not None
    rows = data.draw(pollux_rows())
    doc = data.draw(layout(POLLUX, rows))
    jobs = TALLY.run(
        "load_pollux (valid)", lambda: load_pollux(doc.text, "w.csv", PROFILES, max_gpus=64), ()
    )
    assert jobs is not None and len(jobs) == len(rows)
    _sorted_from_zero(jobs)
    t0 = min(int(r[1]) for r in rows)
    got = _by_line(jobs)
    for line, (_, time, app, replicas, batch) in zip(doc.lines, rows, strict=True):
        job = got[line]
        assert job.submit_s == int(time) - t0
        assert job.name == app and job.gpus == int(replicas)
        assert isinstance(job.model, ProfiledJob) and job.model.batch_size == int(batch)
        assert job.malleable is not None and job.malleable.min_gpus == 1
        assert job.malleable.max_gpus >= job.gpus


@needs_profiles
@SETTINGS
@given(st.data())
def test_a_bad_pollux_field_is_refused_with_its_line(data: st.DataObject) -> None:
    assert PROFILES is not None
    rows = data.draw(pollux_rows())
    k = data.draw(st.integers(0, len(rows) - 1))
    column = data.draw(st.sampled_from([1, 2, 3, 4]))
    bad_app = st.sampled_from(["", "resnet", "BERT", "x" * 5000, "cifar10 "[:-1] + "\x00"])
    rows[k][column] = data.draw([BAD_SUBMIT, bad_app, BAD_COUNT, BAD_COUNT][column - 1])
    if column == 4 and rows[k][column] == "1e5":
        rows[k][column] = "1e12"  # batch sizes may be large; past 1e9 they are refused
    doc = data.draw(layout(POLLUX, rows))
    _refused_at(
        "load_pollux (one bad field)",
        lambda: load_pollux(doc.text, "w.csv", PROFILES),
        "w.csv",
        doc.lines[k],
    )


@needs_profiles
@SETTINGS
@given(syntax)
def test_random_pollux_text_is_loaded_or_refused(junk: str) -> None:
    assert PROFILES is not None
    text = ",".join(POLLUX) + "\ncifar10-0,0,cifar10,2,2048\n" + junk
    _either("load_pollux (random rows)", lambda: load_pollux(text, "w.csv", PROFILES))


# --------------------------------------------------------------------------- sacct parsable2

SACCT = ["JobID", "User", "JobName", "Partition", "Submit", "Start", "End"]
SACCT += ["AllocTRES", "Timelimit", "State"]


@st.composite
def sacct_rows(draw: st.DrawFn) -> tuple[list[list[str]], list[int | None]]:
    """Rows and, per row, the GPUs of the job it must give (None: a row to skip)."""
    rows: list[list[str]] = []
    gpus_of: list[int | None] = []
    for job_id in range(100, 100 + draw(st.integers(1, 8))):
        submit = EPOCH + timedelta(seconds=draw(st.integers(0, 86400 * 30)))
        start = submit + timedelta(seconds=draw(st.integers(0, 7200)))
        end = start + timedelta(seconds=draw(st.integers(0, 86400)))
        kind = draw(st.sampled_from(["gpu", "gpu", "gpu", "cpu", "never ran"]))
        gpus = draw(st.integers(1, 16))
        tres = f"billing=4,cpu=4,gres/gpu={gpus},mem=16G,node=1" if kind != "cpu" else "cpu=2"
        limit: int | None = draw(st.one_of(st.none(), st.integers(60, 7 * 86400)))
        times = [submit.isoformat(timespec="seconds").replace("+00:00", "")]
        times += (
            ["Unknown", "Unknown"]
            if kind == "never ran"
            else [t.isoformat(timespec="seconds").replace("+00:00", "") for t in (start, end)]
        )
        limit_s = "UNLIMITED" if limit is None else format_time_limit(timedelta(seconds=limit))
        user, name = draw(label), draw(label)
        rows.append([str(job_id), user, name, "gpu", *times, tres, limit_s, "COMPLETED"])
        gpus_of.append(gpus if kind == "gpu" else None)
        if kind == "gpu" and draw(st.booleans()):  # its batch step: skipped
            rows.append([f"{job_id}.batch", "", "batch", "", *times, tres, "", "COMPLETED"])
            gpus_of.append(None)
    return rows, gpus_of


@SETTINGS
@given(st.data())
def test_valid_sacct_parsable_rows_come_back_exactly(data: st.DataObject) -> None:
    rows, gpus_of = data.draw(sacct_rows())
    doc = data.draw(layout(SACCT, rows, delimiter="|"))
    expected = sum(1 for g in gpus_of if g is not None)

    def call() -> list[TraceJob]:
        return load_sacct_parsable(doc.text, "sacct.txt")

    if not expected:
        with pytest.raises(TraceError, match="no jobs in the trace"):
            call()
        TALLY.accept("load_sacct_parsable (valid)")
        return
    jobs = TALLY.run("load_sacct_parsable (valid)", call, ())
    assert jobs is not None and len(jobs) == expected
    _sorted_from_zero(jobs)
    got = _by_line(jobs)
    t0 = min(
        datetime.fromisoformat(r[4]).timestamp()
        for r, g in zip(rows, gpus_of, strict=True)
        if g is not None
    )
    for line, row, gpus in zip(doc.lines, rows, gpus_of, strict=True):
        if gpus is None:
            assert line not in got
            continue
        job = got[line]
        submit, start, end = (datetime.fromisoformat(v).timestamp() for v in row[4:7])
        assert job.submit_s == submit - t0
        assert (job.user, job.name, job.partition, job.gpus) == (row[1], row[2], "gpu", gpus)
        assert isinstance(job.model, RigidJob) and job.model.duration_s == max(1.0, end - start)
        if row[8] != "UNLIMITED":
            assert job.time_limit_s is not None
            assert format_time_limit(timedelta(seconds=job.time_limit_s)) == row[8]


@SETTINGS
@given(st.data())
def test_a_bad_sacct_parsable_field_is_refused_with_its_line(data: st.DataObject) -> None:
    rows, gpus_of = data.draw(sacct_rows())
    candidates = [i for i, g in enumerate(gpus_of) if g is not None]
    if not candidates:  # make the first job one that ran on a GPU
        rows[0][5] = rows[0][6] = rows[0][4]
        rows[0][7] = "cpu=4,gres/gpu=1"
        candidates = [0]
    k = data.draw(st.sampled_from(candidates))
    column = data.draw(st.sampled_from([4, 5, 6, 7, 8]))
    bad = {
        4: BAD_STAMP.filter(bool),
        5: BAD_STAMP.filter(bool),
        6: BAD_STAMP.filter(bool),
        7: st.sampled_from(["gres/gpu=x", "cpu=4,gres/gpu=" + "9" * 5000, "gres/gpu=1e5", "="]),
        8: st.sampled_from(["soon", "1-", "99:99:99:99", "9" * 5000, "-5"]),
    }[column]
    rows[k][column] = data.draw(bad)
    doc = data.draw(layout(SACCT, rows, delimiter="|"))
    _refused_at(
        "load_sacct_parsable (one bad field)",
        lambda: load_sacct_parsable(doc.text, "sacct.txt"),
        "sacct.txt",
        doc.lines[k],
    )


@SETTINGS
@given(syntax)
def test_random_sacct_parsable_text_is_loaded_or_refused(junk: str) -> None:
    ran = "2017-10-01T00:00:00|2017-10-01T00:00:00|2017-10-01T01:00:00"
    first = f"7|u|n|gpu|{ran}|gres/gpu=1|01:00:00|COMPLETED"
    text = "|".join(SACCT) + "\n" + first + "\n" + junk
    _either("load_sacct_parsable (random rows)", lambda: load_sacct_parsable(text, "s.txt"))


# --------------------------------------------------------------------------- sacct --json

SACCT_JSON = sorted(GOLDEN.glob("slurm-*/sacct*.json"))


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.mark.parametrize("path", SACCT_JSON, ids=_name)
def test_golden_sacct_json_loads_every_finished_gpu_job(path: Path) -> None:
    text = path.read_text()
    records, _ = decode_sacct(text)
    finished = [
        j
        for j in records
        if j.start_time and j.end_time and j.submit_time and (j.gpus.gpus or j.allocated_gpus)
    ]
    jobs = _either(f"load_sacct_json {_name(path)} (valid)", lambda: load_sacct_json(text, "s"))
    assert len(jobs or []) == len(finished)


@pytest.mark.parametrize("path", SACCT_JSON, ids=_name)
@SETTINGS
@given(data=st.data())
def test_damaged_sacct_json_is_loaded_or_refused(path: Path, data: st.DataObject) -> None:
    raw = data.draw(damaged_json(json.loads(path.read_text())))
    text = raw.decode("utf-8", "replace")
    _either(f"load_sacct_json {_name(path)} (damaged)", lambda: load_sacct_json(text, "s.json"))


# --------------------------------------------------------------------------- any file


@SETTINGS
@given(st.binary(max_size=400) | syntax.map(str.encode))
def test_any_bytes_as_a_trace_file_are_loaded_or_refused(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.csv"
        path.write_bytes(raw)
        _either("load_trace (any bytes)", lambda: load_trace(path, PROFILES))


@SETTINGS
@given(st.sampled_from(["pollux", "philly", "sacct", "csv", "lucid"]), st.data())
def test_a_known_header_with_random_rows_as_a_file(fmt: str, data: st.DataObject) -> None:
    header = {
        "pollux": ",".join(POLLUX),
        "philly": ",".join(PHILLY),
        "sacct": "|".join(SACCT),
        "csv": "submit_s,duration_s,gpus,user,min_gpus,max_gpus",
        "lucid": ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,gpu_num2,"
        "batchsize2,amp2,speed2,gpu_util,gmem_util,gmem",
    }[fmt]
    body = data.draw(syntax)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.txt"
        path.write_text(header + "\n" + body)
        jobs: Any = _either(f"load_trace {fmt} (random rows)", lambda: load_trace(path, PROFILES))
        if jobs is not None:
            assert all(j.line >= 2 for j in jobs)


def test_a_non_numeric_release_in_meta_leaves_the_release_unknown() -> None:
    from slurmgpu.slurm.sacct import decode_sacct

    doc = json.loads((GOLDEN / "slurm-22.05" / "sacct_nothing_found.json").read_bytes())
    doc["meta"]["Slurm"]["version"]["minor"] = ""
    del doc["meta"]["Slurm"]["release"]
    # Found by hypothesis: int("") escaped as a ValueError instead of a clean decode.
    assert decode_sacct(json.dumps(doc).encode()) is not None

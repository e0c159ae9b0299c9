"""The daemon's recommendations export: content, JSON/TSV agreement, atomic replacement."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.daemon.recommend import (
    DEFAULT_PATH,
    TSV_HEADER,
    ExportError,
    Recommendation,
    RecommendationExport,
    atomic_write,
    build_export,
    parse_tsv,
    render_json,
    render_tsv,
    split_key,
    tsv_path_for,
)

BY_KEY: dict[Any, object] = {
    "bob|train|gpu": Recommendation(time_limit_min=120, mem_mib=1500, cpus=4, gpus=1, samples=12),
    ("alice", "eval | nightly", "gpu"): {"time_limit_min": 30, "samples": 3},
    "alice|sweep|debug": Recommendation(gpus=2, samples=7),
}
FALLBACK: dict[str, object] = {"bob": Recommendation(time_limit_min=240, samples=30)}


def test_build_export_sorts_keys_and_leaves_absent_values_out() -> None:
    doc = build_export(BY_KEY, FALLBACK, generated_at=1_700_000_000)

    assert doc == {
        "version": 1,
        "generated_at": 1_700_000_000,
        "by_key": {
            "alice|eval | nightly|gpu": {"time_limit_min": 30, "samples": 3},
            "alice|sweep|debug": {"gpus": 2, "samples": 7},
            "bob|train|gpu": {
                "time_limit_min": 120,
                "mem_mib": 1500,
                "cpus": 4,
                "gpus": 1,
                "samples": 12,
            },
        },
        "fallback": {"bob": {"time_limit_min": 240, "samples": 30}},
    }
    assert list(doc["by_key"]) == sorted(doc["by_key"])


def test_values_are_rounded_up_and_unusable_ones_dropped() -> None:
    doc = build_export(
        {
            "u|a|p": {"time_limit_min": 90.2, "mem_mib": 0, "cpus": -1, "gpus": True},
            "u|b|p": {"mem_mib": float("nan"), "cpus": 2**40},  # nothing usable left
            "u|c|p": {"cpus": "4"},  # strings are not numbers
        },
        generated_at=0,
    )
    assert doc["by_key"] == {"u|a|p": {"time_limit_min": 91, "samples": 0}}


@pytest.mark.parametrize(
    "key",
    [
        "u|tab\there|p",
        "u|new\nline|p",
        "us|er|name|p,q",  # several partitions
        "nobars",
        "u||p",
        ("u|x", "name", "p"),  # a bar in the user
    ],
)
def test_keys_lua_could_never_match_are_skipped(key: object, tmp_path: Path) -> None:
    export = RecommendationExport(tmp_path / "rec.json")
    result = export.write({key: Recommendation(cpus=1)}, generated_at=0)

    assert result.entries == 0
    assert result.skipped == (str(key),)
    assert export.load()["by_key"] == {}


def test_split_key_keeps_bars_inside_the_job_name() -> None:
    assert split_key("alice|a|b|gpu") == ("alice", "a|b", "gpu")
    with pytest.raises(ValueError, match=r"user\|name\|partition"):
        split_key("alice|gpu")


def test_max_entries_keeps_the_best_sampled_keys(tmp_path: Path) -> None:
    by_key = {f"u|job{i}|p": Recommendation(cpus=1, samples=i) for i in range(10)}
    export = RecommendationExport(tmp_path / "r.json", max_entries=4)

    result = export.write(by_key, {"u": Recommendation(cpus=2, samples=1)}, generated_at=0)

    doc = export.load()
    assert sorted(doc["by_key"]) == ["u|job7|p", "u|job8|p", "u|job9|p"]
    assert doc["fallback"] == {"u": {"cpus": 2, "samples": 1}}
    assert result.entries == 4
    assert len(result.skipped) == 7


def test_write_round_trips_and_tsv_agrees_with_json(tmp_path: Path) -> None:
    export = RecommendationExport(tmp_path / "etc" / "recommendations.json")

    result = export.write(BY_KEY, FALLBACK, generated_at=123)

    expected = build_export(BY_KEY, FALLBACK, generated_at=123)
    assert result.entries == 4
    assert result.skipped == ()
    assert export.load() == expected
    assert export.load_tsv() == expected
    assert json.loads(export.json_path.read_text()) == expected
    assert export.tsv_path == tmp_path / "etc" / "recommendations.tsv"


def test_the_tsv_is_what_job_submit_lua_expects(tmp_path: Path) -> None:
    text = render_tsv(build_export(BY_KEY, FALLBACK, generated_at=5))
    assert text.splitlines() == [
        TSV_HEADER,
        "# generated_at=5",
        "# key\ttime_limit_min\tmem_mib\tcpus\tgpus\tsamples",
        "alice|eval | nightly|gpu\t30\t-\t-\t-\t3",
        "alice|sweep|debug\t-\t-\t-\t2\t7",
        "bob|train|gpu\t120\t1500\t4\t1\t12",
        "bob\t240\t-\t-\t-\t30",
        "# end 4",
    ]
    assert text.endswith("\n")


def test_json_is_one_entry_per_line_and_valid() -> None:
    doc = build_export(BY_KEY, FALLBACK, generated_at=5)
    text = render_json(doc)
    assert json.loads(text) == doc
    assert '"bob|train|gpu": {"cpus":4,"gpus":1,"mem_mib":1500,"samples":12,' in text
    assert json.loads(render_json(build_export({}, generated_at=1))) == {
        "version": 1,
        "generated_at": 1,
        "by_key": {},
        "fallback": {},
    }


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("garbage\n", "not a slurmgpu"),
        (f"{TSV_HEADER}\n# generated_at=1\nu|a|p\t1\t-\t-\t-\t0\n", "no end line"),
        (f"{TSV_HEADER}\n# generated_at=1\nu|a|p\t1\t-\t-\t-\t0\n# end 2\n", "says 2"),
        (f"{TSV_HEADER}\n# generated_at=1\nu|a|p\tx\t-\t-\t-\t0\n# end 1\n", "not a count"),
        (f"{TSV_HEADER}\n# generated_at=1\nu|a|p\t1\t-\t-\n# end 1\n", "cells"),
        (f"{TSV_HEADER}\n# generated_at=1\n# end 0\nu|a|p\t1\t-\t-\t-\t0\n", "after the end"),
        (f"{TSV_HEADER}\n# generated_at=soon\n# end 0\n", "bad recommendations"),
        (f"{TSV_HEADER}\n# generated_at=1\n# end 0", "not a slurmgpu"),  # no final newline
    ],
)
def test_parse_tsv_is_strict(text: str, match: str) -> None:
    with pytest.raises(ExportError, match=match):
        parse_tsv(text)


def test_files_are_world_readable_and_no_temp_file_is_left(tmp_path: Path) -> None:
    export = RecommendationExport(tmp_path / "r.json")
    export.write(BY_KEY, generated_at=1)

    for path in (export.json_path, export.tsv_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.tsv"]


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "r.tsv"
    atomic_write(target, b"old\n")

    def boom(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, b"new\n")

    assert target.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.tsv"]


def test_remove_deletes_both_files(tmp_path: Path) -> None:
    export = RecommendationExport(tmp_path / "r.json")
    export.write(BY_KEY, generated_at=1)
    export.remove()
    export.remove()  # twice is fine
    assert list(tmp_path.iterdir()) == []


def test_defaults() -> None:
    export = RecommendationExport()
    assert export.json_path == DEFAULT_PATH == Path("/etc/slurmgpu/recommendations.json")
    assert (
        export.tsv_path == tsv_path_for(DEFAULT_PATH) == Path("/etc/slurmgpu/recommendations.tsv")
    )


# slow tier: 60 generations of thousands of rows against a busy reader, ~3 s
@pytest.mark.slow
def test_a_concurrent_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    """Replace both files many times, with sizes from one row to thousands, while another
    thread reads them as fast as it can: every read parses whole (JSON and strict TSV)."""
    export = RecommendationExport(tmp_path / "r.json", max_entries=None)
    export.write({}, generated_at=0)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for load in (export.load, export.load_tsv):
                try:
                    doc = load()
                except (OSError, ExportError, ValueError) as exc:
                    errors.append(f"{load.__name__}: {exc!r}")
                    continue
                n = doc["generated_at"]
                if len(doc["by_key"]) != (n % 5) * 300:
                    errors.append(f"{load.__name__}: generation {n} has {len(doc['by_key'])}")
                seen.append(n)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for gen in range(1, 60):
            rows = {
                f"user{i}|job{i}|gpu": Recommendation(cpus=1 + i % 8, samples=i)
                for i in range((gen % 5) * 300)
            }
            export.write(rows, generated_at=gen)
    finally:
        stop.set()
        thread.join(timeout=30)

    assert not thread.is_alive()
    assert errors == []
    assert len(set(seen)) > 5, "the reader should have seen several generations"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.tsv"]

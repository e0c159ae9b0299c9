"""The ``sgpu:`` comment tokens (slurmgpu/tokens.py), against the vectors job_submit.lua's
tests read too (tests/vectors/sgpu_tokens.json), and what every Python site makes of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.cli.submit import add_comment_token
from slurmgpu.daemon.policy_cycle import opted_in
from slurmgpu.policy.colocate import ColocateHints, hints_from_comment
from slurmgpu.policy.rightsize import RightsizePolicy
from slurmgpu.policy.settings import RightsizeSettings
from slurmgpu.tokens import (
    Malleable,
    Tokens,
    add_to_comment,
    gpu_mem_token,
    malleable_token,
    parse,
    rightsize_opted_in,
    rightsize_opted_out,
    words,
)
from tests.hypothesis_profiles import examples
from tests.unit.policy_builders import pending_job, record, snapshot

VECTORS_FILE = Path(__file__).resolve().parents[1] / "vectors" / "sgpu_tokens.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))["vectors"]


def expected_tokens(expect: dict[str, Any]) -> Tokens:
    fields = dict(expect)
    m = fields.pop("malleable", None)
    return Tokens(**fields, malleable=None if m is None else Malleable(m["lo"], m["hi"], m["pool"]))


@pytest.mark.parametrize("vector", VECTORS, ids=[v["why"] for v in VECTORS])
def test_parse_gives_what_the_vectors_say(vector: dict[str, Any]) -> None:
    comment, expect = vector["comment"], vector["expect"]
    got = parse(comment)
    want = expected_tokens(expect)
    assert (got.rightsize, got.norightsize, got.shareable, got.separated) == (
        want.rightsize,
        want.norightsize,
        want.shareable,
        want.separated,
    )
    assert (got.gpu_mem_mib, got.malleable, got.malleable_bad) == (
        want.gpu_mem_mib,
        want.malleable,
        want.malleable_bad,
    )
    assert (got.ckpt_signal, got.ckpt_grace_s, got.elastic_dir) == (
        want.ckpt_signal,
        want.ckpt_grace_s,
        want.elastic_dir,
    )
    opted = want.rightsize and not want.norightsize
    assert rightsize_opted_in(comment) is opted is got.rightsize_opted_in
    assert opted_in(comment) is opted  # the daemon's snapshot
    assert rightsize_opted_out(comment) is want.norightsize
    assert hints_from_comment(comment) == ColocateHints(
        want.shareable, want.gpu_mem_mib, want.separated
    )


def test_the_vectors_cover_every_kind_of_token() -> None:
    seen = {key for v in VECTORS for key in v["expect"]}
    assert seen == set(Tokens.__dataclass_fields__) - {"problems"}


def test_a_malformed_token_is_reported_once_and_counts_for_nothing() -> None:
    got = parse("sgpu:gpu-mem=8G sgpu:malleable=0:2 sgpu:ckpt=KILL:1 sgpu:edir=rel ok")
    assert got.gpu_mem_mib is None and got.malleable is None and got.ckpt_signal is None
    assert len(got.problems) == 4
    assert "'sgpu:gpu-mem=8G' is not sgpu:gpu-mem=MiB" in got.problems


@given(
    lo=st.integers(1, 999_999),
    span=st.integers(0, 999),
    pool=st.booleans(),
    mib=st.integers(0, 999_999_999),
    text=st.text(max_size=30),
)
@settings(max_examples=examples(200), deadline=None)
def test_what_is_written_reads_back(lo: int, span: int, pool: bool, mib: int, text: str) -> None:
    hi = min(lo + span, 999_999)
    comment = add_to_comment(text, [malleable_token(lo, hi, pool=pool), gpu_mem_token(mib)])
    got = parse(comment)
    assert got.malleable == Malleable(lo, hi, pool) or (
        # the user's own text already held a well-formed token of its own: it comes first
        parse(text).malleable is not None
    )
    assert got.gpu_mem_mib == mib or parse(text).gpu_mem_mib is not None


def test_rendering_refuses_a_range_no_parser_would_accept() -> None:
    with pytest.raises(ValueError, match="1 <= MIN <= MAX"):
        malleable_token(0, 2)


def test_words_split_only_at_ascii_whitespace_commas_and_semicolons() -> None:
    assert words(" a,b;c\td\ne\x0bf\x0cg\rh ") == list("abcdefgh")
    assert words("a\u00a0b c\x1fd") == ["a\u00a0b", "c\x1fd"]


def test_submit_adds_a_token_once() -> None:
    assert add_comment_token(["--comment=sgpu:rightsize run 3"], "sgpu:rightsize") == [
        "--comment=sgpu:rightsize run 3"
    ]
    assert add_comment_token(["--comment", "run 3"], "sgpu:rightsize") == [
        "--comment",
        "run 3 sgpu:rightsize",
    ]


@pytest.mark.parametrize("apply_to_all", [False, True])
def test_rightsizing_honours_the_opt_out_as_job_submit_lua_does(apply_to_all: bool) -> None:
    """sgpu:norightsize: no proposal at all, opted in or under apply_to_all."""
    runs = [record() for _ in range(5)]  # 1 h runs: an 8 h limit comes down
    jobs = [
        pending_job(1, comment="sgpu:rightsize"),
        pending_job(2, comment="sgpu:rightsize sgpu:norightsize"),
        pending_job(3, comment="run,sgpu:norightsize"),
        pending_job(4, comment=""),
    ]
    comments = {j.job_id: j.comment for j in jobs}
    snap = snapshot(jobs, history=runs, opted_in=[j for j, c in comments.items() if opted_in(c)])
    policy = RightsizePolicy(RightsizeSettings(apply_to_all=apply_to_all))
    proposed = {a.job_id: a for a in policy.propose(snap)}
    assert set(proposed) == {1, 4}
    assert proposed[1].numbers["opted_in"] == 1 and proposed[4].numbers["opted_in"] == 0
    assert proposed[4].requires_opt_in is not apply_to_all
    # the verdict memo must not carry a proposal over once the job opts out
    again = [pending_job(1, comment="sgpu:rightsize sgpu:norightsize"), *jobs[1:]]
    assert policy.propose(snapshot(again, history=snap.history)) == [proposed[4]]

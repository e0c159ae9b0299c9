"""Checkpoint options in a job's comment: written by ``sgpu submit``, trusted only if valid."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmgpu.daemon.malleable import spec_from
from slurmgpu.tokens import CHECKPOINT_SIGNALS, ckpt_tokens, parse
from tests.hypothesis_profiles import examples
from tests.unit.policy_builders import pending_job


@given(
    sig=st.sampled_from(sorted(CHECKPOINT_SIGNALS)),
    grace=st.integers(1, 65535),
    path=st.lists(
        st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(
            lambda p: p not in {".", ".."} and "/" not in p
        ),
        min_size=1,
        max_size=4,
    ).map(lambda parts: "/" + "/".join(parts)),
)
@settings(max_examples=examples(200), deadline=None)
def test_what_submit_writes_the_daemon_reads_back(sig: str, grace: int, path: str) -> None:
    comment = "user text; " + " ".join(["sgpu:malleable=1:4", *ckpt_tokens(sig, grace, path)])
    got = parse(comment)
    assert (got.ckpt_signal, got.ckpt_grace_s, got.elastic_dir, got.problems) == (
        sig,
        grace,
        path,
        (),
    )


@pytest.mark.parametrize(
    "token",
    [
        "sgpu:ckpt=KILL:10",
        "sgpu:ckpt=STOP:10",
        "sgpu:ckpt=USR1:0",
        "sgpu:ckpt=USR1:65536",
        "sgpu:ckpt=usr1:10",
        "sgpu:ckpt=USR1",
        "sgpu:edir=relative/dir",
        "sgpu:edir=/a/../etc",
        "sgpu:edir=/a%0Ab",
        "sgpu:edir=%ff",
        "sgpu:edir=",
        "sgpu:edir=/" + "a" * 2000,
    ],
)
def test_an_untrusted_token_falls_back_to_the_default_with_a_warning(
    token: str, caplog: pytest.LogCaptureFixture
) -> None:
    job = pending_job(7, comment=f"sgpu:malleable=1:2 {token}")
    with caplog.at_level(logging.WARNING, logger="slurmgpu.daemon"):
        spec = spec_from(job, None)
    assert spec is not None
    assert spec.checkpoint_signal == "USR2" and spec.checkpoint_grace == timedelta(seconds=120)
    assert spec.state_dir == ""
    assert "job 7: comment token" in caplog.text


def test_the_comment_wins_over_the_recorded_submission_and_fills_what_it_lacks() -> None:
    job = pending_job(8, comment="sgpu:malleable=1:2 sgpu:ckpt=USR1:300")
    recorded = {
        "checkpoint_signal": "TERM",
        "checkpoint_grace_s": 60,
        "hints": {"elastic_dir": "/x"},
    }
    spec = spec_from(job, recorded)
    assert spec is not None
    assert (spec.checkpoint_signal, spec.checkpoint_grace) == ("USR1", timedelta(seconds=300))
    assert spec.state_dir == "/x"

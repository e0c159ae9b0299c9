"""slurmgpu/slurm/sbatch.py: typed requests in, sbatch options out (golden table).

The strings are what ``sgpu eff`` advises, the alert emails suggest and ``sgpu submit``
adds for a malleable job; they are written out here by hand, so a change to any of them
shows in this table.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmgpu import tokens
from slurmgpu.checkpoint_signal import CATCHABLE, MAX_GRACE_S, MIN_GRACE_S
from slurmgpu.cli.submit import malleable_args, malleable_request
from slurmgpu.slurm import sbatch
from slurmgpu.slurm.sbatch import SbatchOptions
from slurmgpu.units import parse_time_limit

GOLDEN: list[tuple[Callable[[], SbatchOptions], tuple[str, ...]]] = [
    # GPUs for the job; a multi-node job that used one node's GPUs is asked onto one node
    (lambda: sbatch.gpus(1), ("--gpus=1",)),
    (lambda: sbatch.gpus(3), ("--gpus=3",)),
    (lambda: sbatch.gpus(2, nodes=1), ("--nodes=1", "--gpus=2")),
    (lambda: sbatch.gpus(8, nodes=2), ("--nodes=2", "--gpus=8")),
    # a share of one GPU
    (lambda: sbatch.shards(1), ("--gres=shard:1",)),
    (lambda: sbatch.shards(16), ("--gres=shard:16",)),
    # cores per task
    (lambda: sbatch.cpus_per_task(1), ("-c", "1")),
    (lambda: sbatch.cpus_per_task(12), ("-c", "12")),
    # memory per node: G only for whole GiB, never rounded to a rounder figure
    (lambda: sbatch.mem(1), ("--mem=1M",)),
    (lambda: sbatch.mem(1023), ("--mem=1023M",)),
    (lambda: sbatch.mem(1024), ("--mem=1G",)),
    (lambda: sbatch.mem(1025), ("--mem=1025M",)),
    (lambda: sbatch.mem(2560), ("--mem=2560M",)),
    (lambda: sbatch.mem(6144), ("--mem=6G",)),
    (lambda: sbatch.mem(9984), ("--mem=9984M",)),
    (lambda: sbatch.mem(10240), ("--mem=10G",)),
    (lambda: sbatch.mem(262144), ("--mem=256G",)),
    # time limits: HH:MM:SS under a day, D-HH:MM:SS from a day on, seconds rounded up
    (lambda: sbatch.time_limit(timedelta(seconds=1)), ("--time=00:00:01",)),
    (lambda: sbatch.time_limit(timedelta(milliseconds=1)), ("--time=00:00:01",)),
    (lambda: sbatch.time_limit(timedelta(minutes=15)), ("--time=00:15:00",)),
    (lambda: sbatch.time_limit(timedelta(seconds=5400)), ("--time=01:30:00",)),
    (lambda: sbatch.time_limit(timedelta(seconds=5400.2)), ("--time=01:30:01",)),
    (lambda: sbatch.time_limit(timedelta(hours=100)), ("--time=4-04:00:00",)),
    (lambda: sbatch.time_limit(timedelta(seconds=86399)), ("--time=23:59:59",)),
    (lambda: sbatch.time_limit(timedelta(days=1)), ("--time=1-00:00:00",)),
    (lambda: sbatch.time_limit(timedelta(days=2, seconds=5)), ("--time=2-00:00:05",)),
    (lambda: sbatch.time_limit(timedelta(days=365)), ("--time=365-00:00:00",)),
    # the checkpoint signal, to the batch shell, GRACE seconds before the limit
    (lambda: sbatch.checkpoint_signal("USR2", 120), ("--signal=B:USR2@120",)),
    (lambda: sbatch.checkpoint_signal("TERM", 1), ("--signal=B:TERM@1",)),
    (lambda: sbatch.checkpoint_signal("USR1", 65535), ("--signal=B:USR1@65535",)),
]


@pytest.mark.parametrize(("request_", "argv"), GOLDEN)
def test_golden_options(request_: Callable[[], SbatchOptions], argv: tuple[str, ...]) -> None:
    options = request_()
    assert options.argv == argv
    assert str(options) == " ".join(argv)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (lambda: sbatch.gpus(0), "GPUs must be a whole number of at least 1, not 0"),
        (lambda: sbatch.gpus(-1), "at least 1, not -1"),
        (lambda: sbatch.gpus(True), "not True"),  # a bool is no count
        (lambda: sbatch.gpus(1.5), "not 1.5"),  # type: ignore[arg-type]
        (lambda: sbatch.gpus(2, nodes=0), "nodes must be"),
        (lambda: sbatch.shards(0), "shards must be"),
        (lambda: sbatch.cpus_per_task(0), "CPUs per task must be"),
        (lambda: sbatch.mem(0), "memory"),  # --mem=0 is a node's whole memory
        (lambda: sbatch.mem(2560.5), "not 2560.5"),  # type: ignore[arg-type]
        (lambda: sbatch.time_limit(timedelta(0)), "positive"),  # --time=0: no limit
        (lambda: sbatch.time_limit(timedelta(seconds=-1)), "positive"),
        (lambda: sbatch.time_limit(5400), "positive timedelta"),  # type: ignore[arg-type]
        (lambda: sbatch.checkpoint_signal("USR2", 0), "at least 1, not 0"),
        (lambda: sbatch.checkpoint_signal("USR2", 65536), "at most 65535 s, not 65536"),
        (lambda: sbatch.checkpoint_signal("KILL", 60), "not the name of a catchable signal"),
        (lambda: sbatch.checkpoint_signal("SIGUSR2", 60), "not the name"),  # canonical only
        (lambda: sbatch.checkpoint_signal("usr2", 60), "not the name"),
    ],
)
def test_requests_sbatch_would_refuse_or_misread_are_errors(
    request_: Callable[[], SbatchOptions], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        request_()


@given(st.integers(min_value=1, max_value=3650 * 86400))
def test_a_time_limit_reads_back_as_itself(seconds: int) -> None:
    text = str(sbatch.time_limit(timedelta(seconds=seconds))).removeprefix("--time=")
    assert parse_time_limit(text) == timedelta(seconds=seconds)


@given(st.integers(min_value=1, max_value=2**40))
def test_memory_is_exact_and_in_g_only_for_whole_gib(mib: int) -> None:
    text = sbatch.mem_size(mib)
    number, unit = int(text[:-1]), text[-1]
    assert number * (1024 if unit == "G" else 1) == mib
    assert (unit == "G") == (mib % 1024 == 0)


def test_every_catchable_signal_can_be_written() -> None:
    for name in CATCHABLE:
        assert sbatch.checkpoint_signal(name, 60).argv == (f"--signal=B:{name}@60",)


def test_submit_the_token_and_sbatch_share_one_grace_bound() -> None:
    """``sgpu submit --checkpoint-grace``, the ``sgpu:ckpt`` token and the ``--signal``
    option take the same seconds: 1 to 65535 (sbatch's most)."""
    assert (MIN_GRACE_S, MAX_GRACE_S) == (1, 65535)
    assert tokens.MAX_GRACE_S == MAX_GRACE_S
    for grace, ok in ((MIN_GRACE_S, True), (MAX_GRACE_S, True), (MAX_GRACE_S + 1, False)):
        values = {"--malleable": "1:2", "--checkpoint-grace": f"{grace}s"}
        if ok:
            req = malleable_request(values, False, ["--wrap=x"])
            assert f"--signal=B:USR2@{grace}" in malleable_args(req, ["--wrap=x"])
        else:
            with pytest.raises(ValueError, match="between 1s and 18h"):
                malleable_request(values, False, ["--wrap=x"])
            with pytest.raises(ValueError, match="at most"):
                sbatch.checkpoint_signal("USR2", grace)
        assert (tokens.parse(f"sgpu:ckpt=USR2:{grace}").ckpt_grace_s == grace) is ok
    assert tokens.parse("sgpu:ckpt=USR2:0").ckpt_grace_s is None

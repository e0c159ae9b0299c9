"""CliSlurmClient's argument lists and error mapping, through an injected command runner.

The runner answers with outputs recorded from real Slurm (tests/golden/: squeue/sinfo/
sacct documents from 22.05/24.11/26.05 daemons, and slurm-22.05/commands.json: exit
status, stdout and stderr of each command with no controller and with a running one), so
these run in milliseconds; tests/slurm/test_cli_backend.py checks the real thing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.intent import NarrowToShards, Resize, SetComment, SetGpus, SetNice, SetTimeLimit
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.client import (
    SlurmCommandError,
    SlurmError,
    SlurmParseError,
    SlurmUnavailableError,
)
from slurmgpu.slurm.jsonformat import decode_sinfo, decode_squeue
from slurmgpu.slurm.runner import CommandResult, CommandTimeout, SubprocessRunner

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
COMMANDS = json.loads((GOLDEN / "slurm-22.05" / "commands.json").read_text(encoding="utf-8"))

# What 24.11 and 26.05 squeue/sinfo print (exit 1, nothing on stdout) for a --json=vX they
# lack, as the release smoke tests saw it (docs/slurm.md, "Empty output").
NO_PLUGIN_STDERR = b"squeue: error: load_plugins: unable to find plugin: data_parser/v0.0.40\n"


def recorded(section: str, argv: Sequence[str]) -> CommandResult:
    """The recorded answer to ``argv`` (slurm-22.05/commands.json)."""
    for entry in COMMANDS[section]:
        if entry["argv"] == list(argv):
            return CommandResult(
                entry["returncode"], entry["stdout"].encode(), entry["stderr"].encode()
            )
    raise AssertionError(f"nothing recorded for {argv} in {section}")


Answer = CommandResult | BaseException | Callable[[Sequence[str]], CommandResult]


@dataclass
class Call:
    argv: list[str]
    input: bytes | None
    timeout: float
    env: Mapping[str, str]
    cwd: str | None
    big_output: bool


@dataclass
class ScriptedRunner:
    """A CommandRunner that answers from a list and records each call."""

    answers: list[Answer]
    calls: list[Call] = field(default_factory=list)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None,
        timeout: float,
        env: Mapping[str, str],
        cwd: str | None,
        big_output: bool,
    ) -> CommandResult:
        self.calls.append(Call(list(argv), input, timeout, dict(env), cwd, big_output))
        assert self.answers, f"unexpected command {list(argv)}"
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(argv)
        return answer


def client_with(*answers: Answer, **kw: Any) -> tuple[CliSlurmClient, ScriptedRunner]:
    runner = ScriptedRunner(list(answers))
    return CliSlurmClient(runner=runner, **kw), runner


def ok(stdout: bytes) -> CommandResult:
    return CommandResult(0, stdout, b"")


# ---------------------------------------------------------------- listings and their argv


@pytest.mark.parametrize(
    "golden",
    ["slurm-22.05/squeue.json", "slurm-24.11/mixed_squeue.json", "slurm-26.05/mixed_squeue.json"],
)
def test_jobs_runs_one_squeue_json_listing(golden: str) -> None:
    data = (GOLDEN / golden).read_bytes()
    client, runner = client_with(ok(data), timeout_s=7, slurm_conf="/etc/lab/slurm.conf")
    jobs = client.jobs()
    expected, release = decode_squeue(data)
    assert [j.job_id for j in jobs] == [j.job_id for j in expected] and jobs
    assert client.version() == release  # read from the listing: no sinfo --version run
    (call,) = runner.calls
    assert call.argv == ["squeue", "--json", "--all", "--states=all"]
    assert call.big_output and call.input is None and call.cwd is None
    assert call.timeout == 7 and call.env["SLURM_CONF"] == "/etc/lab/slurm.conf"


@pytest.mark.parametrize(
    "golden",
    ["slurm-22.05/squeue.json", "slurm-24.11/mixed_squeue.json", "slurm-26.05/mixed_squeue.json"],
)
def test_job_asks_for_one_job_and_keeps_only_it(golden: str) -> None:
    # 22.05's --json ignores --jobs and sends every job: the client filters too
    data = (GOLDEN / golden).read_bytes()
    expected, _ = decode_squeue(data)
    wanted = expected[-1]
    client, runner = client_with(ok(data), ok(data))
    job = client.job(wanted.job_id)
    assert job is not None and job.job_id == wanted.job_id and job.nodes == wanted.nodes
    (call,) = runner.calls
    assert call.argv == ["squeue", "--json", "--all", f"--jobs={wanted.job_id}", "--states=all"]
    assert client.job(max(j.job_id for j in expected) + 1) is None


def test_a_job_slurm_refuses_to_list_is_an_error() -> None:
    failed = CommandResult(1, b"", b"slurm_load_jobs error: Invalid job id specified\n")
    client, _runner = client_with(failed)
    with pytest.raises(SlurmError):
        client.job(99)


def test_listing_options_shape_the_argv() -> None:
    data = (GOLDEN / "slurm-26.05" / "mixed_squeue.v0.0.42.json").read_bytes()
    client, runner = client_with(
        ok(data), all_states=False, bin_dir="/opt/slurm/bin", data_parser="v0.0.42"
    )
    client.jobs()
    assert runner.calls[0].argv == ["/opt/slurm/bin/squeue", "--json=v0.0.42", "--all"]


def test_nodes_runs_sinfo_per_node() -> None:
    data = (GOLDEN / "slurm-24.11" / "mixed_sinfo.json").read_bytes()
    client, runner = client_with(ok(data))
    nodes = client.nodes()
    assert [n.name for n in nodes] == [n.name for n in decode_sinfo(data)] and nodes
    assert runner.calls[0].argv == ["sinfo", "--json", "--Node"] and runner.calls[0].big_output


def test_version_parses_sinfo_version_once() -> None:
    client, runner = client_with(recorded("no_controller", ["sinfo", "--version"]))
    assert client.version() == "22.05.8"
    assert client.version() == "22.05.8"
    assert [c.argv for c in runner.calls] == [["sinfo", "--version"]]
    assert not runner.calls[0].big_output


def test_finished_jobs_asks_sacct_200_ids_at_a_time() -> None:
    data = (GOLDEN / "slurm-22.05" / "sacct.json").read_bytes()
    client, runner = client_with(ok(data), ok(data), ok(data))
    jobs = client.finished_jobs([*range(1, 451), 3])
    assert [c.argv[:5] for c in runner.calls] == [["sacct", "--json", "--allusers", "-X", "-j"]] * 3
    ids = [c.argv[5].split(",") for c in runner.calls]
    assert [len(chunk) for chunk in ids] == [200, 200, 50] and ids[0][:2] == ["1", "2"]
    # the recorded jobs 1..10, terminal ones only (job 9 was still running), newest run each
    assert sorted({j.job_id for j in jobs}) == [1, 2, 3, 4, 5, 6, 7, 8, 10]


# ---------------------------------------------------------------- recorded failures


def test_no_controller_squeue_json_errors_are_unavailable() -> None:
    argv = ["squeue", "--json", "--all", "--states=all"]
    client, _ = client_with(recorded("no_controller", argv))
    with pytest.raises(SlurmUnavailableError, match="slurm_load_jobs"):
        client.jobs()


def test_no_controller_sinfo_json_errors_are_unavailable() -> None:
    client, _ = client_with(recorded("no_controller", ["sinfo", "--json", "--Node"]))
    with pytest.raises(SlurmUnavailableError):
        client.nodes()


@pytest.mark.parametrize(
    ("argv", "action", "message"),
    [
        (["scontrol", "hold", "12"], lambda c: c.hold(12), "Unexpected message received"),
        (
            ["scancel", "--verbose", "12"],
            lambda c: c.cancel(12),
            "Unable to contact slurm controller",
        ),
        (
            ["sbatch", "--parsable", "--wrap", "true"],
            lambda c: c.submit(["--wrap", "true"]),
            "Unable to contact slurm controller",
        ),
    ],
    ids=["scontrol-hold", "scancel", "sbatch"],
)
def test_no_controller_actions_are_unavailable(
    argv: list[str], action: Callable[[CliSlurmClient], object], message: str
) -> None:
    client, runner = client_with(recorded("no_controller", argv))
    with pytest.raises(SlurmUnavailableError, match=message) as info:
        action(client)
    assert runner.calls[0].argv == argv
    assert "\n" not in str(info.value)


def test_sacct_without_accounting_is_no_finished_jobs() -> None:
    argv = ["sacct", "--json", "--allusers", "-X", "-j", "1"]
    client, runner = client_with(recorded("no_controller", argv))
    assert client.finished_jobs([1]) == []
    assert runner.calls[0].argv == argv


def test_submit_returns_the_parsable_job_id() -> None:
    argv = ["sbatch", "--parsable", "-t", "5", "--wrap", "sleep 60"]
    client, runner = client_with(recorded("controller_up", argv), slurm_conf="/lab.conf")
    job = client.submit(argv[2:], env={"SGPU_X": "1"}, cwd="/tmp", stdin=b"#!/bin/sh\n")
    assert job == 1
    call = runner.calls[0]
    assert call.argv == argv and call.input == b"#!/bin/sh\n" and call.cwd == "/tmp"
    assert call.env["SGPU_X"] == "1" and call.env["SLURM_CONF"] == "/lab.conf"
    assert call.env.get("PATH") == os.environ.get("PATH")  # added to, not replacing, ours


def test_submit_refused_keeps_slurms_words_and_exit_status() -> None:
    argv = ["sbatch", "--parsable", "--gres=gpu:99", "--wrap", "true"]
    client, _ = client_with(recorded("controller_up", argv))
    with pytest.raises(SlurmCommandError) as info:
        client.submit(argv[2:])
    assert str(info.value) == (
        "sbatch: error: Batch job submission failed: Requested node configuration is not available"
    )
    assert info.value.returncode == 1


@pytest.mark.parametrize(
    ("argv", "action"),
    [
        (["scontrol", "hold", "99999"], lambda c: c.hold(99999)),
        (["scontrol", "release", "99999"], lambda c: c.release("99999")),
        (["scontrol", "requeuehold", "99999"], lambda c: c.requeue(99999, hold=True)),
        (
            ["scontrol", "update", "JobId=99999", "TimeLimit=00:10:00"],
            lambda c: c.set_time_limit(99999, timedelta(minutes=10)),
        ),
    ],
    ids=["hold", "release", "requeuehold", "update"],
)
def test_unknown_job_is_a_command_error(
    argv: list[str], action: Callable[[CliSlurmClient], object]
) -> None:
    client, runner = client_with(recorded("controller_up", argv))
    with pytest.raises(
        SlurmCommandError, match=r"^scontrol: Invalid job id specified for job 99999$"
    ):
        action(client)
    assert runner.calls[0].argv == argv


def test_unknown_update_field_is_a_command_error() -> None:
    argv = ["scontrol", "update", "JobId=1", "NoSuchField=1"]
    client, runner = client_with(recorded("controller_up", argv))
    with pytest.raises(SlurmCommandError, match="Update of this parameter is not supported"):
        client.update_job(1, (SetNice(1),))  # answered as Slurm answered an unknown field
    assert runner.calls[0].argv == ["scontrol", "update", "JobId=1", "Nice=1"]


def test_an_update_is_spelt_for_the_clusters_release() -> None:
    client, runner = client_with(ok(b"slurm 22.05.8\n"), ok(b""), ok(b""))
    client.update_job(3, (SetGpus(2), SetTimeLimit(5400)))
    client.update_job(3, (NarrowToShards(4),))  # the release is asked once
    assert [c.argv for c in runner.calls] == [
        ["sinfo", "--version"],
        ["scontrol", "update", "JobId=3", "TresPerNode=gres:gpu:2", "TimeLimit=01:30:00"],
        ["scontrol", "update", "JobId=3", "TresPerNode=gres:shard:4"],
    ]


def test_scancel_of_an_unknown_job_exits_0_but_is_an_error() -> None:
    argv = ["scancel", "--verbose", "99999"]
    client, _ = client_with(recorded("controller_up", argv))
    with pytest.raises(SlurmCommandError, match="Invalid job id specified"):
        client.cancel(99999)


def test_cancelling_a_job_that_already_ended_is_not_an_error() -> None:
    client, runner = client_with(recorded("controller_up", ["scancel", "--verbose", "1"]))
    client.cancel(1)
    assert runner.calls[0].argv == ["scancel", "--verbose", "1"]


def test_signal_argv_and_slurms_refusal() -> None:
    argv = ["scancel", "--verbose", "--signal=NOPE", "1"]
    client, _ = client_with(recorded("controller_up", argv))
    with pytest.raises(SlurmCommandError, match="scancel: Unknown job signal: NOPE"):
        client.signal(1, "NOPE")
    client, runner = client_with(ok(b""), ok(b""))
    client.signal("7_3", "USR1", batch_only=True)
    client.signal_all(8, "SIGTERM")
    assert [c.argv for c in runner.calls] == [
        ["scancel", "--verbose", "--signal=USR1", "--batch", "7_3"],
        ["scancel", "--verbose", "--signal=SIGTERM", "--full", "8"],
    ]


def test_action_argv() -> None:
    client, runner = client_with(*(ok(b"") for _ in range(5)))
    client.update_job(5, (SetTimeLimit(86400), SetComment("sgpu:x")))
    client.set_time_limit(5, timedelta(days=1, seconds=1))
    client.requeue(6)
    client.set_array_throttle(9, 2)
    client.release("10+1")
    assert [c.argv for c in runner.calls] == [
        ["scontrol", "update", "JobId=5", "TimeLimit=1-00:00:00", "Comment=sgpu:x"],
        ["scontrol", "update", "JobId=5", "TimeLimit=1-00:00:01"],
        ["scontrol", "requeue", "6"],
        ["scontrol", "update", "JobId=9", "ArrayTaskThrottle=2"],
        ["scontrol", "release", "10+1"],
    ]


@pytest.mark.parametrize(
    "action",
    [
        lambda c: c.hold("1;rm -rf /"),
        lambda c: c.update_job(1, (Resize(2, 4),)),
        lambda c: c.update_job(1, (SetComment("two\nlines"),)),
        lambda c: c.update_job(1, ()),
        lambda c: c.signal(1, "KILL; ls"),
        lambda c: c.set_time_limit(1, timedelta(seconds=-1)),
        lambda c: c.finished_jobs([0]),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(
    action: Callable[[CliSlurmClient], object],
) -> None:
    client, runner = client_with()
    with pytest.raises(SlurmCommandError):
        action(client)
    assert runner.calls == []


# ---------------------------------------------------------------- the runner's own failures


def test_a_timeout_is_slurm_unavailable() -> None:
    client, _ = client_with(CommandTimeout("squeue ran past 2 s"), timeout_s=2)
    with pytest.raises(SlurmUnavailableError, match=r"^squeue did not finish within 2 s$"):
        client.jobs()


def test_a_missing_binary_is_slurm_unavailable() -> None:
    missing = FileNotFoundError(2, "No such file or directory")
    client, _ = client_with(missing)
    with pytest.raises(SlurmUnavailableError, match="sinfo: command not found"):
        client.version()


def test_a_missing_working_directory_is_a_command_error(tmp_path: Path) -> None:
    client, _ = client_with(FileNotFoundError(2, "No such file or directory"))
    with pytest.raises(SlurmCommandError, match="no such directory"):
        client.submit(["--wrap", "true"], cwd=str(tmp_path / "gone"))


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (PermissionError(13, "Permission denied"), SlurmUnavailableError),
        (OSError(8, "x"), SlurmError),
    ],
)
def test_other_start_failures(error: OSError, kind: type[SlurmError]) -> None:
    client, _ = client_with(error)
    with pytest.raises(kind, match="sbatch: cannot run"):
        client.submit([])


# ---------------------------------------------------------------- unsupported --json=vX


def test_2205_json_with_a_version_falls_back_once(caplog: pytest.LogCaptureFixture) -> None:
    """22.05 takes no --json argument (recorded); the client drops to plain --json once."""
    lacks = recorded("no_controller", ["squeue", "--json=v0.0.40", "--all", "--states=all"])
    data = (GOLDEN / "slurm-22.05" / "squeue.json").read_bytes()
    client, runner = client_with(lacks, ok(data), ok(data), data_parser="v0.0.40")
    with caplog.at_level(logging.WARNING, logger="slurmgpu.slurm"):
        assert client.jobs() and client.jobs()
    assert [c.argv[1] for c in runner.calls] == ["--json=v0.0.40", "--json", "--json"]
    assert caplog.text.count("lacks data_parser v0.0.40") == 1
    assert "doesn't allow an argument" in caplog.text


def test_2411_missing_data_parser_plugin_falls_back() -> None:
    data = (GOLDEN / "slurm-24.11" / "mixed_squeue.json").read_bytes()
    client, runner = client_with(
        CommandResult(1, b"", NO_PLUGIN_STDERR), ok(data), data_parser="v0.0.40"
    )
    assert client.jobs()
    assert [c.argv[1] for c in runner.calls] == ["--json=v0.0.40", "--json"]
    assert client.data_parser is None


def test_sacct_printing_nothing_for_a_version_falls_back() -> None:
    data = (GOLDEN / "slurm-24.11" / "mixed_sacct.json").read_bytes()
    client, runner = client_with(ok(b""), ok(data), data_parser="v0.0.39")
    client.finished_jobs([1])
    assert [c.argv[1] for c in runner.calls] == ["--json=v0.0.39", "--json"]


@pytest.mark.parametrize("stdout", [b"", b"\n  \n"])
def test_plain_json_printing_nothing_is_never_an_empty_cluster(stdout: bytes) -> None:
    client, runner = client_with(ok(stdout))
    with pytest.raises(SlurmParseError, match="squeue --json exited 0 but printed no JSON"):
        client.jobs()
    assert len(runner.calls) == 1


def test_the_fallback_printing_nothing_too_is_an_error() -> None:
    client, runner = client_with(ok(b""), ok(b""), data_parser="v0.0.42")
    with pytest.raises(SlurmParseError, match="sinfo --json exited 0 but printed no JSON"):
        client.nodes()
    assert [c.argv[1] for c in runner.calls] == ["--json=v0.0.42", "--json"]


# ---------------------------------------------------------------- the default runner


def test_subprocess_runner_returns_what_the_command_gave() -> None:
    run = SubprocessRunner()
    script = ["sh", "-c", "cat; echo out; echo err >&2; exit 3"]
    env = dict(os.environ)
    for big in (False, True):
        got = run(script, input=b"in:", timeout=30, env=env, cwd=None, big_output=big)
        assert got == CommandResult(3, b"in:out\n", b"err\n")
    got = run(["sh", "-c", "cat"], input=None, timeout=30, env=env, cwd=None, big_output=False)
    assert got == CommandResult(0, b"", b"")  # stdin closed, never the terminal's


def test_subprocess_runner_timeout_and_missing_binary() -> None:
    run = SubprocessRunner()
    env = dict(os.environ)
    with pytest.raises(CommandTimeout):
        run(["sleep", "30"], input=None, timeout=0.2, env=env, cwd=None, big_output=False)
    with pytest.raises(FileNotFoundError):
        run(["/nonexistent/squeue"], input=None, timeout=5, env=env, cwd=None, big_output=False)

"""Config parsing: defaults, validation, and errors that name file, line and key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmgpu.config import ConfigError, load_settings, parse_duration, parse_settings


def test_empty_config_gives_documented_defaults() -> None:
    s = parse_settings("")
    assert s.daemon.poll_interval == timedelta(seconds=30)
    assert s.daemon.mode == "advise"
    assert s.daemon.listen == "127.0.0.1:8787"
    assert s.slurm.backend == "auto"


def test_values_are_read_and_typed() -> None:
    s = parse_settings(
        '[daemon]\npoll_interval = "1m30s"\nmode = "observe"\n[slurm]\nbackend = "cli"\n'
    )
    assert s.daemon.poll_interval == timedelta(seconds=90)
    assert s.daemon.mode == "observe"
    assert s.slurm.backend == "cli"


def test_bad_duration_error_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[daemon]\nmode = "advise"\n\npoll_interval = "soon"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message == (
        f'config error in {path}, line 4: daemon.poll_interval must be a duration like "30s", '
        "not 'soon'"
    )
    assert "\n" not in message


def test_unknown_key_is_refused_with_its_line() -> None:
    with pytest.raises(ConfigError, match=r"line 3: daemon.pol_interval is not a known setting"):
        parse_settings('[daemon]\nmode = "advise"\npol_interval = "30s"\n', Path("c.toml"))


def test_bad_choice_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="must be one of observe, advise, enforce"):
        parse_settings('[daemon]\nmode = "yolo"\n')


def test_resize_pacing_is_read_from_policy_resize() -> None:
    default = parse_settings("").policy.resize
    assert default.ack_timeout is None and default.requeue_within == 0.5
    assert default.release_delay == timedelta(seconds=1.5) and default.fast_start
    s = parse_settings(
        "[policy.resize]\n"
        'ack_timeout = "20s"\nrequeue_within = 0.25\nfast_start = false\n'
        'release_delay = "2s"\nrelease_after = "5m"\ncycle_interval = "500ms"\n'
        'overtaken_after = "3m"\n'
    ).policy.resize
    assert s.ack_timeout == timedelta(seconds=20) and s.requeue_within == 0.25
    assert not s.fast_start and s.release_delay == timedelta(seconds=2)
    assert s.release_after == timedelta(minutes=5)
    assert s.overtaken_after == timedelta(minutes=3)
    assert default.overtaken_after == timedelta(minutes=10)
    assert s.cycle_interval == timedelta(milliseconds=500)
    assert (
        parse_settings('[policy.resize]\nack_timeout = "grace"\n').policy.resize.ack_timeout is None
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("requeue_within = 0", "policy.resize.requeue_within must be a number in (0, 1], not 0"),
        ("requeue_within = true", "policy.resize.requeue_within must be a number in (0, 1]"),
        ('ack_timeout = "0s"', "policy.resize.ack_timeout must be at least 1s"),
        ('cycle_interval = "1ms"', "policy.resize.cycle_interval must be at least 0.1s"),
        ('release_delay = "soon"', "policy.resize.release_delay must be a duration"),
        ("delay = 1", "policy.resize.delay is not a known setting"),
    ],
)
def test_bad_resize_pacing_is_one_line_naming_key_and_line(line: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(f"[policy.resize]\n{line}\n", Path("c.toml"))
    assert f"line 2: {message}" in str(info.value)


def test_invalid_toml_reports_the_line() -> None:
    with pytest.raises(ConfigError, match=r"line 2: not valid TOML"):
        parse_settings("[daemon]\nmode = \n", Path("c.toml"))


def test_unknown_section_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"\[deamon\] is not a known section"):
        parse_settings("[deamon]\n")


def test_missing_explicit_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_settings(tmp_path / "nope.toml")


def test_sgpu_db_environment_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[daemon]\ndatabase = "sqlite:////tmp/a.db"\n')
    monkeypatch.setenv("SGPU_DB", "sqlite:////tmp/b.db")
    assert load_settings(path).daemon.database == "sqlite:////tmp/b.db"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("1h30m", 5400),
        ("2d", 172800),
        ("45", 45),
        ("250ms", 0.25),
        (12, 12),
    ],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@given(st.text(max_size=20))
def test_any_text_is_a_duration_or_a_value_error(text: str) -> None:
    try:
        d = parse_duration(text)
    except ValueError:
        return
    assert d >= timedelta(0)


@given(st.text(max_size=200))
def test_any_config_text_parses_or_raises_config_error(text: str) -> None:
    try:
        parse_settings(text)
    except ConfigError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize(
    ("listen", "reason"),
    [
        ("999.1.1.1:99999", "port '99999' is not between 1 and 65535"),
        ("999.1.1.1:8787", "'999.1.1.1' is not an IPv4 address"),
        ("10.0.0.256:8787", "'10.0.0.256' is not an IPv4 address"),
        ("127.0.0.1:0", "port '0' is not between 1 and 65535"),
        ("127.0.0.1", "no port"),
        ("127.0.0.1:http", "port 'http' is not between 1 and 65535"),
        ("::1:8787", "an IPv6 address goes in brackets"),
        ("[::g]:8787", "'::g' is not an IPv6 address"),
        ("bad_host:8787", "'bad_host' is not an IP address or a host name"),
        ("-head:8787", "'-head' is not an IP address or a host name"),
        (f"{'a' * 64}.example:8787", "is not an IP address or a host name"),
        ("héad:8787", "ASCII only"),
    ],
)
def test_a_bad_listen_address_is_one_line_naming_file_line_and_key(
    tmp_path: Path, listen: str, reason: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'[daemon]\nmode = "advise"\nlisten = "{listen}"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(
        f'config error in {path}, line 3: daemon.listen must be HOST:PORT like "127.0.0.1:8787", '
        f"not {listen!r}: "
    )
    assert reason in message and "\n" not in message


@pytest.mark.parametrize(
    "listen",
    [
        "127.0.0.1:8787",
        "0.0.0.0:1",
        "[::1]:65535",
        "[::]:8787",
        ":8787",
        "slurmctld:8787",
        "head-1.cluster.example.org.:8787",
    ],
)
def test_a_good_listen_address_is_read(listen: str) -> None:
    assert parse_settings(f'[daemon]\nlisten = "{listen}"\n').daemon.listen == listen


def test_policy_check_refuses_a_bad_listen_address_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurmgpu.cli.main import main

    path = tmp_path / "config.toml"
    path.write_text('[daemon]\nlisten = "999.1.1.1:99999"\n')
    result = CliRunner().invoke(main, ["policy", "check", str(path)])
    assert result.exit_code != 0
    assert "daemon.listen" in result.output and len(result.output.strip().splitlines()) == 1


def test_sgpu_daemon_listen_option_is_checked_before_anything_starts(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurmgpu.cli.main import main

    result = CliRunner().invoke(
        main, ["--db", f"sqlite:///{tmp_path / 'never.db'}", "daemon", "--listen", "1.2.3.4:0"]
    )
    assert result.exit_code == 2
    assert (
        result.output.strip() == "sgpu: --listen '1.2.3.4:0': port '0' is not between 1 and 65535"
    )
    assert not (tmp_path / "never.db").exists()


def test_metrics_max_users_is_bounded() -> None:
    assert parse_settings("").daemon.metrics_max_users == 20
    assert parse_settings("[daemon]\nmetrics_max_users = 0\n").daemon.metrics_max_users == 0
    for bad in ("-1", "1001", '"many"'):
        with pytest.raises(ConfigError, match="metrics_max_users"):
            parse_settings(f"[daemon]\nmetrics_max_users = {bad}\n")

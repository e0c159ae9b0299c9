"""``sgpu policy show`` prints a configuration file: ``policy check`` accepts it and it
reads back as the same settings (defaults, and a file that sets every kind of value)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from click.testing import CliRunner

from slurmgpu.cli.main import main as cli
from slurmgpu.cli.policy import effective, to_toml, unset
from slurmgpu.config import Settings, load_settings, parse_settings

# Non-default values of every shape: optional strings and paths set, a None that the file
# spells "off" / "auto" set to a value, sub-second and odd durations, lists, a mapping.
CUSTOM = """
[daemon]
poll_interval = "1.5s"
max_backoff = "7m13s"
mode = "enforce"
listen = "0.0.0.0:9000"
admin_uids = [0, 1001]
lease_ttl = "90s"

[slurm]
backend = "cli"
cluster = "lab"

[policy]
history_days = 30
recommendations_file = "/var/lib/slurmgpu/recommendations.json"

[policy.engine]
exempt_users = ["root", "alice"]
exempt_partitions = ["debug"]
job_cooldown = "45m"

[policy.idle_gpu]
mode = "observe"
second_warn_after = "off"
act_after = "3h"

[policy.colocate]
device_memory = "24GiB"
memory_margin = "1GiB"

[policy.malleable]
mode = "enforce"
min_gain = 0.3

[policy.las]
grow_back = true

[notify]
enabled = true
username = "slurmgpu"
password_file = "/etc/slurmgpu/smtp.pass"
domain = "example.edu"
address_map_file = "/etc/slurmgpu/addresses"
admin_recipients = ["hpc@example.edu", "ops@example.edu"]
template_dir = "/etc/slurmgpu/templates"

[notify.alert_intervals]
idle_gpu_cancel = "0s"
"idle_gpu_warning_1" = "2d"
"""


def _same(a: Settings, b: Settings) -> None:
    a, b = dataclasses.replace(a, source=None), dataclasses.replace(b, source=None)
    for section in ("daemon", "slurm", "policy", "notify"):
        assert getattr(a, section) == getattr(b, section), section
    assert a == b


def _round_trip(settings: Settings) -> Settings:
    return parse_settings(to_toml(effective(settings)))


def test_default_settings_round_trip_through_policy_show() -> None:
    settings = Settings()
    _same(_round_trip(settings), settings)
    assert "notify.username" in unset(settings)
    assert "policy.colocate.device_memory" not in unset(settings)  # printed as "auto"


def test_a_file_setting_every_kind_of_value_round_trips() -> None:
    settings = parse_settings(CUSTOM)
    assert settings.policy.colocate.device_memory_mib == 24 * 1024
    assert settings.policy.idle_gpu.second_warn_after is None
    assert settings.notify.alert_intervals  # the mapping is not lost
    again = _round_trip(settings)
    _same(again, settings)
    assert unset(settings) == []
    # Printing the read-back settings gives the same text (a fixed point).
    assert to_toml(effective(again)) == to_toml(effective(settings))


def test_policy_show_output_passes_policy_check(tmp_path: Path) -> None:
    runner = CliRunner()
    for name, text in {"defaults": "", "custom": CUSTOM}.items():
        config = tmp_path / f"{name}.toml"
        config.write_text(text)
        shown = runner.invoke(cli, ["--config", str(config), "policy", "show"])
        assert shown.exit_code == 0, shown.output
        printed = tmp_path / f"{name}-shown.toml"
        printed.write_text(shown.output)
        checked = runner.invoke(cli, ["policy", "check", str(printed)])
        assert checked.exit_code == 0, f"{name}: {checked.output}"
        assert "OK" in checked.output
        expected = parse_settings(text)
        _same(load_settings(printed), expected)

"""Rendering the lab cluster's Slurm config from its packaged templates (no Slurm needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmgpu.lab.cluster import LabCluster, LabClusterError
from slurmgpu.lab.cluster import render as render_module
from slurmgpu.lab.cluster.render import (
    TEMPLATES_ENV,
    ClusterConfig,
    RenderError,
    find_templates,
    main,
    node_range,
    packaged_templates,
    render,
    write,
)

REPO_TEMPLATES = Path(__file__).resolve().parents[2] / "slurmgpu" / "lab" / "cluster" / "templates"


def conf_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def option(text: str, key: str) -> str:
    values = [ln.split("=", 1)[1] for ln in conf_lines(text) if ln.split("=", 1)[0] == key]
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def node_lines(text: str) -> list[str]:
    return [ln for ln in conf_lines(text) if ln.startswith("NodeName=gpu")]


@pytest.fixture
def native(tmp_path: Path) -> dict[str, str]:
    return render(ClusterConfig.native(tmp_path / "lab", ctld_port=6917, slurmd_port_base=17101))


def test_default_templates_are_the_packaged_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEMPLATES_ENV, raising=False)
    assert find_templates() == packaged_templates() == REPO_TEMPLATES


def test_templates_env_var_overrides_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for f in REPO_TEMPLATES.iterdir():
        (tmp_path / f.name).write_text(
            f.read_text().replace("ClusterName=${CLUSTER_NAME}", "ClusterName=envlab")
        )
    monkeypatch.setenv(TEMPLATES_ENV, str(tmp_path))

    text = render(ClusterConfig.native(tmp_path / "lab"))["slurm.conf"]

    assert option(text, "ClusterName") == "envlab"


def test_missing_templates_raise_an_error_naming_the_directory(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match=re.escape(str(tmp_path))):
        find_templates(tmp_path)


def test_unknown_placeholder_is_an_error_not_left_in_the_config(tmp_path: Path) -> None:
    for f in REPO_TEMPLATES.iterdir():
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "gres.conf.in").write_text("NodeName=${NO_SUCH_VAR}\n")

    with pytest.raises(RenderError, match="NO_SUCH_VAR"):
        render(ClusterConfig.native(tmp_path / "lab"), tmp_path)


def test_native_mode_declares_four_nodes_on_localhost_with_consecutive_ports(
    native: dict[str, str],
) -> None:
    assert node_lines(native["slurm.conf"]) == [
        f"NodeName=gpu{i} NodeHostname=localhost NodeAddr=127.0.0.1 Port={17100 + i}"
        for i in range(1, 5)
    ]


def test_native_mode_sets_the_ctld_port_and_address(native: dict[str, str]) -> None:
    text = native["slurm.conf"]
    assert option(text, "SlurmctldPort") == "6917"
    assert option(text, "SlurmctldHost") == "localhost(127.0.0.1)"


def test_native_mode_keeps_all_state_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    text = render(ClusterConfig.native(root))["slurm.conf"]
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldLogFile", "SlurmdPidFile"):
        assert option(text, key).startswith(f"{root}/"), key
    assert "${" not in text


def test_required_cluster_options_are_present(native: dict[str, str]) -> None:
    text = native["slurm.conf"]
    expected = {
        "SlurmdParameters": "config_overrides",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory",
        "GresTypes": "gpu,shard",
        "AuthInfo": "cred_expire=10",
        "JobRequeue": "1",
        "MinJobAge": "600",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/filetxt",
        "JobSubmitPlugins": "lua",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "SlurmUser": "root",
    }
    assert {k: option(text, k) for k in expected} == expected
    default_node = next(ln for ln in conf_lines(text) if ln.startswith("NodeName=DEFAULT"))
    for part in ("CPUs=8", "RealMemory=4000", "Gres=gpu:4,shard:16"):
        assert part in default_node.split()
    partition = next(ln for ln in conf_lines(text) if ln.startswith("PartitionName="))
    assert partition.split()[:3] == ["PartitionName=gpu", "Nodes=gpu[1-4]", "Default=YES"]


def test_options_dropped_after_22_05_are_not_used(native: dict[str, str]) -> None:
    keys = {ln.split("=", 1)[0].lower() for ln in conf_lines(native["slurm.conf"])}
    assert not keys & {"switchtype", "cryptotype", "controlmachine", "fastschedule"}


def test_gres_conf_declares_four_fake_gpus_and_sixteen_shards(native: dict[str, str]) -> None:
    assert conf_lines(native["gres.conf"]) == [
        "AutoDetect=off",
        "NodeName=gpu[1-4] Name=gpu File=/dev/tty[0-3]",
        "NodeName=gpu[1-4] Name=shard Count=16",
    ]


def test_node_count_changes_node_lines_range_and_gres(tmp_path: Path) -> None:
    files = render(ClusterConfig.native(tmp_path, nodes=2, slurmd_port_base=17201))
    assert [ln.split()[0] for ln in node_lines(files["slurm.conf"])] == [
        "NodeName=gpu1",
        "NodeName=gpu2",
    ]
    assert "Nodes=gpu[1-2]" in files["slurm.conf"]
    assert "NodeName=gpu[1-2] Name=shard Count=16" in files["gres.conf"]


def test_node_range_of_one_node_is_a_plain_name() -> None:
    assert node_range(1) == "gpu1"
    assert node_range(7) == "gpu[1-7]"


def test_docker_mode_addresses_nodes_by_container_name_on_default_ports() -> None:
    files = render(ClusterConfig.docker())
    text = files["slurm.conf"]
    assert node_lines(text) == [f"NodeName=gpu{i} NodeAddr=gpu{i} Port=6818" for i in range(1, 5)]
    assert option(text, "SlurmctldHost") == "slurmctld(slurmctld)"
    assert option(text, "SlurmctldPort") == "6817"
    assert option(text, "StateSaveLocation") == "/var/spool/slurmctld"
    assert "File=/dev/fakegpu[0-3]" in files["gres.conf"]
    assert "slurmdbd.conf" not in files


def test_docker_accounting_points_slurmctld_at_slurmdbd_and_renders_its_conf() -> None:
    files = render(ClusterConfig.docker(accounting=True))
    text = files["slurm.conf"]
    assert option(text, "AccountingStorageType") == "accounting_storage/slurmdbd"
    assert option(text, "AccountingStorageHost") == "slurmdbd"
    # sacct lists GPUs and shards in ReqTRES/AllocTRES only when they are tracked
    assert option(text, "AccountingStorageTRES") == "gres/gpu,gres/shard"
    assert option(files["slurmdbd.conf"], "StorageHost") == "mariadb"


def test_native_accounting_uses_the_ports_after_the_nodes(tmp_path: Path) -> None:
    """A chroot lab's slurmdbd and MariaDB (LabCluster(accounting=True)) on their own ports."""
    config = ClusterConfig.native(
        tmp_path, ctld_port=16850, slurmd_port_base=16851, accounting=True
    )
    files = render(config)
    assert "AccountingStoragePort=16855" in files["slurm.conf"]
    assert "AccountingStorageTRES=gres/gpu,gres/shard" in files["slurm.conf"]
    assert (
        "DbdPort=16855" in files["slurmdbd.conf"] and "StoragePort=16856" in files["slurmdbd.conf"]
    )
    assert "DbdHost=localhost" in files["slurmdbd.conf"]


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ((22, 5), "IgnoreSystemdOnFailure=yes"),
        ((23, 2), "CgroupPlugin=disabled"),
        ((24, 11), "CgroupPlugin=disabled"),
        (None, "IgnoreSystemdOnFailure=yes"),
    ],
)
def test_cgroup_conf_gets_the_line_its_slurm_version_understands(
    tmp_path: Path, version: tuple[int, int] | None, line: str
) -> None:
    text = render(ClusterConfig.native(tmp_path, slurm_version=version))["cgroup.conf"]
    assert conf_lines(text) == [line]


REPO_PLUGIN = REPO_TEMPLATES.parents[3] / "plugins" / "job_submit.lua"


def test_job_submit_lua_is_the_plugin_reading_the_labs_recommendations(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    text = render(ClusterConfig.native(root))["job_submit.lua"]

    line = f'local RECOMMENDATIONS_FILE = "{root}/etc/slurmgpu/recommendations.tsv"'
    assert [ln for ln in text.splitlines() if "RECOMMENDATIONS_FILE =" in ln] == [line]
    original = REPO_PLUGIN.read_text().splitlines()
    assert [ln for ln in text.splitlines() if ln != line] == [
        ln for ln in original if "RECOMMENDATIONS_FILE =" not in ln
    ]


def test_the_plugins_module_is_installed_next_to_it_and_written_first(tmp_path: Path) -> None:
    """plugins/job_submit.lua is a thin script over slurmgpu_submit.lua, which it looks up
    in its own directory; written before the script, which a running slurmctld reloads."""
    out = render(ClusterConfig.native(tmp_path / "lab"))
    assert out["slurmgpu_submit.lua"] == REPO_PLUGIN.with_name("slurmgpu_submit.lua").read_text()
    names = list(out)
    assert names.index("slurmgpu_submit.lua") < names.index("job_submit.lua")
    written = write(ClusterConfig.native(tmp_path / "lab"), tmp_path / "etc")
    assert written["slurmgpu_submit.lua"] == tmp_path / "etc" / "slurmgpu_submit.lua"


def test_docker_mode_plugin_keeps_the_default_recommendations_path() -> None:
    text = render(ClusterConfig.docker())["job_submit.lua"]
    assert 'local RECOMMENDATIONS_FILE = "/etc/slurmgpu/recommendations.tsv"' in text


def test_placeholder_job_submit_lua_is_copied_verbatim_without_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no source tree with plugins/job_submit.lua around the package, and no installed copy
    monkeypatch.setattr(render_module, "SOURCE_PLUGIN", tmp_path / "plugins" / "job_submit.lua")
    monkeypatch.setattr(render_module, "INSTALLED_PLUGINS", (tmp_path / "share" / "x.lua",))

    text = render(ClusterConfig.native(tmp_path / "lab"))["job_submit.lua"]

    assert text == (REPO_TEMPLATES / "job_submit.lua").read_text()


def test_lab_cluster_names_its_recommendations_path(tmp_path: Path) -> None:
    lab = LabCluster(tmp_path / "lab", ctld_port=6917, slurmd_port_base=17101)
    assert lab.recommendations_path == tmp_path / "lab" / "etc" / "slurmgpu" / (
        "recommendations.json"
    )


@pytest.mark.parametrize(
    ("nodes", "ctld_port", "slurmd_port_base", "match"),
    [
        (0, 6817, 17001, "at least 1 node"),
        (4, 17102, 17101, "collides"),
        (4, 70000, 17001, "outside"),
    ],
)
def test_invalid_sizes_and_ports_are_rejected(
    tmp_path: Path, nodes: int, ctld_port: int, slurmd_port_base: int, match: str
) -> None:
    with pytest.raises(RenderError, match=match):
        ClusterConfig.native(
            tmp_path, nodes=nodes, ctld_port=ctld_port, slurmd_port_base=slurmd_port_base
        )
    with pytest.raises(LabClusterError, match=match):
        LabCluster(tmp_path, nodes=nodes, ctld_port=ctld_port, slurmd_port_base=slurmd_port_base)


def test_write_puts_every_file_in_the_out_dir(tmp_path: Path) -> None:
    written = write(ClusterConfig.docker(accounting=True), tmp_path / "etc")
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == sorted(written)
    assert (written["slurmdbd.conf"].stat().st_mode & 0o777) == 0o600


def test_render_module_cli_docker_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--mode", "docker", "--out", str(tmp_path), "--slurm-version", "24.11"])

    assert rc == 0
    assert "NodeAddr=gpu3" in (tmp_path / "slurm.conf").read_text()
    assert conf_lines((tmp_path / "cgroup.conf").read_text()) == ["CgroupPlugin=disabled"]
    assert str(tmp_path / "slurm.conf") in capsys.readouterr().out


def test_lab_cluster_env_points_at_its_rendered_slurm_conf(tmp_path: Path) -> None:
    lab = LabCluster(tmp_path / "lab", ctld_port=6917, slurmd_port_base=17101)
    assert lab.env() == {"SLURM_CONF": str(tmp_path / "lab" / "etc" / "slurm.conf")}
    assert lab.daemon_names == [
        "slurmctld",
        "slurmd-gpu1",
        "slurmd-gpu2",
        "slurmd-gpu3",
        "slurmd-gpu4",
    ]
    assert not lab.is_up()


def test_missing_slurm_without_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmgpu.lab.cluster import host_setup

    monkeypatch.setattr(host_setup, "packages_present", lambda: False)
    monkeypatch.setattr("os.geteuid", lambda: 1000)

    with pytest.raises(LabClusterError, match="needs root"):
        host_setup.ensure_packages()

"""The lab's GPU sharing layout (``sharing="mig-mps"``): MIG-typed and MPS nodes in the
rendered slurm.conf and gres.conf, read back by the same gres.conf parser the agent uses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli.cluster import cluster
from slurmgpu.lab.cluster import LabCluster, LabClusterError
from slurmgpu.lab.cluster.render import ClusterConfig, RenderError, main, render
from slurmgpu.lab.cluster.sharing import MIG_LAYOUT, MIG_LAYOUT_22_05, mig_layout
from slurmgpu.telemetry.gresconf import mps_minors, parse_gres_conf
from slurmgpu.telemetry.simgpu import SimulatedGpuProbe


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def _rendered(tmp_path: Path, version: tuple[int, int] | None) -> dict[str, str]:
    config = ClusterConfig.native(tmp_path, sharing="mig-mps", slurm_version=version)
    return render(config)


def _node_gres(slurm_conf: str) -> dict[str, str]:
    """Each node's GRES as slurmctld reads slurm.conf: the last ``NodeName=DEFAULT``
    line's ``Gres=`` before the node's line."""
    current, out = "", {}
    for line in _lines(slurm_conf):
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") == "DEFAULT":
            current = fields.get("Gres", current)
        elif "NodeName" in fields:
            out[fields["NodeName"]] = current
    return out


def test_mig_and_mps_nodes_get_their_own_gres_and_the_rest_stay_default(tmp_path: Path) -> None:
    files = _rendered(tmp_path, (26, 5))
    assert _node_gres(files["slurm.conf"]) == {
        "gpu1": "gpu:4,shard:16",
        "gpu4": "gpu:4,shard:16",
        "gpu2": "gpu:3g.40gb:2,gpu:2g.20gb:2,gpu:1g.10gb:4",
        "gpu3": "gpu:4,mps:400",
    }
    assert "GresTypes=gpu,shard,mps" in _lines(files["slurm.conf"])
    gres = files["gres.conf"]
    assert "NodeName=gpu1,gpu4 Name=shard Count=16" in gres
    assert "NodeName=gpu3 Name=mps Count=400 File=/dev/tty[0-3]" in gres


def test_the_agents_parser_sees_mig_instances_grouped_by_their_parent_gpu(tmp_path: Path) -> None:
    gres = _rendered(tmp_path, (26, 5))["gres.conf"]
    devices = parse_gres_conf(gres, "gpu2")
    assert sorted(d.gpu_type or "" for d in devices) == sorted(MIG_LAYOUT * 2)
    # Slurm index order: grouped by profile, each profile's instances GPU by GPU
    assert [(d.gpu_type, d.minor) for d in devices[:2]] == [("3g.40gb", 0), ("3g.40gb", 1)]
    assert len({d.path for d in devices}) == 2  # two parents, /dev/tty0 and /dev/tty1
    assert mps_minors(gres, "gpu3") == {0, 1, 2, 3}
    assert mps_minors(gres, "gpu2") == set()
    assert [d.gpu_type for d in parse_gres_conf(gres, "gpu1")] == [None] * 4
    (tmp_path / "gres.conf").write_text(gres)
    probe = SimulatedGpuProbe("gpu2", tmp_path / "gres.conf", None, tmp_path / "sim")
    samples = probe.sample()
    assert [len(s.mig_instances) for s in samples] == [4, 4]
    assert all(s.util_pct is None for s in samples)


def test_before_23_02_each_mig_gpu_has_one_profile(tmp_path: Path) -> None:
    assert mig_layout((22, 5)) == MIG_LAYOUT_22_05
    assert mig_layout(None) == mig_layout((24, 11)) == MIG_LAYOUT
    files = _rendered(tmp_path, (22, 5))
    assert _node_gres(files["slurm.conf"])["gpu2"] == "gpu:1g.10gb:14"
    devices = parse_gres_conf(files["gres.conf"], "gpu2")
    assert [d.minor for d in devices] == [0] * 7 + [1] * 7
    # every instance has a capability file of its own, as nvidia-caps are
    assert len({d.path for d in devices}) == 2
    assert len(set(files["gres.conf"].split("MultipleFiles=")[1:])) == 14


def test_accounting_counts_mps_too(tmp_path: Path) -> None:
    config = ClusterConfig.native(tmp_path, sharing="mig-mps", accounting=True)
    assert "AccountingStorageTRES=gres/gpu,gres/shard,gres/mps" in render(config)["slurm.conf"]


def test_without_sharing_the_config_is_the_default_one(tmp_path: Path) -> None:
    files = render(ClusterConfig.native(tmp_path))
    assert "GresTypes=gpu,shard" in _lines(files["slurm.conf"])
    assert set(_node_gres(files["slurm.conf"]).values()) == {"gpu:4,shard:16"}
    assert _lines(files["gres.conf"]) == [
        "AutoDetect=off",
        "NodeName=gpu[1-4] Name=gpu File=/dev/tty[0-3]",
        "NodeName=gpu[1-4] Name=shard Count=16",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sharing": "mig"}, "unknown sharing 'mig'"),
        ({"sharing": "mig-mps", "nodes": 2}, "at least 3 nodes"),
    ],
)
def test_bad_sharing_is_one_clear_error(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(RenderError, match=message):
        ClusterConfig.native(tmp_path, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(LabClusterError, match=message):
        LabCluster(tmp_path, **kwargs)  # type: ignore[arg-type]


def test_docker_mode_has_no_sharing_layout() -> None:
    with pytest.raises(RenderError, match="native lab"):
        dataclasses.replace(ClusterConfig.docker(), sharing="mig-mps")


def test_the_render_cli_takes_sharing(tmp_path: Path) -> None:
    assert (
        main(["--out", str(tmp_path / "etc"), "--sharing", "mig-mps", "--slurm-version", "22.05"])
        == 0
    )
    assert "Gres=gpu:1g.10gb:14" in (tmp_path / "etc" / "slurm.conf").read_text()


def test_sgpu_cluster_up_takes_sharing_and_refuses_too_few_nodes(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cluster, ["up", "--root", str(tmp_path), "--sharing", "mig-mps", "--nodes", "2"]
    )
    assert result.exit_code == 1
    assert "sharing 'mig-mps' needs the native lab and at least 3 nodes" in result.output
    assert len(result.output.strip().splitlines()) == 1

"""The lab's site profile: what it renders, the Unix users and sacctmgr commands it plans
(no Slurm needed; tests/slurm/test_site_profile_real.py runs it for real)."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

from slurmgpu.lab.cluster import LabCluster, LabClusterError, site
from slurmgpu.lab.cluster.provision import (
    ProvisionError,
    ensure_unix_users,
    planned_users,
    sacctmgr_setup,
)
from slurmgpu.lab.cluster.render import ClusterConfig, RenderError, main, render
from slurmgpu.policy.settings import AttainedServiceSettings

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


def conf_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def options(text: str) -> dict[str, str]:
    return {
        k: v
        for ln in conf_lines(text)
        if not ln.startswith(("NodeName=", "PartitionName="))
        for k, _, v in [ln.partition("=")]
    }


def site_render(tmp_path: Path, nodes: int = 16) -> dict[str, str]:
    config = ClusterConfig.native(tmp_path, nodes=nodes, accounting=True, profile="site")
    return render(config)


def test_site_profile_sets_multifactor_fairshare_and_qos_preemption(tmp_path: Path) -> None:
    opts = options(site_render(tmp_path)["slurm.conf"])

    assert opts["PriorityType"] == "priority/multifactor"
    weights = {k: int(v) for k, v in opts.items() if k.startswith("PriorityWeight")}
    # the partition weight is a base every job gets alike (one PriorityJobFactor)
    base = weights.pop("PriorityWeightPartition")
    assert max(weights, key=lambda k: weights[k]) == "PriorityWeightFairshare"
    assert "PriorityJobFactor" not in site_render(tmp_path)["slurm.conf"]
    # LAS's largest Nice (one queue limit: queue 1) never floors a priority at 1
    las = AttainedServiceSettings()
    assert base >= len(las.queue_limits) * las.nice_step
    assert opts["PreemptType"] == "preempt/qos"
    assert opts["PreemptMode"] == "REQUEUE"
    assert set(opts["AccountingStorageEnforce"].split(",")) >= {"associations", "limits", "qos"}
    assert "jobs" in opts["PrivateData"].split(",")
    assert opts["AccountingStorageType"] == "accounting_storage/slurmdbd"


def test_site_profile_has_two_partitions_over_sixteen_nodes(tmp_path: Path) -> None:
    text = site_render(tmp_path)["slurm.conf"]
    parts = [ln for ln in conf_lines(text) if ln.startswith("PartitionName=")]
    nodes = [ln for ln in conf_lines(text) if ln.startswith("NodeName=gpu")]

    assert [p.split()[0] for p in parts] == ["PartitionName=gpu", "PartitionName=debug"]
    assert "Nodes=gpu[1-16]" in parts[0] and "Default=YES" in parts[0]
    assert "Nodes=gpu[1-2]" in parts[1] and "MaxNodes=1" in parts[1]
    assert len(nodes) == 16
    assert "Gres=gpu:4,shard:16" in text


def test_site_profile_says_in_one_line_why_cgroups_are_off(tmp_path: Path) -> None:
    text = site_render(tmp_path)["slurm.conf"]
    reasons = [ln for ln in text.splitlines() if ln.startswith("# cgroups off:")]

    assert len(reasons) == 1
    assert options(text)["ProctrackType"] == "proctrack/linuxproc"


def test_cgroup_reason_names_the_hybrid_mount_and_its_controllers() -> None:
    mounts = (
        "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
        "cgroup /sys/fs/cgroup/devices cgroup rw,devices 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    )
    hybrid = site.cgroup_reason(mounts, "hugetlb\n")
    v2 = site.cgroup_reason("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", "cpu memory")

    assert "cgroup v1 (hybrid: cgroup2 only at /sys/fs/cgroup/unified" in hybrid
    assert "controllers: hugetlb" in hybrid
    assert "cgroup v2 at /sys/fs/cgroup" in v2
    assert "\n" not in hybrid


def test_site_profile_hides_other_users_jobs_in_slurmdbd_too(tmp_path: Path) -> None:
    dbd = options(site_render(tmp_path)["slurmdbd.conf"])
    plain = render(ClusterConfig.native(tmp_path, accounting=True))

    assert "jobs" in dbd["PrivateData"].split(",")
    assert "PrivateData" not in options(plain["slurmdbd.conf"])


def test_default_profile_keeps_one_partition_and_basic_priority(tmp_path: Path) -> None:
    opts = options(render(ClusterConfig.native(tmp_path))["slurm.conf"])

    assert "PriorityType" not in opts and "PreemptType" not in opts
    text = render(ClusterConfig.native(tmp_path))["slurm.conf"]
    assert [ln.split()[0] for ln in conf_lines(text) if ln.startswith("PartitionName")] == [
        "PartitionName=gpu"
    ]


def test_site_profile_without_accounting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="accounting"):
        ClusterConfig.native(tmp_path, profile="site")


def test_lab_cluster_site_profile_means_sixteen_nodes_and_accounting(tmp_path: Path) -> None:
    lab = LabCluster(tmp_path, ctld_port=7917, slurmd_port_base=18001, profile="site")

    assert lab.nodes == 16 and lab.accounting
    assert lab.daemon_names[:2] == ["mariadb", "slurmdbd"]
    assert LabCluster(tmp_path, nodes=4, profile="site").nodes == 4
    with pytest.raises(LabClusterError, match="unknown profile"):
        LabCluster(tmp_path, profile="campus")  # type: ignore[arg-type]


def test_render_cli_site_profile_writes_slurmdbd_conf(tmp_path: Path) -> None:
    code = main(["--mode", "docker", "--profile", "site", "--out", str(tmp_path)])

    assert code == 0
    assert (tmp_path / "slurmdbd.conf").is_file()
    assert "PreemptType=preempt/qos" in (tmp_path / "slurm.conf").read_text()


def test_eight_users_in_three_accounts_with_documented_uids() -> None:
    assert len(site.USERS) == 8
    assert {u.account for u in site.USERS} == set(site.ACCOUNTS) and len(site.ACCOUNTS) >= 3
    uids = [uid for _name, uid in planned_users()]
    assert uids == list(range(site.DAEMON_UID, site.DAEMON_UID + 9))
    assert len(set(uids)) == len(uids)


# --------------------------------------------------------------------------- provisioning


class FakeHost:
    """/etc/passwd and /etc/group in a directory; groupadd/useradd append to them."""

    def __init__(self, etc: Path) -> None:
        self.etc = etc
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (etc / "group").write_text("root:x:0:\n")
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if argv[0] == "groupadd":
            with (self.etc / "group").open("a") as f:
                f.write(f"{argv[-1]}:x:{argv[2]}:\n")
        else:
            uid, gid = argv[argv.index("--uid") + 1], argv[argv.index("--gid") + 1]
            with (self.etc / "passwd").open("a") as f:
                f.write(f"{argv[-1]}:x:{uid}:{gid}::/nonexistent:/bin/sh\n")
        return subprocess.CompletedProcess(list(argv), 0, "", "")


def test_unix_users_are_made_once(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "etc")

    first = ensure_unix_users(host.run, passwd=host.etc / "passwd")
    calls = len(host.calls)
    second = ensure_unix_users(host.run, passwd=host.etc / "passwd")

    assert first == [name for name, _uid in planned_users()]
    assert second == [] and len(host.calls) == calls == 10  # 1 groupadd + 9 useradd


def test_a_user_with_another_uid_is_an_error_not_reused(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "etc")
    with (host.etc / "passwd").open("a") as f:
        f.write("sgpu-u3:x:1234:1234::/home/u3:/bin/sh\n")

    with pytest.raises(ProvisionError, match=r"sgpu-u3 .* has uid 1234, not 61003"):
        ensure_unix_users(host.run, passwd=host.etc / "passwd")


def test_useradd_failure_is_reported_with_its_message(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "etc")

    def refuse(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "useradd":
            return subprocess.CompletedProcess(list(argv), 9, "", "useradd: cannot lock")
        return host.run(argv)

    with pytest.raises(
        ProvisionError, match=r"useradd sgpu-daemon in .* exited 9: useradd: cannot lock"
    ):
        ensure_unix_users(refuse, passwd=host.etc / "passwd")


def test_sacctmgr_setup_accepts_nothing_new_and_stops_at_a_real_error() -> None:
    seen: list[list[str]] = []

    def again(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        seen.append(list(args))
        return subprocess.CompletedProcess(list(args), 1, " Nothing new added.\n", "")

    sacctmgr_setup(again, "lab")
    assert seen == site.sacctmgr_commands("lab")
    coordinator = ["add", "coordinator", "account=root,physics,biology,chemistry"]
    assert [*coordinator, f"names={site.DAEMON_USER}"] in seen

    def broken(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(args), 1, "", "sacctmgr: error: no slurmdbd")

    with pytest.raises(ProvisionError, match="add cluster lab exited 1: sacctmgr: error"):
        sacctmgr_setup(broken, "lab")

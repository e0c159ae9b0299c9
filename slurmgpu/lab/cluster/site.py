"""The lab's *site* profile: a cluster set up like a shared site, not like a test bench.

What ``LabCluster(profile="site")`` (and ``python -m slurmgpu.lab.cluster --profile site``)
adds to the default lab:

* accounting: slurmdbd + MariaDB, ``AccountingStorageEnforce=associations,limits,qos``;
* :data:`ACCOUNTS` (3, with fairshare shares) and :data:`USERS` (8 Unix users, uids
  :data:`UID_FIRST`..``UID_FIRST + 7``, group :data:`GROUP` gid :data:`GID`), each with an
  association in one account, QOS ``normal`` (default) and ``scavenger``;
* ``priority/multifactor`` with fairshare as its heaviest weight (of the factors that
  differ between jobs) and a base priority of :data:`BASE_PRIORITY` for every job;
* QOS preemption: ``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``; QOS ``normal``
  preempts ``scavenger`` (priority 0, ``UsageFactor=0``: free, and requeued when needed);
* two partitions: ``gpu`` (every node, default) and ``debug`` (:data:`DEBUG_NODES`,
  ``MaxNodes=1``, ``MaxTime=1:00:00``);
* ``PrivateData=jobs,usage,users,accounts``: a user sees only their own jobs;
* :data:`DAEMON_USER`, the Unix user the slurmgpu daemon runs as: no AdminLevel, but
  *coordinator* of account ``root`` and of every account under it (:data:`COORDINATED`),
  and so of accounts added later. Tried on 22.05 and 26.05: with no right it sees no
  other user's job (PrivateData) and every hold/update is refused ("Invalid user id"); as
  coordinator it sees them and may hold, release, requeue, signal, cancel, lower
  ``Nice`` to 0 and change time limits -- all slurmgpu does. What only
  ``AdminLevel=Operator`` adds (a negative Nice, node and reservation changes) slurmgpu
  never asks for (docs/admin-guide.md "The daemon's Slurm rights").

Cgroups stay off (``proctrack/linuxproc``, ``task/none``); slurm.conf says why in one line
(:func:`cgroup_reason`).

Standard library only (the docker entrypoint renders with the image's ``python3``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ACCOUNTS",
    "BASE_PRIORITY",
    "COORDINATED",
    "DAEMON_UID",
    "DAEMON_USER",
    "DBD_PRIVATE_DATA",
    "DEBUG_NODES",
    "GID",
    "GROUP",
    "PRIVATE_DATA",
    "QOS_LINES",
    "UID_FIRST",
    "USERS",
    "SiteUser",
    "cgroup_reason",
    "partition_lines",
    "policy_lines",
    "sacctmgr_commands",
]

# The uid/gid range the site profile owns on a host (and in a Slurm chroot): 61000 for the
# daemon and the group, 61001-61008 for the users. Debian leaves 60000-64999 unallocated.
GID = 61000
GROUP = "sgpu-lab"
DAEMON_USER = "sgpu-daemon"
DAEMON_UID = 61000
UID_FIRST = 61001

# account -> fairshare shares (RawShares)
ACCOUNTS: dict[str, int] = {"physics": 50, "biology": 30, "chemistry": 20}
# The accounts the daemon's user coordinates: root and each one under it, named one by
# one. 22.05 makes a coordinator of root one of every existing sub-account too; 26.05
# only of root (tried: it then saw no other user's job). Both make it coordinator of an
# account added under root later.
COORDINATED = ",".join(["root", *ACCOUNTS])

DEBUG_NODES = 2


def cgroup_reason(mounts: str, unified_controllers: str | None) -> str:
    """One line: why the site profile keeps ``proctrack/linuxproc`` + ``task/none`` instead
    of ``proctrack/cgroup`` + ``task/cgroup`` with ``ConstrainDevices=yes``. ``mounts`` is
    the text of /proc/self/mounts, ``unified_controllers`` that of cgroup.controllers of
    the cgroup2 mount (None: no cgroup2 mount)."""
    points = {
        fields[1]: fields[2] for line in mounts.splitlines() if len(fields := line.split()) > 2
    }
    host: str
    if points.get("/sys/fs/cgroup") == "cgroup2":
        host = "this host has cgroup v2 at /sys/fs/cgroup"
    else:
        v2 = [mp for mp, fs in points.items() if fs == "cgroup2"]
        controllers = (unified_controllers or "").split()
        host = (
            "this host mounts cgroup v1 (hybrid: cgroup2 only at "
            f"{v2[0]}, controllers: {', '.join(controllers) or 'none'}), so Slurm's "
            "cgroup/v2 cannot load"
            if v2
            else "this host mounts cgroup v1 only, so Slurm's cgroup/v2 cannot load"
        )
    return (
        f"cgroups off: {host}; and the lab's slurmd all run on one host, where each "
        "would take the one cgroup tree (and its device rules) for its own"
    )


@dataclass(frozen=True, slots=True)
class SiteUser:
    name: str
    uid: int
    account: str


USERS: tuple[SiteUser, ...] = tuple(
    SiteUser(f"sgpu-u{i}", UID_FIRST + i - 1, account)
    for i, account in enumerate(("physics",) * 3 + ("biology",) * 3 + ("chemistry",) * 2, start=1)
)

# sacctmgr's settings of the two QOS (the ``normal`` one exists in every new database)
QOS_LINES: dict[str, tuple[str, ...]] = {
    "scavenger": ("Priority=0", "PreemptMode=requeue", "UsageFactor=0"),
    "normal": ("Priority=100", "Preempt=scavenger"),
}


# what ordinary users may not see of others', in slurm.conf (squeue, scontrol) and in
# slurmdbd.conf (sacct, sreport, sacctmgr): the two are separate settings
PRIVATE_DATA = "jobs,usage,users,accounts"
DBD_PRIVATE_DATA = PRIVATE_DATA


# Every job's priority starts from this (PriorityWeightPartition x 1.0: both partitions
# have the same PriorityJobFactor). Slurm floors a priority at 1, so a job whose factors
# sum to less than its Nice loses its fair share to submit order; this base is LAS's
# largest Nice with the default one queue limit (1 x nice_step = 100000), which keeps
# fair share deciding inside LAS's worse queue (docs/policies.md, "With fair share").
BASE_PRIORITY = 100000
WEIGHT_FAIRSHARE = 100000
WEIGHT_QOS = 10000  # x the QOS's priority over the largest (normal: 100 of 100)
CALC_PERIOD_S = 60  # PriorityCalcPeriod=1 (minutes)
DECAY_HALF_LIFE_S = 86400  # PriorityDecayHalfLife=1-0


def policy_lines() -> list[str]:
    """slurm.conf lines of the site policy: priority, preemption, enforcement, privacy."""
    return [
        "PriorityType=priority/multifactor",
        f"PriorityDecayHalfLife={DECAY_HALF_LIFE_S // 86400}-0",
        f"PriorityCalcPeriod={CALC_PERIOD_S // 60}",
        f"PriorityWeightFairshare={WEIGHT_FAIRSHARE}",
        f"PriorityWeightQOS={WEIGHT_QOS}",
        "PriorityWeightAge=1000",
        "PriorityWeightJobSize=0",
        f"PriorityWeightPartition={BASE_PRIORITY}",
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "AccountingStorageEnforce=associations,limits,qos",
        f"PrivateData={PRIVATE_DATA}",
    ]


def fairshare_toml() -> str:
    """The site's priority as ``sgpu simulate --fairshare`` reads it (sim/fairshare.py),
    in wall seconds: its accounts and users, ``root`` and the daemon's user under root,
    the weights of :func:`policy_lines` (every job has the partition's and the ``normal``
    QOS's terms) and billing one per job (one CPU each, no ``TRESBillingWeights``)."""
    lines = [
        "# the site lab's priority/multifactor (slurmgpu/lab/cluster/site.py)",
        f"calc_period = {CALC_PERIOD_S}",
        f"half_life = {DECAY_HALF_LIFE_S}",
        f"weight = {WEIGHT_FAIRSHARE}",
        f"base = {BASE_PRIORITY + WEIGHT_QOS}",
        'billing = "job"',
        f'root_users = ["root", "{DAEMON_USER}"]',
        "[accounts]",
        *(f"{account} = {shares}" for account, shares in ACCOUNTS.items()),
        "[users]",
        *(f'"{user.name}" = "{user.account}"' for user in USERS),
    ]
    return "\n".join(lines) + "\n"


def partition_lines(node_range: str, nodes: int) -> list[str]:
    """``gpu`` over every node (the default) and ``debug`` over the first nodes."""
    debug = "gpu1" if min(DEBUG_NODES, nodes) == 1 else f"gpu[1-{min(DEBUG_NODES, nodes)}]"
    common = "State=UP OverSubscribe=NO DefMemPerCPU=256"
    return [
        f"PartitionName=gpu Nodes={node_range} Default=YES MaxTime=INFINITE {common}",
        f"PartitionName=debug Nodes={debug} MaxTime=01:00:00 MaxNodes=1 {common}",
    ]


def sacctmgr_commands(cluster: str) -> list[list[str]]:
    """The ``sacctmgr -i`` argument lists that set the site up, in order. Re-running them
    on a database that has it all is harmless: sacctmgr says "Nothing new added"."""
    cmds: list[list[str]] = [["add", "cluster", cluster]]
    cmds.append(["add", "qos", "scavenger"])
    for qos, settings in QOS_LINES.items():
        cmds.append(["modify", "qos", "where", f"name={qos}", "set", *settings])
    for account, shares in ACCOUNTS.items():
        cmds.append(["add", "account", account, f"cluster={cluster}", f"fairshare={shares}"])
    for user in USERS:
        cmds.append(
            [
                "add",
                "user",
                user.name,
                f"account={user.account}",
                f"cluster={cluster}",
                "qos=normal,scavenger",
                "defaultqos=normal",
            ]
        )
    cmds.append(["add", "user", DAEMON_USER, "account=root", f"cluster={cluster}"])
    cmds.append(["add", "coordinator", f"account={COORDINATED}", f"names={DAEMON_USER}"])
    return cmds

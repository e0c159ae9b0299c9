#!/usr/bin/env python3
"""Record golden JSON from real Slurm daemons: shards and whole GPUs on one node.

    .venv/bin/python scripts/record_golden.py [--suite trixie|sid] [--port 16840]

Without ``--suite`` the host's Slurm (Debian 12: 22.05); with it, the Slurm of the chroot
``scripts/slurm_chroot.sh build SUITE`` made. Starts a throw-away lab cluster (4 nodes,
4 fake GPUs and 16 shards each; ports PORT and PORT+1..PORT+4), submits the plan below,
waits until it runs, and writes to ``tests/golden/slurm-MAJOR.MINOR/``:

- ``mixed_squeue[.vX].json``, ``mixed_sinfo[.vX].json``: ``squeue --json`` and
  ``sinfo --json --Node`` with the default data_parser and with every other version this
  Slurm has (``--json=vX``; 22.05 has one and takes no argument);
- ``mixed_scontrol_nodes.json``: ``scontrol show nodes --json``;
- ``mixed_sacct[.vX].json`` (chroot labs, which run slurmdbd + MariaDB): ``sacct --json
  -X`` after two short jobs ended (``ok``: 1 GPU, exit 0; ``fails``: 2 shards, exit 3)
  beside the running plan;
- ``mixed_expected.json``: the plan (per node and per job), what the captures must parse to.

With ``--sharing`` the lab runs the ``mig-mps`` layout (slurmgpu/lab/cluster/sharing.py:
gpu2 MIG slices, gpu3 MPS) and the plan :func:`sharing_plan` instead, and writes
``sharing_squeue[.vX].json``, ``sharing_sinfo[.vX].json``, ``sharing_scontrol_nodes.json``
(23.02+), ``sharing_scontrol_show_node.txt`` (``scontrol show node``, every release) and
``sharing_expected.json``.

With ``--site-config`` the lab runs the site profile (slurmgpu/lab/cluster/site.py: 16
nodes, slurmdbd, ``priority/multifactor``) and only its configuration is written:
``site_show_config.txt`` (``scontrol show config``) and ``site_show_partition.txt``
(``scontrol show partition -o``), what ``slurmgpu.slurm.config`` parses.

Run as root. Nothing is written by hand; run it again to refresh a release's files.
The controller is never restarted during a capture (after a restart 24.11 and 26.05 print
running shard jobs' shards as 0 in the node's gres_used).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slurmgpu.lab.cluster import LabCluster
from slurmgpu.lab.cluster.sharing import MIG_GPUS, MIG_NODE, MPS_NODE, MPS_PER_GPU, mig_layout
from slurmgpu.slurm.jsonformat import data_parser_version

REPO = Path(__file__).resolve().parents[1]
BAD_NAME = b"bad\xff\xfename"  # invalid UTF-8, as any user may submit

# (name, node, gres, held): what runs where
PLAN: list[tuple[str, str, str, bool]] = [
    ("whole2", "gpu1", "gpu:2", False),
    ("shard2", "gpu1", "shard:2", False),
    ("shard3", "gpu1", "shard:3", False),
    ("whole4", "gpu2", "gpu:4", False),
    ("shard4", "gpu3", "shard:4", False),
    ("badname", "gpu4", "gpu:1", False),
    ("held", "gpu1", "gpu:4", True),
]


def expected() -> dict[str, object]:
    nodes: dict[str, dict[str, int]] = {
        f"gpu{i}": {"gpus": 4, "shards": 16, "gpus_used": 0, "shards_used": 0} for i in range(1, 5)
    }
    jobs: dict[str, dict[str, object]] = {}
    for name, node, gres, held in PLAN:
        kind, count = gres.split(":")
        jobs[name] = {
            "node": node,
            "gpus": int(count) if kind == "gpu" else 0,
            "shards": int(count) if kind == "shard" else 0,
            "state": "PENDING" if held else "RUNNING",
        }
        if not held:
            nodes[node][f"{kind}s_used"] += int(count)
    finished = {
        "ok": {"gpus": 1, "shards": 0, "state": "COMPLETED", "exit_code": 0},
        "fails": {"gpus": 0, "shards": 2, "state": "FAILED", "exit_code": 3},
    }
    return {
        "nodes": nodes,
        "jobs": jobs,
        "finished": finished,
        "bad_name": BAD_NAME.decode("latin-1"),
    }


# (name, node, gres, held) of the sharing plan, for a Slurm whose MIG GPUs are split as
# ``layout``: slices of the smallest and (when there is one) the largest profile on the
# MIG node, a half- and a quarter-GPU MPS job and a plain GPU on the MPS node, shards on
# gpu1 as before, and a held slice job. (22.05.8 keeps a node's MPS jobs on one GPU: a
# third job of mps:75 beside the two waited for Resources with three GPUs free.)
def sharing_plan(layout: tuple[str, ...]) -> list[tuple[str, str, str, bool]]:
    small, large = layout[-1], layout[0]
    plan = [
        ("mig_small", MIG_NODE, f"gpu:{small}:1", False),
        ("mig_two", MIG_NODE, f"gpu:{small}:2", False),
    ]
    if large != small:
        plan.append(("mig_large", MIG_NODE, f"gpu:{large}:1", False))
    return [
        *plan,
        ("mps_half", MPS_NODE, "mps:50", False),
        ("mps_quarter", MPS_NODE, "mps:25", False),
        ("whole1", MPS_NODE, "gpu:1", False),
        ("shard4", "gpu1", "shard:4", False),
        ("mig_held", MIG_NODE, f"gpu:{small}:1", True),
    ]


def sharing_expected(
    plan: list[tuple[str, str, str, bool]], layout: tuple[str, ...]
) -> dict[str, object]:
    types: dict[str, int] = {}
    for profile in layout * MIG_GPUS:
        types[profile] = types.get(profile, 0) + 1
    nodes: dict[str, dict[str, object]] = {
        f"gpu{i}": {"gpus": 4, "shards": 16, "gpu_types": {}, "mps": 0} for i in (1, 4)
    }
    nodes[MIG_NODE] = {"gpus": sum(types.values()), "shards": 0, "gpu_types": types, "mps": 0}
    nodes[MPS_NODE] = {"gpus": 4, "shards": 0, "gpu_types": {}, "mps": 4 * MPS_PER_GPU}
    for node in nodes.values():
        node.update(gpus_used=0, shards_used=0, mps_used=0)
    jobs: dict[str, dict[str, object]] = {}
    for name, node, gres, held in plan:
        kind, *typed, count_s = gres.split(":")
        count = int(count_s)
        jobs[name] = {
            "node": node,
            "gpus": count if kind == "gpu" else 0,
            "gpu_type": typed[0] if typed else None,
            "shards": count if kind == "shard" else 0,
            "mps": count if kind == "mps" else 0,
            "state": "PENDING" if held else "RUNNING",
        }
        if not held:
            used = nodes[node]
            key = {"gpu": "gpus_used", "shard": "shards_used", "mps": "mps_used"}[kind]
            used[key] = int(str(used[key])) + count
    return {"nodes": nodes, "jobs": jobs, "layout": list(layout)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", help="a chroot made by scripts/slurm_chroot.sh (trixie, sid)")
    ap.add_argument("--port", type=int, default=16840)
    ap.add_argument(
        "--sharing", action="store_true", help="the mig-mps layout and its plan (sharing_*)"
    )
    ap.add_argument(
        "--site-config",
        action="store_true",
        help="the site profile's scontrol show config / partition (site_show_*)",
    )
    args = ap.parse_args()
    slurm_root = None
    if args.suite:
        built = subprocess.run(
            [str(REPO / "scripts" / "slurm_chroot.sh"), "build", args.suite],
            capture_output=True,
            text=True,
            check=True,
        )
        slurm_root = built.stdout.strip().splitlines()[-1]
    root = Path(tempfile.mkdtemp(prefix="sgpu-golden-", dir="/tmp"))
    lab = LabCluster(
        root,
        ctld_port=args.port,
        slurmd_port_base=args.port + 1,
        slurm_root=slurm_root,
        accounting=slurm_root is not None and not args.sharing,
        sharing="mig-mps" if args.sharing else "none",
        profile="site" if args.site_config else "default",
    )
    lab.up(timeout_s=180 if args.site_config else 60)
    env = {**os.environ, **lab.env()}

    def run(*argv: str | bytes, check: bool = True) -> bytes:
        cmd = [os.fsencode(lab.command(os.fsdecode(argv[0]))), *map(os.fsencode, argv[1:])]
        proc = subprocess.run(cmd, env=env, capture_output=True, timeout=30, check=False)
        if check and proc.returncode != 0:
            raise SystemExit(f"{argv}: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout

    try:
        if args.sharing:
            return record_sharing(run)
        if args.site_config:
            return record_site_config(run)
        if lab.accounting:  # two short jobs first, for sacct
            run("sbatch", "-o", "/dev/null", "-J", "ok", "--gres=gpu:1", "-w", "gpu4",
                "--wrap", "true")  # fmt: skip
            run("sbatch", "-o", "/dev/null", "-J", "fails", "--gres=shard:2", "-w", "gpu3",
                "--wrap", "exit 3")  # fmt: skip
            for _ in range(300):
                if not run("squeue", "-h", "-o", "%i").split():
                    break
                time.sleep(0.2)
        for name, node, gres, held in PLAN:
            job_name = BAD_NAME if name == "badname" else name.encode()
            run("sbatch", "-o", "/dev/null", "-J", job_name, f"--gres={gres}", "-w", node,
                *(["-H"] if held else []), "--wrap", "sleep 600")  # fmt: skip
        for _ in range(300):
            states = run("squeue", "-h", "-o", "%T").split()
            if states.count(b"RUNNING") == sum(1 for p in PLAN if not p[3]):
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"the plan did not start: {states}")
        time.sleep(2)  # node records catch up with the allocations
        version = run("sinfo", "--version").decode().split()[-1]
        folder = REPO / "tests" / "golden" / ("slurm-" + ".".join(version.split(".")[:2]))
        folder.mkdir(parents=True, exist_ok=True)
        listed = run("squeue", "--json=list", check=False)
        parsers = sorted(set(re.findall(r"v0\.0\.\d+", listed.decode(errors="replace"))))
        default = data_parser_version(run("squeue", "--json"))
        written = []
        for suffix, flag in [("", "--json"), *((f".{p}", f"--json={p}") for p in parsers)]:
            if suffix == f".{default}":
                continue  # the default version is the unsuffixed file
            for what, argv in (("squeue", ["squeue", flag]), ("sinfo", ["sinfo", flag, "--Node"])):
                path = folder / f"mixed_{what}{suffix}.json"
                path.write_bytes(run(*argv))
                written.append(path.name)
        if lab.accounting:
            for suffix, flag in [("", "--json"), *((f".{p}", f"--json={p}") for p in parsers)]:
                if suffix == f".{default}":
                    continue
                for _ in range(100):  # slurmdbd learns of the plan's jobs a moment later
                    out = run("sacct", flag, "-X", "--allusers")
                    if out.count(b'"job_id"') >= len(PLAN) + 2:
                        break
                    time.sleep(0.2)
                path = folder / f"mixed_sacct{suffix}.json"
                path.write_bytes(out)
                written.append(path.name)
        nodes = run("scontrol", "show", "nodes", "--json", check=False)  # 23.02+
        if nodes.strip():
            (folder / "mixed_scontrol_nodes.json").write_bytes(nodes)
            written.append("mixed_scontrol_nodes.json")
        (folder / "mixed_expected.json").write_text(json.dumps(expected(), indent=2) + "\n")
        written.append("mixed_expected.json")
        print(f"Slurm {version}: wrote {', '.join(written)} in {folder}")
    finally:
        lab.down(cancel_jobs=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


def record_site_config(run: Callable[..., bytes]) -> int:
    """Write the site profile's ``scontrol show config`` and ``show partition -o``."""
    version = run("sinfo", "--version").decode().split()[-1]
    folder = REPO / "tests" / "golden" / ("slurm-" + ".".join(version.split(".")[:2]))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "site_show_config.txt").write_bytes(run("scontrol", "show", "config"))
    (folder / "site_show_partition.txt").write_bytes(run("scontrol", "show", "partition", "-o"))
    print(f"Slurm {version}: wrote site_show_config.txt, site_show_partition.txt in {folder}")
    return 0


def record_sharing(run: Callable[..., bytes]) -> int:
    """Run :func:`sharing_plan` on the mig-mps lab and write the ``sharing_*`` captures."""
    version = run("sinfo", "--version").decode().split()[-1]
    major, minor = (int(x) for x in version.split(".")[:2])
    layout = mig_layout((major, minor))
    plan = sharing_plan(layout)
    for name, node, gres, held in plan:
        run("sbatch", "-o", "/dev/null", "-J", name, f"--gres={gres}", "-w", node,
            *(["-H"] if held else []), "--wrap", "sleep 600")  # fmt: skip
    states: list[bytes] = []
    for _ in range(300):
        states = run("squeue", "-h", "-o", "%T").split()
        if states.count(b"RUNNING") == sum(1 for p in plan if not p[3]):
            break
        time.sleep(0.2)
    else:
        pending = run("squeue", "-h", "-t", "PD", "-o", "%j %r %b").decode()
        raise SystemExit(f"the sharing plan did not start: {pending}")
    time.sleep(2)  # node records catch up with the allocations
    folder = REPO / "tests" / "golden" / ("slurm-" + ".".join(version.split(".")[:2]))
    folder.mkdir(parents=True, exist_ok=True)
    listed = run("squeue", "--json=list", check=False)
    parsers = sorted(set(re.findall(r"v0\.0\.\d+", listed.decode(errors="replace"))))
    default = data_parser_version(run("squeue", "--json"))
    written = []
    for suffix, flag in [("", "--json"), *((f".{p}", f"--json={p}") for p in parsers)]:
        if suffix == f".{default}":
            continue
        for what, argv in (("squeue", ["squeue", flag]), ("sinfo", ["sinfo", flag, "--Node"])):
            path = folder / f"sharing_{what}{suffix}.json"
            path.write_bytes(run(*argv))
            written.append(path.name)
    nodes = run("scontrol", "show", "nodes", "--json", check=False)  # 23.02+
    if nodes.strip():
        (folder / "sharing_scontrol_nodes.json").write_bytes(nodes)
        written.append("sharing_scontrol_nodes.json")
    (folder / "sharing_scontrol_show_node.txt").write_bytes(run("scontrol", "show", "node"))
    written.append("sharing_scontrol_show_node.txt")
    expected = sharing_expected(plan, layout)
    (folder / "sharing_expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    written.append("sharing_expected.json")
    print(f"Slurm {version}: wrote {', '.join(written)} in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

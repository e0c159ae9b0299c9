"""plugins/job_submit.lua inside the real slurmctld of the session lab cluster (no mocks).

The lab renders the plugin into ROOT/etc/job_submit.lua with its recommendations path set
to ``slurm_cluster.recommendations_path`` (.tsv); each test writes that file with the
daemon's own exporter, submits held jobs with sbatch, and reads back what slurmctld
stored (``squeue --json`` and ``scontrol show job``) and what it logged.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from slurmgpu.daemon.recommend import Recommendation, RecommendationExport
from tests import polling

# Why not the site profile (tests/unit/test_slurm_tier_labs.py)
DEFAULT_LAB = "the 4-node lab renders job_submit.lua and its .tsv; reads its ctld log"

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from slurmgpu.lab.cluster import LabCluster

R = TypeVar("R")
MODULE = Path(__file__).resolve().parents[2] / "plugins" / "slurmgpu_submit.lua"
_T = 30.0  # seconds any single wait may take


def wait_for(probe: Callable[[], R | None], what: str, timeout: float = _T) -> R:
    """``tests.polling.wait_for`` with this module's argument order: any value but None."""
    return polling.wait_for(what, probe, timeout, until_not_none=True)


def run(*argv: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=20, check=False, cwd=cwd
    )
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr.strip()}"
    return proc.stdout


class Lab:
    """Submit held jobs, read them back, read slurmctld's slurmgpu log lines."""

    def __init__(self, cluster: LabCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.export = RecommendationExport(cluster.recommendations_path)
        self.log = cluster.log_dir / "slurmctld.log"
        self.submitted: list[int] = []

    def name(self, stem: str = "train") -> str:
        """A job name no other test uses, so log lines can be told apart."""
        return f"{stem}-{uuid.uuid4().hex[:8]}"

    def sbatch(self, *args: str) -> int:
        out = run("sbatch", "--parsable", "--hold", *args, "--wrap", "sleep 60", cwd=self.workdir)
        job_id = int(out.strip().split(";")[0])
        self.submitted.append(job_id)
        return job_id

    def squeue(self, job_id: int) -> dict[str, Any]:
        # Slurm 22.05's squeue --json ignores -j: pick the job out of the full listing
        jobs = json.loads(run("squeue", "--json"))["jobs"]
        found = [j for j in jobs if j.get("job_id") == job_id]
        assert found, f"job {job_id} not in squeue --json"
        job: dict[str, Any] = found[0]
        return job

    def scontrol(self, job_id: int) -> dict[str, str]:
        text = run("scontrol", "show", "job", "-o", str(job_id))
        return dict(re.findall(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", text))

    def lines(self, name: str) -> list[str]:
        """slurmctld's slurmgpu lines about the job named ``name``."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if "slurmgpu:" in ln and f"name={name}" in ln]

    def one_line(self, name: str) -> str:
        """Wait for the job's slurmgpu line, then check it is the only one."""
        found = wait_for(lambda: self.lines(name) or None, f"a slurmgpu log line for {name}")
        assert len(found) == 1, found
        return found[0]


def _number(value: Any) -> int | None:
    """A squeue --json number: plain (22.05) or {"set", "infinite", "number"} (newer)."""
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    return value if isinstance(value, int) else None


def gpus_per_node(tres: str | None) -> tuple[str, int] | None:
    """("gres:" or "gres/", count) of the gpu entry of a tres_per_node string."""
    match = re.search(r"(gres[:/])gpu(?::[^:,]+)?:(\d+)", tres or "")
    return (match.group(1), int(match.group(2))) if match else None


def request(lab: Lab, job_id: int) -> dict[str, Any]:
    """What slurmctld stored for the job, from squeue --json, checked against scontrol."""
    j = lab.squeue(job_id)
    s = lab.scontrol(job_id)
    time_limit = _number(j.get("time_limit"))
    mem_mib = _number(j.get("memory_per_node"))
    cpus = _number(j.get("cpus"))
    gpus = gpus_per_node(j.get("tres_per_node"))
    # the same numbers as scontrol shows them
    assert s["MinMemoryNode"] == f"{mem_mib}M"
    assert s["NumCPUs"] == str(cpus)
    assert gpus_per_node(s.get("TresPerNode")) == gpus
    hours, minutes = divmod(time_limit or 0, 60)
    assert s["TimeLimit"] == f"{hours:02d}:{minutes:02d}:00"
    return {"time_limit": time_limit, "mem_mib": mem_mib, "cpus": cpus, "gpus": gpus}


@pytest.fixture
def lab(slurm_cluster: LabCluster, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(slurm_cluster, tmp_path)
    lab.export.remove()
    try:
        yield lab
    finally:
        lab.export.remove()
        if lab.submitted:
            with contextlib.suppress(AssertionError, subprocess.SubprocessError):
                run("scancel", *map(str, lab.submitted))


def standard_job(lab: Lab, name: str, *extra: str) -> int:
    return lab.sbatch("-J", name, "-t", "10:00:00", "--mem=2000", "--gres=gpu:2", "-c", "4", *extra)


UNCHANGED = {"time_limit": 600, "mem_mib": 2000, "cpus": 4, "gpus": 2}


def counts(got: dict[str, Any]) -> dict[str, Any]:
    """``request`` without the GPU prefix ("gres:" on 22.05, "gres/" on newer Slurm)."""
    return {**got, "gpus": got["gpus"][1] if got["gpus"] else None}


def test_the_lab_installed_the_plugin_reading_its_recommendations(
    slurm_cluster: LabCluster,
) -> None:
    installed = (slurm_cluster.etc_dir / "job_submit.lua").read_text()
    tsv = slurm_cluster.recommendations_path.with_suffix(".tsv")
    assert f'local RECOMMENDATIONS_FILE = "{tsv}"' in installed
    assert str(tsv).startswith(str(slurm_cluster.root))
    # the thin script's module, next to it, loaded by slurmctld without complaint
    assert (slurm_cluster.etc_dir / MODULE.name).read_text() == MODULE.read_text()
    log = (slurm_cluster.log_dir / "slurmctld.log").read_text(errors="replace")
    assert "cannot load slurmgpu_submit.lua" not in log


def test_opted_in_job_is_lowered_to_the_recommendation(lab: Lab) -> None:
    name = lab.name()
    lab.export.write(
        {f"root|{name}|gpu": Recommendation(time_limit_min=120, mem_mib=1500, cpus=2, gpus=1)}
    )

    job_id = standard_job(lab, name, "--comment", "sgpu:rightsize")

    got = request(lab, job_id)
    prefix = got["gpus"][0]  # "gres:" on 22.05, "gres/" on newer Slurm: kept as given
    assert got == {"time_limit": 120, "mem_mib": 1500, "cpus": 2, "gpus": (prefix, 1)}
    line = lab.one_line(name)
    assert f"rightsized user=root name={name} from root|{name}|gpu" in line
    assert "time_limit 600->120 min" in line


def test_a_rightsized_job_runs_with_what_it_was_lowered_to(lab: Lab) -> None:
    name = lab.name()
    lab.export.write({f"root|{name}|gpu": Recommendation(mem_mib=1500, cpus=2, gpus=1)})
    job_id = standard_job(lab, name, "--comment", "sgpu:rightsize")

    run("scontrol", "release", str(job_id))

    def running() -> str | None:
        state = run("squeue", "-h", "-j", str(job_id), "-o", "%T").strip()
        return state if state == "RUNNING" else None

    wait_for(running, f"job {job_id} to run")
    detail = run("scontrol", "show", "job", "-d", str(job_id))
    assert re.search(r"GRES=gpu(?::\w+)?:1\(IDX:\d\)", detail), detail
    assert re.search(r"\bCPU_IDs=\S+ Mem=1500\b", detail), detail


def test_job_without_the_token_passes_unchanged_and_unlogged(lab: Lab) -> None:
    name = lab.name()
    lab.export.write({f"root|{name}|gpu": Recommendation(time_limit_min=60, gpus=1)})

    job_id = standard_job(lab, name, "--comment", "just a comment")

    assert counts(request(lab, job_id)) == UNCHANGED
    assert lab.lines(name) == []


def test_a_recommendation_above_the_request_does_not_raise_it(lab: Lab) -> None:
    name = lab.name()
    lab.export.write(
        {
            f"root|{name}|gpu": Recommendation(
                time_limit_min=900, mem_mib=3500, cpus=8, gpus=4, samples=9
            )
        }
    )

    job_id = standard_job(lab, name, "--comment", "sgpu:rightsize")

    assert counts(request(lab, job_id)) == UNCHANGED
    assert "is not below the request" in lab.one_line(name)


def test_missing_recommendations_pass_the_job_unchanged_with_one_line(lab: Lab) -> None:
    name = lab.name()
    assert not lab.export.tsv_path.exists()

    job_id = standard_job(lab, name, "--comment", "sgpu:rightsize")

    assert counts(request(lab, job_id)) == UNCHANGED
    line = lab.one_line(name)
    assert "slurmgpu: recommendations unavailable (cannot open" in line
    assert "job passed unchanged" in line


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff not a recommendations file {]\n" * 100,
        b"# slurmgpu recommendations v1\nroot|NAME|gpu\t60\t-\t-\t1\t3\n",  # cut: no end line
        b"# slurmgpu recommendations v1\nroot|NAME|gpu\tsixty\t-\t-\t1\t3\n# end 1\n",
    ],
)
def test_garbage_recommendations_pass_the_job_unchanged_with_one_line(
    lab: Lab, garbage: bytes
) -> None:
    name = lab.name()
    lab.export.tsv_path.parent.mkdir(parents=True, exist_ok=True)
    lab.export.tsv_path.write_bytes(garbage.replace(b"NAME", name.encode()))

    job_id = standard_job(lab, name, "--comment", "sgpu:rightsize")

    assert counts(request(lab, job_id)) == UNCHANGED
    line = lab.one_line(name)
    assert "slurmgpu: recommendations unavailable (" in line
    assert "job passed unchanged" in line


def test_the_file_is_read_at_every_submission_without_a_restart(
    lab: Lab, slurm_cluster: LabCluster
) -> None:
    ctld_pid = slurm_cluster.status()["daemons"]["slurmctld"]["pid"]
    name = lab.name()
    key = f"root|{name}|gpu"

    lab.export.write({key: Recommendation(time_limit_min=120)})
    first = standard_job(lab, name, "--comment", "sgpu:rightsize")
    lab.export.write({key: Recommendation(time_limit_min=45)})
    second = standard_job(lab, name, "--comment", "sgpu:rightsize")
    lab.export.write({}, {"root": Recommendation(time_limit_min=30)})  # now only a fallback
    third = standard_job(lab, name, "--comment", "sgpu:rightsize")

    assert [request(lab, j)["time_limit"] for j in (first, second, third)] == [120, 45, 30]
    assert slurm_cluster.status()["daemons"]["slurmctld"]["pid"] == ctld_pid
    assert len(lab.lines(name)) == 3


def test_a_malleable_token_is_logged_and_the_request_kept(lab: Lab) -> None:
    name = lab.name()

    job_id = standard_job(lab, name, "--comment", "sgpu:malleable=1:4")

    assert counts(request(lab, job_id)) == UNCHANGED
    line = lab.one_line(name)
    assert f"slurmgpu: malleable submission user=root name={name} gpus=1:4" in line
    comment = lab.squeue(job_id).get("comment")
    assert comment == "sgpu:malleable=1:4"  # the daemon reads the tag from here


# -- a site's own job_submit.lua that requires slurmgpu's module -----------------------------

SITE_SCRIPT = """
package.path = "MODULE_DIR/?.lua;" .. package.path
local slurmgpu = require("slurmgpu_submit")
slurmgpu.configure({ recommendations_file = "TSV" })

function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.name == "forbidden" then
      slurm.log_user("%s", "site: jobs may not be named forbidden")
      return slurm.ERROR
   end
   if job_desc.account == nil then
      job_desc.account = "sitedefault"
   end
   return slurmgpu.job_submit(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurmgpu.job_modify(job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
"""


def _replace_script(path: Path, text: str) -> None:
    """Write a job_submit.lua slurmctld reloads at its next submission: it compares the
    file's mtime in whole seconds, so the new one is stamped past the old one."""
    old = path.stat().st_mtime
    path.write_text(text)
    stamp = max(old, time.time()) + 2
    os.utime(path, (stamp, stamp))


@pytest.fixture
def site_script(slurm_cluster: LabCluster, lab: Lab) -> Iterator[None]:
    script = slurm_cluster.etc_dir / "job_submit.lua"
    installed = script.read_text()
    # the module kept apart from the script, found through package.path (under the lab's
    # root: a chroot's slurmctld sees that path too)
    module_dir = slurm_cluster.root / "site-lua"
    module_dir.mkdir(exist_ok=True)
    (module_dir / MODULE.name).write_text(MODULE.read_text())
    text = SITE_SCRIPT.replace("MODULE_DIR", str(module_dir)).replace(
        "TSV", str(lab.export.tsv_path)
    )
    _replace_script(script, text)
    try:
        yield
    finally:
        _replace_script(script, installed)


@pytest.mark.usefixtures("site_script")
def test_a_site_script_refuses_its_way_and_slurmgpu_rightsizes_what_it_lets_through(
    lab: Lab,
) -> None:
    refused = subprocess.run(
        ["sbatch", "--hold", "-J", "forbidden", "--wrap", "sleep 60"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        cwd=lab.workdir,
    )
    assert refused.returncode != 0, refused.stdout
    assert "site: jobs may not be named forbidden" in refused.stderr

    name = lab.name()
    lab.export.write({f"root|{name}|gpu": Recommendation(time_limit_min=90, gpus=1)})
    job_id = standard_job(lab, name, "--comment", "sgpu:rightsize")

    got = request(lab, job_id)
    assert (got["time_limit"], got["gpus"][1]) == (90, 1)
    assert lab.squeue(job_id).get("account") == "sitedefault"  # the site's own rule
    line = lab.one_line(name)
    assert f"rightsized user=root name={name} from root|{name}|gpu" in line

    plain = lab.name()
    other = standard_job(lab, plain, "--comment", "no token")
    assert counts(request(lab, other)) == UNCHANGED
    assert lab.squeue(other).get("account") == "sitedefault"

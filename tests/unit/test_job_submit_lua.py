"""plugins/job_submit.lua under a stand-alone Lua interpreter, with a stub ``slurm`` table.

Every plugin test runs twice: through plugins/job_submit.lua (the thin script over
plugins/slurmgpu_submit.lua) and through a site's own job_submit.lua that requires the
module and does its own things too (:data:`SITE_SCRIPT`).

Covers what the lab's Slurm 22.05 cannot show (the "gres/gpu:N" spelling of newer Slurm,
Lua 5.4's float numbers, a field Slurm refuses to set) and every branch cheaply. The real
check against slurmctld is tests/slurm/test_job_submit_lua.py. Needs ``lua5.1``/``lua5.4``
(Debian packages of the same names); skipped with the reason printed when neither is here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.daemon.recommend import Recommendation, RecommendationExport
from slurmgpu.lab.cluster.render import install_job_submit

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "job_submit.lua"
MODULE = PLUGIN.with_name("slurmgpu_submit.lua")
NO_VAL = 4294967294
NO_VAL16 = 65534
INFINITE = 4294967295

_INTERPRETERS = [name for name in ("lua5.1", "lua5.4") if shutil.which(name)]
_COMPILERS = [name for name in ("luac5.1", "luac5.4", "luac") if shutil.which(name)]

# A stand-in for slurmctld's ``slurm`` table that collects the log lines, then the plugin.
_LOAD_PLUGIN = r"""
local logs = {}
slurm = {
   SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294,
   log_info = function(fmt, ...) logs[#logs + 1] = string.format(fmt, ...) end,
   log_user = function(fmt, ...) logs[#logs + 1] = "USER " .. string.format(fmt, ...) end,
}
dofile(plugin)
"""

_HARNESS = (
    r"""
local plugin, case_file = arg[1], arg[2]
"""
    + _LOAD_PLUGIN
    + r"""local case = dofile(case_file)
local store = case.job_desc
local job_desc = store
if case.refuse then  -- a job_desc whose setter refuses one field, like Slurm's C setter
   job_desc = setmetatable({}, {
      __index = store,
      __newindex = function(_, k, v)
         if k == case.refuse then error("refused " .. k) end
         store[k] = v
      end,
   })
end
local rc = slurm_job_submit(job_desc, case.part_list or {}, 0)
io.write("RC\t", tostring(rc), "\n")
for _, line in ipairs(logs) do io.write("LOG\t", line, "\n") end
local keys = {}
for k in pairs(store) do keys[#keys + 1] = k end
table.sort(keys)
for _, k in ipairs(keys) do
   local v = store[k]
   if type(v) == "number" then
      io.write("NUM\t", k, "\t", string.format("%.17g", v), "\n")
   else
      io.write("STR\t", k, "\t", tostring(v), "\n")
   end
end
"""
)


def _lua(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):  # Lua strings are bytes: the UTF-8 ones, each escaped
        raw = value.encode()
        kept = "".join(chr(b) if chr(b).isalnum() and b < 128 else f"\\{b:03d}" for b in raw)
        return f'"{kept}"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{_lua(k)}] = {_lua(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ", ".join(_lua(v) for v in value) + "}"
    raise TypeError(value)


@dataclass
class Outcome:
    rc: int
    logs: list[str]
    fields: dict[str, Any]


GPU_PART = {"gpu": {"name": "gpu", "flag_default": 1, "default_time": NO_VAL, "max_time": INFINITE}}


def job(**fields: Any) -> dict[str, Any]:
    """A job_desc as Slurm 22.05 hands it over for ``sbatch -J train ...`` (see the lab)."""
    base: dict[str, Any] = {
        "name": "train",
        "user_name": "alice",
        "comment": "sgpu:rightsize",
        "time_limit": 600,
        "min_mem_per_node": 2000,
        "min_cpus": 1,
        "pn_min_cpus": NO_VAL16,
        "cpus_per_task": NO_VAL16,
        "num_tasks": NO_VAL,
        "ntasks_per_node": NO_VAL16,
        "min_nodes": NO_VAL,
        "tres_per_node": "gres:gpu:2",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


# A site's own job_submit.lua that uses slurmgpu's module: the module lives elsewhere
# (MODULE_DIR, on package.path), the site refuses jobs named "forbidden" and gives jobs
# of its "cpu" partition a default account, then hands the job to slurmgpu.
SITE_SCRIPT = """
package.path = "MODULE_DIR/?.lua;" .. package.path
local slurmgpu = require("slurmgpu_submit")
slurmgpu.configure({ recommendations_file = "TSV", apply_to_all = APPLY })

function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.name == "forbidden" then
      slurm.log_user("%s", "site: jobs may not be named forbidden")
      return slurm.ERROR
   end
   if job_desc.partition == "cpu" and job_desc.account == nil then
      job_desc.account = "site-default"
   end
   return slurmgpu.job_submit(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurmgpu.job_modify(job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
"""


def site_script(module_dir: Path, tsv: Path, *, apply_to_all: bool = False) -> str:
    return (
        SITE_SCRIPT.replace("MODULE_DIR", str(module_dir))
        .replace("TSV", str(tsv))
        .replace("APPLY", "true" if apply_to_all else "false")
    )


class Plugin:
    def __init__(
        self, lua: str, tmp_path: Path, *, apply_to_all: bool = False, site: bool = False
    ) -> None:
        self.lua = lua
        self.tmp = tmp_path
        self.export = RecommendationExport(tmp_path / "rec" / "recommendations.json")
        self.path = tmp_path / "job_submit.lua"
        if site:
            module_dir = tmp_path / "site-lua"
            module_dir.mkdir()
            (module_dir / MODULE.name).write_text(MODULE.read_text())
            text = site_script(module_dir, self.export.tsv_path, apply_to_all=apply_to_all)
        else:
            # installed as the lab and the docs say: the module next to the script
            (tmp_path / MODULE.name).write_text(MODULE.read_text())
            text = install_job_submit(PLUGIN.read_text(), str(self.export.tsv_path))
            if apply_to_all:
                text = text.replace("local apply_to_all = false", "local apply_to_all = true")
        self.path.write_text(text)
        (tmp_path / "harness.lua").write_text(_HARNESS)
        self.calls = 0

    def recommend(
        self, by_key: dict[str, object], fallback: dict[str, object] | None = None
    ) -> None:
        self.export.write(by_key, fallback, generated_at=1)

    def submit(
        self,
        job_desc: dict[str, Any],
        part_list: dict[str, Any] | None = None,
        refuse: str | None = None,
        rc: int = 0,
    ) -> Outcome:
        self.calls += 1
        case: dict[str, object] = {
            "job_desc": job_desc,
            "part_list": GPU_PART if part_list is None else part_list,
        }
        if refuse:
            case["refuse"] = refuse
        case_file = self.tmp / f"case{self.calls}.lua"
        case_file.write_text(f"return {_lua(case)}\n")
        proc = subprocess.run(
            [self.lua, str(self.tmp / "harness.lua"), str(self.path), str(case_file)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        got_rc: int | None = None
        logs: list[str] = []
        fields: dict[str, Any] = {}
        for line in proc.stdout.splitlines():
            kind, _, rest = line.partition("\t")
            if kind == "RC":
                got_rc = int(rest)
            elif kind == "LOG":
                logs.append(rest)
            elif kind == "NUM":
                k, text = rest.split("\t")
                fields[k] = int(float(text)) if float(text).is_integer() else float(text)
            elif kind == "STR":
                k, v = rest.split("\t")
                fields[k] = v
        assert got_rc == rc
        return Outcome(rc=got_rc, logs=logs, fields=fields)


_HOW = ["plugin", "site"]  # plugins/job_submit.lua, or a site's script requiring the module


@pytest.fixture(
    params=[(lua, how) for lua in _INTERPRETERS for how in _HOW] or [("none", "")],
    ids="-".join,
)
def plugin(request: pytest.FixtureRequest, tmp_path: Path) -> Plugin:
    lua, how = request.param
    if lua == "none":
        reason = "no Lua interpreter (apt-get install lua5.1) to run job_submit.lua"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    return Plugin(lua, tmp_path, site=how == "site")


@pytest.fixture(params=_INTERPRETERS or ["none"])
def lua_name(request: pytest.FixtureRequest) -> str:
    """Each Lua interpreter here, for a test that sets the plugin up itself."""
    if request.param == "none":
        reason = "no Lua interpreter (apt-get install lua5.1) to run job_submit.lua"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    return str(request.param)


REC = Recommendation(time_limit_min=120, mem_mib=1500, cpus=4, gpus=1, samples=12)


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: after.get(k) for k in set(before) | set(after) if before.get(k) != after.get(k)}


def test_luac_parses_the_plugin() -> None:
    if not _COMPILERS:
        reason = "no luac (apt-get install lua5.1) to syntax-check job_submit.lua"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(reason)
    for luac in _COMPILERS:
        for script in (PLUGIN, MODULE):  # one at a time: luac5.4 -p of two files crashes
            proc = subprocess.run(
                [luac, "-p", str(script)], capture_output=True, text=True, check=False
            )
            assert proc.returncode == 0, f"{luac} {script.name}: {proc.stderr}"


def test_opted_in_job_is_lowered_to_its_recommendation(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    before = job()

    out = plugin.submit(before)

    assert changed(before, out.fields) == {
        "time_limit": 120,
        "min_mem_per_node": 1500,
        "tres_per_node": "gres:gpu:1",
    }
    assert len(out.logs) == 1
    assert out.logs[0].startswith("slurmgpu: rightsized user=alice name=train from alice|train|gpu")
    assert "time_limit 600->120 min" in out.logs[0]
    assert "tres_per_node gres:gpu:2->gres:gpu:1" in out.logs[0]


@pytest.mark.parametrize(
    ("tres", "expected"),
    [
        ("gres/gpu:4", "gres/gpu:1"),  # Slurm >= 23.02 spelling, kept
        ("gres:gpu:a100:4", "gres:gpu:a100:1"),
        ("gres/gpu:a100:4", "gres/gpu:a100:1"),
        ("gres:shard:2,gres:gpu:4", "gres:shard:2,gres:gpu:1"),
        ("gres:gpu", "gres:gpu"),  # count implied: left alone
        ("gres:gpu:a100:1,gres:gpu:v100:2", "gres:gpu:a100:1,gres:gpu:v100:2"),
        ("gres:shard:4", "gres:shard:4"),
        ("gres:gpu:1", "gres:gpu:1"),
    ],
)
def test_gpu_count_is_lowered_in_either_spelling(plugin: Plugin, tres: str, expected: str) -> None:
    plugin.recommend({"alice|train|gpu": Recommendation(gpus=1, samples=1)})
    out = plugin.submit(job(tres_per_node=tres))
    assert out.fields["tres_per_node"] == expected
    assert len(out.logs) == 1


def test_job_without_the_token_is_untouched_and_not_logged(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    for comment in (None, "", "just a comment", "sgpu:rightsizeX", "xsgpu:rightsize"):
        before = job(comment=comment)
        out = plugin.submit(before)
        assert out.fields == before
        assert out.logs == []


def test_token_among_other_words_opts_in(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    out = plugin.submit(job(comment="run 7, sgpu:rightsize;nightly"))
    assert out.fields["time_limit"] == 120


def test_apply_to_all_rightsizes_every_job_but_honours_opt_out(tmp_path: Path) -> None:
    if not _INTERPRETERS:
        pytest.skip("no Lua interpreter")
    plugin = Plugin(_INTERPRETERS[0], tmp_path, apply_to_all=True)
    plugin.recommend({"alice|train|gpu": REC})

    assert plugin.submit(job(comment=None)).fields["time_limit"] == 120
    kept = plugin.submit(job(comment="sgpu:norightsize"))
    assert kept.fields["time_limit"] == 600
    assert kept.logs == []


def test_recommendation_above_the_request_never_raises_it(plugin: Plugin) -> None:
    plugin.recommend(
        {"alice|train|gpu": Recommendation(time_limit_min=900, mem_mib=9000, cpus=8, gpus=4)}
    )
    before = job(tres_per_node="gres:gpu:2", min_cpus=2)

    out = plugin.submit(before)

    assert out.fields == before
    assert len(out.logs) == 1
    assert "is not below the request" in out.logs[0]


def test_user_fallback_applies_when_the_key_has_none(plugin: Plugin) -> None:
    plugin.recommend({"alice|other|gpu": REC}, {"alice": Recommendation(time_limit_min=60)})
    out = plugin.submit(job())
    assert changed(job(), out.fields) == {"time_limit": 60}
    assert "from alice (0 samples)" in out.logs[0]


def test_no_recommendation_is_one_line(plugin: Plugin) -> None:
    plugin.recommend({"bob|train|gpu": REC}, {"bob": REC})
    out = plugin.submit(job())
    assert out.fields == job()
    assert len(out.logs) == 1
    assert "no recommendation for alice|train|gpu" in out.logs[0]


def test_default_partition_comes_from_the_partition_list(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|batch": REC})
    parts = {
        "gpu": {"name": "gpu", "flag_default": 0, "default_time": NO_VAL, "max_time": INFINITE},
        "batch": {"name": "batch", "flag_default": 1, "default_time": NO_VAL, "max_time": 999},
    }
    assert plugin.submit(job(), parts).fields["time_limit"] == 120
    # an explicit partition wins; several partitions: no key, so no match here
    assert plugin.submit(job(partition="batch"), parts).fields["time_limit"] == 120
    assert plugin.submit(job(partition="gpu,batch"), parts).fields["time_limit"] == 600


def test_unset_time_limit_is_measured_against_the_partition(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": Recommendation(time_limit_min=120)})
    assert plugin.submit(job(time_limit=NO_VAL)).fields["time_limit"] == 120  # MaxTime=INFINITE
    assert plugin.submit(job(time_limit=INFINITE)).fields["time_limit"] == 120
    short = {"gpu": {"flag_default": 1, "default_time": 60, "max_time": INFINITE}}
    assert plugin.submit(job(time_limit=NO_VAL), short).fields["time_limit"] == NO_VAL
    assert plugin.submit(job(time_limit=NO_VAL), {}).fields["time_limit"] == NO_VAL  # unknown


def test_time_limit_never_goes_below_time_min(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": Recommendation(time_limit_min=30)})
    assert plugin.submit(job(time_min=200)).fields["time_limit"] == 200
    assert plugin.submit(job(time_min=700)).fields["time_limit"] == 600


def test_memory_per_cpu_and_whole_node_memory_are_left_alone(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": Recommendation(mem_mib=100)})
    per_cpu = job(min_mem_per_node=None, min_mem_per_cpu=300)
    assert plugin.submit(per_cpu).fields == per_cpu
    assert plugin.submit(job(min_mem_per_node=0)).fields["min_mem_per_node"] == 0
    unset = job(min_mem_per_node=None)
    assert plugin.submit(unset).fields == unset


def test_cpus_of_a_single_task_job_are_lowered_consistently(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": Recommendation(cpus=4)})
    before = job(min_cpus=8, cpus_per_task=8, pn_min_cpus=8)
    assert changed(before, plugin.submit(before).fields) == {
        "min_cpus": 4,
        "cpus_per_task": 4,
        "pn_min_cpus": 4,
    }
    for many in (job(min_cpus=8, num_tasks=8), job(min_cpus=8, ntasks_per_node=8)):
        assert plugin.submit(many).fields == many
    per_gpu = job(min_cpus=8, cpus_per_tres="gres:gpu:4")
    assert plugin.submit(per_gpu).fields == per_gpu


def test_cpus_keep_enough_memory_when_memory_is_per_cpu(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": Recommendation(cpus=1, mem_mib=1500)})
    parts = {"gpu": {"flag_default": 1, "max_time": INFINITE, "def_mem_per_cpu": 256}}
    # DefMemPerCPU=256: 1500 MiB needs 6 CPUs
    assert plugin.submit(job(min_mem_per_node=None, min_cpus=8), parts).fields["min_cpus"] == 6
    # --mem-per-cpu=1000: 2 CPUs
    out = plugin.submit(job(min_mem_per_node=None, min_mem_per_cpu=1000, min_cpus=8), parts)
    assert out.fields["min_cpus"] == 2
    # no memory recommendation and memory per CPU: CPUs are not lowered
    plugin.recommend({"alice|train|gpu": Recommendation(cpus=1)})
    assert plugin.submit(job(min_mem_per_node=None, min_cpus=8), parts).fields["min_cpus"] == 8


def test_multi_node_jobs_only_get_the_time_limit(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    before = job(min_nodes=2, min_cpus=8)
    assert changed(before, plugin.submit(before).fields) == {"time_limit": 120}


def test_memory_per_gpu_keeps_the_gpu_count(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": Recommendation(gpus=1)})
    before = job(mem_per_tres="gres:gpu:4096")
    assert plugin.submit(before).fields == before


def test_malleable_token_is_logged_and_keeps_the_gpu_count(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    before = job(comment="sgpu:rightsize sgpu:malleable=1:4")

    out = plugin.submit(before)

    assert out.fields["tres_per_node"] == "gres:gpu:2"
    assert out.fields["time_limit"] == 120
    assert out.logs[0] == (
        "slurmgpu: malleable submission user=alice name=train gpus=1:4; "
        "tagged by its comment, request unchanged"
    )
    assert len(out.logs) == 2


@pytest.mark.parametrize("token", ["sgpu:malleable=4:1", "sgpu:malleable=0:2", "sgpu:malleable=x"])
def test_malformed_malleable_token_is_logged_and_ignored(plugin: Plugin, token: str) -> None:
    before = job(comment=token)
    out = plugin.submit(before)
    assert out.fields == before
    assert len(out.logs) == 1
    assert "malformed malleable token" in out.logs[0]


def test_pool_token_is_logged_and_leaves_the_gpu_count_to_rightsizing(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    out = plugin.submit(job(comment="sgpu:rightsize sgpu:pool=1:8"))
    assert out.logs[0] == (
        "slurmgpu: pool submission user=alice name=train tasks=1:8; "
        "tagged by its comment, request unchanged"
    )
    # a pool resizes how many tasks run, not a task's GPUs
    assert out.fields["tres_per_node"] == "gres:gpu:1"


# -- the shared token vectors (tests/vectors/sgpu_tokens.json, read by test_tokens.py too) ---

TOKEN_VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "sgpu_tokens.json").read_text("utf-8")
)["vectors"]

_VECTOR_HARNESS = (
    r"""
local plugin, cases_file = arg[1], arg[2]
"""
    + _LOAD_PLUGIN
    + r"""for i, case in ipairs(dofile(cases_file)) do
   logs = {}
   local rc = slurm_job_submit(case.job_desc, case.part_list, 0)
   local limit = string.format("%d", case.job_desc.time_limit)
   io.write("CASE\t", i, "\t", tostring(rc), "\t", limit, "\n")
   for _, line in ipairs(logs) do io.write("LOG\t", i, "\t", line, "\n") end
end
"""
)


def _run_vectors(plugin: Plugin) -> list[tuple[int, list[str]]]:
    """(time limit after, log lines) per vector, submitted with the vector's comment."""
    cases = [{"job_desc": job(comment=v["comment"]), "part_list": GPU_PART} for v in TOKEN_VECTORS]
    (plugin.tmp / "vectors.lua").write_text(f"return {_lua(cases)}\n")
    (plugin.tmp / "vector_harness.lua").write_text(_VECTOR_HARNESS)
    harness, cases_file = plugin.tmp / "vector_harness.lua", plugin.tmp / "vectors.lua"
    proc = subprocess.run(
        [plugin.lua, str(harness), str(plugin.path), str(cases_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: list[tuple[int, list[str]]] = []
    for line in proc.stdout.splitlines():
        kind, i, rest = line.split("\t", 2)
        if kind == "CASE":
            rc, limit = rest.split("\t")
            assert (int(i), rc) == (len(out) + 1, "0")
            out.append((int(limit), []))
        else:
            out[int(i) - 1][1].append(rest)
    assert len(out) == len(TOKEN_VECTORS)
    return out


@pytest.mark.parametrize("apply_to_all", [False, True])
def test_the_plugin_reads_comments_as_the_shared_vectors_say(
    lua_name: str, tmp_path: Path, apply_to_all: bool
) -> None:
    plugin = Plugin(lua_name, tmp_path, apply_to_all=apply_to_all)
    plugin.recommend({"alice|train|gpu": REC})
    for vector, (limit, logs) in zip(TOKEN_VECTORS, _run_vectors(plugin), strict=True):
        expect, why = vector["expect"], f"{vector['comment']!r}: {vector['why']}"
        asked = expect.get("rightsize", False) or apply_to_all
        rightsized = asked and not expect.get("norightsize", False)
        assert limit == (120 if rightsized else 600), why
        m, bad = expect.get("malleable"), expect.get("malleable_bad")
        about = [
            line
            for line in logs
            if "malleable" in line or line.startswith("slurmgpu: pool submission")
        ]
        if m is not None:
            kind, what = ("pool", "tasks") if m["pool"] else ("malleable", "gpus")
            assert about == [
                f"slurmgpu: {kind} submission user=alice name=train {what}={m['lo']}:{m['hi']}; "
                "tagged by its comment, request unchanged"
            ], why
        elif bad is not None:
            assert len(about) == 1 and about[0].startswith(
                f"slurmgpu: malformed malleable token '{bad}' ("
            ), why
        else:
            assert about == [], why


def _one_unavailable_line(out: Outcome, before: dict[str, Any], why: str) -> None:
    assert out.fields == before
    assert len(out.logs) == 1, out.logs
    assert out.logs[0].startswith("slurmgpu: recommendations unavailable (")
    assert why in out.logs[0]
    assert "job passed unchanged" in out.logs[0]


def test_missing_file_passes_the_job_unchanged(plugin: Plugin) -> None:
    before = job()
    _one_unavailable_line(plugin.submit(before), before, "cannot open")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "is empty"),
        ("\x00\x01garbage{}\n" * 50, "not a slurmgpu v1"),
        ('{"version": 1, "by_key": {}}\n', "not a slurmgpu v1"),
        ("# slurmgpu recommendations v1\nalice|train|gpu\t120\t-\t-\t-\t1\n", "no end line"),
        ("# slurmgpu recommendations v1\nalice|train|gpu\t120\t-\t-\t-\t1", "no end line"),
        (
            "# slurmgpu recommendations v1\nalice|train|gpu\tsoon\t-\t-\t-\t1\n# end 1\n",
            "malformed",
        ),
        ("# slurmgpu recommendations v1\nalice|train|gpu\t120\t-\n# end 1\n", "malformed"),
        ("# slurmgpu recommendations v1\nalice\t-1\t-\t-\t-\t1\n# end 1\n", "malformed"),
    ],
)
def test_bad_file_passes_the_job_unchanged_with_one_line(
    plugin: Plugin, text: str, why: str
) -> None:
    plugin.export.tsv_path.parent.mkdir(parents=True, exist_ok=True)
    plugin.export.tsv_path.write_text(text)
    before = job()
    _one_unavailable_line(plugin.submit(before), before, why)


def test_a_directory_instead_of_a_file_passes_the_job_unchanged(plugin: Plugin) -> None:
    plugin.export.tsv_path.mkdir(parents=True)
    before = job()
    out = plugin.submit(before)
    assert out.fields == before
    assert len(out.logs) == 1
    assert "job passed unchanged" in out.logs[0]


def test_unexpected_field_types_are_one_internal_error_line(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    before = job(time_limit="600")  # a string where Slurm gives a number
    out = plugin.submit(before)
    assert out.fields == before
    assert len(out.logs) == 1
    assert out.logs[0] == (
        "slurmgpu: unexpected job request (job_desc.time_limit is a string, not a number); "
        "job passed unchanged"
    )


def test_a_refused_setter_undoes_what_was_already_set(plugin: Plugin) -> None:
    plugin.recommend({"alice|train|gpu": REC})
    before = job()
    out = plugin.submit(before, refuse="tres_per_node")  # set after time and memory
    assert out.fields == before
    assert len(out.logs) == 1
    assert "internal error" in out.logs[0]
    assert "refused tres_per_node" in out.logs[0]


def test_user_text_cannot_break_the_log_format(plugin: Plugin) -> None:
    plugin.recommend({"alice|%s%d\n|gpu": REC})
    out = plugin.submit(job(name="%s%d\n"))
    assert out.fields["time_limit"] == 600  # a control character: never a key
    assert len(out.logs) == 1
    assert "name=%s%d?" in out.logs[0]


# -- the module a site's own job_submit.lua requires (plugins/slurmgpu_submit.lua) ----------


def test_a_site_script_refuses_its_own_way_before_slurmgpu_sees_the_job(tmp_path: Path) -> None:
    for lua in _INTERPRETERS:
        (tmp_path / lua).mkdir()
        plugin = Plugin(lua, tmp_path / lua, site=True)
        plugin.recommend({"alice|forbidden|gpu": REC})
        out = plugin.submit(job(name="forbidden"), rc=-1)
        assert out.logs == ["USER site: jobs may not be named forbidden"]
        assert out.fields["time_limit"] == 600


def test_a_site_script_sets_its_account_and_slurmgpu_rightsizes_the_job(tmp_path: Path) -> None:
    cpu = {"cpu": {"name": "cpu", "flag_default": 0, "default_time": NO_VAL, "max_time": INFINITE}}
    for lua in _INTERPRETERS:
        (tmp_path / lua).mkdir()
        plugin = Plugin(lua, tmp_path / lua, site=True)
        plugin.recommend({"alice|train|cpu": REC})
        out = plugin.submit(job(partition="cpu"), {**GPU_PART, **cpu})
        assert out.fields["account"] == "site-default"
        assert out.fields["time_limit"] == 120 and out.fields["tres_per_node"] == "gres:gpu:1"
        (line,) = out.logs
        assert line.startswith("slurmgpu: rightsized user=alice name=train from alice|train|cpu")


def test_the_thin_script_without_its_module_passes_every_job_with_one_line(
    tmp_path: Path,
) -> None:
    for lua in _INTERPRETERS:
        (tmp_path / lua).mkdir()
        plugin = Plugin(lua, tmp_path / lua)
        (tmp_path / lua / MODULE.name).unlink()
        plugin.recommend({"alice|train|gpu": REC})
        out = plugin.submit(job())
        (line,) = out.logs
        assert line.startswith("slurmgpu: cannot load slurmgpu_submit.lua (module ")
        assert line.endswith("); every job passes unchanged")
        assert out.fields["time_limit"] == 600


_MODULE_HARNESS = r"""
package.path = arg[1] .. "/?.lua;" .. package.path
slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end }
local m = require("slurmgpu_submit")
local function fails(opts)
   local ok, err = pcall(m.configure, opts)
   return ok and "ok" or tostring(err)
end
print("GLOBAL", tostring(slurm_job_submit), tostring(slurm_job_modify))
print("UNKNOWN", fails({ recomendations_file = "/x" }))
print("TYPE", fails({ apply_to_all = "yes" }))
print("OK", fails({ recommendations_file = "/x.tsv", apply_to_all = true }))
local s = m.settings()
print("SETTINGS", s.recommendations_file, tostring(s.apply_to_all))
print("RC", m.job_submit({ name = "j", user_name = "u", comment = "" }, {}, 0),
      m.job_modify({}, {}, {}, 0))
"""


def test_the_module_alone_defines_no_slurm_hooks_and_checks_its_settings(
    tmp_path: Path,
) -> None:
    (tmp_path / "m.lua").write_text(_MODULE_HARNESS)
    for lua in _INTERPRETERS:
        proc = subprocess.run(
            [lua, str(tmp_path / "m.lua"), str(MODULE.parent)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        out = dict(line.split("\t", 1) for line in proc.stdout.splitlines())
        assert out["GLOBAL"] == "nil\tnil"  # the site's script defines slurm_job_submit
        assert "unknown setting recomendations_file" in out["UNKNOWN"]
        assert "apply_to_all must be a boolean, not a string" in out["TYPE"]
        assert out["OK"] == "ok"
        assert out["SETTINGS"] == "/x.tsv\ttrue"
        assert out["RC"] == "0\t0"

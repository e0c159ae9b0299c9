"""Every benchmark in bench/ runs at its smoke size, so a bench that breaks fails CI.

Each script is run as an admin would (its own process, ``--smoke --json-out DIR``) and
must exit 0 and write one JSON record with its figures and the baseline measured in the
same run (slurmgpu/lab/benchrun.py). No timing is judged here: smoke sizes are seconds of
work on a shared machine; the full-size figures are in bench/README.md. Benches that read
shared/data skip, with the reason, where it is absent; the bench/gpu_check_*.py scripts
where what they check is absent (NVML; torch), which their record says with exit code 2;
bench/resize_path.py needs the lab cluster (tests/slurm/test_bench_resize_path.py),
bench/replay_real.py the site lab (tests/slurm/test_replay_real.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.bench.smoke import BENCH, ROOT, run_smoke

DATA = ROOT.parent / "shared" / "data"

# bench -> what it needs beyond the repository (None: nothing)
NEEDS: dict[str, Path | None] = {
    "agent": None,
    "api_load": None,
    "colocate_sim": DATA / "lucid" / "colocate_info.csv",
    "ingest": None,
    "interference": DATA / "lucid" / "colocate_info.csv",
    "malleable_policy": None,
    "observe": None,
    "policy": None,
    "report": None,
    "sharing_sim": DATA / "lucid" / "colocate_info.csv",
    "sim_pollux": DATA / "pollux" / "profiles",
    "pollux_gap": DATA / "pollux" / "profiles",
    "sim_hetero": DATA / "pollux" / "profiles",
    "sim_scheduling": DATA / "pollux" / "profiles",
    "speedup_fit": DATA / "pollux" / "profiles",
    "decode_records": None,
    "energy_query": None,
    "retention": None,
    "history_load": None,
    "metrics_scrape": None,
    # the gpu_check_* benches skip where what they check is absent (their record says so)
    "gpu_check_nvml": None,  # NVML
    "gpu_check_energy": None,  # NVML (and needs only pynvml + the standard library)
    "gpu_check_torch": None,  # torch; with the CPU build: gloo on 2 CPU ranks, ~40 s
}
ELSEWHERE = {
    "resize_path": "tests/slurm/test_bench_resize_path.py (needs the lab cluster)",
    "replay_real": "tests/slurm/test_replay_real.py (needs the site lab)",
}


def test_every_bench_has_a_smoke_run() -> None:
    scripts = {p.stem for p in BENCH.glob("*.py")}
    assert scripts == set(NEEDS) | set(ELSEWHERE), "a bench without a smoke run in CI"


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_bench_smoke(name: str, tmp_path: Path) -> None:
    needs = NEEDS[name]
    if needs is not None and not needs.exists():
        reason = f"{needs} absent (shared/data is not on this machine)"
        print(f"bench {name}: skipping: {reason}", file=sys.stderr)
        pytest.skip(reason)
    proc, doc = run_smoke(name, tmp_path)
    if name.startswith("gpu_check_") and proc.returncode == 2 and "skipped" in doc["figures"]:
        reason = f"not checkable here: {doc['figures']['skipped']}"
        print(f"bench {name}: skipping: {reason}", file=sys.stderr)
        pytest.skip(reason)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert doc["bench"] == name and doc["smoke"] is True
    assert doc["figures"], f"{name} recorded no figures"
    assert doc["baseline"], f"{name} recorded no same-run baseline"
    assert doc["machine"]["cpus"] >= 1
    for target in doc["targets"].values():
        assert set(target) == {"value", "target", "met"}


# gpu_check_torch.py --framework: the other malleable examples, each through the same
# interrupt / resume-at-half / compare cycle (the torch one is in test_bench_smoke above)
FRAMEWORK_PACKAGES = {"lightning": "lightning", "hf": "transformers", "accelerate": "accelerate"}


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(FRAMEWORK_PACKAGES))
def test_gpu_check_torch_framework_smoke(framework: str, tmp_path: Path) -> None:
    package = FRAMEWORK_PACKAGES[framework]
    if importlib.util.find_spec(package) is None or importlib.util.find_spec("torch") is None:
        reason = f"{package} or torch is not installed"
        print(f"bench gpu_check_torch --framework {framework}: skipping: {reason}", file=sys.stderr)
        pytest.skip(reason)
    proc, doc = run_smoke("gpu_check_torch", tmp_path, "--framework", framework)
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-3000:]}"
    figures = doc["figures"]
    assert doc["params"]["framework"] == figures["framework"] == framework
    assert figures["ok"] is True and figures["steps"] == 40, figures
    # the process group of the 2-rank run: NCCL on CUDA, gloo on the CPU build
    assert figures["backend"] == ("nccl" if figures["cuda"] else "gloo"), figures
    assert [run[:2] for run in figures["runs"]] == [[2, False], [1, True]], figures
    assert doc["baseline"]["uninterrupted_steps"] == 40
    # The loss target is a correctness check; SIGTERM -> gone is a timing figure the bench
    # reports (no timing thresholds in tests: a loaded CI box measured 10 s once).
    assert doc["targets"]["max_relative_loss_diff"]["met"], doc["targets"]

"""The built wheel, installed in a fresh venv, runs the lab tooling with no checkout around it.

Issue 21, item 5: the lab cluster's templates are package data, so ``sgpu cluster up`` and
the config render work from an installed wheel (they once read ``docker-slurm/conf`` next
to the source tree, and failed from a wheel). The wheel is built by pip from a copy of the
source (no build isolation when this environment has setuptools: nothing to download),
installed with its dependencies into a new venv (no system site-packages) from the
configured index, or with ``SGPU_WHEELHOUSE=DIR`` from that directory only (offline CI).
The installed ``sgpu`` and ``python -m slurmgpu.lab.cluster`` then run with no PYTHONPATH,
from an empty directory, so nothing of the checkout can be imported.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE_ENV = "SGPU_WHEELHOUSE"


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (
        f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for tree in ("slurmgpu", "plugins"):
        shutil.copytree(ROOT / tree, src / tree, ignore=shutil.ignore_patterns("__pycache__"))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    dist = tmp / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(dist), "."],
        cwd=src,
    )
    (wheel,) = dist.glob("slurmgpu-*.whl")
    return wheel


def _install(wheel: Path, venv: Path, cwd: Path) -> Path:
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=cwd)
    python = venv / "bin" / "python"
    source = []
    if os.environ.get(WHEELHOUSE_ENV):
        source = ["--no-index", "--find-links", os.environ[WHEELHOUSE_ENV]]
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "-q", *source, str(wheel)], cwd=cwd)
    return python


def test_the_installed_wheel_renders_the_lab_cluster_config(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    empty = tmp_path / "empty"
    empty.mkdir()
    python = _install(wheel, venv, empty)

    # the package comes from the venv, not from this checkout
    where = _run([str(python), "-c", "import slurmgpu; print(slurmgpu.__file__)"], cwd=empty)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    assert ROOT not in Path(where.stdout.strip()).parents

    help_text = _run([str(venv / "bin" / "sgpu"), "cluster", "up", "--help"], cwd=empty).stdout
    assert "Usage: sgpu cluster up" in help_text
    assert "--slurmd-port-base" in help_text and "--slurm-root" in help_text
    # the Prometheus rules and the Grafana dashboard are package data too (issue 38)
    sgpu = str(venv / "bin" / "sgpu")
    for what, source in (("rules", "rules.yml"), ("dashboard", "dashboard.json")):
        shipped = _run([sgpu, "monitoring", what], cwd=empty).stdout
        assert shipped == (ROOT / "slurmgpu" / "monitoring" / source).read_text(), what

    lab = tmp_path / "lab"
    render = [str(python), "-m", "slurmgpu.lab.cluster"]
    native = ["--mode", "native", "--root", str(lab), "--out", str(lab / "etc")]
    ports = ["--port", "7400", "--slurmd-port-base", "24000", "--slurm-version", "24.11"]
    out = _run([*render, *native, *ports], cwd=empty).stdout
    files = {p.name: p for p in (lab / "etc").iterdir()}
    assert sorted(files) == [
        "cgroup.conf",
        "gres.conf",
        "job_submit.lua",
        "slurm.conf",
        "slurmgpu_submit.lua",
    ]
    assert sorted(out.split()) == sorted(str(p) for p in files.values())
    for path in files.values():
        assert path.stat().st_size > 0, f"{path} is empty"
    slurm_conf = files["slurm.conf"].read_text()
    assert "SlurmctldPort=7400" in slurm_conf
    assert "NodeName=gpu4 NodeHostname=localhost NodeAddr=127.0.0.1 Port=24003" in slurm_conf
    assert f"StateSaveLocation={lab / 'state'}" in slurm_conf
    assert "${" not in slurm_conf
    assert "Name=gpu File=/dev/tty[0-3]" in files["gres.conf"].read_text()
    assert files["cgroup.conf"].read_text().splitlines()[-1] == "CgroupPlugin=disabled"
    # no source tree around the installed package: the plugin the wheel put in
    # <venv>/share/slurmgpu/plugins (with the systemd units), pointed at the lab's advice
    shared = venv / "share" / "slurmgpu" / "plugins"
    assert sorted(p.name for p in shared.iterdir()) == sorted(
        p.name for p in (ROOT / "plugins").iterdir()
    )
    plugin = (ROOT / "plugins" / "job_submit.lua").read_text()
    assert (shared / "job_submit.lua").read_text() == plugin
    installed = files["job_submit.lua"].read_text()
    tsv = lab / "etc" / "slurmgpu" / "recommendations.tsv"
    assert f'local RECOMMENDATIONS_FILE = "{tsv}"' in installed
    assert installed.count("\n") == plugin.count("\n") and "function slurm_job_submit" in installed

    docker = tmp_path / "docker"
    docker_mode = ["--mode", "docker", "--accounting", "--slurm-version", "22.05"]
    _run([*render, *docker_mode, "--out", str(docker)], cwd=empty)
    dbd = (docker / "slurmdbd.conf").read_text()
    assert "DbdHost=slurmdbd" in dbd and "StorageHost=mariadb" in dbd
    assert "NodeName=gpu2 NodeAddr=gpu2" in (docker / "slurm.conf").read_text()

"""tests/tier_guard.py: a run that selected tests fails when nothing was tested (every
selected test skipped) or when a tier it asked for lacks a prerequisite; other skips
stay skips, and a run that selected nothing is never failed (issue 36, item 7).

Each case runs pytest in process (pytester) on a small tree whose tests carry the tier
markers, with the plugin loaded by ``-p tests.tier_guard`` as ``tests/conftest.py`` loads
it for the real suite; the real ``-m docker`` case is the slow test at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tier_guard import asked_tiers, prerequisite

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

INI = """[pytest]
markers =
    slurm: x
    slow: x
    release: x
    docker: x
"""
TREE = {
    "test_docker.py": """
import pytest
from tests.tier_guard import skip_missing
pytestmark = [pytest.mark.docker, pytest.mark.slow]
def test_lab_a():
    skip_missing("docker", "no container engine")
def test_lab_b():
    skip_missing("docker", "no container engine")
""",
    "test_slurm.py": """
import pytest
from tests.tier_guard import skip_missing
pytestmark = pytest.mark.slurm
def test_needs_the_lab():
    skip_missing(("slurm", "release"), "the lab needs root")
def test_render_only():
    assert 1 + 1 == 2
""",
    "test_slurm_legit.py": """
import pytest
pytestmark = pytest.mark.slurm
def test_as_a_second_user():
    pytest.skip("munge as nobody failed")
def test_runs():
    assert True
""",
    "test_unit.py": """
import pytest
def test_fast():
    assert True
def test_postgres():
    pytest.skip("PostgreSQL server binaries not found")
""",
    "test_only_skips.py": """
import pytest
def test_skips():
    pytest.skip("shared/data is not on this machine")
""",
}
GUARD = "FAILED (tier guard)"


@pytest.fixture
def tree(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".ini", pytest=INI)
    pytester.makepyfile(**TREE)
    return pytester


def _run(tree: pytest.Pytester, *args: str) -> tuple[int, str]:
    result = tree.runpytest("-p", "tests.tier_guard", "-p", "no:cacheprovider", *args)
    return int(result.ret), result.stdout.str()


@pytest.mark.parametrize(
    ("expr", "asked"),
    [
        ("not slow and not slurm and not docker", []),  # CI's unit tier asks for none
        ("hypothesis and not slow and not slurm and not docker", ["hypothesis"]),
        ("slow and not slurm and not docker", ["slow"]),
        ("slurm and not docker", ["slurm"]),
        ("release", ["release"]),
        ("docker", ["docker"]),
        ("slurm or docker", ["slurm", "docker"]),
        ("not slurm", []),
        ("", []),
    ],
)
def test_the_tiers_a_marker_expression_asks_for(expr: str, asked: list[str]) -> None:
    assert asked_tiers(expr) == asked


def test_a_prerequisite_reason_names_its_tiers() -> None:
    reason = "missing prerequisite (slurm, release tiers): the lab needs root"
    assert prerequisite(reason) == (["slurm", "release"], "the lab needs root")
    assert prerequisite("munge as nobody failed") is None


def test_a_tier_whose_tests_all_skipped_fails_naming_what_is_missing(
    tree: pytest.Pytester,
) -> None:
    ret, out = _run(tree, "-m", "docker")
    assert ret == 1
    last = out.strip().splitlines()[-1]
    assert last.startswith(GUARD) and "no container engine (2 tests)" in last


def test_an_asked_for_tier_missing_a_prerequisite_fails_though_others_passed(
    tree: pytest.Pytester,
) -> None:
    ret, out = _run(tree, "-m", "slurm and not docker")
    assert ret == 1
    assert "asked for the slurm tier, but a prerequisite is missing: the lab needs root" in out


def test_the_verdict_names_the_tier_short_of_a_prerequisite(tree: pytest.Pytester) -> None:
    ret, out = _run(tree, "-m", "docker or slurm", "test_docker.py", "test_slurm_legit.py")
    assert ret == 1
    assert "asked for the docker tier, but a prerequisite is missing: no container engine" in out


def test_ordinary_skips_beside_passing_tests_do_not_fail_a_tier(tree: pytest.Pytester) -> None:
    ret, out = _run(tree, "-m", "slurm and not docker", "test_slurm_legit.py")
    assert (ret, GUARD in out) == (0, False)
    ret, out = _run(tree, "-m", "not slow and not slurm and not docker", "test_unit.py")
    assert (ret, GUARD in out) == (0, False)


def test_a_prerequisite_of_a_tier_not_asked_for_is_an_ordinary_skip(
    tree: pytest.Pytester,
) -> None:
    # -m "not docker" asks for no tier: the slurm test skipping for root does not fail it
    ret, out = _run(tree, "-m", "not docker", "test_slurm.py", "test_unit.py")
    assert (ret, GUARD in out) == (0, False)


def test_an_explicit_path_whose_tests_all_skipped_fails(tree: pytest.Pytester) -> None:
    ret, out = _run(tree, "test_only_skips.py")
    assert ret == 1
    assert "nothing was tested" in out and "shared/data is not on this machine" in out


def test_a_run_without_a_selection_is_not_judged(tree: pytest.Pytester) -> None:
    tree.makepyfile(test_docker="", test_slurm="", test_slurm_legit="", test_unit="")
    ret, out = _run(tree)  # only test_only_skips.py has a test: it skips
    assert (ret, GUARD in out) == (0, False)


def test_collecting_only_is_not_judged(tree: pytest.Pytester) -> None:
    # scripts/test.sh collects everything first (byte-code caches); a module skipped at
    # import (torch missing) must not fail that
    tree.makepyfile(test_no_torch="import pytest\npytest.importorskip('no_such_module')\n")
    ret, out = _run(tree, "--collect-only", "test_no_torch.py")
    assert (ret, GUARD in out) == (5, False)  # pytest's own "no tests collected"
    ret, out = _run(tree, "--collect-only", "test_no_torch.py", "test_unit.py")
    assert (ret, GUARD in out) == (0, False)


_NEEDS_A_TOOL = """
from tests.tier_guard import need_tool
def test_promtool():
    need_tool("sgpu-no-such-tool", "apt-get install it")
def test_other():
    assert True
"""


def test_a_missing_tool_skips_unless_the_run_requires_it(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.makepyfile(test_tool=_NEEDS_A_TOOL)
    # the unit tier's expression asks for no tier: the missing tool is a skip there...
    monkeypatch.delenv("SGPU_REQUIRE_TOOLS", raising=False)
    ret, out = _run(tree, "-m", "not slow and not slurm and not docker", "test_tool.py")
    assert (ret, "1 passed, 1 skipped" in out) == (0, True), out
    # ...and a failure where the run says it must be there (scripts/test.sh)
    monkeypatch.setenv("SGPU_REQUIRE_TOOLS", "promtool sgpu-no-such-tool")
    ret, out = _run(tree, "-m", "not slow and not slurm and not docker", "test_tool.py")
    assert ret == 1
    assert "sgpu-no-such-tool is not installed (apt-get install it), and SGPU_REQUIRE_TOOLS" in out


def test_a_failure_stays_a_failure(tree: pytest.Pytester) -> None:
    tree.makepyfile(test_fails="def test_x():\n    assert False\n")
    ret, _ = _run(tree, "test_fails.py", "test_only_skips.py")
    assert ret == 1


def test_the_tiers_of_a_selection_are_written_for_scripts_test_sh(
    tree: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "tiers"
    monkeypatch.setenv("SGPU_SELECTED_TIERS", str(out))
    tree.runpytest("-p", "tests.tier_guard", "--collect-only", "-m", "not slurm")
    assert out.read_text().split() == ["docker", "slow"]
    tree.runpytest("-p", "tests.tier_guard", "--collect-only", "-m", "slurm")
    assert out.read_text().split() == ["slurm"]


@pytest.mark.slow  # pytest as a separate process, with two xdist workers
def test_the_real_docker_tier_without_an_engine_fails_under_xdist() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SGPU_DOCKER_TESTS"}
    env["PYTHONPATH"] = str(ROOT)
    argv = ["-q", "-n", "2", "-p", "no:cacheprovider", "-m", "docker", "tests/docker"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(GUARD) and "SGPU_DOCKER_TESTS=1" in last, last

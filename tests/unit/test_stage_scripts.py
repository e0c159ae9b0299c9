"""scripts/test.sh and scripts/slurm_chroot.sh run every stage and leave nothing
mounted, whatever fails (issue 36, item 7c).

Black-box: the real scripts run in a copy of the repository's layout whose commands are
fakes that log what they were asked (pytest, ruff, mypy, docker_prepare.sh,
slurm_chroot.sh for test.sh; mount, umount, mountpoint, chroot, id for slurm_chroot.sh).
A fake "mount" is a line in a state file, so the tests need neither root nor a chroot;
the real chroots' cleanup was checked once by hand (docs/slurm.md, "Releases")."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTEST = r"""#!/usr/bin/env bash
echo "pytest $* | root=${SGPU_TEST_SLURM_ROOT:-} docker=${SGPU_DOCKER_TESTS:-}" >>"$FAKE_LOG"
case " $* " in *" --collect-only "*)
  [ -z "${SGPU_SELECTED_TIERS:-}" ] || printf '%b' "${FAKE_TIERS:-}" >"$SGPU_SELECTED_TIERS"
  exit 0 ;;
esac
if [ -n "${SGPU_TEST_SLURM_ROOT:-}" ]; then
  echo "$SGPU_TEST_SLURM_ROOT" >>"$FAKE_MOUNTS"  # the lab mounts the chroot
  [ "${FAKE_HANG:-}" != "$(basename "$SGPU_TEST_SLURM_ROOT")" ] || exec sleep 60
  [ "${FAKE_FAIL_RELEASE:-}" != "$(basename "$SGPU_TEST_SLURM_ROOT")" ] || exit 1
  exit 0
fi
case " $* " in *" -m ${FAKE_FAIL_TIER:-@none@} "*) exit 1 ;; esac
exit 0
"""
FAKE_CHROOT_SH = r"""#!/usr/bin/env bash
echo "slurm_chroot $*" >>"$FAKE_LOG"
d=$FAKE_CHROOTS/$2
case $1 in
build)
  mkdir -p "$d"
  if [ "${FAKE_FAIL_BUILD:-}" = "$2" ]; then echo "$d" >>"$FAKE_MOUNTS"; exit 1; fi
  echo "$d" ;;
version) echo "24.11.5-1" ;;
umount)
  grep -vxF "$d" "$FAKE_MOUNTS" >"$FAKE_MOUNTS.new" || true
  mv "$FAKE_MOUNTS.new" "$FAKE_MOUNTS" ;;
esac
"""
LOGGING = '#!/usr/bin/env bash\necho "$(basename "$0") $*" >>"$FAKE_LOG"\n'


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


class Repo:
    """A copy of test.sh among fakes; ``run`` returns (exit status, output)."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "repo"
        self.log = tmp / "calls.log"
        self.mounts = tmp / "mounts"
        self.chroots = tmp / "chroots"
        _script(self.dir / "scripts" / "test.sh", (ROOT / "scripts" / "test.sh").read_text())
        _script(self.dir / "scripts" / "slurm_chroot.sh", FAKE_CHROOT_SH)
        for name in ("scripts/bootstrap.sh", "scripts/docker_prepare.sh"):
            _script(self.dir / name, LOGGING)
        for name in ("python", "ruff", "mypy"):
            _script(self.dir / ".venv" / "bin" / name, LOGGING)
        _script(self.dir / ".venv" / "bin" / "pytest", FAKE_PYTEST)
        self.mounts.write_text("")
        self.env = {
            "PATH": os.environ["PATH"],
            "FAKE_LOG": str(self.log),
            "FAKE_MOUNTS": str(self.mounts),
            "FAKE_CHROOTS": str(self.chroots),
            "SGPU_SKIP_BOOTSTRAP": "1",
        }

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", str(self.dir / "scripts" / "test.sh"), *args],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def run(self, *args: str, **env: str) -> tuple[int, str]:
        proc = self.start(*args, **env)
        out, _ = proc.communicate(timeout=60)
        return proc.returncode, out

    def calls(self, prefix: str) -> list[str]:
        text = self.log.read_text() if self.log.exists() else ""
        return [line for line in text.splitlines() if line.startswith(prefix)]

    def still_mounted(self) -> list[str]:
        return self.mounts.read_text().split()


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def _release_runs(repo: Repo) -> list[str]:
    """The suites the release stage ran (they run side by side: in no given order)."""
    return sorted(
        Path(c.split("root=")[1].split()[0]).name
        for c in repo.calls("pytest -q -p no:xdist -m release")
    )


def test_a_failing_release_does_not_stop_the_next_and_both_are_unmounted(repo: Repo) -> None:
    rc, out = repo.run(FAKE_FAIL_RELEASE="trixie")
    assert rc == 1
    assert _release_runs(repo) == ["sid", "trixie"]  # sid ran whatever trixie did
    assert repo.calls("slurm_chroot umount") == [
        "slurm_chroot umount trixie",
        "slurm_chroot umount sid",
    ]
    assert repo.still_mounted() == []
    assert repo.calls("docker_prepare.sh")  # and the docker stage ran too
    assert out.strip().splitlines()[-1] == "== failed: release trixie"


def test_a_failing_tier_does_not_stop_the_release_and_docker_stages(repo: Repo) -> None:
    rc, out = repo.run(FAKE_FAIL_TIER="slurm and not docker")
    assert rc == 1
    assert _release_runs(repo) == ["sid", "trixie"]
    assert repo.calls("docker_prepare.sh")
    assert out.strip().splitlines()[-1] == "== failed: slurm"


def test_a_failing_chroot_build_is_unmounted_and_the_next_release_runs(repo: Repo) -> None:
    rc, out = repo.run(FAKE_FAIL_BUILD="trixie")
    assert rc == 1
    assert _release_runs(repo) == ["sid"]
    assert repo.still_mounted() == []
    assert out.strip().splitlines()[-1] == "== failed: release trixie (chroot build)"


def test_everything_passing_says_so(repo: Repo) -> None:
    rc, out = repo.run()
    assert (rc, out.strip().splitlines()[-1]) == (0, "== all passed")
    assert _release_runs(repo) == ["sid", "trixie"] and repo.still_mounted() == []


def test_sigterm_during_a_release_leaves_its_chroot_unmounted(repo: Repo) -> None:
    proc = repo.start(FAKE_HANG="trixie")
    deadline = time.monotonic() + 30
    while len(repo.still_mounted()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(repo.still_mounted()) == 2, "the release suites never started"
    os.killpg(proc.pid, signal.SIGTERM)  # a CI timeout, ^C: the whole process group
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    # Both suites had started (they run side by side): both chroots are unmounted.
    assert repo.calls("slurm_chroot umount") == [
        "slurm_chroot umount trixie",
        "slurm_chroot umount sid",
    ]
    assert repo.still_mounted() == []


def test_asking_for_docker_tests_prepares_the_engine_and_enables_them(repo: Repo) -> None:
    rc, _ = repo.run("-m", "docker", FAKE_TIERS="docker\nslow\n")
    assert rc == 0
    assert repo.calls("docker_prepare.sh") == ["docker_prepare.sh --build"]  # once, not again
    run = [c for c in repo.calls("pytest") if "--collect-only" not in c]
    assert len(run) == 1 and "-p no:xdist" in run[0] and "docker=1" in run[0]


def test_a_selection_without_docker_tests_leaves_the_engine_alone(repo: Repo) -> None:
    rc, _ = repo.run("-m", "not slurm and not docker", FAKE_TIERS="slow\n")
    assert rc == 0
    assert repo.calls("docker_prepare.sh") == [] and _release_runs(repo) == []
    run = [c for c in repo.calls("pytest") if "--collect-only" not in c]
    assert len(run) == 1 and "-n 2" in run[0]  # two workers as ever


# ------------------------------------------------------------------- slurm_chroot.sh

FAKE_MOUNT = r"""#!/usr/bin/env bash
t=${*: -1}
case $t in *"/${FAKE_FAIL_MOUNT:-@none@}") echo "mount: $t: failed" >&2; exit 32 ;; esac
echo "$t" >>"$FAKE_MOUNTS"
"""
FAKE_UMOUNT = r"""#!/usr/bin/env bash
t=${*: -1}
grep -vxF "$t" "$FAKE_MOUNTS" >"$FAKE_MOUNTS.new" || true; mv "$FAKE_MOUNTS.new" "$FAKE_MOUNTS"
"""
FAKE_MOUNTPOINT = '#!/usr/bin/env bash\n[ "$1" != -q ] || shift\ngrep -qxF "$1" "$FAKE_MOUNTS"\n'
FAKE_CHROOT = r"""#!/usr/bin/env bash
case " $* " in *" update "*) [ -z "${FAKE_HANG_APT:-}" ] || exec sleep 60 ;; esac
exit "${FAKE_CHROOT_RC:-0}"
"""


class Chroot:
    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "bin"
        self.mounts = tmp / "mounts"
        self.mounts.write_text("")
        self.srv = tmp / "srv"
        self.root = self.srv / "slurmgpu-chroot-trixie"
        for d in ("proc", "sys", "dev/pts", "run"):
            (self.root / d).mkdir(parents=True)
        (self.root / ".slurmgpu-ready").write_text("24.11.5-1\n")  # built, before the extras
        for name, text in (
            ("mount", FAKE_MOUNT),
            ("umount", FAKE_UMOUNT),
            ("mountpoint", FAKE_MOUNTPOINT),
            ("chroot", FAKE_CHROOT),
            ("id", "#!/bin/sh\necho 0\n"),
        ):
            _script(self.bin / name, text)
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "FAKE_MOUNTS": str(self.mounts),
            "SGPU_CHROOT_DIR": str(self.srv),
        }

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "slurm_chroot.sh"), *args],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def run(self, *args: str, **env: str) -> int:
        proc = self.start(*args, **env)
        proc.communicate(timeout=60)
        return proc.returncode

    def mounted(self) -> list[str]:
        return [m.removeprefix(str(self.root)) for m in self.mounts.read_text().split()]


@pytest.fixture
def chroot(tmp_path: Path) -> Chroot:
    return Chroot(tmp_path)


def test_a_mount_stage_failing_half_way_undoes_what_it_mounted(chroot: Chroot) -> None:
    assert chroot.run("mount", "trixie", FAKE_FAIL_MOUNT="dev") != 0  # after proc and sys
    assert chroot.mounted() == []


def test_a_mount_stage_that_succeeds_leaves_its_mounts(chroot: Chroot) -> None:
    assert chroot.run("mount", "trixie") == 0
    assert chroot.mounted() == ["/proc", "/sys", "/dev", "/dev/pts", "/run"]
    assert chroot.run("umount", "trixie") == 0
    assert chroot.mounted() == []


def test_a_failing_build_stage_leaves_nothing_mounted(chroot: Chroot) -> None:
    assert chroot.run("build", "trixie", FAKE_CHROOT_RC="100") == 1  # apt-get fails
    assert chroot.mounted() == []


def test_a_build_stage_killed_by_sigterm_leaves_nothing_mounted(chroot: Chroot) -> None:
    proc = chroot.start("build", "trixie", FAKE_HANG_APT="1")
    deadline = time.monotonic() + 30
    while len(chroot.mounted()) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(chroot.mounted()) == 5, "the build never mounted"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert chroot.mounted() == []

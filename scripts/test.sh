#!/usr/bin/env bash
# The whole test suite: install everything, lint, type-check, run all tests including
# the real-cluster ones (they start their own slurmctld + 4 slurmd on 127.0.0.1).
# Usage (as root on Debian 12/13):  ./scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
# Byte-code caches: where PYTHONDONTWRITEBYTECODE is set (some CI images set it), every
# pytest worker of every tier rewrites the asserts of all test modules again, and every
# `sgpu` subprocess a test starts compiles slurmgpu from source. Here the caches
# (__pycache__/, git-ignored) are written once, before the tiers, and reused by all.
unset PYTHONDONTWRITEBYTECODE
echo "== byte-code caches"
.venv/bin/python -m compileall -q -j 0 slurmgpu >/dev/null
.venv/bin/pytest -q -p no:cacheprovider --collect-only tests >/dev/null
echo "== ruff"; .venv/bin/ruff check slurmgpu tests bench
echo "== mypy"; .venv/bin/mypy
# Two workers (pytest-xdist), each with its own lab cluster on its own ports: the
# real-cluster tests mostly wait on Slurm, so two run side by side in about half the time.
# SGPU_TEST_WORKERS=0 runs in one process.
# Property tests (tests/hypothesis_profiles.py) draw the same inputs every run here. The
# unit tier draws a quarter of them (profile "quick"), so it answers within a minute; the
# properties tier then runs every property test of the unit tier again with all of them
# ("ci"). With pytest arguments, "ci" (SGPU_HYPOTHESIS_PROFILE overrides both).
profile="${SGPU_HYPOTHESIS_PROFILE:-}"
export SGPU_HYPOTHESIS_PROFILE="${profile:-ci}"
workers="${SGPU_TEST_WORKERS:-2}"
if [ $# -gt 0 ]; then
  echo "== pytest $*"; .venv/bin/pytest -q -n "$workers" "$@"
else
  # Every test, tier by tier (README "Test tiers"): the fast tier first, so a broken unit
  # fails within a minute; every tier runs even when one fails, and the script fails after.
  # The markers split the whole tree, so a test in a new directory runs in some tier;
  # docker tests run in the docker stage below.
  failed=()
  tier() {  # NAME HYPOTHESIS-PROFILE MARKER-EXPRESSION
    local start=$SECONDS
    echo "== pytest: $1 tier (-m \"$3\")"
    SGPU_HYPOTHESIS_PROFILE="${profile:-$2}" .venv/bin/pytest -q -n "$workers" -m "$3" ||
      failed+=("$1")
    echo "== $1 tier: $((SECONDS - start)) s"
  }
  tier unit quick "not slow and not slurm and not docker"
  tier properties ci "hypothesis and not slow and not slurm and not docker"
  tier slow ci "slow and not slurm and not docker"
  tier slurm ci "slurm and not docker"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "== failed tiers: ${failed[*]}"; exit 1
  fi
fi
# With pytest arguments (a tier, a file) the release and docker stages are left out
# unless asked for (SGPU_SKIP_RELEASES=0 / SGPU_SKIP_DOCKER=0); CI passes none.
if [ $# -gt 0 ]; then
  : "${SGPU_SKIP_RELEASES:=1}" "${SGPU_SKIP_DOCKER:=1}"
fi

# Slurm releases users run today (issue 18): the release smoke set again on Debian
# trixie's 24.11 and sid's 26.05, each run by its own daemons (slurmdbd + MariaDB too)
# from a debootstrap chroot
# cached under /srv (scripts/slurm_chroot.sh: built once, about 1 min each; reused after).
# SGPU_SKIP_RELEASES=1 skips this part.
if [ "${SGPU_SKIP_RELEASES:-0}" != 1 ]; then
  for suite in trixie sid; do
    echo "== release smoke set: Debian $suite"
    root=$(./scripts/slurm_chroot.sh build "$suite")
    release=$(./scripts/slurm_chroot.sh version "$suite" | cut -d. -f1,2)
    SGPU_TEST_SLURM_ROOT="$root" SGPU_TEST_SLURM_RELEASE="$release" SGPU_TEST_SLURM_ACCOUNTING=1 \
      .venv/bin/pytest -q -p no:xdist -m release tests/slurm/test_release_smoke.py \
      tests/slurm/test_malleable_torch_real.py
    ./scripts/slurm_chroot.sh umount "$suite"
  done
fi

# The containerised lab (docker-slurm/, tests/docker, both Compose versions): installs the
# engine and starts dockerd if needed, builds the images without a registry (cached in
# /var/cache/slurmgpu/docker and the engine). An engine that cannot start fails here.
# SGPU_SKIP_DOCKER=1 leaves it out.
if [ "${SGPU_SKIP_DOCKER:-0}" != 1 ]; then
  echo "== docker"; ./scripts/docker_prepare.sh --build
  SGPU_DOCKER_TESTS=1 .venv/bin/pytest -q -p no:xdist -m docker tests/docker
fi

#!/usr/bin/env bash
# The whole test suite: install everything, lint, type-check, run all tests including
# the real-cluster ones (they start their own slurmctld + 4 slurmd on 127.0.0.1).
# Usage (as root on Debian 12/13):  ./scripts/test.sh [extra pytest args]
# Every tier and stage runs even when another fails; the script fails after all of them,
# naming the ones that failed. SGPU_SKIP_BOOTSTRAP=1 leaves out bootstrap.sh (apt + pip).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SGPU_SKIP_BOOTSTRAP:-0}" = 1 ] || ./scripts/bootstrap.sh
failed=()
# bootstrap.sh installed these: a test that runs one fails, not skips, when it is missing
# (tests/tier_guard.py need_tool), so a run never passes without the rules' checks.
export SGPU_REQUIRE_TOOLS="${SGPU_REQUIRE_TOOLS:-promtool prometheus}"
# The chroots a release stage mounted (through the lab) are unmounted whatever happens:
# a failing test, a failing build, ^C or a CI timeout's SIGTERM.
chroots=()
release_pids=()
unmount_chroots() {
  local suite pid
  for pid in ${release_pids[@]+"${release_pids[@]}"}; do  # suites still running
    pkill -TERM -P "$pid" 2>/dev/null || true  # its pytest first, then the subshell
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for suite in ${chroots[@]+"${chroots[@]}"}; do
    ./scripts/slurm_chroot.sh umount "$suite" || echo "== umount of the $suite chroot failed" >&2
  done
  chroots=()
}
trap unmount_chroots EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Byte-code caches: where PYTHONDONTWRITEBYTECODE is set (some CI images set it), every
# pytest worker of every tier rewrites the asserts of all test modules again, and every
# `sgpu` subprocess a test starts compiles slurmgpu from source. Here the caches
# (__pycache__/, git-ignored) are written once, before the tiers, and reused by all.
unset PYTHONDONTWRITEBYTECODE
echo "== byte-code caches"
.venv/bin/python -m compileall -q -j 0 slurmgpu >/dev/null
.venv/bin/pytest -q -p no:cacheprovider --collect-only tests >/dev/null
echo "== ruff"; .venv/bin/ruff check slurmgpu tests bench || failed+=(ruff)
echo "== mypy"; .venv/bin/mypy || failed+=(mypy)
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
docker_in_selection=0
if [ $# -gt 0 ]; then
  # The tiers the selection holds: docker tests need the engine prepared first (or, with
  # SGPU_SKIP_DOCKER=1, they skip and a run asking for them fails: tests/tier_guard.py).
  selected=$(mktemp)
  SGPU_SELECTED_TIERS="$selected" .venv/bin/pytest -q -p no:cacheprovider --collect-only "$@" \
    >/dev/null 2>&1 || true  # a bad argument fails the run below, with its message
  parallel=(-n "$workers")
  if grep -qx docker "$selected"; then
    docker_in_selection=1
    # In one process, as the docker stage runs them: under xdist (even all on one worker,
    # --dist loadgroup) 4 of the 12 failed here, a Compose service killed (exit 143);
    # in one process all 12 pass.
    parallel=(-p no:xdist)
    if [ "${SGPU_SKIP_DOCKER:-0}" != 1 ]; then
      echo "== docker: the selection holds docker tests"
      ./scripts/docker_prepare.sh --build || failed+=("docker (prepare)")
      export SGPU_DOCKER_TESTS=1
    fi
  fi
  rm -f "$selected"
  echo "== pytest $*"
  .venv/bin/pytest -q "${parallel[@]}" "$@" || failed+=("pytest $*")
else
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
fi
# With pytest arguments (a tier, a file) the release and docker stages are left out
# unless asked for (SGPU_SKIP_RELEASES=0 / SGPU_SKIP_DOCKER=0); CI passes none. Docker
# tests in the selection itself ran above.
if [ $# -gt 0 ]; then
  : "${SGPU_SKIP_RELEASES:=1}" "${SGPU_SKIP_DOCKER:=1}"
fi
[ "$docker_in_selection" = 0 ] || SGPU_SKIP_DOCKER=1

# Slurm releases users run today (issue 18): the release smoke set again on Debian
# trixie's 24.11 and sid's 26.05, each run by its own daemons (slurmdbd + MariaDB too)
# from a debootstrap chroot: the smoke set, the torchrun resizes, the slurmctld restart
# under shard load (test_gres_usage_real) and the site profile's tests (users, QOS
# preemption, interplay, LAS with fair share; about 5 min per release), chroots
# cached under /srv (scripts/slurm_chroot.sh: built once, about 1 min each; reused after).
# Each release runs and reports even when another failed, and its chroot is unmounted
# after it whatever happened. SGPU_RELEASE_SUITES picks the suites ("trixie sid").
# SGPU_SKIP_RELEASES=1 skips this part.
if [ "${SGPU_SKIP_RELEASES:-0}" != 1 ]; then
  # Every chroot is built (or reused) first; then the suites run side by side, each with
  # its own daemons, chroot and ports (100 apart: SGPU_TEST_*PORT*). A release test
  # spends most of its time waiting on Slurm, so two at once take little more than the
  # longer one (they took 10 min each one after the other).
  stage_start=$SECONDS
  names=() pids=() logs=()
  shift_by=0
  for suite in ${SGPU_RELEASE_SUITES:-trixie sid}; do
    echo "== release smoke set: Debian $suite"
    chroots+=("$suite")  # the build mounts it too
    if ! root=$(./scripts/slurm_chroot.sh build "$suite"); then
      failed+=("release $suite (chroot build)")
      continue
    elif ! version=$(./scripts/slurm_chroot.sh version "$suite"); then
      failed+=("release $suite (no Slurm in the chroot)")
      continue
    fi
    log=$(mktemp "/tmp/sgpu-release-$suite.XXXXXX")
    (
      export SGPU_TEST_SLURM_ROOT="$root" SGPU_TEST_SLURM_ACCOUNTING=1
      export SGPU_TEST_SLURM_RELEASE="$(echo "$version" | cut -d. -f1,2)"
      export SGPU_TEST_CTLD_PORT=$((${SGPU_TEST_CTLD_PORT:-6917} + shift_by))
      export SGPU_TEST_SLURMD_PORT_BASE=$((${SGPU_TEST_SLURMD_PORT_BASE:-17101} + shift_by))
      export SGPU_TEST_SITE_CTLD_PORT=$((${SGPU_TEST_SITE_CTLD_PORT:-6990} + shift_by))
      export SGPU_TEST_SITE_SLURMD_PORT_BASE=$((${SGPU_TEST_SITE_SLURMD_PORT_BASE:-17300} + shift_by))
      export SGPU_TEST_SHARING_CTLD_PORT=$((${SGPU_TEST_SHARING_CTLD_PORT:-7200} + shift_by))
      export SGPU_TEST_SHARING_SLURMD_PORT_BASE=$((${SGPU_TEST_SHARING_SLURMD_PORT_BASE:-17600} + shift_by))
      export SGPU_TEST_REPLAY_CTLD_PORT=$((${SGPU_TEST_REPLAY_CTLD_PORT:-7120} + shift_by))
      export SGPU_TEST_REPLAY_SLURMD_PORT_BASE=$((${SGPU_TEST_REPLAY_SLURMD_PORT_BASE:-17620} + shift_by))
      # the small trace replay (issue 33 item 5) on 22.05 (slurm tier) and 26.05 (here)
      replay=()
      [ "$suite" = sid ] && replay=(tests/slurm/test_replay_real.py)
      start=$SECONDS
      status=0
      .venv/bin/pytest -q -p no:xdist -m release tests/slurm/test_release_smoke.py \
        tests/slurm/test_malleable_torch_real.py tests/slurm/test_malleable_multinode_real.py \
        tests/slurm/test_limit_restore_real.py tests/slurm/test_rightsize_limits_real.py \
        tests/slurm/test_gres_usage_real.py tests/slurm/test_site_profile_real.py \
        tests/slurm/test_site_interplay_real.py tests/slurm/test_site_las_fairshare_real.py \
        tests/slurm/test_site_submission_real.py tests/slurm/test_site_las_floor_real.py \
        ${replay[@]+"${replay[@]}"} || status=$?
      echo "== release $suite ($version): $((SECONDS - start)) s"
      exit "$status"
    ) >"$log" 2>&1 &
    names+=("$suite") pids+=($!) logs+=("$log")
    release_pids=(${pids[@]+"${pids[@]}"})
    shift_by=$((shift_by + 100))
  done
  for i in ${pids[@]+"${!pids[@]}"}; do
    if wait "${pids[$i]}"; then status=0; else status=$?; fi
    echo "== release smoke set: Debian ${names[$i]}, its output:"
    cat "${logs[$i]}"
    rm -f "${logs[$i]}"
    [ "$status" = 0 ] || failed+=("release ${names[$i]}")
  done
  for suite in ${chroots[@]+"${chroots[@]}"}; do
    ./scripts/slurm_chroot.sh umount "$suite" || failed+=("release $suite (umount)")
  done
  chroots=()
  echo "== release stage: $((SECONDS - stage_start)) s"
fi

# The containerised lab (docker-slurm/, tests/docker, both Compose versions): installs the
# engine and starts dockerd if needed, builds the images without a registry (cached in
# /var/cache/slurmgpu/docker and the engine). An engine that cannot start fails here.
# SGPU_SKIP_DOCKER=1 leaves it out.
if [ "${SGPU_SKIP_DOCKER:-0}" != 1 ]; then
  echo "== docker"
  if ./scripts/docker_prepare.sh --build; then
    SGPU_DOCKER_TESTS=1 .venv/bin/pytest -q -p no:xdist -m docker tests/docker || failed+=(docker)
  else
    failed+=("docker (prepare)")
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed: $(printf '%s; ' "${failed[@]}" | sed 's/; $//')"
  exit 1
fi
echo "== all passed"

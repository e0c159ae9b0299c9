#!/usr/bin/env bash
# Debian's Slurm of another release in a debootstrap chroot, for the real-cluster release
# smoke set (tests/slurm/test_release_smoke.py) and the golden captures
# (scripts/record_golden.sh). Run as root on a Debian 12/13 host.
#
#   ./scripts/slurm_chroot.sh build SUITE     # make (or reuse) the chroot; prints its root
#   ./scripts/slurm_chroot.sh mount SUITE     # proc, sys, dev, dev/pts and its own /run
#   ./scripts/slurm_chroot.sh umount SUITE    # stops the chroot's munged, then unmounts
#   ./scripts/slurm_chroot.sh version SUITE   # the Slurm version installed there
#   ./scripts/slurm_chroot.sh path SUITE      # the chroot's directory
#
# SUITE: trixie (Slurm 24.11) or sid (Slurm 26.05; sid moves, `version` says which).
# The chroot is cached at $SGPU_CHROOT_DIR/slurmgpu-chroot-SUITE (default /srv): reused
# when its stamp file says it is complete, rebuilt from scratch when not (a build that
# was cut off leaves no stamp). The daemons are started by the lab launcher
# (slurmgpu/lab/cluster, `root=`), not by this script.
# Pitfalls handled (../docs/slurm.md, "Releases"): no daemon may start during the
# install (policy-rc.d); sid's Release file may be "expired" against this clock
# (Check-Valid-Until=false); the chroot gets its own tmpfs /run so its munged and pid
# files never meet the host's.
set -euo pipefail

usage() { sed -n '2,14p' "$0" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1 suite=$2
case $suite in trixie|sid|forky|bookworm-backports|trixie-backports) ;; *)
  echo "slurm_chroot: unknown suite '$suite' (trixie, sid)" >&2; exit 2 ;; esac
R=${SGPU_CHROOT_DIR:-/srv}/slurmgpu-chroot-$suite
MIRROR=${SGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
STAMP=$R/.slurmgpu-ready
# Shared libraries the host's Python needs when a test runs it inside the chroot (a
# torchrun job on this release: the checkout and the interpreter are bind-mounted,
# LabCluster.share). A chroot built before they were added gets them on its next build.
EXTRAS=(libffi8 libexpat1 libsqlite3-0)
EXTRAS_STAMP=$R/.slurmgpu-extras-1

# What this run mounted (do_mount), so a stage that fails half-way undoes exactly that.
mounted=()
mount_one() {  # TARGET MOUNT-ARGS...
  local target=$1; shift
  mountpoint -q "$R/$target" && return 0
  mount "$@" "$R/$target"
  mounted=("$target" ${mounted[@]+"${mounted[@]}"})
}
do_mount() {
  mount_one proc -t proc proc
  mount_one sys -t sysfs sys
  mount_one dev --bind /dev
  mount_one dev/pts --bind /dev/pts
  mount_one run -t tmpfs -o mode=755 tmpfs
}
undo_mounts() {  # unmount what this run mounted, newest first
  local m
  for m in ${mounted[@]+"${mounted[@]}"}; do
    if mountpoint -q "$R/$m"; then umount "$R/$m" || umount -l "$R/$m" || true; fi
  done
  mounted=()
}
# A stage that fails (set -e), is interrupted (^C) or killed by a timeout's SIGTERM
# leaves nothing mounted: `mount` undoes what it mounted unless it succeeded, `build`
# unmounts everything as it would at its end.
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then undo_mounts; fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
do_umount() {
  local m pid
  if [ -s "$R/run/munge/munged.pid" ]; then  # the lab's munged (started by the launcher)
    pid=$(cat "$R/run/munge/munged.pid")
    if [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$R" ]; then kill "$pid" || true; sleep 0.5; fi
  fi
  for m in run dev/pts dev sys proc; do
    if mountpoint -q "$R/$m"; then umount "$R/$m" || umount -l "$R/$m"; fi
  done
}

case $cmd in
path) echo "$R" ;;
mount) do_mount ;;
umount) do_umount ;;
version) chroot "$R" dpkg-query -W -f '${Version}\n' slurmctld ;;
build)
  if [ -f "$STAMP" ] && [ -f "$EXTRAS_STAMP" ]; then echo "$R"; exit 0; fi
  if [ -f "$STAMP" ]; then        # cached, but from before the extras
    [ "$(id -u)" -eq 0 ] || { echo "slurm_chroot: needs root" >&2; exit 1; }
    log=$(mktemp)
    trap 'do_umount; rm -f "$log"' EXIT
    do_mount
    if ! { chroot "$R" apt-get -o Acquire::Check-Valid-Until=false update -qq &&
           chroot "$R" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
             --no-install-recommends "${EXTRAS[@]}" &&
           chroot "$R" apt-get clean; } >"$log" 2>&1; then
      echo "slurm_chroot: apt-get of ${EXTRAS[*]} in $R failed:" >&2; tail -n 20 "$log" >&2
      exit 1
    fi
    touch "$EXTRAS_STAMP"; echo "$R"; exit 0
  fi
  [ "$(id -u)" -eq 0 ] || { echo "slurm_chroot: needs root" >&2; exit 1; }
  command -v debootstrap >/dev/null 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  if [ -d "$R" ]; then           # a build cut off half-way: start again
    do_umount
    if awk -v r="$R/" 'index($2, r) == 1 {found=1} END {exit !found}' /proc/mounts; then
      # e.g. a crashed lab's bind mount: rm would reach through it into the host
      echo "slurm_chroot: $R still has mounts under it; unmount them first" >&2; exit 1
    fi
    rm -rf --one-file-system "$R"
  fi
  base=$suite; case $suite in *-backports) base=${suite%-backports} ;; esac
  t0=$(date +%s)
  log=$(mktemp)
  if ! debootstrap --variant=minbase "$base" "$R" "$MIRROR" >"$log" 2>&1; then
    echo "slurm_chroot: debootstrap $base failed:" >&2; tail -n 20 "$log" >&2; rm -f "$log"; exit 1
  fi
  if [ "$suite" != "$base" ]; then
    echo "deb $MIRROR $suite main" > "$R/etc/apt/sources.list.d/backports.list"
  fi
  printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"; chmod +x "$R/usr/sbin/policy-rc.d"
  [ -s "$R/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' > "$R/etc/hosts"
  trap do_umount EXIT
  do_mount
  pkgs=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server "${EXTRAS[@]}")
  tgt=(); [ "$suite" != "$base" ] && tgt=(-t "$suite")
  if ! { chroot "$R" apt-get -o Acquire::Check-Valid-Until=false update -qq &&
         chroot "$R" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           --no-install-recommends "${tgt[@]}" "${pkgs[@]}" &&
         chroot "$R" apt-get clean; } >"$log" 2>&1; then
    echo "slurm_chroot: apt-get in $R failed:" >&2; tail -n 20 "$log" >&2; rm -f "$log"; exit 1
  fi
  rm -f "$log"
  [ -s "$R/etc/munge/munge.key" ] || chroot "$R" mungekey --create >/dev/null 2>&1 || true
  chroot "$R" chown munge:munge /etc/munge/munge.key
  chroot "$R" dpkg-query -W -f '${Version}\n' slurmctld > "$STAMP"
  touch "$EXTRAS_STAMP"
  echo "slurm_chroot: $suite ready in $(( $(date +%s) - t0 )) s: Slurm $(cat "$STAMP")" >&2
  echo "$R" ;;
*) usage ;;
esac

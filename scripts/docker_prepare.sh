#!/usr/bin/env bash
# Prepare a machine without a container engine for docker-slurm/ (run as root, Debian 12/13):
#   1. apt-get install Debian's docker.io, Compose v1 (docker-compose 1.29) and debootstrap;
#   2. Compose v2 as a CLI plugin, extracted from Debian 13's docker-compose package (it runs
#      on Debian 12; fetched with a private apt index, the system's sources are untouched);
#   3. start dockerd when `docker info` does not answer (no systemd needed);
#   4. the base image without a registry: debootstrap minbase + `docker import`, tagged
#      slurmgpu/debian:<release>-slim (docker-slurm's build argument SGPU_BASE_IMAGE);
#   5. with --build, build the lab images (slurmgpu/slurm-lab, slurmgpu/mariadb-lab).
# Idempotent and cached: every step is skipped when its result is there; the rootfs tarball
# and the Compose v2 package are kept in $SGPU_DOCKER_CACHE (default /var/cache/slurmgpu/docker),
# so a machine that lost its images re-imports in a second instead of running debootstrap.
#
# Usage: ./scripts/docker_prepare.sh [--build]
# Env:   DEBIAN_RELEASE (bookworm)  SGPU_DOCKER_CACHE  SGPU_COMPOSE_V2=0 (skip the plugin)
#        SGPU_BASE_IMAGE=debian (use the registry's debian:<release>-slim; no debootstrap)
#        SGPU_DEBIAN_MIRROR (default: the first Debian archive in the apt sources)
set -euo pipefail
cd "$(dirname "$0")/.."

REL=${DEBIAN_RELEASE:-bookworm}
CACHE=${SGPU_DOCKER_CACHE:-/var/cache/slurmgpu/docker}
BASE=${SGPU_BASE_IMAGE:-slurmgpu/debian}
BUILD=0
[ "${1:-}" = --build ] && BUILD=1
say() { echo "docker_prepare: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (installs packages and starts dockerd)"
mkdir -p "$CACHE"
t0=$(date +%s)

mirror() {
  [ -n "${SGPU_DEBIAN_MIRROR:-}" ] && { echo "$SGPU_DEBIAN_MIRROR"; return; }
  local m
  m=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list \
      | grep -v security | grep -oE 'https?://[^ ]+' | head -n1 || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# -- 1. packages ---------------------------------------------------------------------------
need=()
[ -x /usr/sbin/dockerd ] || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# -- 2. Compose v2 plugin from Debian 13 ------------------------------------------------------
PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose
if [ "${SGPU_COMPOSE_V2:-1}" = 1 ] && [ ! -x "$PLUGIN" ] && ! docker compose version >/dev/null 2>&1; then
  deb=$(ls "$CACHE"/docker-compose_2.*.deb 2>/dev/null | head -n1 || true)
  if [ -z "$deb" ]; then
    d=$CACHE/trixie-apt; rm -rf "$d"; mkdir -p "$d/lists/partial" "$d/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(mirror) trixie main" >"$d/sources.list"
    O=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=- -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache")
    say "fetching Compose v2 (trixie's docker-compose package)"
    apt-get "${O[@]}" update -qq >/dev/null
    (cd "$CACHE" && apt-get "${O[@]}" download docker-compose >/dev/null)
    rm -rf "$d"
    deb=$(ls "$CACHE"/docker-compose_2.*.deb | head -n1)
  fi
  x=$(mktemp -d); dpkg-deb -x "$deb" "$x"
  install -D -m 0755 "$x/usr/libexec/docker/cli-plugins/docker-compose" "$PLUGIN"
  rm -rf "$x"
fi

# -- 3. the engine --------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  log=/var/log/slurmgpu-dockerd.log
  say "starting dockerd (log: $log)"
  # its own session, so it outlives this script and the CI step's process group
  setsid /usr/sbin/dockerd >"$log" 2>&1 < /dev/null &
  echo $! >/run/slurmgpu-dockerd.pid
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { tail -n 30 "$log" >&2; die "dockerd did not answer within 30 s"; }
fi
say "engine $(docker version -f '{{.Server.Version}}' 2>/dev/null), $(docker-compose version --short 2>/dev/null | sed 's/^/compose v1 /')$(docker compose version --short 2>/dev/null | sed 's/^/, compose v2 /')"
if ! grep -q 'CapBnd:.*' /proc/self/status || \
   ! (( 0x$(awk '/CapBnd/ {print $2}' /proc/self/status) & (1 << 24) )); then
  say "note: CAP_SYS_RESOURCE is not in this machine's bounding set: 'privileged' containers cannot start here (docker-slurm does not use it)"
fi

# -- 4. base image without a registry -----------------------------------------------------------
IMG="$BASE:$REL-slim"
if docker image inspect "$IMG" >/dev/null 2>&1; then
  :
elif [ "$BASE" != slurmgpu/debian ]; then
  say "pulling $IMG"; docker pull "$IMG" >/dev/null || die "cannot pull $IMG (no registry? leave SGPU_BASE_IMAGE unset)"
else
  tarball=$CACHE/rootfs-$REL.tar
  if [ ! -s "$tarball" ]; then
    root=$(mktemp -d /var/tmp/sgpu-rootfs-XXXX)
    say "debootstrap --variant=minbase $REL (about 40 s)"
    if ! debootstrap --variant=minbase "$REL" "$root" "$(mirror)" >"$CACHE/debootstrap.log" 2>&1; then
      tail -n 20 "$CACHE/debootstrap.log" >&2; rm -rf "$root"; die "debootstrap failed"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "docker import $tarball as $IMG"
  docker import "$tarball" "$IMG" >/dev/null
fi

# -- 5. the lab images ------------------------------------------------------------------------
if [ "$BUILD" = 1 ]; then
  say "building the lab images on $IMG"
  build() {
    SGPU_BASE_IMAGE=$BASE DEBIAN_RELEASE=$REL docker-compose -f docker-slurm/docker-compose.yml \
      --profile accounting build config mariadb >"$CACHE/build.log" 2>&1
  }
  # apt-get inside the build depends on the mirror: one transient failure gets a second try
  if ! build; then
    tail -n 15 "$CACHE/build.log" >&2; say "build failed; trying once more"
    build || { tail -n 40 "$CACHE/build.log" >&2; die "image build failed (log: $CACHE/build.log)"; }
  fi
fi
say "ready in $(( $(date +%s) - t0 )) s (base image $IMG)"

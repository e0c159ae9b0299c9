#!/bin/sh
# sgpu-entrypoint ROLE -- ROLE is one of:
#   config     render /etc/slurm from the templates and create the munge key, then exit
#   slurmctld  run the controller          (needs config done)
#   slurmd     run one compute node; NodeName = the container's hostname (gpu1..gpuN)
#   slurmdbd   run the accounting daemon   (profile "accounting" or "site")
# SGPU_PROFILE=site: the lab's site profile (slurmgpu/lab/cluster/site.py): 16 nodes unless
# SGPU_NODES says otherwise, accounting, and its Unix users in every container
#   anything else is exec'd as a command (e.g. "sinfo")
set -eu

ROLE=${1:-slurmd}
PROFILE=${SGPU_PROFILE:-default}
CONF_DIR=$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")
KEY=/etc/munge/munge.key
WAIT_S=${SGPU_WAIT_S:-60}

log() { echo "sgpu-entrypoint[$ROLE]: $*" >&2; }

wait_for_file() {  # poll with a deadline, never a fixed sleep
  end=$(( $(date +%s) + WAIT_S ))
  while [ ! -s "$1" ]; do
    [ "$(date +%s)" -lt "$end" ] || { log "timed out waiting for $1"; exit 1; }
    sleep 0.2
  done
}

make_config() {
  mkdir -p "$CONF_DIR" /etc/munge
  if [ ! -s "$KEY" ]; then
    mungekey --create --keyfile="$KEY.tmp" 2>/dev/null \
      || dd if=/dev/urandom of="$KEY.tmp" bs=1024 count=1 2>/dev/null
    mv "$KEY.tmp" "$KEY"
  fi
  # one command per line: under set -e a failure inside an && list would pass unnoticed
  chown -R munge:munge /etc/munge
  chmod 0700 /etc/munge
  chmod 0400 "$KEY"
  nodes=${SGPU_NODES:-}
  if [ -z "$nodes" ]; then
    if [ "$PROFILE" = site ]; then nodes=16; else nodes=4; fi
  fi
  # --profile site implies accounting
  set -- --mode docker --out "$CONF_DIR" --nodes "$nodes" --profile "$PROFILE"
  if [ "${SGPU_ACCOUNTING:-0}" = 1 ]; then set -- "$@" --accounting; fi
  python3 -m slurmgpu.lab.cluster "$@"
}

site_users() {  # the site profile's Unix users: every container resolves uids on its own
  [ "$PROFILE" = site ] || return 0
  python3 -c 'from slurmgpu.lab.cluster.provision import ensure_unix_users; ensure_unix_users()'
}

site_accounts() {  # the site's cluster, QOS, accounts and users in slurmdbd (idempotent),
  # before slurmctld starts, so it finds its associations at once
  [ "$PROFILE" = site ] || return 0
  cluster=$(sed -n 's/^ClusterName=//p' "$CONF_DIR/slurm.conf")
  python3 - "${cluster:-lab}" <<'PY'
import subprocess, sys
from slurmgpu.lab.cluster.provision import sacctmgr_setup
sacctmgr_setup(
    lambda args: subprocess.run(
        ["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=60, check=False
    ),
    sys.argv[1],
)
PY
}

start_munge() {
  wait_for_file "$KEY"
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  end=$(( $(date +%s) + WAIT_S ))
  until munge -n | unmunge >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || { log "munged not answering"; exit 1; }
    sleep 0.2
  done
}

prepare_dirs() {
  # SlurmdSpoolDir is /var/spool/slurmd/%n: 24.11's slurmd does not create it (it logs
  # "Domain socket directory ... No such file or directory")
  mkdir -p /var/log/slurm /run/slurm /var/spool/slurmctld "/var/spool/slurmd/$(hostname)"
  wait_for_file "$CONF_DIR/slurm.conf"
}

wait_for_tcp() {  # HOST PORT: slurmctld must not start before slurmdbd answers
  log "waiting for $1:$2"
  python3 - "$1" "$2" "$WAIT_S" <<'PY' || { log "$1:$2 did not answer within $WAIT_S s"; exit 1; }
import socket, sys, time
host, port, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((host, port), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > end:
            sys.exit(1)
        time.sleep(0.2)
PY
}

fake_gpus() {  # compose maps /dev/null to /dev/fakegpuN; create them if it did not
  for i in 0 1 2 3; do
    [ -e "/dev/fakegpu$i" ] || mknod -m 0666 "/dev/fakegpu$i" c 1 3 || touch "/dev/fakegpu$i"
  done
}

case "$ROLE" in
  config)
    make_config ;;
  slurmctld)
    start_munge; prepare_dirs
    # With accounting, a first start without slurmdbd is fatal ("no TRES from it"), and
    # Compose v1 cannot make this service depend on one in a profile: wait here instead.
    if grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$CONF_DIR/slurm.conf"; then
      host=$(sed -n 's/^AccountingStorageHost=//p' "$CONF_DIR/slurm.conf")
      wait_for_tcp "${host:-slurmdbd}" 6819
    fi
    site_users; site_accounts
    exec /usr/local/sbin/slurmctld -D -i -f "$CONF_DIR/slurm.conf" ;;
  slurmd)
    start_munge; prepare_dirs; fake_gpus; site_users
    exec /usr/local/sbin/slurmd -D -f "$CONF_DIR/slurm.conf" -d /usr/local/sbin/slurmstepd ;;
  slurmdbd)
    start_munge; prepare_dirs; wait_for_file "$CONF_DIR/slurmdbd.conf"
    exec /usr/local/sbin/slurmdbd -D ;;
  *)
    exec "$@" ;;
esac

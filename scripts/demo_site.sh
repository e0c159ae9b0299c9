#!/usr/bin/env bash
# slurmgpu on a cluster set up like a shared site: the lab's site profile (16 nodes x 4
# fake GPUs, slurmdbd + MariaDB, 3 accounts, 8 Unix users sgpu-u1..8, fairshare, QOS
# normal preempting QOS scavenger by requeue; slurmgpu/lab/cluster/site.py). The daemon
# runs as its own user (sgpu-daemon: coordinator of account root, no AdminLevel).
#   1. several users submit at once; each sees only their own jobs
#   2. Slurm preempts a scavenger job for a normal one (sacct: PREEMPTED)
#   3. a malleable training (sgpu submit --malleable) in QOS scavenger is preempted
#      mid-way by Slurm, checkpoints on the SIGTERM, and carries on from its step after
# Run as root, standalone or from scripts/demo.sh (its own root and ports either way):
#   ./scripts/demo_site.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || ./scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

SITE_ROOT=${SGPU_SITE_ROOT:-/var/tmp/slurmgpu-demo-site}
CTLD_PORT=${SGPU_SITE_PORT:-6847}
SLURMD_BASE=${SGPU_SITE_SLURMD_PORT_BASE:-17201}
sgpu cluster down --root "$SITE_ROOT/cluster" >/dev/null 2>&1 || true
rm -rf "$SITE_ROOT"
mkdir -p "$SITE_ROOT"
chmod 1777 "$SITE_ROOT"   # the users' job output and the training's log go here

# The users run slurmgpu with this venv's Python, or (when that one lives where other
# users cannot run it, e.g. pyenv under /root) the system python3 of the same version
# with the venv's packages on PYTHONPATH.
UPY="$PWD/.venv/bin/python"
UPATH="$PWD"
if ! runuser -u nobody -- "$UPY" -c pass 2>/dev/null; then
  UPATH="$PWD:$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  UPY=/usr/bin/python3
fi
as() {  # as USER COMMAND...: run a command as a site user, in this cluster's environment
  local user=$1; shift
  # exec: the subshell becomes runuser, which passes a TERM on to the command
  (cd "$SITE_ROOT" && exec runuser -u "$user" -- env PATH="$PATH" SLURM_CONF="$SLURM_CONF" \
    PYTHONPATH="$UPATH" SGPU_DB="$SGPU_DB" SGPU_CONFIG="$SGPU_CONFIG" "$@")
}
sgpu_as() { local user=$1; shift; as "$user" "$UPY" -m slurmgpu "$@"; }

DAEMON_PID=""
cleanup() {
  if [ -n "$DAEMON_PID" ]; then
    pkill -TERM -P "$DAEMON_PID" 2>/dev/null || true   # runuser, the subshell's child
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
  sgpu cluster down --root "$SITE_ROOT/cluster" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== site 1. the site-profile cluster (16 nodes, accounting, accounts and users)"
sgpu cluster up --profile site --root "$SITE_ROOT/cluster" --port "$CTLD_PORT" \
  --slurmd-port-base "$SLURMD_BASE" --timeout 120
eval "$(sgpu cluster env --root "$SITE_ROOT/cluster")"
sinfo -o "%P %D %G"
sacctmgr -n show assoc format=account%10,user%12,qos%18,fairshare where users=sgpu-u1,sgpu-u4,sgpu-u7
grep '^# cgroups off' "$SLURM_CONF"

echo "== site 2. the daemon, as its own user sgpu-daemon (its database is its own)"
mkdir -p "$SITE_ROOT/daemon"
chown sgpu-daemon:sgpu-lab "$SITE_ROOT/daemon"; chmod 0700 "$SITE_ROOT/daemon"
export SGPU_DB="sqlite:///$SITE_ROOT/daemon/state.db"
export SGPU_CONFIG="$SITE_ROOT/config.toml"
cat >"$SGPU_CONFIG" <<CONF
[daemon]
listen = "127.0.0.1:${SGPU_SITE_API_PORT:-8797}"
secret_file = "$SITE_ROOT/daemon/site.secret"
CONF
chmod 0644 "$SGPU_CONFIG"
sgpu_as sgpu-daemon db upgrade
as sgpu-daemon "$UPY" -m slurmgpu daemon --interval 2s >"$SITE_ROOT/daemon.log" 2>&1 &
DAEMON_PID=$!  # the function's subshell; runuser is its child (see cleanup)

echo "== site 3. eight users submit at once; each sees only their own jobs"
SUBMITS=()
for i in 1 2 3 4 5 6 7 8; do
  sgpu_as "sgpu-u$i" submit -J "u$i-job" --gres=gpu:1 -t 5 -o /dev/null --wrap "sleep 30" >/dev/null 2>&1 &
  SUBMITS+=($!)
done
for pid in "${SUBMITS[@]}"; do wait "$pid"; done
echo "-- squeue as root:"; squeue -o "%.6i %.10u %.10a %.9q %.8T %j"
echo "-- squeue as sgpu-u3:"; as sgpu-u3 squeue -o "%.6i %.10u %.10a %.8T %j"
echo "-- sgpu-u3 tries to cancel sgpu-u5's job:"
U5=$(squeue -h -u sgpu-u5 -o %i | head -n1)
as sgpu-u3 scancel "$U5" || true
squeue -h -j "$U5" -o "job %i of %u: %T"

echo "== site 4. Slurm's own QOS preemption: a scavenger job requeued for a normal one"
SCAV=$(as sgpu-u7 sbatch --parsable --qos=scavenger -w gpu14 --gres=gpu:4 -o /dev/null --wrap "sleep 300")
for i in $(seq 60); do [ "$(squeue -h -j "$SCAV" -o %T)" = RUNNING ] && break; sleep 1; done
NORMAL=$(as sgpu-u2 sbatch --parsable -w gpu14 --gres=gpu:2 -t 2 -o /dev/null --wrap "sleep 20")
for i in $(seq 60); do [ "$(squeue -h -j "$NORMAL" -o %T)" = RUNNING ] && break; sleep 1; done
squeue -j "$SCAV,$NORMAL" -o "%.6i %.10u %.9q %.8T %r"
sleep 2
sacct -X -j "$SCAV" -D -o jobid,user,qos,state,restarts 2>/dev/null || sacct -X -j "$SCAV" -D -o jobid,user,qos,state

echo "== site 5. a malleable training in QOS scavenger, preempted mid-way by Slurm"
LOG="$SITE_ROOT/train.jsonl"
# A user cannot open the daemon's database, and sgpu submit does not try: the options
# ride in the job's comment, and the daemon records the submission from Slurm's view.
TRAIN=$(sgpu_as sgpu-u4 submit --parsable --malleable 2:4 --checkpoint-grace 30s \
  --elastic-dir "$SITE_ROOT/elastic" --qos=scavenger -w gpu16 --gres=gpu:4 -J elastic \
  -o "$SITE_ROOT/train.out" \
  --wrap "$UPY $PWD/examples/elastic_train.py --steps 100000 --step-time 0.2 --log $LOG")
TRAIN=${TRAIN%%;*}
steps() { python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; s=[x["step"] for x in r if "event" not in x]; print(len(s), s[-1] if s else 0, sum(1 for x in r if x.get("event")=="start"))' "$LOG" 2>/dev/null || echo "0 0 0"; }
for i in $(seq 90); do [ "$(steps | cut -d' ' -f1)" -ge 15 ] && break; sleep 1; done
echo "training job $TRAIN: $(steps | awk '{print $1" steps so far"}')"
echo "-- the daemon's record of sgpu-u4's submission, made from Slurm's view of the job:"
as sgpu-daemon "$UPY" -c 'import os, sys
from slurmgpu.store import open_store
r = open_store(os.environ["SGPU_DB"], migrate=False).submissions(int(sys.argv[1]))[-1]
print(", ".join(f"{k}={r[k]}" for k in ("user", "uid", "cwd", "malleable_min", "malleable_max", "checkpoint_signal", "checkpoint_grace_s")))' "$TRAIN"
RIVAL=$(as sgpu-u1 sbatch --parsable -w gpu16 --gres=gpu:4 -t 2 -o /dev/null --wrap "sleep 20")
echo "sgpu-u1's normal job $RIVAL wants gpu16's 4 GPUs"
for i in $(seq 60); do [ "$(squeue -h -j "$RIVAL" -o %T)" = RUNNING ] && break; sleep 1; done
squeue -j "$TRAIN,$RIVAL" -o "%.6i %.10u %.9q %.8T %r"
for i in $(seq 120); do
  [ "$(steps | cut -d' ' -f3)" -ge 2 ] && [ "$(squeue -h -j "$TRAIN" -o %T)" = RUNNING ] && break; sleep 1
done
sleep 5
python3 - "$LOG" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
steps = [r["step"] for r in rows if "event" not in r]
for r in rows:
    if r.get("event") == "start":
        print(f"run {r['restart']}: {r['gpus']} GPUs, resumed at step {r['resumed_step']}")
ok = steps == list(range(1, len(steps) + 1))
print(f"{len(steps)} steps, {'none lost or repeated' if ok else 'STEPS LOST OR REPEATED'}")
sys.exit(0 if ok and sum(r.get("event") == "start" for r in rows) >= 2 else 1)
PY
echo "-- what the daemon (as sgpu-daemon) saw of it:"
sgpu_as sgpu-daemon jobs --limit 12

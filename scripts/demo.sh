#!/usr/bin/env bash
# The main job: bring up the local 4-node Slurm cluster with fake GPUs, start the
# slurmgpu daemon, submit a small mixed GPU workload with `sgpu submit`, and show
# `sgpu jobs` while the jobs run and finish; last, scripts/demo_site.sh on a second lab
# cluster with the site profile (users, accounts, QOS preemption). Run as root on Debian
# 12/13:
#   ./scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

ROOT=${SGPU_LAB_ROOT:-/var/tmp/slurmgpu-demo}
# Start from nothing: a previous run's cluster state and database would mix in old jobs.
sgpu cluster down --root "$ROOT/cluster" >/dev/null 2>&1 || true
rm -rf "$ROOT"
mkdir -p "$ROOT"
export SGPU_DB="sqlite:///$ROOT/state.db"
export SGPU_SIMGPU_DIR="$ROOT/simgpu"     # where fakeload declares usage for the sim probe
PORT=${SGPU_DEMO_PORT:-8787}
export SGPU_CONFIG="$ROOT/config.toml"
# Policies in enforce mode with idle windows in SECONDS (production defaults are minutes:
# warn at 60, act at 120), so the demo shows a whole warn → requeue within its run.
cat >"$SGPU_CONFIG" <<CONF
[daemon]
listen = "127.0.0.1:$PORT"
secret_file = "$ROOT/site.secret"

[policy]
history_refresh = "2s"

[policy.engine]
# Every demo job is root's: the production guardrail (10 changes per user per hour)
# would stop the demo's later parts.
max_actions_per_user_per_hour = 100

[policy.idle_gpu]
mode = "enforce"
warn_after = "6s"
second_warn_after = "off"
act_after = "14s"
min_warning_lead = "4s"

[policy.rightsize]
mode = "enforce"

[policy.colocate]
mode = "enforce"
device_memory = "80GiB"   # the simulated GPUs' size

[policy.malleable]
mode = "enforce"
min_interval = "10s"
checkpoint_time = "2s"
requeue_delay = "2s"
startup_time = "2s"
CONF
JOBDIR="$ROOT/jobs"; mkdir -p "$JOBDIR" "$SGPU_SIMGPU_DIR"
export ROOT JOBDIR PORT   # for the demo_*.sh parts
NODES="gpu1 gpu2 gpu3 gpu4"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  sgpu cluster down --root "$ROOT/cluster" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== 1. local Slurm cluster (4 nodes x 4 fake GPUs, 16 shards each)"
if ! sgpu cluster up --root "$ROOT/cluster"; then
  # No local cluster here (no root, ports taken, Slurm cannot start): show the same
  # policies in the simulator instead, on a published workload, against the baselines.
  echo "demo: the local Slurm cluster did not start; running the simulator instead" >&2
  exec ./scripts/demo_simulate.sh "$ROOT/simulate.html"
fi
eval "$(sgpu cluster env --root "$ROOT/cluster")"
sinfo -N -o "%N %T %G"

echo "== 2. slurmgpu daemon (poll every 2s, API on 127.0.0.1:$PORT, log in $ROOT/daemon.log)"
sgpu db upgrade
sgpu daemon --interval 2s >"$ROOT/daemon.log" 2>&1 &
PIDS+=($!)
python3 - "$PORT" <<'PY'
import sys, time, urllib.request
for _ in range(100):  # wait for the API, at most 20 s
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1); break
    except OSError:
        time.sleep(0.2)
else:
    sys.exit("demo: the daemon's API did not come up; see the daemon log")
PY

echo "== 3. one node agent per node (simulated GPUs, per-node tokens, sampling every 2s)"
for n in $NODES; do
  sgpu node-token "$n" --out "$ROOT/tokens/$n.token" >/dev/null
  sgpu agent --node "$n" --daemon "http://127.0.0.1:$PORT" --interval 2s --probe sim \
    --sim-dir "$SGPU_SIMGPU_DIR" --gres-conf "$ROOT/cluster/etc/gres.conf" --auth hmac \
    --token-file "$ROOT/tokens/$n.token" --spool-dir "$ROOT/spool/$n" >"$ROOT/agent-$n.log" 2>&1 &
  PIDS+=($!)
done

echo "== 4. a mixed workload through sgpu submit"
J=examples/workload/gpu_job.sh
T=examples/workload/fake_train.sh
# History for rightsizing: three runs of "sim" that ask for 4 h and need seconds.
for i in 1 2 3; do sgpu submit -J sim -t 4:00:00 --mem=2G -o "$JOBDIR/%j.out" $J 4 >/dev/null; done
# A job that holds a GPU and never uses it: warned, then requeued (it asked for --requeue).
IDLE=$(sgpu submit --parsable -J idle-gpu --requeue --gres=gpu:1 -o "$JOBDIR/%j.out" $T 30s 0 1GiB)
TRAIN=$(sgpu submit --parsable -J train-2gpu --gres=gpu:2 -t 1:00:00 --mem=2G -o "$JOBDIR/%j.out" --requeue $T 40s 85 20GiB)
sgpu submit -J idle-after --gpus-per-node=1 -o "$JOBDIR/%j.out" $T 40s 70 4GiB idle-after:10s
sgpu submit -J light-a --gres=shard:4 -w gpu3 -o "$JOBDIR/%j.out" $T 30s 12 3GiB
sgpu submit -J light-b --gres=shard:4 -w gpu3 -o "$JOBDIR/%j.out" $T 30s 8 2GiB
sgpu submit -J sweep -a 0-3%2 --gres=gpu:1 -o "$JOBDIR/%A_%a.out" $T 10s 60 8GiB
sgpu submit -J big-2node -N 2 --gres=gpu:4 -t 10 -o "$JOBDIR/%j.out" $J 10
sgpu submit -J cpu-only -c 2 -o "$JOBDIR/%j.out" $J 5
sgpu submit -J crashes --gpus=1 -o "$JOBDIR/%j.out" $J 3 1

echo "== 5. an over-asking job, opted in to rightsizing (held until the daemon has looked)"
for i in $(seq 90); do  # the three "sim" runs must have finished: they are its history
  [ "$(sgpu jobs --json | python3 -c 'import json,sys; print(sum(j["name"]=="sim" and j["state"]=="COMPLETED" for j in json.load(sys.stdin)))')" -ge 3 ] && break
  sleep 1
done
OVER=$(sgpu submit --parsable --rightsize --hold -J sim -t 4:00:00 --mem=2G -o "$JOBDIR/%j.out" $J 4)
for i in $(seq 60); do
  sgpu actions --json --job "$OVER" | python3 -c 'import json,sys; sys.exit(not any(a["outcome"]=="done" for a in json.load(sys.stdin)))' && break
  sleep 1
done
echo "job $OVER asked for 4:00:00; Slurm now has: $(scontrol show job "$OVER" | grep -o 'TimeLimit=[^ ]*')"
scontrol release "$OVER"

echo "== 5b. co-location: two light jobs packed onto one GPU"
./scripts/demo_colocate.sh

echo "== 6. what slurmgpu sees (sgpu jobs), until every job has finished"
deadline=$(( $(date +%s) + 180 ))
while :; do
  sleep 5
  sgpu jobs
  active=$(sgpu jobs --json --active | python3 -c 'import json,sys; print(sum(j["state"] in ("PENDING","RUNNING","SUSPENDED") for j in json.load(sys.stdin)))')
  [ "$active" -eq 0 ] && break
  [ "$(date +%s)" -ge "$deadline" ] && { echo "demo: jobs still active after 180 s" >&2; exit 1; }
done
sleep 3   # one more daemon cycle to see the final states
echo "== 7. final state"
sgpu jobs
echo "== job outputs"; head -n1 "$JOBDIR"/*.out
echo "== daemon log (last lines)"; tail -n 5 "$ROOT/daemon.log"
echo "== 8. what slurmgpu decided (sgpu actions): idle job $IDLE warned then requeued, job $OVER rightsized"
sgpu actions --taken
echo "== 9. what job $TRAIN really used (sgpu eff $TRAIN)"
sgpu eff "$TRAIN"
echo "== 9b. malleable training: shrinks for a rigid job on a full cluster, grows back after it"
./scripts/demo_malleable.sh
echo "== 10. reliability and security against the running daemon"
PORT=$PORT ./scripts/demo_reliability.sh
echo "== 11. the efficiency report"
./scripts/demo_report.sh "$ROOT/report.html"
echo "== 12. the same on a cluster set up like a site: users, accounts, QOS preemption"
SGPU_SITE_ROOT="$ROOT/site" ./scripts/demo_site.sh

#!/usr/bin/env bash
# The main job: bring up the local 4-node Slurm cluster with fake GPUs, start the
# slurmgpu daemon, submit a small mixed GPU workload with `sgpu submit`, and show
# `sgpu jobs` while the jobs run and finish. Run as root on Debian 12/13:
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
JOBDIR="$ROOT/jobs"; mkdir -p "$JOBDIR"

cleanup() {
  [ -n "${DAEMON_PID:-}" ] && kill -TERM "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null || true
  sgpu cluster down --root "$ROOT/cluster" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== 1. local Slurm cluster (4 nodes x 4 fake GPUs, 16 shards each)"
sgpu cluster up --root "$ROOT/cluster"
eval "$(sgpu cluster env --root "$ROOT/cluster")"
sinfo -N -o "%N %T %G"

echo "== 2. slurmgpu daemon (poll every 2s, log in $ROOT/daemon.log)"
sgpu db upgrade
sgpu daemon --interval 2s >"$ROOT/daemon.log" 2>&1 &
DAEMON_PID=$!

echo "== 3. a mixed workload through sgpu submit"
J=examples/workload/gpu_job.sh
sgpu submit -J train-2gpu --gres=gpu:2 -o "$JOBDIR/%j.out" --requeue $J 25
sgpu submit -J per-node   --gpus-per-node=1 -o "$JOBDIR/%j.out" $J 15
sgpu submit -J light-shard --gres=shard:4 -o "$JOBDIR/%j.out" $J 15
sgpu submit -J sweep -a 0-3%2 --gres=gpu:1 -o "$JOBDIR/%A_%a.out" $J 8
sgpu submit -J big-2node -N 2 --gres=gpu:4 -t 10 -o "$JOBDIR/%j.out" $J 10
sgpu submit -J cpu-only -c 2 -o "$JOBDIR/%j.out" $J 5
sgpu submit -J crashes --gpus=1 -o "$JOBDIR/%j.out" $J 3 1

echo "== 4. what slurmgpu sees (sgpu jobs), until every job has finished"
deadline=$(( $(date +%s) + 180 ))
while :; do
  sleep 5
  sgpu jobs
  active=$(sgpu jobs --json --active | python3 -c 'import json,sys; print(sum(j["state"] in ("PENDING","RUNNING","SUSPENDED") for j in json.load(sys.stdin)))')
  [ "$active" -eq 0 ] && break
  [ "$(date +%s)" -ge "$deadline" ] && { echo "demo: jobs still active after 180 s" >&2; exit 1; }
done
sleep 3   # one more daemon cycle to see the final states
echo "== 5. final state"
sgpu jobs
echo "== job outputs"; head -n1 "$JOBDIR"/*.out
echo "== daemon log (last lines)"; tail -n 5 "$ROOT/daemon.log"

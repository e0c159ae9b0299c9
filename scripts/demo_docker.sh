#!/usr/bin/env bash
# The demo's mixed GPU workload on the containerised cluster (docker-slurm/): slurmctld +
# gpu1..gpu4 (4 fake GPUs, 16 shards each) + slurmdbd/MariaDB in containers, the slurmgpu
# daemon in the controller container, one agent per node container (simulated GPUs), jobs
# submitted from the host with `sgpu submit` through docker-slurm/host-bin (sbatch in the
# controller container), then `sgpu jobs` / `sgpu eff` / `sgpu report` on the host, reading
# the same SQLite database. Run as root on Debian 12:  ./scripts/demo_docker.sh
# Nothing is published on the host: the daemon listens on the compose network only.
# Env: SGPU_DOCKER_DEMO_ROOT (default /var/tmp/slurmgpu-docker-demo), COMPOSE=v1|v2 (v2),
#      SGPU_KEEP=1 leaves the cluster up at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh >/dev/null
./scripts/docker_prepare.sh --build

ROOT=${SGPU_DOCKER_DEMO_ROOT:-/var/tmp/slurmgpu-docker-demo}
PROJECT=sgpu-demo
PORT=8787   # inside the controller container's network namespace, not on the host
export SGPU_REPO=$PWD SGPU_WORK=$ROOT SGPU_ACCOUNTING=1 SGPU_DOCKER_PROJECT=$PROJECT
docker image inspect "slurmgpu/debian:${DEBIAN_RELEASE:-bookworm}-slim" >/dev/null 2>&1 \
  && export SGPU_BASE_IMAGE=${SGPU_BASE_IMAGE:-slurmgpu/debian}
if [ "${COMPOSE:-v2}" = v1 ]; then DC=(docker-compose); else DC=(docker compose); fi
DC+=(-p "$PROJECT" -f docker-slurm/docker-compose.yml -f docker-slurm/docker-compose.sgpu.yml --profile accounting)
# host side: sgpu from the venv, Slurm commands through docker exec
export PATH="$PWD/docker-slurm/host-bin:$PWD/.venv/bin:$PATH"
unset SLURM_CONF

"${DC[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
rm -rf "$ROOT"; mkdir -p "$ROOT/jobs" "$ROOT/simgpu" "$ROOT/tokens"
export SGPU_DB="sqlite:///$ROOT/state.db" SGPU_CONFIG="$ROOT/config.toml"
cat >"$SGPU_CONFIG" <<CONF
[daemon]
listen = "slurmctld:$PORT"
secret_file = "$ROOT/site.secret"

[policy]
history_refresh = "2s"

[policy.engine]
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
device_memory = "80GiB"
CONF

cleanup() {
  if [ "${SGPU_KEEP:-0}" = 1 ]; then
    echo "cluster left up: ${DC[*]} down -v"
  else
    "${DC[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
# run COMMAND in service SVC with the demo's environment (docker exec passes none by itself);
# in_ctr_d starts it in the background (it lives until the container stops)
in_ctr() { local svc=$1; shift; "${DC[@]}" exec -T -e "SGPU_DB=$SGPU_DB" -e "SGPU_CONFIG=$SGPU_CONFIG" "$svc" "$@"; }
in_ctr_d() { local svc=$1; shift; "${DC[@]}" exec -d -e "SGPU_DB=$SGPU_DB" -e "SGPU_CONFIG=$SGPU_CONFIG" "$svc" "$@"; }

echo "== 1. the cluster in containers (Compose ${COMPOSE:-v2})"
t0=$(date +%s.%N)
"${DC[@]}" up -d >/dev/null 2>&1 || "${DC[@]}" up -d
for _ in $(seq 300); do
  [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -ge 4 ] && break; sleep 0.2
done
printf 'up -> 4 nodes idle in %.1f s\n' "$(echo "$(date +%s.%N) - $t0" | bc)"
sinfo -N -o "%N %T %G"

echo "== 2. slurmgpu daemon in the controller container (log: $ROOT/daemon.log)"
sgpu -q db upgrade >/dev/null
in_ctr_d slurmctld sh -c "exec sgpu daemon --interval 2s >'$ROOT/daemon.log' 2>&1"
for _ in $(seq 100); do
  in_ctr slurmctld python3 -c "import urllib.request; urllib.request.urlopen('http://slurmctld:$PORT/healthz', timeout=1)" \
    >/dev/null 2>&1 && break
  sleep 0.2
done

echo "== 3. one agent per node container (simulated GPUs)"
for n in gpu1 gpu2 gpu3 gpu4; do
  sgpu -q node-token "$n" --out "$ROOT/tokens/$n.token" >/dev/null
  in_ctr_d "$n" sh -c "exec sgpu agent --node $n --daemon http://slurmctld:$PORT --interval 2s --probe sim \
    --sim-dir '$ROOT/simgpu' --gres-conf /etc/slurm/gres.conf --auth hmac \
    --token-file '$ROOT/tokens/$n.token' --spool-dir /var/spool/sgpu-agent >'$ROOT/agent-$n.log' 2>&1"
done

echo "== 4. the demo's mixed workload through sgpu submit (sbatch in the controller container)"
J=examples/workload/gpu_job.sh
T=examples/workload/fake_train.sh
O=(-o "$ROOT/jobs/%j.out")
for i in 1 2 3; do sgpu submit -J sim -t 4:00:00 --mem=2G "${O[@]}" $J 4 >/dev/null; done
IDLE=$(sgpu submit --parsable -J idle-gpu --requeue --gres=gpu:1 "${O[@]}" $T 30s 0 1GiB)
TRAIN=$(sgpu submit --parsable -J train-2gpu --gres=gpu:2 -t 1:00:00 --mem=2G --requeue "${O[@]}" $T 40s 85 20GiB)
sgpu submit -J idle-after --gpus-per-node=1 "${O[@]}" $T 40s 70 4GiB idle-after:10s
sgpu submit -J light-a --gres=shard:4 -w gpu3 "${O[@]}" $T 30s 12 3GiB
sgpu submit -J light-b --gres=shard:4 -w gpu3 "${O[@]}" $T 30s 8 2GiB
sgpu submit -J sweep -a 0-3%2 --gres=gpu:1 -o "$ROOT/jobs/%A_%a.out" $T 10s 60 8GiB
sgpu submit -J big-2node -N 2 --gres=gpu:4 -t 10 "${O[@]}" $J 10
sgpu submit -J cpu-only -c 2 "${O[@]}" $J 5
sgpu submit -J crashes --gpus=1 "${O[@]}" $J 3 1

echo "== 5. what slurmgpu sees (sgpu jobs), until every job has finished"
deadline=$(( $(date +%s) + 240 ))
while :; do
  sleep 5
  sgpu jobs
  active=$(sgpu jobs --json --active | python3 -c 'import json,sys; print(sum(j["state"] in ("PENDING","RUNNING","SUSPENDED") for j in json.load(sys.stdin)))')
  [ "$active" -eq 0 ] && break
  [ "$(date +%s)" -ge "$deadline" ] && { echo "demo_docker: jobs still active after 240 s" >&2; exit 1; }
done
sleep 3   # one more daemon cycle for the final states
echo "== 6. final state"
sgpu jobs
echo "== job outputs (written on the node containers into $ROOT/jobs)"; head -qn1 "$ROOT"/jobs/*.out
echo "== sacct (accounting profile)"
sacct -a -X -o JobID,JobName%12,State,AllocTRES%50 | head -n 25
echo "== 7. what slurmgpu decided: idle job $IDLE warned, then requeued"
sgpu actions --taken
echo "== 8. what job $TRAIN really used (sgpu eff $TRAIN)"
sgpu eff "$TRAIN"
echo "== 9. the efficiency report"
sgpu report --since 1d
echo "== daemon log (last lines)"; tail -n 5 "$ROOT/daemon.log"

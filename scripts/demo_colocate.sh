#!/bin/bash
# Co-location on the demo's running cluster and daemon: two light jobs submitted with
# `sgpu submit --shareable --gpu-mem` are narrowed by the daemon to half a GPU's shards,
# then Slurm puts both on ONE GPU, and each gets its own usage (sgpu eff).
#
# Runs inside scripts/demo.sh's environment (PATH with .venv/bin, SGPU_DB, SGPU_CONFIG,
# SLURM_CONF, ROOT, JOBDIR, SGPU_SIMGPU_DIR) while its daemon and agents run. The daemon's
# config needs the co-location policy in enforce mode:
#
#   [policy.colocate]
#   mode = "enforce"
#   device_memory = "80GiB"   # the simulated GPUs' size; else learned from running jobs
#
# Jobs are submitted held with a whole GPU's shards (--gres=shard:4): Slurm 22.05 refuses
# to turn a pending gres/gpu request into shards, and held jobs wait for the decision.
set -euo pipefail
: "${SGPU_CONFIG:?run from scripts/demo.sh (SGPU_CONFIG unset)}" "${JOBDIR:?JOBDIR unset}"
if ! grep -q '^\[policy.colocate\]' "$SGPU_CONFIG"; then
  echo "demo_colocate: $SGPU_CONFIG has no [policy.colocate] table; add mode = \"enforce\"" >&2
  exit 1
fi
T=examples/workload/fake_train.sh
NODE=${SGPU_DEMO_COLOCATE_NODE:-gpu4}

echo "== co-location: two light jobs (25 % and 15 % GPU, 3 and 2 GiB) declared shareable"
A=$(sgpu submit --parsable --shareable --gpu-mem 4GiB --hold --requeue --gres=shard:4 \
  -w "$NODE" -J light-share-a -o "$JOBDIR/%j.out" $T 40s 25 3GiB)
B=$(sgpu submit --parsable --shareable --gpu-mem 4GiB --hold --requeue --gres=shard:4 \
  -w "$NODE" -J light-share-b -o "$JOBDIR/%j.out" $T 40s 15 2GiB)

packed() {  # true once the daemon's colocate update of job $1 is done
  sgpu actions --json --job "$1" | python3 -c 'import json,sys
sys.exit(not any(a["policy"]=="colocate" and a["kind"]=="update" and a["outcome"]=="done"
                 for a in json.load(sys.stdin)))'
}
for _ in $(seq 60); do packed "$A" && packed "$B" && break; sleep 1; done
packed "$A" && packed "$B" || { echo "demo_colocate: the daemon did not pack $A and $B" >&2; exit 1; }
echo "-- the daemon's decisions (sgpu actions)"
sgpu actions --job "$A"
sgpu actions --job "$B"
scontrol release "$A" "$B"

gres() { scontrol show job -d "$1" | grep -o 'GRES=shard:[0-9]*(IDX:[0-9]*)' || true; }
for _ in $(seq 60); do [ -n "$(gres "$A")" ] && [ -n "$(gres "$B")" ] && break; sleep 1; done
echo "-- where Slurm put them (scontrol show job -d): job $A $(gres "$A"), job $B $(gres "$B")"
[ "$(gres "$A" | grep -o 'IDX:[0-9]*')" = "$(gres "$B" | grep -o 'IDX:[0-9]*')" ] \
  && echo "   both on $NODE GPU $(gres "$A" | grep -o 'IDX:[0-9]*' | cut -d: -f2)"

sleep 16  # a few agent samples of both (agents sample every 2 s)
echo "-- what each job used on the shared GPU (its own processes, not the device total)"
sgpu eff "$A"
sgpu eff "$B"

#!/usr/bin/env bash
# The simulator's main job, for machines where the local Slurm cluster cannot start:
# replay a published workload (Pollux's workload 1, 160 jobs) through the daemon's own
# policy engine in virtual time on 16 nodes x 4 GPUs, for every policy set and the
# Tiresias and QSSF baselines, and print the comparison (and write it as HTML); then
# a fractional-GPU workload built from Lucid's pairs, with and without co-location.
# Usage: scripts/demo_simulate.sh [OUT.html]   (data: $SGPU_DATA or ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/sgpu ] || ./scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
out=${1:-./simulate.html}
data=${SGPU_DATA:-../shared/data}
trace="$data/pollux/workloads/workload-1.csv"
if [ ! -f "$trace" ]; then
  echo "demo_simulate: no trace at $trace (set SGPU_DATA to the shared data directory)" >&2
  exit 1
fi
echo "== sgpu simulate: Pollux workload 1, 16x4 GPUs, load 1.0, seed 1"
sgpu simulate "$trace" --policies slurm,rightsize,colocate,malleable,all,tiresias,qssf \
  --cluster 16x4 --load 1.0 --seed 1 --html "$out"
echo "== comparison written to $out"
lucid="$data/lucid/colocate_info.csv"
if [ -f "$lucid" ]; then
  echo "== sgpu simulate: 1-GPU jobs built from Lucid's co-location pairs, with and without sharing"
  sgpu simulate "$lucid" --policies slurm,colocate --cluster 4x4 --load 1.2 --seed 1
fi

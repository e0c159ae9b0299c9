#!/usr/bin/env bash
# Malleable training on the demo's running cluster and daemon: a real PyTorch DDP training
# under torchrun (examples/torch_ddp_elastic.py, gloo on CPU, one rank per GPU,
# `sgpu submit --malleable 2:4`; `sgpu fakeload` beside it declares its load on the fake
# GPUs) runs on 4 GPUs of a full cluster; a rigid 2-GPU job arrives and cannot start, so the daemon shrinks the
# training to 2 GPUs (checkpoint -> requeue held -> update -> release) and the rigid job
# starts on the GPUs given back; when it ends, the daemon grows the training back to 4.
# Prints the history: the daemon's decisions (sgpu actions), the resize transactions
# with their phases (sgpu resizes), and the training's runs, steps and loss.
#
# Runs inside scripts/demo.sh's environment (PATH with .venv/bin, SGPU_DB, SGPU_CONFIG,
# SLURM_CONF, ROOT, JOBDIR, SGPU_SIMGPU_DIR) while its daemon and agents run. The daemon's
# config needs the malleable policy in enforce mode, with demo-sized pacing (production
# defaults: min_interval 10 min, a 181 s resize cost assumed until one is measured):
#
#   [policy.malleable]
#   mode = "enforce"
#   min_interval = "10s"
#   checkpoint_time = "2s"
#   requeue_delay = "2s"
#   startup_time = "2s"
#
# Every GPU the training does not hold is filled with busy 4-minute jobs first (cancelled
# at the end), so the rigid job really finds the cluster full.
set -euo pipefail
: "${SGPU_CONFIG:?run from scripts/demo.sh (SGPU_CONFIG unset)}" "${JOBDIR:?JOBDIR unset}"
if ! python3 - "$SGPU_CONFIG" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    doc = tomllib.load(f)
sys.exit(doc.get("policy", {}).get("malleable", {}).get("mode") != "enforce")
PY
then
  echo "demo_malleable: $SGPU_CONFIG needs [policy.malleable] mode = \"enforce\" (see this script's header)" >&2
  exit 1
fi
PY_BIN=$(command -v python)
T=examples/workload/fake_train.sh
STATE=${ROOT:-/tmp}/elastic
LOG=$JOBDIR/elastic-train.jsonl
rm -f "$LOG"
FILLERS=()
cleanup_malleable() { scancel "${FILLERS[@]}" ${TRAIN:+"$TRAIN"} 2>/dev/null || true; }
trap cleanup_malleable EXIT

runs() {  # "N G": the training's number of runs so far and the GPUs of the latest
  python3 - "$LOG" <<'PY'
import json, sys
try:
    starts = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "start"]
except FileNotFoundError:
    starts = []
print(len(starts), starts[-1]["gpus"] if starts else 0)
PY
}
wait_runs() {  # wait_runs N G WHAT [SECONDS]: until the training's Nth run trains on G GPUs
  for _ in $(seq "${4:-120}"); do [ "$(runs)" = "$1 $2" ] && return 0; sleep 1; done
  echo "demo_malleable: timed out waiting for $3" >&2; exit 1
}
state() { squeue -h -j "$1" -o %T 2>/dev/null || true; }

echo "== malleable PyTorch training: torchrun, 4 ranks on 4 GPUs, may shrink to 2 (sgpu submit --malleable 2:4)"
# One rank per GPU of this run ($SGPU_GPUS, set by sgpu launch); the fake GPUs see the
# load sgpu fakeload declares, as a real GPU would show the training's. The fake GPUs do
# not compute: --sample-time sleeps 10 ms per sample of a rank's share of the global
# batch (64), so a step takes ~0.16 s at 4 ranks and ~0.32 s at 2, and the daemon
# measures the speedup it grows the job back for. (With a fixed sleep per step the
# measured speedup is ~1, and the daemon rightly never grows it back.)
TRAIN=$(sgpu submit --parsable --malleable 2:4 --checkpoint-grace 30s --elastic-dir "$STATE" \
  --gres=gpu:4 -J torch-ddp -o "$JOBDIR/%j.out" \
  --wrap "sgpu fakeload --util 80 --mem 8GiB --duration 2h --interval 2s & \
OMP_NUM_THREADS=1 $PY_BIN -m torch.distributed.run --standalone --nproc-per-node=\$SGPU_GPUS \
$PWD/examples/torch_ddp_elastic.py --steps 100000 --sample-time 0.01 --train-log $LOG")
wait_runs 1 4 "job $TRAIN training on 4 GPUs" 180
echo "job $TRAIN trains on 4 GPUs (torchrun: 4 DDP ranks)"

echo "-- filling every other GPU with busy jobs"
while read -r node free; do
  [ "$free" -gt 0 ] || continue
  FILLERS+=("$(sgpu submit --parsable -w "$node" --gres=gpu:"$free" -J filler -t 5 \
    -o "$JOBDIR/%j.out" $T 240s 90 20GiB)")
done < <(python3 -c '
from slurmgpu.slurm.cli import CliSlurmClient
for n in CliSlurmClient().nodes():
    print(n.name, max(0, n.gpus - n.gpus_used))')
for _ in $(seq 60); do
  n=0; for f in "${FILLERS[@]}"; do [ "$(state "$f")" = RUNNING ] && n=$((n + 1)); done
  [ "$n" -eq "${#FILLERS[@]}" ] && break; sleep 1
done
sinfo -N -h -o "%N %t" | tr '\n' ' '; echo "(every GPU allocated)"

echo "== a rigid 2-GPU job arrives (20 s, time limit 1 min)"
RIGID=$(sgpu submit --parsable --gres=gpu:2 -t 1 -J rigid-2gpu -o "$JOBDIR/%j.out" $T 20s 70 10GiB)
echo "job $RIGID: $(squeue -h -j "$RIGID" -o '%T (%r)') on a full cluster"
wait_runs 2 2 "the training shrunk to 2 GPUs"
for _ in $(seq 30); do [ "$(state "$RIGID")" = RUNNING ] && break; sleep 1; done
echo "-- the daemon shrank job $TRAIN to 2 GPUs; rigid job $RIGID $(squeue -h -j "$RIGID" \
  -o '%T: submitted %V, started %S')"

echo "== the rigid job ends; the daemon grows the training back"
for _ in $(seq 90); do [ -z "$(state "$RIGID")" ] && break; sleep 1; done
wait_runs 3 4 "the training grown back to 4 GPUs"
sleep 4  # a few steps at 4 GPUs again
echo "-- job $TRAIN trains on 4 GPUs again"

echo "== history: the daemon's decisions (sgpu actions --policy malleable --job $TRAIN)"
sgpu actions --policy malleable --job "$TRAIN" --taken
echo "== the resize transactions and where their time went (sgpu resizes --job $TRAIN)"
sgpu resizes --job "$TRAIN"
echo "== the training's runs: steps and loss carry on across both resizes"
python3 - "$LOG" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
steps = [r["step"] for r in records if "event" not in r]
run = None
for r in records:
    if r.get("event") == "start":
        if run:
            print(f"  run {run['restart']}: {run['gpus']} GPUs, steps {run['first']}-{run['last']}, "
                  f"loss {run['loss0']:.3f} -> {run['loss']:.3f}")
        run = {"restart": r["restart"], "gpus": r["gpus"], "first": r["resumed_step"] + 1}
    elif "event" not in r and run is not None:
        run.setdefault("loss0", r["loss"])
        run["last"], run["loss"] = r["step"], r["loss"]
if run and "last" in run:
    print(f"  run {run['restart']}: {run['gpus']} GPUs, steps {run['first']}-{run['last']} "
          f"(still training), loss {run['loss0']:.3f} -> {run['loss']:.3f}")
ok = steps == list(range(1, len(steps) + 1))
print(f"  {len(steps)} steps, " + ("none lost or repeated" if ok else "STEPS LOST OR REPEATED"))
sys.exit(0 if ok else 1)
PY

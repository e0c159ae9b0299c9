#!/bin/bash
# A stand-in for GPU training on the lab cluster's fake GPUs: declares utilisation and
# memory on the devices Slurm gave it (CUDA_VISIBLE_DEVICES) with `sgpu fakeload`, so the
# node agents see realistic per-process usage.
# usage: fake_train.sh DURATION UTIL_PCT MEMORY [PATTERN]
echo "job ${SLURM_JOB_ID} on ${SLURMD_NODENAME:-?}: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-none} shards=${SLURM_SHARDS_ON_NODE:-0}"
exec sgpu fakeload --duration "$1" --util "$2" --mem "$3" --pattern "${4:-constant}" --interval 2s

#!/bin/bash
# A stand-in for a GPU training job: reports the devices Slurm gave it, then works.
echo "job ${SLURM_JOB_ID} on $(hostname) as ${SLURM_JOB_NODELIST:-?}: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-none} shards=${SLURM_SHARDS_ON_NODE:-0}"
sleep "${1:-20}"
exit "${2:-0}"

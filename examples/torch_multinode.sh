#!/bin/bash
# A PyTorch DDP training over several nodes that shrinks and grows by node count.
# Submit with:  sgpu submit --malleable 4:8 examples/torch_multinode.sh
# (docs/malleable.md, "Multi-node torchrun"). One launcher per node under srun, the
# batch launcher in front of srun (it gets the time limit's signal and requeues),
# torchrun's c10d rendezvous on the first node ($SGPU_HEAD_ADDR, set by the batch
# launcher). The training script is the single-node one.
#SBATCH --job-name=ddp-multinode
#SBATCH --nodes=2
#SBATCH --gres=gpu:4
#SBATCH --time=12:00:00

# The single quotes matter: $SGPU_HEAD_ADDR is set by the batch launcher, so it is
# expanded by a shell under each node's launcher, not by this batch shell.
exec sgpu launch -- srun --ntasks-per-node=1 sgpu launch -- /bin/sh -c '
    exec torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="$SGPU_GPUS" \
    --rdzv-backend=c10d --rdzv-endpoint="$SGPU_HEAD_ADDR:29400" --rdzv-id="$SLURM_JOB_ID" \
    examples/torch_ddp_elastic.py --steps 100000 --train-log train.jsonl'

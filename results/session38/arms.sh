#!/bin/bash
# One device call: train.py's default run with --attention=fp8_stale and with --attention=sdpa (each 1000
# steps, alone on the GPU), then grad_fidelity.py on each one's final weights: does a model trained with the
# stale delta (or with BF16) give the FP8 arms other gradient errors than the matched run's weights did
# (h100_default/)? Carry ".carry/tiktoken_cache". One archive to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s38arms; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
git log --oneline -1
for arm in fp8_stale sdpa; do
    start=$(date +%s)
    python train.py --attention=$arm --out_dir=out_$arm > "$logs/train_$arm.log" 2>&1
    echo "== $arm: train.py exit $? after $(( $(date +%s) - start )) s"
    grep -E "^attention|val loss|^iter (500|990) " "$logs/train_$arm.log"
    python grad_fidelity.py --batches=4 --batch_size=16 --out_dir=out_$arm --json="$logs/grads_$arm.json" \
        > "$logs/grads_$arm.txt" 2>&1; cat "$logs/grads_$arm.txt"
done
tar -C "$logs" -czf "${OUT:-/tmp}/session38_arms.tgz" .

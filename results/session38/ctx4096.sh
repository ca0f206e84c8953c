#!/bin/bash
# One device call: the default model at context 4096 (--block_size=4096 --batch_size=4: 65,536 tokens per
# step, as results/ablation_4096.sh), 300 steps, keeping its checkpoints; then grad_fidelity.py at
# initialization and at iters 150 and 300 on 4 micro-batches of 4 x 4096 tokens (one step's worth).
# Carry ".carry/tiktoken_cache". One archive to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s38c; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
python train.py --block_size=4096 --batch_size=4 --max_iters=300 --warmup_iters=30 --eval_interval=150 \
    --out_dir=out4k > "$logs/train.log" 2>&1 &
pid=$!
last=""; n=0
while kill -0 $pid 2>/dev/null; do
    if [ -f out4k/ckpt.pt ]; then
        ino=$(stat -c %i out4k/ckpt.pt)
        if [ "$ino" != "$last" ]; then n=$((n+1)); mkdir -p "ck4k/$n" && ln out4k/ckpt.pt "ck4k/$n/ckpt.pt"; last=$ino; fi
    fi
    sleep 1
done
wait $pid; echo "train.py exit $? after $(( $(date +%s) - start )) s"
grep -E "^model|val loss|^iter 290 " "$logs/train.log"
fid="python grad_fidelity.py --batches=4 --batch_size=4"
$fid --out_dir=ck4k/1 --init=True --json="$logs/grads_init.json" > "$logs/grads_init.txt" 2>&1; cat "$logs/grads_init.txt"
for d in $(ls ck4k | sort -n); do
    $fid --out_dir=ck4k/$d --json="$logs/grads_$d.json" > "$logs/grads_$d.txt" 2>&1; cat "$logs/grads_$d.txt"
    echo "elapsed $(( $(date +%s) - start )) s"
done
tar -C "$logs" -czf "${OUT:-/tmp}/session38_ctx4096.tgz" .

#!/bin/bash
# Device call 6: does the stale excess grow faster in training at 354M than at 81M? The 354M model of the
# README's 354M ablation (24 layers, 8 heads of 128, lr 3e-4, 8 x 8 micro-batches of 1024), FP8 matched,
# 450 steps, keeping each checkpoint (hard links: train.py replaces out/ckpt.pt by rename), then
# grad_fidelity.py at iters 150, 300 and 450 (8 x 8 x 1024 validation tokens). Carry ".carry/tiktoken_cache".
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s39f; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name --format=csv,noheader
start=$(date +%s)
timeout 60 python data/builtin/prepare.py --max_mb=64 2>&1 | tail -1
timeout 420 python train.py --n_layer=24 --n_head=8 --n_embd=1024 --batch_size=8 --gradient_accumulation_steps=8 \
    --max_iters=450 --warmup_iters=45 --learning_rate=3e-4 --min_lr=3e-5 --eval_interval=150 --eval_tokens=262144 \
    --out_dir=out_medium > "$logs/train.log" 2>&1 &
pid=$!; last=""
while kill -0 $pid 2>/dev/null; do
    if [ -f out_medium/ckpt.pt ]; then
        ino=$(stat -c %i out_medium/ckpt.pt)
        if [ "$ino" != "$last" ]; then mkdir -p "ckpts/$ino" && ln out_medium/ckpt.pt "ckpts/$ino/ckpt.pt"; last=$ino; fi
    fi
    sleep 1
done
wait $pid; echo "train.py exit $? after $(( $(date +%s) - start )) s"
grep -E "^attention|^model|val loss" "$logs/train.log"; grep -E "^iter (440|300) " "$logs/train.log"
cp out_medium/metrics.jsonl "$logs/" 2>/dev/null
for d in $(ls -t ckpts); do
    timeout 100 python grad_fidelity.py --out_dir="ckpts/$d" --batches=8 --batch_size=8 --arms=sdpa,fp8,fp8_stale \
        --json="$logs/grads_$d.json" > "$logs/grads_$d.txt" 2>&1
    grep -E "at iter|^\| (W_q|W_k|all) " "$logs/grads_$d.txt"; echo "elapsed $(( $(date +%s) - start )) s"
done
tar -C "$logs" -czf "${OUT:-/tmp}/session39_call6.tgz" .

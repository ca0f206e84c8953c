#!/bin/bash
# More short ablations beside results/ablation_4096.sh, each sized to one device call:
#   bash results/ablation_more.sh qknorm   # block 1024 with --qk_norm=True: sdpa, fp8_stale, fp8 (seed
#                                          # 1337), 300 steps as in the README's block-1024 ablation
#   bash results/ablation_more.sh long     # block 1024, no QK-norm, 1000 steps (65.5M tokens per arm,
#                                          # 3.3x the README's block-1024 ablation): sdpa, fp8_stale, fp8
#   bash results/ablation_more.sh medium   # a 354M model (24 layers, n_embd 1024, head dim 128), block
#                                          # 1024, no QK-norm, STEPS (300) steps of 65,536 tokens; two arms
#                                          # per device call (2.2-3.2 min each on an H100): ARMS="fp8
#                                          # fp8_stale", then "fp8_seed2 fp8_stale_seed2", "sdpa sdpa_seed2",
#                                          # "fp8_seed3 fp8_stale_seed3", "sdpa_seed3" (2026-12-05)
# On the device machine (no network there), with carry ".carry/tiktoken_cache" made by
#   mkdir -p .carry/tiktoken_cache && cp ../shared/tiktoken_cache/* .carry/tiktoken_cache/
# Metrics go to $OUT/<mode> (out-ablation links there, so a run cut short still brings back what it wrote).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in qknorm|long|medium) ;; *) echo "usage: $0 qknorm|long|medium" >&2; exit 2 ;; esac
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
out=${OUT:-/tmp/ablation_more}/$mode
nvidia-smi --query-gpu=name --format=csv,noheader
git rev-parse --short HEAD
mkdir -p "$out"
rm -rf out-ablation && ln -s "$out" out-ablation
if [ "$mode" = long ]; then
    timeout 90 python data/builtin/prepare.py --max_mb=192 2>&1 | tail -2
    A="--n_layer=6 --n_head=6 --n_embd=768 --max_iters=1000 --warmup_iters=100 --learning_rate=1e-3 --min_lr=1e-4
       --eval_interval=200 --eval_tokens=262144 --save_checkpoint=False"
    arms=${ARMS:-"sdpa fp8_stale fp8"}; limit=170   # ARMS="sdpa_seed2 fp8_stale_seed2 fp8_seed2" for seed 2024
elif [ "$mode" = medium ]; then
    # 8 x 8 micro-batches instead of 16 x 4: the same tokens per step, within an H100's 80 GB
    timeout 60 python data/builtin/prepare.py --max_mb=64 2>&1 | tail -2
    steps=${STEPS:-300}
    A="--n_layer=24 --n_head=8 --n_embd=1024 --batch_size=8 --gradient_accumulation_steps=8
       --max_iters=$steps --warmup_iters=$((steps / 10)) --learning_rate=3e-4 --min_lr=3e-5
       --eval_interval=100 --eval_tokens=262144 --save_checkpoint=False"
    arms=${ARMS:-"sdpa fp8"}; limit=260
else
    timeout 60 python data/builtin/prepare.py --max_mb=128 2>&1 | tail -2
    A="--n_layer=6 --n_head=6 --n_embd=768 --max_iters=300 --warmup_iters=30 --learning_rate=1e-3 --min_lr=1e-4
       --eval_interval=75 --eval_tokens=262144 --save_checkpoint=False --qk_norm=True"
    arms="sdpa fp8_stale fp8"; limit=160
fi
date +%T
for arm in $arms; do
    timeout $limit python ablation.py run --arms=$arm $A > "$out/$arm.log" 2>&1
    echo "$arm exit $? at $(date +%T)"
    grep -E "^model|val loss|delta monitor" "$out/$arm.log" | tail -3
    grep "tok/s" "$out/$arm.log" | tail -1
done

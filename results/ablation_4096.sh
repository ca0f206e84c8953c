#!/bin/bash
# The stale-delta ablation at context 4096 (README, "Training results": not run yet), sized to fit one
# device call of about 4 minutes: fp8 (matched), fp8_stale and sdpa, 150 steps of 65,536 tokens each
# (4 sequences of 4096 x 4 micro-batches), the 81M model of the block-1024 ablation, the delta
# monitor on (ablation.py turns it on). Run on 2026-12-05 on an H100 as written here, the sdpa arm in a
# second call on the same machine (the session's GPU time was nearly spent); results/ablation_4096/.
# On the device machine (no network there), with carry ".carry/tiktoken_cache" made by
#   mkdir -p .carry/tiktoken_cache && cp ../shared/tiktoken_cache/* .carry/tiktoken_cache/
# run `bash results/ablation_4096.sh`; metrics go to $OUT/abl (out-ablation links there, so a run cut
# short still brings back what it wrote).
set -uo pipefail
cd "$(dirname "$0")/.."
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
out=${OUT:-/tmp/ablation_4096}
nvidia-smi --query-gpu=name --format=csv,noheader
git rev-parse --short HEAD
timeout 60 python data/builtin/prepare.py --max_mb=64 2>&1 | tail -2
mkdir -p "$out/abl"
rm -rf out-ablation && ln -s "$out/abl" out-ablation
A="--n_layer=6 --n_head=6 --n_embd=768 --block_size=4096 --batch_size=4 --max_iters=150 --warmup_iters=15
   --learning_rate=1e-3 --min_lr=1e-4 --eval_interval=50 --eval_tokens=262144 --save_checkpoint=False"
# ARMS="sdpa_seed2 fp8_stale_seed2 fp8_seed2" for the second seed (run with these arguments on 2026-12-05
# at 3f521d9, from a copy of this loop since folded in here; metrics in results/ablation_more/seed2/)
for arm in ${ARMS:-fp8 fp8_stale sdpa}; do
    timeout 140 python ablation.py run --arms=$arm $A > "$out/abl/$arm.log" 2>&1
    echo "$arm exit $?"
    grep -E "^model|val loss" "$out/abl/$arm.log" | tail -5
    grep "tok/s" "$out/abl/$arm.log" | tail -1
done
# the table and plot, where matplotlib is: the arms' metrics.jsonl into out-ablation/<arm>/, then
# python ablation.py plot

#!/bin/bash
# Device call 5: is gpt2's 1.9% (call 1) its architecture or its draw? The same sizes at three more seeds.
# fp8 arms in bf16, 8 x 8 windows. Carry ".carry/tiktoken_cache".
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s39e; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
[ -f data/builtin/meta.json ] && grep -q gpt2 data/builtin/meta.json || python data/builtin/prepare.py --max_mb=128 > "$logs/prepare.log" 2>&1
for seed in 1 2 3; do
  python results/size_probe.py --arms=fp8,fp8_stale --sizes=gpt2,default,12x6x768,gpt2-medium --seed=$seed \
    --batches=8 --batch_size=8 --json="$logs/seed$seed.json" > "$logs/seed$seed.txt" 2>&1
done
for f in "$logs"/seed*.txt; do echo "== $f"; grep -E "^## |^\| (all|W_k) " "$f"; done | grep -v "W_k L[0-9] \|W_k L1[0-9] \|W_k L2[0-2] "
tar -C "$logs" -czf "${OUT:-/tmp}/session39_call5.tgz" .

#!/bin/bash
# Device call 3: why did gpt2 (124M, 12 heads of 64) read about twice the FP8 error of the other sizes?
# It and the default ran micro-batches of 16, the larger sizes 4, 2 and 1 (the same 64 windows).
# Same sizes again with other micro-batches; fp8 arms only. Carry ".carry/tiktoken_cache".
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s39c; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
[ -f data/builtin/meta.json ] && grep -q gpt2 data/builtin/meta.json || python data/builtin/prepare.py --max_mb=128 > "$logs/prepare.log" 2>&1
probe="python results/size_probe.py --arms=fp8,fp8/fp32"
for bs in 16 4 1; do
  $probe --sizes=gpt2,default --batches=$((64 / bs)) --batch_size=$bs --json="$logs/small_bs$bs.json" > "$logs/small_bs$bs.txt" 2>&1
done
$probe --sizes=gpt2-medium --batches=8 --batch_size=8 --json="$logs/medium_bs8.json" > "$logs/medium_bs8.txt" 2>&1
for f in "$logs"/*.txt; do echo "== $f"; grep -E "^## |^\| all " "$f"; done
tar -C "$logs" -czf "${OUT:-/tmp}/session39_call3.tgz" .

#!/bin/bash
# Device call 4: gpt2 (12 layers, 12 heads of 64, width 768) read 1.9% FP8 error at initialization where
# every other size read 1.1-1.3%, whatever the micro-batch (call 3). Which of depth, width and head dim
# does it follow? fp8 and fp8/fp32 arms, 8 x 8 windows. Carry ".carry/tiktoken_cache".
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s39d; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
[ -f data/builtin/meta.json ] && grep -q gpt2 data/builtin/meta.json || python data/builtin/prepare.py --max_mb=128 > "$logs/prepare.log" 2>&1
python results/size_probe.py --arms=fp8,fp8/fp32 --sizes=6x12x768,24x12x768,12x6x768,12x16x1024,12x8x1024,12x12x1152 \
  --batches=8 --batch_size=8 --json="$logs/shapes.json" > "$logs/shapes.txt" 2>&1
grep -E "^## |^\| (all|W_v|W_k) " "$logs/shapes.txt"; tail -3 "$logs/shapes.txt"
tar -C "$logs" -czf "${OUT:-/tmp}/session39_call4.tgz" .

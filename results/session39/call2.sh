#!/bin/bash
# Device call 2: results/size_probe.py at GPT-2 large and XL (smaller micro-batches for the fp32
# reference's memory; the same 64 validation windows). Carry ".carry/tiktoken_cache".
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s39; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -f data/builtin/meta.json ] && grep -q gpt2 data/builtin/meta.json || python data/builtin/prepare.py --max_mb=128 > "$logs/prepare2.log" 2>&1
probe="python results/size_probe.py"
$probe --sizes=gpt2-large --batches=32 --batch_size=2 --json="$logs/size_large.json" > "$logs/size_large.txt" 2>&1
$probe --sizes=gpt2-xl --batches=64 --batch_size=1 --json="$logs/size_xl.json" > "$logs/size_xl.txt" 2>&1
grep -E "^## |^\| (W_k|all) |Error|error" "$logs"/size_*.txt | head -150
tar -C "$logs" -czf "${OUT:-/tmp}/session39_call2.tgz" .

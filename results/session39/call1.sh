#!/bin/bash
# Device call 1: the GPU suites at HEAD (test_attention.py; tests/) in the background, while
# results/size_probe.py measures the step gradient at initialization for the smaller sizes.
# Carry ".carry/tiktoken_cache". Everything to one archive in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s39; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
rm -f data/builtin/*.bin data/builtin/meta.json
python data/builtin/prepare.py --max_mb=128 > "$logs/prepare.log" 2>&1; tail -2 "$logs/prepare.log"
timeout 480 python -m pytest -q test_attention.py > "$logs/tests_attention.log" 2>&1 &
timeout 480 python -m pytest -q tests > "$logs/tests_rest.log" 2>&1 &
probe="python results/size_probe.py"
$probe --sizes=default,gpt2 --batches=4 --batch_size=16 --json="$logs/size_small.json" > "$logs/size_small.txt" 2>&1
$probe --sizes=medium-d128,gpt2-medium --batches=16 --batch_size=4 --json="$logs/size_medium.json" > "$logs/size_medium.txt" 2>&1
wait
grep -E "^## |^\| (W_k|all) " "$logs"/size_*.txt
for f in "$logs"/tests*.log; do echo "== $(basename "$f")"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$f" | tail -8; done
tar -C "$logs" -czf "${OUT:-/tmp}/session39_call1.tgz" .

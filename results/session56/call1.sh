#!/bin/bash
# Session 56, device call 1, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache. Writes straight to $OUT.
# 1. The whole of test_attention.py and the whole of tests/, side by side on the one GPU, under the
#    machine's Triton: neither has run whole on a GPU since session 49 (788ad1e); sessions 51-55 added
#    kernel-side tests and host-side fixes that have run on a GPU only in parts.
# 2. The speed table (ratios to cuDNN and errors against FP32) with the time left: not measured since
#    session 53's H200 run.
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git log -1 --format=%H | tee -a "$OUT/gpu.txt"; git status --short | head -5 | tee -a "$OUT/gpu.txt"
T=${TESTS_LIMIT:-330}
timeout $T python -m pytest -q -p no:cacheprovider test_attention.py > "$OUT/test_attention.txt" 2>&1 &
a=$!
timeout $T python -m pytest -q -p no:cacheprovider tests > "$OUT/tests.txt" 2>&1 &
b=$!
wait $a; echo "test_attention.py rc=$? [$SECONDS s]"; wait $b; echo "tests rc=$? [$SECONDS s]"
for f in test_attention tests; do
    tail -2 "$OUT/$f.txt"; grep -E "^(FAILED|ERROR)" "$OUT/$f.txt" | head
done
left=$((BUDGET - 15 - SECONDS))
if [ $left -gt 90 ]; then
    timeout $left python bench_attention.py --json "$OUT/bench_attention.json" 2>&1 | grep -v -i warn \
        > "$OUT/bench_attention.txt"; tail -14 "$OUT/bench_attention.txt"; echo "[$SECONDS s]"
fi

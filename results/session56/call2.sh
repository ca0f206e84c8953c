#!/bin/bash
# Session 56, device call 2 (after call1.sh, on the same machine if it stays warm). Carry
# .carry/triton-3.8.0.tar.xz and .carry/tiktoken_cache. Writes straight to $OUT.
# 1. On an H200 only: GPU time per kernel (--kernels), the pre-pass's share at N = 16384, which the
#    H100 runs of sessions 41 and 55 left at the target's edge (13.6% and 16.3%).
# 2. The whole of test_attention.py and of tests/ under Triton 3.8.0, what `pip install -r
#    requirements.txt` brings, side by side: last run whole under 3.8 in session 45 (4420e7a).
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu2.txt"
date -u | tee -a "$OUT/gpu2.txt"; git log -1 --format=%H | tee -a "$OUT/gpu2.txt"
r38=(bash results/carry_triton.sh run 3.8.0)
if grep -q H200 "$OUT/gpu2.txt"; then
    timeout 110 python -u bench_attention.py --kernels 2>&1 | grep -v -i warn > "$OUT/kernels.txt"
    tail -45 "$OUT/kernels.txt"; echo "[$SECONDS s]"
fi
"${r38[@]}" python -c "import triton; print(triton.__version__, triton.__file__)" | tee -a "$OUT/gpu2.txt"
T=$((BUDGET - 15 - SECONDS))
timeout $T "${r38[@]}" python -m pytest -q -p no:cacheprovider test_attention.py > "$OUT/test_attention_triton38.txt" 2>&1 &
a=$!
timeout $T "${r38[@]}" python -m pytest -q -p no:cacheprovider tests > "$OUT/tests_triton38.txt" 2>&1 &
b=$!
wait $a; echo "test_attention.py rc=$? [$SECONDS s]"; wait $b; echo "tests rc=$? [$SECONDS s]"
for f in test_attention_triton38 tests_triton38; do
    tail -2 "$OUT/$f.txt"; grep -E "^(FAILED|ERROR)" "$OUT/$f.txt" | head
done

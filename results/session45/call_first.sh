#!/bin/bash
# Session 45, device call 1, on whichever card comes. On an H200: the speed table on the current
# kernels under Triton 3.6 (none on an H200 since step 23), end to end (bench_train.py), then the table under 3.8.
# On an H100: the GPU suites under Triton 3.8 on the current tree (session 44's call was cut off).
# Before the call, here: `bash results/carry_triton.sh build 3.8.0 3.12`. Writes straight to $OUT.
set -uo pipefail
BUDGET=${BUDGET:-560}     # seconds for the whole script: the device time left decides it
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git log -1 --format=%H | tee -a "$OUT/gpu.txt"
r38=(bash results/carry_triton.sh run 3.8.0)
"${r38[@]}" python -c "import triton; print('carried triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if grep -q H200 "$OUT/gpu.txt"; then
    timeout $((BUDGET / 2)) python bench_attention.py --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        > "$OUT/h200_bench_attention.txt"; tail -12 "$OUT/h200_bench_attention.txt"; echo "[$SECONDS s]"
    timeout $((BUDGET / 3)) python bench_train.py --warmup=3 --steps=10 2>&1 | grep -v -i warn > "$OUT/h200_bench_train.txt"
    tail -8 "$OUT/h200_bench_train.txt"; echo "[$SECONDS s]"
    left=$((BUDGET - 20 - SECONDS))
    timeout $left "${r38[@]}" python bench_attention.py --json "$OUT/h200_bench_attention_triton38.json" 2>&1 \
        | grep -v -i warn > "$OUT/h200_bench_attention_triton38.txt"; tail -12 "$OUT/h200_bench_attention_triton38.txt"; echo "[$SECONDS s]"
else
    timeout $((BUDGET - 20 - SECONDS)) "${r38[@]}" python -m pytest -q -p no:cacheprovider test_attention.py > "$OUT/triton38_test_attention.txt" 2>&1 &
    timeout $((BUDGET - 20 - SECONDS)) "${r38[@]}" python -m pytest -q -p no:cacheprovider tests > "$OUT/triton38_tests.txt" 2>&1 &
    wait
    for f in "$OUT"/triton38_test*.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -12; done
fi

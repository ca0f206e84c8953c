#!/bin/bash
# Session 43, device call 1. On an H200: the speed table with step 23's kernels under Triton 3.6 (the
# machine's) and 3.8 (carried; what `pip install -r requirements.txt` brings), none on an H200 since
# step 23. On an H100, where those tables exist: the GPU suite under Triton 3.8 at this commit (last
# run under 3.8 at 9f11385). Before the call, here: `bash results/carry_triton.sh build 3.8.0 3.12`.
# Everything is written straight to $OUT, so a cut run still returns what it printed.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
git log -1 --format='%h %s' | tee -a "$OUT/gpu.txt"
run38() { bash results/carry_triton.sh run 3.8.0 "$@"; }
if grep -q H200 "$OUT/gpu.txt"; then
    timeout 250 python bench_attention.py --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        > "$OUT/h200_bench_attention.txt"; tail -22 "$OUT/h200_bench_attention.txt"
    timeout 290 bash -c 'bash results/carry_triton.sh run 3.8.0 python bench_attention.py --json "$OUT/h200_bench_attention_triton38.json"' 2>&1 \
        | grep -v -i warn > "$OUT/h200_bench_attention_triton38.txt"; tail -22 "$OUT/h200_bench_attention_triton38.txt"
else
    timeout 420 bash -c 'bash results/carry_triton.sh run 3.8.0 python -m pytest -q -x -p no:cacheprovider test_attention.py' \
        > "$OUT/h100_tests_attention_triton38.txt" 2>&1; tail -5 "$OUT/h100_tests_attention_triton38.txt"
    timeout 150 bash -c 'bash results/carry_triton.sh run 3.8.0 python -m pytest -q -p no:cacheprovider tests/test_model.py' \
        > "$OUT/h100_tests_model_triton38.txt" 2>&1; tail -5 "$OUT/h100_tests_model_triton38.txt"
fi

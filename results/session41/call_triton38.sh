#!/bin/bash
# Session 41, device call 6: the speed table under Triton 3.8 (what `pip install -r requirements.txt`
# brings) with step 23's flattened grid, then GPU time per kernel (the pre-pass share). Before the call,
# here: `bash results/carry_triton.sh build 3.8.0 3.12`; the call carries .carry/triton-3.8.0.tar.xz.
# Writes straight to $OUT, so a cut run still returns what it printed.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
run38() { bash results/carry_triton.sh run 3.8.0 "$@"; }
run38 python -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
timeout 230 bash -c 'bash results/carry_triton.sh run 3.8.0 python bench_attention.py --json "$OUT/bench_attention_triton38.json"' \
    > "$OUT/bench_attention_triton38.txt" 2>&1
grep -v -i warn "$OUT/bench_attention_triton38.txt" | tail -20
timeout 80 bash -c 'bash results/carry_triton.sh run 3.8.0 python bench_attention.py --kernels --shapes 4x16x4096x128 2x16x8192x128 1x16x16384x128' \
    > "$OUT/kernels_triton38.txt" 2>&1
grep "pre-pass" "$OUT/kernels_triton38.txt"

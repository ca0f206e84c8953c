#!/bin/bash
# Session 44, device call 1. On any card: bench_train.py's forced SDPA arms in one compiled process
# (the check profiles one step and stops if the backend's op did not run; until now checked on a CPU
# with MATH and flash only), and bench_attention.py's strict --json. On an H200: step 23's speed table
# under Triton 3.6 and 3.8 (none on an H200 since step 23). On an H100: end to end under Triton 3.8.
# Before the call, here: `bash results/carry_triton.sh build 3.8.0 3.12`. Writes straight to $OUT.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git log -1 --format=%H | tee -a "$OUT/gpu.txt"
timeout 150 python bench_train.py --attentions=sdpa,sdpa_cudnn,sdpa_flash,fp8 --block_sizes=1024 --n_layer=2 \
    --warmup=3 --steps=10 > "$OUT/bench_train_forced.txt" 2>&1; echo "rc $?" >> "$OUT/bench_train_forced.txt"
grep -v -i warn "$OUT/bench_train_forced.txt" | tail -8
timeout 60 python bench_attention.py --shapes 4x16x4096x128 --json "$OUT/strict.json" > "$OUT/bench_strict.txt" 2>&1
python -c "import json,sys; r=json.load(open(sys.argv[1])); print('strict json rows', len(r), sorted(r[0]))" "$OUT/strict.json" 2>&1 | tail -1
if grep -q H200 "$OUT/gpu.txt"; then
    timeout 200 python bench_attention.py --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        > "$OUT/h200_bench_attention.txt"; tail -9 "$OUT/h200_bench_attention.txt"
    timeout 200 bash -c 'bash results/carry_triton.sh run 3.8.0 python bench_attention.py --json "$OUT/h200_bench_attention_triton38.json"' 2>&1 \
        | grep -v -i warn > "$OUT/h200_bench_attention_triton38.txt"; tail -9 "$OUT/h200_bench_attention_triton38.txt"
else
    timeout 300 bash -c 'bash results/carry_triton.sh run 3.8.0 python bench_train.py --warmup=3 --steps=10' 2>&1 \
        | grep -v -i warn > "$OUT/h100_bench_train_triton38.txt"; tail -8 "$OUT/h100_bench_train_triton38.txt"
fi

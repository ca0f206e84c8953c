#!/bin/bash
# Session 43, device call 2. On an H200: first the speed table with step 23's kernels under Triton 3.6
# and 3.8 (none on an H200 since step 23). Then, on any card: bench_train.py's forced SDPA arms, whose
# new check profiles a step and stops if the backend's op did not run (checked on a CPU with MATH and
# flash only), in one process, compiled, so that the second would have taken the first's cached graph
# before the fix; and bench_attention.py's strict --json.
# Before the call, here: `bash results/carry_triton.sh build 3.8.0 3.12`. Writes straight to $OUT.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
if grep -q H200 "$OUT/gpu.txt"; then
    timeout 230 python bench_attention.py --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        > "$OUT/h200_bench_attention.txt"; tail -9 "$OUT/h200_bench_attention.txt"
    timeout 250 bash -c 'bash results/carry_triton.sh run 3.8.0 python bench_attention.py --json "$OUT/h200_bench_attention_triton38.json"' 2>&1 \
        | grep -v -i warn > "$OUT/h200_bench_attention_triton38.txt"; tail -9 "$OUT/h200_bench_attention_triton38.txt"
fi
timeout 100 python bench_attention.py --shapes 4x16x4096x128 --json "$OUT/strict.json" > "$OUT/bench_strict.txt" 2>&1
python -c "import json,sys; r=json.load(open(sys.argv[1])); print('strict json rows', len(r), sorted(r[0]))" "$OUT/strict.json" 2>&1 | tail -1
timeout 200 python bench_train.py --attentions=sdpa,sdpa_cudnn,sdpa_flash,fp8 --block_sizes=1024 --n_layer=4 \
    --warmup=3 --steps=10 > "$OUT/bench_train_forced.txt" 2>&1; echo "rc $?" >> "$OUT/bench_train_forced.txt"
grep -v -i warn "$OUT/bench_train_forced.txt" | tail -8

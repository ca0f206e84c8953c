#!/bin/bash
# Session 43, device call 3 (about 480 s of device time left): on any card, bench_train.py's forced SDPA
# arms in one process, compiled (the new check profiles a step and stops if the backend's op did not
# run), and bench_attention.py's strict --json; then, on an H200, the speed table under Triton 3.8.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
timeout 150 python bench_train.py --attentions=sdpa,sdpa_cudnn,sdpa_flash,fp8 --block_sizes=1024 --n_layer=2 \
    --warmup=3 --steps=10 > "$OUT/bench_train_forced.txt" 2>&1; echo "rc $?" >> "$OUT/bench_train_forced.txt"
grep -v -i warn "$OUT/bench_train_forced.txt" | tail -8
timeout 60 python bench_attention.py --shapes 4x16x4096x128 --json "$OUT/strict.json" > "$OUT/bench_strict.txt" 2>&1
python -c "import json,sys; r=json.load(open(sys.argv[1])); print('strict json rows', len(r), sorted(r[0]))" "$OUT/strict.json" 2>&1 | tail -1
if grep -q H200 "$OUT/gpu.txt"; then
    timeout 230 bash -c 'bash results/carry_triton.sh run 3.8.0 python bench_attention.py --json "$OUT/h200_bench_attention_triton38.json"' 2>&1 \
        | grep -v -i warn > "$OUT/h200_bench_attention_triton38.txt"; tail -9 "$OUT/h200_bench_attention_triton38.txt"
fi

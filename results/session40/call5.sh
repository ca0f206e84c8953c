#!/bin/bash
# Session 40, device call 5: the speed table and end-to-end tokens/s at main after the launch order
# (merge of branch lpt-order). Outputs one archive in $OUT.
set -uo pipefail
logs=/tmp/s40c5; mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
timeout 330 python bench_attention.py --json "$logs/bench_attention.json" 2>&1 | tee "$logs/bench_attention.txt"
timeout 230 python bench_train.py --warmup=3 --steps=10 2>&1 | tee "$logs/bench_train.txt"
tar -C "$logs" -czf "${OUT:-/tmp}/s40c5.tgz" .

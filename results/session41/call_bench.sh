#!/bin/bash
# Session 41, device call 1: the speed table and end-to-end tokens/s at main with step 23's flattened grid
# (the README's tables), then GPU time per kernel against the same code with one head per section (rev/g1:
# SECTION_BYTES = 0, MIN_SECTION = 1, i.e. main's start order before step 23) at the long shapes, where the
# tail model says sections buy under 1%. Before the call, here:
#   mkdir -p rev/g1; cp attention_fp8.py attention_fp8_hopper.py rev/g1/
#   sed -i 's/^SECTION_BYTES = .*/SECTION_BYTES = 0/; s/^MIN_SECTION = .*/MIN_SECTION = 1/' rev/g1/attention_fp8.py
# Outputs one archive in $OUT.
set -uo pipefail
logs=/tmp/s41bench; mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
date -u | tee -a "$logs/gpu.txt"
timeout 280 python bench_attention.py --json "$logs/bench_attention.json" 2>&1 | tee "$logs/bench_attention.txt"
timeout 170 python bench_train.py --warmup=3 --steps=10 2>&1 | tee "$logs/bench_train.txt"
timeout 120 python bench_attention.py --compare rev/g1 --kernels --shapes 2x16x8192x128 1x16x16384x128 2>&1 \
    | grep -v Warn | tee "$logs/g1_long.txt"
tar -C "$logs" -czf "${OUT:-/tmp}/s41bench.tgz" .

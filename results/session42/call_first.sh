#!/bin/bash
# Session 42, device call 1: the unrolled Gluon forward (rev/unroll2, results/session41/call_unroll2.sh)
# first, then, when the card is an H200, the speed table on step 23's grid (none on an H200 since step 23).
# Everything is written straight to $OUT, so a cut run still returns what it printed.
set -uo pipefail
bash results/session41/call_unroll2.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    date -u | tee "$OUT/h200_date.txt"
    timeout 280 python bench_attention.py --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        | tee "$OUT/h200_bench_attention.txt" | tail -25
fi

#!/bin/bash
# Session 44: the GPU suites on the final tree, side by side on the one GPU, under the machine's Triton
# (3.6) or, with `38`, under the carried 3.8 (`bash results/carry_triton.sh build 3.8.0 3.12` here first).
#   bash results/session44/call_suites.sh [38]
set -uo pipefail
run=(); tag=triton36
if [ "${1:-}" = 38 ]; then run=(bash results/carry_triton.sh run 3.8.0); tag=triton38; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu_$tag.txt"
"${run[@]}" python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu_$tag.txt"
date -u | tee -a "$OUT/gpu_$tag.txt"
"${run[@]}" true    # extract the carried Triton once, before two processes want it
timeout 540 "${run[@]}" python -m pytest -q -p no:cacheprovider test_attention.py > "$OUT/${tag}_test_attention.txt" 2>&1 &
timeout 540 "${run[@]}" python -m pytest -q -p no:cacheprovider tests > "$OUT/${tag}_tests.txt" 2>&1 &
wait
for f in "$OUT"/${tag}_test*.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -12; done

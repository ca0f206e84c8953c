#!/bin/bash
# Session 46, device call 3 (little device time left): on an H200, the speed table after step 23 under
# Triton 3.6 alone; on an H100, call2.sh's halves from CUDA graphs alone.
set -uo pipefail
BUDGET=${BUDGET:-240}
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git log -1 --format=%H | tee -a "$OUT/gpu.txt"
if grep -q H200 "$OUT/gpu.txt"; then
    timeout $((BUDGET - 10)) python -u bench_attention.py --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        | tee "$OUT/h200_bench_attention.txt"; echo "[$SECONDS s]"
else
    timeout $((BUDGET - 10 - SECONDS)) python -u results/session46/halves_graphs.py 2>&1 | grep -v -i warn \
        | tee "$OUT/halves_graphs_h100.txt"; echo "[$SECONDS s]"
fi

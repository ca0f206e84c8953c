#!/bin/bash
# Session 46, device call 2, on whichever card comes. On an H200: as call_first.sh (the speed table
# after step 23 under Triton 3.6, end to end, the table under 3.8). On an H100: the backward's halves
# at the small shapes replayed from CUDA graphs (results/session46/halves_graphs.py), then their GPU
# time under Triton 3.8 (carried: `bash results/carry_triton.sh build 3.8.0 3.12` here first).
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if grep -q H200 "$OUT/gpu.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh; exit
fi
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git log -1 --format=%H | tee -a "$OUT/gpu.txt"
r38=(bash results/carry_triton.sh run 3.8.0)
for v in onepass:'float("inf")' halves:0; do
    d=/tmp/rev/${v%%:*}; mkdir -p $d; cp attention_fp8.py attention_fp8_hopper.py $d/
    sed -i "s/^SPLIT_BYTES = .*/SPLIT_BYTES = ${v#*:}/" $d/attention_fp8.py; grep -H "^SPLIT_BYTES" $d/attention_fp8.py
done
timeout $((BUDGET / 3)) python -u results/session46/halves_graphs.py 2>&1 | grep -v -i warn | tee "$OUT/halves_graphs_h100.txt"
echo "[$SECONDS s]"
timeout $((BUDGET - 15 - SECONDS)) "${r38[@]}" python -u bench_attention.py --compare /tmp/rev/onepass /tmp/rev/halves \
    --kernels --rounds 5 --shapes 8x16x1024x64 4x16x2048x128 4x16x4096x64 4x16x4096x128 2>&1 | grep -v -i warn \
    | tee "$OUT/halves_kernels_triton38_h100.txt"; echo "[$SECONDS s]"

#!/bin/bash
# Session 46, device call 1, on whichever card comes.
# On an H200: the speed table on the current kernels under Triton 3.6 (none on an H200 since step 23),
# end to end (bench_train.py), then the table under 3.8.
# On an H100: what the backward's halves of the heads cost after step 23 (causal launches now start
# longest tile first, so a half no longer ends on its own causal tail): peak memory one pass / halves /
# cuDNN, GPU time per kernel and wall time, one pass vs halves vs the default (SPLIT_BYTES).
# Before the call, here: `bash results/carry_triton.sh build 3.8.0 3.12`. Writes straight to $OUT.
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git log -1 --format=%H | tee -a "$OUT/gpu.txt"
r38=(bash results/carry_triton.sh run 3.8.0)
# one pass always / halves always: copies of the current kernel files with SPLIT_BYTES changed
for v in onepass:'float("inf")' halves:0; do
    d=/tmp/rev/${v%%:*}; mkdir -p $d; cp attention_fp8.py attention_fp8_hopper.py $d/
    sed -i "s/^SPLIT_BYTES = .*/SPLIT_BYTES = ${v#*:}/" $d/attention_fp8.py; grep -H "^SPLIT_BYTES" $d/attention_fp8.py
done
halves() {   # $1: time left for it
    local t0=$SECONDS
    timeout 60 python -u results/session46/halves_peak.py 2>&1 | grep -v -i warn | tee "$OUT/halves_peak.txt"; echo "[$SECONDS s]"
    local left=$(( ($1 - (SECONDS - t0)) * 3 / 5 ))
    timeout $left python -u bench_attention.py --compare /tmp/rev/onepass /tmp/rev/halves --kernels --rounds 5 2>&1 \
        | grep -v -i warn | tee "$OUT/halves_kernels.txt"; echo "[$SECONDS s]"
    left=$(( $1 - (SECONDS - t0) - 5 ))
    timeout $left python -u bench_attention.py --compare /tmp/rev/onepass /tmp/rev/halves --rounds 3 2>&1 \
        | grep -v -i warn | tee "$OUT/halves_wall.txt"; echo "[$SECONDS s]"
}
if grep -q H200 "$OUT/gpu.txt"; then
    timeout $((BUDGET * 2 / 5)) python bench_attention.py --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        > "$OUT/h200_bench_attention.txt"; tail -12 "$OUT/h200_bench_attention.txt"; echo "[$SECONDS s]"
    timeout $((BUDGET / 4)) python bench_train.py --warmup=3 --steps=10 2>&1 | grep -v -i warn > "$OUT/h200_bench_train.txt"
    tail -8 "$OUT/h200_bench_train.txt"; echo "[$SECONDS s]"
    left=$((BUDGET - 20 - SECONDS))
    timeout $left "${r38[@]}" python bench_attention.py --json "$OUT/h200_bench_attention_triton38.json" 2>&1 \
        | grep -v -i warn > "$OUT/h200_bench_attention_triton38.txt"; tail -12 "$OUT/h200_bench_attention_triton38.txt"; echo "[$SECONDS s]"
else
    halves $((BUDGET - 15 - SECONDS))
fi

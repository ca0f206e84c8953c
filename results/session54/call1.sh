#!/bin/bash
# Session 54, device call 1, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache. Writes straight to $OUT.
# Session 54 got no GPU; this script ran in session 55 (BUDGET=400, an H100): results/session55/call1/.
# 1. Session 53's later tests, run on the CPU only so far: the second mutant hunt's tests (the Gluon
#    decision, compute capability, tilings refused, quantize's padding tile, halves, NaN-filled buffers
#    at N = 40, the span checks) and test_torch_compile_fullgraph[full-scale-0.05] with inductor; the
#    compiled-first-call probe fix. Under the machine's Triton, then under 3.8.
# 2. GPU time per kernel after step 23 (--kernels: the pre-pass's share of GPU time), machine's Triton.
# 3. The whole of test_attention.py with what time is left.
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git log -1 --format=%H | tee -a "$OUT/gpu.txt"; git status --short | head -5 | tee -a "$OUT/gpu.txt"
r38=(bash results/carry_triton.sh run 3.8.0)
K="torch_compile or compute_capability or only_on_hopper or scale_tiles_fit or inconsistent_tiling or padding_tile or halves or did_not or bounds_are_exact or compiled_first"
timeout 150 python -m pytest -v -p no:cacheprovider test_attention.py tests/test_host_code.py -k "$K" \
    > "$OUT/hunt2_tests.txt" 2>&1
tail -3 "$OUT/hunt2_tests.txt"; grep -E "FAILED|ERROR" "$OUT/hunt2_tests.txt" | head; echo "[$SECONDS s]"
timeout 110 python -u bench_attention.py --kernels 2>&1 | grep -v -i warn > "$OUT/kernels.txt"
cat "$OUT/kernels.txt" | tail -45; echo "[$SECONDS s]"
timeout 170 "${r38[@]}" python -m pytest -v -p no:cacheprovider test_attention.py tests/test_host_code.py -k "$K" \
    > "$OUT/hunt2_tests_triton38.txt" 2>&1
tail -3 "$OUT/hunt2_tests_triton38.txt"; grep -E "FAILED|ERROR" "$OUT/hunt2_tests_triton38.txt" | head; echo "[$SECONDS s]"
left=$((BUDGET - 15 - SECONDS))
if [ $left -gt 60 ]; then
    timeout $left python -m pytest -q -p no:cacheprovider test_attention.py --deselect "test_attention.py::test_torch_compile_fullgraph" \
        > "$OUT/test_attention.txt" 2>&1
    tail -3 "$OUT/test_attention.txt"; echo "[$SECONDS s]"
fi

#!/bin/bash
# Session 52, device call 1, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache.
# On an H200: the speed table after step 23 (results/session46/call_first.sh's H200 branch).
# On an H100: session 51's new kernel tests first (dO layouts, NaN-filled buffers, N = 0, bool sm_scale,
# numpy bool causal, the transposed copy), which ran only under the interpreter; then test_attention.py
# and tests/ side by side, whole if the time allows.
set -uo pipefail
BUDGET=${BUDGET:-590}
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/card.txt"
date -u | tee -a "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh; exit
fi
timeout 150 python -m pytest -v -p no:cacheprovider tests/test_host_code.py test_attention.py \
    -k "layout_of_do or reads_memory_it_did_not or sm_scale_may_not or numpy_bool or transposed_copy or refuses or empty" \
    > "$OUT/new_tests.txt" 2>&1
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/new_tests.txt" | tail -30; echo "[$SECONDS s]"
left=$((BUDGET - 10 - SECONDS))
timeout $left python -m pytest -q -p no:cacheprovider -rs test_attention.py > "$OUT/test_attention.txt" 2>&1 &
timeout $left python -m pytest -q -p no:cacheprovider -rs tests > "$OUT/tests.txt" 2>&1 &
wait
for f in "$OUT"/test_attention.txt "$OUT"/tests.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -12; done
grep -E "^SKIPPED" "$OUT/tests.txt" "$OUT/test_attention.txt" | head -14
echo "[$SECONDS s]"

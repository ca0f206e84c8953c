#!/bin/bash
# Session 51, device call 1, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache.
# On an H200: the speed table after step 23 (results/session46/call_first.sh's H200 branch).
# On an H100: this session's tree on a GPU: test_attention.py and tests/ side by side, whole (session
# 50's last GPU run of them was stopped at 310 s for want of device time), then the NCCL test verbose.
set -uo pipefail
BUDGET=${BUDGET:-570}
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/card.txt"
date -u | tee -a "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh; exit
fi
timeout $((BUDGET - 40)) python -m pytest -q -p no:cacheprovider -rs test_attention.py > "$OUT/test_attention.txt" 2>&1 &
timeout $((BUDGET - 40)) python -m pytest -q -p no:cacheprovider -rs tests > "$OUT/tests.txt" 2>&1 &
wait
for f in "$OUT"/test_attention.txt "$OUT"/tests.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -12; done
grep -E "^SKIPPED" "$OUT/tests.txt" "$OUT/test_attention.txt" | head -14
echo "[$SECONDS s]"
timeout $((BUDGET - 5 - SECONDS)) python -m pytest -v -p no:cacheprovider tests/test_train.py -k nccl 2>&1 | grep -E "PASSED|FAILED|SKIPPED|passed|failed" | tail -3
echo "[$SECONDS s]"

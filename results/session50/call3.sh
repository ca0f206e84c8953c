#!/bin/bash
# Session 50, device call 3, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache.
# On an H200: the speed table after step 23 (results/session46/call_first.sh's H200 branch).
# On an H100: the session's last tree on a GPU: test_attention.py and tests/ side by side (call 2's
# two failures were tests that assumed a CPU machine; fixed since), and the NCCL test by name, verbose.
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/card.txt"
date -u | tee -a "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh; exit
fi
timeout $((BUDGET - 20)) python -m pytest -q -p no:cacheprovider test_attention.py > "$OUT/test_attention.txt" 2>&1 &
timeout $((BUDGET - 20)) python -m pytest -q -p no:cacheprovider -rs tests > "$OUT/tests.txt" 2>&1 &
wait
for f in "$OUT"/test_attention.txt "$OUT"/tests.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -12; done
grep -E "^SKIPPED" "$OUT/tests.txt" | head -12
timeout 60 python -m pytest -v -p no:cacheprovider tests/test_train.py -k nccl 2>&1 | grep -E "PASSED|FAILED|SKIPPED|passed|failed" | tail -3
echo "[$SECONDS s]"

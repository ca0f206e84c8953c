#!/bin/bash
# Session 48, device call 2, on whichever card comes.
# On an H200: the speed table after step 23 (none on an H200 yet), end to end, and the table under
# Triton 3.8: results/session46/call_first.sh's H200 branch.
# On an H100: test_attention.py with the Gluon kernels at every size and head dim
# (FP8_GLUON_EVERYWHERE=1), under the machine's Triton (3.6) and under 3.8 side by side; the last
# such run was at aca102b, before step 23 (README, "Where the tests run").
# Before the call, here: `bash results/carry_triton.sh build 3.8.0 3.12` (.carry/triton-3.8.0.tar.xz).
set -uo pipefail
BUDGET=${BUDGET:-560}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
git log -1 --format=%H | tee -a "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh; exit
fi
r38=(bash results/carry_triton.sh run 3.8.0)
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/card.txt"
"${r38[@]}" python -c "import triton; print('carried triton', triton.__version__)" | tee -a "$OUT/card.txt"
date -u | tee -a "$OUT/card.txt"
export FP8_GLUON_EVERYWHERE=1
timeout $((BUDGET - 20)) python -m pytest -q -p no:cacheprovider test_attention.py > "$OUT/gluon_everywhere_triton36.txt" 2>&1 &
timeout $((BUDGET - 20)) "${r38[@]}" python -m pytest -q -p no:cacheprovider test_attention.py > "$OUT/gluon_everywhere_triton38.txt" 2>&1 &
wait
for f in "$OUT"/gluon_everywhere_*.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -12; done

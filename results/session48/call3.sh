#!/bin/bash
# Session 48, device call 3 (little device time left), on whichever card comes.
# On an H200: the speed table after step 23 (none on an H200 yet), Triton 3.6, nothing else.
# On an H100: test_attention.py with the Gluon kernels at every size and head dim (FP8_GLUON_EVERYWHERE=1)
# under the machine's Triton (3.6); the last such run was at aca102b, before step 23.
set -uo pipefail
BUDGET=${BUDGET:-400}
SECONDS=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/card.txt"
git log -1 --format=%H | tee -a "$OUT/card.txt"; date -u | tee -a "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt"; then
    shapes=()     # under 400 s, the shapes of the targets only
    if [ "$BUDGET" -lt 400 ]; then shapes=(--shapes 4x16x4096x128 2x16x8192x128 1x16x16384x128 4x16x4096x64); fi
    timeout $((BUDGET - 15)) python bench_attention.py "${shapes[@]}" --json "$OUT/h200_bench_attention.json" 2>&1 | grep -v -i warn \
        > "$OUT/h200_bench_attention.txt"; tail -14 "$OUT/h200_bench_attention.txt"; echo "[$SECONDS s]"
else
    select=()     # under 400 s, the tests that run kernels on the GPU and compare them
    if [ "$BUDGET" -lt 400 ]; then select=(-k "against_fp32 or gpu or hopper or zero or weighted or dv_is or invariant or launch_order"); fi
    FP8_GLUON_EVERYWHERE=1 timeout $((BUDGET - 15)) python -m pytest -q -p no:cacheprovider test_attention.py "${select[@]}" \
        > "$OUT/gluon_everywhere_triton36.txt" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gluon_everywhere_triton36.txt" | tail -12; echo "[$SECONDS s]"
fi

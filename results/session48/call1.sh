#!/bin/bash
# Session 48, device call 1, on whichever card comes.
# On an H200: the speed table after step 23 (none on an H200 yet), end to end, and the table under
# Triton 3.8: results/session46/call_first.sh's H200 branch.
# On an H100: both GPU suites on this tree under the machine's Triton, side by side
# (results/session44/call_suites.sh), the first full GPU run since session 45.
# Before the call, here: `bash results/carry_triton.sh build 3.8.0 3.12` (.carry/triton-3.8.0.tar.xz).
set -uo pipefail
BUDGET=${BUDGET:-560}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
git log -1 --format=%H | tee -a "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh
else
    bash results/session44/call_suites.sh
fi

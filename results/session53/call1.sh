#!/bin/bash
# Session 53, device call 1, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache.
# On an H200: the speed table after step 23 (results/session46/call_first.sh's H200 branch).
# On an H100: session 52's later host-code changes (model.py's attention property, through which
# torch.compile(fullgraph=True) with inductor and the fp8 kernel runs on a GPU only; generate's prompt
# check; the GPTConfig default; configurator.run_script): results/session52/call3.sh, after this
# session's four precision tests.
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/card0.txt"
if grep -q H200 "$OUT/card0.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh; exit
fi
# this session's four precision tests, Triton kernels and then the Gluon ones at every size
K="small_gradient or score_low or fp16_outputs or attention_sink"
timeout 100 python -m pytest -v -p no:cacheprovider test_attention.py -k "$K" > "$OUT/new_tests.txt" 2>&1
FP8_GLUON_EVERYWHERE=1 timeout 100 python -m pytest -v -p no:cacheprovider test_attention.py -k "$K" \
    > "$OUT/new_tests_gluon.txt" 2>&1
grep -h -E "PASSED|FAILED|Error|passed|failed" "$OUT"/new_tests*.txt | tail -16; echo "[$SECONDS s]"
LIMIT=$((BUDGET - 20 - SECONDS)) bash results/session52/call3.sh

#!/bin/bash
# Session 52, device call 3 (short: the device time left): this session's later host-code changes on a GPU.
# model.py's attention switch became a property (torch.compile(fullgraph=True) with the fp8 kernel and
# inductor runs through it on a GPU only), generate's prompt check, configurator.run_script, the
# GPTConfig default. Carry .carry/tiktoken_cache.
set -uo pipefail
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/card.txt"
timeout ${LIMIT:-230} python -m pytest -q -p no:cacheprovider -rs tests/test_model.py tests/test_sample.py \
    tests/test_host_code.py > "$OUT/tests.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.txt" | tail -12; echo "[$SECONDS s]"

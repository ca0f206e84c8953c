#!/bin/bash
# Session 50, device call 2, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache.
# On an H200: the speed table after step 23 (results/session46/call_first.sh's H200 branch).
# On an H100: this session's changes on a GPU. tests/ whole (the trainer's, model's, data's and the
# bench scripts' tests, with the new NCCL test of train.py under torchrun), then, with the GPU to
# themselves, bench_attention.py --json at one shape (the new settings block) and bench_train.py with
# an auto arm (its row now names the path it ran).
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
timeout 330 python -m pytest -q -p no:cacheprovider tests > "$OUT/tests.txt" 2>&1
echo "tests rc $? at $SECONDS s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.txt" | tail -12
timeout 60 python bench_attention.py --shapes 4x16x4096x128 --json "$OUT/bench_one.json" > "$OUT/bench_one.txt" 2>&1
echo "bench_attention rc $? at $SECONDS s"; tail -6 "$OUT/bench_one.txt"; head -c 600 "$OUT/bench_one.json"; echo
timeout $((BUDGET - 10 - SECONDS)) python bench_train.py --attentions=auto,sdpa,fp8 --block_sizes=1024 --n_layer=2 \
    --warmup=2 --steps=10 > "$OUT/bench_train_auto.txt" 2>&1
echo "bench_train rc $? at $SECONDS s"; grep -v -i warn "$OUT/bench_train_auto.txt" | tail -8

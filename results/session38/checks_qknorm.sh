#!/bin/bash
# One device call: the GPU suites at HEAD under the machine's Triton (test_attention.py; tests/), in the
# background, while `python train.py --qk_norm=True --out_dir=out_qk` trains and grad_fidelity.py measures
# its weights at initialization and at iter 1000 (timings in this call are shared with the tests: not
# quoted). Carry ".carry/tiktoken_cache".
# Everything to one archive in $OUT (the device tool returns only a few files).
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s38; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
git log --oneline -1
timeout 500 python -m pytest -q test_attention.py > "$logs/tests_attention.log" 2>&1 &
timeout 500 python -m pytest -q tests > "$logs/tests_rest.log" 2>&1 &
python train.py --qk_norm=True --out_dir=out_qk > "$logs/train_qk.log" 2>&1
grep -E "^attention|^model|val loss" "$logs/train_qk.log"
fid="python grad_fidelity.py --batches=4 --batch_size=16"
$fid --out_dir=out_qk --json="$logs/grads_qk_1000.json" > "$logs/grads_qk_1000.txt" 2>&1; cat "$logs/grads_qk_1000.txt"
$fid --out_dir=out_qk --init=True --json="$logs/grads_qk_init.json" > "$logs/grads_qk_init.txt" 2>&1; cat "$logs/grads_qk_init.txt"
wait
for f in "$logs"/tests*.log; do echo "== $(basename "$f")"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$f" | tail -8; done
tar -C "$logs" -czf "${OUT:-/tmp}/session38_checks_qknorm.tgz" .

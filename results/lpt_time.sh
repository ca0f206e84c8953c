#!/bin/bash
# Time the launch order of branch lpt-order (SPEED.md, "next to time: the launch order") against main's
# kernels, and against the branch's own kernels with one head at a time (G = 1: main's start order, the
# branch's code; its Triton kernels spill 8-80 bytes more than main's, so this separates the two).
#   bash results/lpt_time.sh prepare     # here, on branch lpt-order: writes rev/main and rev/g1 (untracked)
#   bash results/lpt_time.sh kernels     # device call 1: GPU time per kernel (bench_attention.py --kernels)
#   bash results/lpt_time.sh wall        # device call 2: wall time, then the GPU suite of test_attention.py
# Outputs to $OUT/lpt (one archive).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
    mkdir -p rev/main rev/g1
    for f in attention_fp8.py attention_fp8_hopper.py; do git show "main:$f" > "rev/main/$f"; cp "$f" rev/g1/; done
    sed -i 's/^SECTION_BYTES = .*/SECTION_BYTES = 0/; s/^MIN_SECTION = .*/MIN_SECTION = 1/' rev/g1/attention_fp8.py
    # a revision's Gluon file calls the current attention_fp8's _grid: give it one head at a time itself
    sed -i 's/attention_fp8\._grid(/_one_head_at_a_time(/' rev/g1/attention_fp8_hopper.py
    printf '\n\ndef _one_head_at_a_time(tiles, heads, bytes_per_head, causal):\n    return 1, tiles, heads\n' \
        >> rev/g1/attention_fp8_hopper.py
    grep -n "^SECTION_BYTES\|^MIN_SECTION" rev/g1/attention_fp8.py; grep -c _one_head_at_a_time rev/g1/attention_fp8_hopper.py
    exit 0 ;;
kernels|wall) ;;
*) echo "usage: $0 prepare|kernels|wall" >&2; exit 2 ;;
esac
[ -d rev/main ] && [ -d rev/g1 ] || { echo "run '$0 prepare' first" >&2; exit 2; }
logs=/tmp/lpt; mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$1" = kernels ]; then
    timeout 560 python bench_attention.py --compare rev/main rev/g1 --kernels 2>&1 | tee "$logs/kernels.txt"
else
    timeout 300 python bench_attention.py --compare rev/main rev/g1 2>&1 | tee "$logs/wall.txt"
    timeout 280 python -m pytest -q test_attention.py > "$logs/tests.txt" 2>&1; tail -3 "$logs/tests.txt"
fi
tar -C "$logs" -czf "${OUT:-/tmp}/lpt_$1.tgz" .

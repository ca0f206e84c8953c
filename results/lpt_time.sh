#!/bin/bash
# The record of how step 23 was timed (SPEED.md), for the grid (G, tiles, heads / G) of bab18b6. Since
# the grid became (G * tiles, heads / G) with G a constexpr, the rev/g1 and section copies `prepare` makes
# no longer run (their Gluon files patch in a 3-axis _grid); `python bench_attention.py --compare DIR
# --kernels` against a revision directory times any two revisions.
#
# Time the launch order of branch lpt-order (SPEED.md, "next to time: the launch order") against main's
# kernels, and against the branch's own kernels with one head at a time (G = 1: main's start order, the
# branch's code; its Triton kernels spill 96-168 bytes more than main's under Triton 3.6, 8-80 under
# 3.8, so this separates the two).
#   bash results/lpt_time.sh prepare     # here, on branch lpt-order: writes rev/main and rev/g1 (untracked)
#   bash results/lpt_time.sh kernels     # device call 1: GPU time per kernel (bench_attention.py --kernels)
#   bash results/lpt_time.sh wall        # device call 2: wall time against main and G = 1
#   bash results/lpt_time.sh tests       # device call 3: test_attention.py and tests/ on the GPU (about 5 min)
#   bash results/lpt_time.sh sections    # device call 4: GPU time per kernel at SECTION_BYTES 4, 8, 32, 64 MiB
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
    for mib in 4 8 32 64; do    # other section sizes; the Gluon copy gets a _grid of its own size too
        mkdir -p "rev/s$mib"; cp attention_fp8.py attention_fp8_hopper.py "rev/s$mib/"
        sed -i "s/^SECTION_BYTES = .*/SECTION_BYTES = $mib * 2**20/" "rev/s$mib/attention_fp8.py"
        sed -i 's/attention_fp8\._grid(/_grid_here(/' "rev/s$mib/attention_fp8_hopper.py"
        printf '\n\ndef _grid_here(tiles, heads, bytes_per_head, causal):\n    G = attention_fp8._largest_divisor(heads, max(4, %d * 2**20 // bytes_per_head)) if causal else 1\n    return G, tiles, heads // G\n' \
            "$mib" >> "rev/s$mib/attention_fp8_hopper.py"
    done
    exit 0 ;;
kernels|wall|tests|sections) ;;
*) echo "usage: $0 prepare|kernels|wall|tests|sections" >&2; exit 2 ;;
esac
[ -d rev/main ] && [ -d rev/g1 ] || { echo "run '$0 prepare' first" >&2; exit 2; }
logs=/tmp/lpt; mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$1" = kernels ]; then
    timeout 560 python bench_attention.py --compare rev/main rev/g1 --kernels 2>&1 | tee "$logs/kernels.txt"
elif [ "$1" = sections ]; then
    timeout 560 python bench_attention.py --compare rev/s4 rev/s8 rev/s32 rev/s64 --kernels 2>&1 | tee "$logs/sections.txt"
elif [ "$1" = wall ]; then
    timeout 300 python bench_attention.py --compare rev/main rev/g1 2>&1 | tee "$logs/wall.txt"
else    # about 5 minutes each, together
    timeout 560 python -m pytest -q test_attention.py > "$logs/tests_attention.log" 2>&1 &
    timeout 560 python -m pytest -q tests > "$logs/tests_rest.log" 2>&1 &
    wait
    for f in "$logs"/tests_*.log; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -8; done
fi
tar -C "$logs" -czf "${OUT:-/tmp}/lpt_$1.tgz" .

#!/bin/bash
# The GPU runs step 23's flattened grid (SPEED.md, step 23, "The tile index from the first axis again") lacked
# when it landed, as two device calls on a Hopper GPU. Outputs to $OUT (one archive per call).
#   bash results/flat_grid_checks.sh tests    # test_attention.py and tests/ side by side (about 6 minutes)
#   bash results/flat_grid_checks.sh gluon    # all 11 planted Gluon bugs of tests/mutate_kernel.py --gluon
set -uo pipefail
cd "$(dirname "$0")/.."
logs=/tmp/flat_checks; mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case "${1:-}" in
tests)
    timeout 560 python -m pytest -q test_attention.py > "$logs/tests_attention.log" 2>&1 &
    timeout 560 python -m pytest -q tests > "$logs/tests_rest.log" 2>&1 &
    wait ;;
gluon)
    # the clean copy runs test_attention.py's Gluon tests with FP8_GLUON_EVERYWHERE=1 first, then every
    # bug at once (as results/step22_checks.sh did); new G values compile on first use, so give it time
    # (150 s was too little for the three section bugs in session 40)
    timeout 570 python tests/mutate_kernel.py --gluon -j 11 --timeout 420 2>&1 | tee "$logs/mutants_gluon.log" ;;
*) echo "usage: $0 tests|gluon" >&2; exit 2 ;;
esac
for f in "$logs"/*.log; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed|caught|CAUGHT|error|timeout|stale" "$f" | tail -16; done
tar -C "$logs" -czf "${OUT:-/tmp}/flat_checks_$1.tgz" .

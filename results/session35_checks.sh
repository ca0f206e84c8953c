#!/bin/bash
# GPU checks of a session's HEAD in one device call (about 6 min, judged from step22_checks.sh's four
# processes in 276 s; not yet run: on 2026-12-06 no GPU could be started in nine tries): the GPU suites under the
# machine's Triton (3.6) and under 3.8 (carried: `bash results/carry_triton.sh build 3.8.0 3.12`, then
# carry ".carry/triton-3.8.0.tar.xz" and ".carry/tiktoken_cache"), side by side on the one GPU:
#   3.6: test_attention.py; everything under tests/; the Gluon kernels at every size
#   3.8: test_attention.py; the model's tests; the Gluon kernels at every size
# Whole logs go to $OUT, summaries to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-/tmp/session35}
mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
bash results/carry_triton.sh run 3.8.0 python -c "import triton; print('carried triton', triton.__version__)"
[ "${QUICK:-0}" = 1 ] || python data/builtin/prepare.py > "$logs/prepare.log" 2>&1 || { echo "prepare failed"; tail -5 "$logs/prepare.log"; }
gluon_k="against_fp32 or gpu or hopper or zero or weighted or dv_is or invariant or shared or bad_inputs"
rest="tests"
# QUICK=1 (for a call with little device time left): test_attention.py under both, Gluon everywhere
# under 3.6 only, each stopped after LIMIT seconds (default 540)
limit=${LIMIT:-540}
for v in 36 38; do
    run=""; [ $v = 38 ] && run="bash results/carry_triton.sh run 3.8.0"
    export TRITON_CACHE_DIR=/tmp/cache$v      # one compile cache per Triton version
    timeout $limit $run python -m pytest -q test_attention.py > "$logs/tests${v}_attention.log" 2>&1 &
    if [ "${QUICK:-0}" = 1 ]; then
        [ $v = 36 ] && FP8_GLUON_EVERYWHERE=1 timeout $limit python -m pytest -q test_attention.py -k "$gluon_k" \
            > "$logs/tests36_gluon.log" 2>&1 &
        continue
    fi
    if [ $v = 36 ]; then
        timeout $limit python -m pytest -q $rest > "$logs/tests36_rest.log" 2>&1 &
    else
        timeout $limit $run python -m pytest -q tests/test_model.py > "$logs/tests38_model.log" 2>&1 &
    fi
    FP8_GLUON_EVERYWHERE=1 timeout $limit $run python -m pytest -q test_attention.py -k "$gluon_k" \
        > "$logs/tests${v}_gluon.log" 2>&1 &
done
wait
# the accuracy figures the README quotes from the tests, at the GPU's CASES (a few seconds)
python results/test_figures.py > "$logs/test_figures_gpu.txt" 2>&1; cat "$logs/test_figures_gpu.txt"
for f in "$logs"/tests*.log; do
    echo "== $(basename "$f")"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$f" | tail -8
done

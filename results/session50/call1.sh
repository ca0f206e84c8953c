#!/bin/bash
# Session 50, device call 1, on whichever card comes. Carry .carry/triton-3.8.0.tar.xz and
# .carry/tiktoken_cache (GPT-2's tokenizer file, as tiktoken would download it online).
# On an H200: the speed table after step 23 (none on an H200 yet), end to end, and the table under
# Triton 3.8: results/session46/call_first.sh's H200 branch.
# On an H100: the README's first command on this version (train.py changed in sessions 44-49 and last
# trained on a GPU in session 37), then sample.py on its checkpoint, a resume of it, and train.py
# under torchrun with one NCCL process (the DDP path; no machine with two GPUs is lent).
set -uo pipefail
BUDGET=${BUDGET:-560}
SECONDS=0
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/card.txt"
date -u | tee -a "$OUT/card.txt"; git log -1 --format=%H | tee -a "$OUT/card.txt"
if grep -q H200 "$OUT/card.txt"; then
    BUDGET=$BUDGET bash results/session46/call_first.sh; exit
fi
run() {   # $1: log name, $2: seconds, the rest: the command
    local log=$1 t=$2; shift 2
    echo "== $* (limit $t s, at $SECONDS s)" | tee -a "$OUT/steps.txt"
    timeout "$t" "$@" > "$OUT/$log" 2>&1; echo "rc $? at $SECONDS s" | tee -a "$OUT/steps.txt"
    grep -E "val loss|^attention|^model|^data|saved|Error|error" "$OUT/$log" | tail -14
}
run train_default.log 300 python train.py
cp out/metrics.jsonl "$OUT/metrics_default.jsonl" 2>/dev/null
grep -E "^iter [0-9]+ \| loss.*tok/s" "$OUT/train_default.log" | awk -F'|' '{print $5}' | tr -d ' ,tok/s' | sort -n | awk '{a[NR]=$1} END {print "tok/s min", a[1], "median", a[int((NR+1)/2)], "max", a[NR], "n", NR}' | tee -a "$OUT/steps.txt"
run sample.log 60 python sample.py --num_samples=2 --max_new_tokens=100
run resume.log 120 python train.py --init_from=resume --max_iters=1040 --eval_interval=20
run ddp.log $((BUDGET - 10 - SECONDS)) torchrun --standalone --nproc_per_node=1 train.py --max_iters=60 \
    --eval_interval=30 --out_dir=out_ddp
ls -la out out_ddp | tee -a "$OUT/steps.txt"

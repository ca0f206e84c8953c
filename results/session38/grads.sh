#!/bin/bash
# One device call: the README's first command (`python train.py`, 1000 steps, GPT-2 tokens), keeping each
# checkpoint it saves (hard links, since train.py replaces out/ckpt.pt by rename), then grad_fidelity.py on
# the weights at initialization and at every evaluation, one train.py step's worth of tokens (4 x 16 x 1024).
# Carry ".carry/tiktoken_cache". Logs and JSON to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${OUT:-/tmp/session38}
mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
git log --oneline -1
start=$(date +%s)
python train.py > "$logs/train.log" 2>&1 &
pid=$!
last=""
while kill -0 $pid 2>/dev/null; do
    if [ -f out/ckpt.pt ]; then
        ino=$(stat -c %i out/ckpt.pt)
        if [ "$ino" != "$last" ]; then mkdir -p "ckpts/$ino" && ln out/ckpt.pt "ckpts/$ino/ckpt.pt"; last=$ino; fi
    fi
    sleep 1
done
wait $pid; echo "train.py exit $? after $(( $(date +%s) - start )) s"
grep -E "^attention|^model|^data|val loss" "$logs/train.log"; grep -E "^iter 990 " "$logs/train.log"
cp out/metrics.jsonl "$logs/"
fid="python grad_fidelity.py --batches=4 --batch_size=16"
$fid --init=True --json="$logs/grads_init.json" > "$logs/grads_init.txt" 2>&1; cat "$logs/grads_init.txt"
for d in $(ls -t ckpts); do   # the last checkpoint first
    $fid --out_dir="ckpts/$d" --json="$logs/grads_$d.json" > "$logs/grads_$d.txt" 2>&1; cat "$logs/grads_$d.txt"
    echo "elapsed $(( $(date +%s) - start )) s"
done

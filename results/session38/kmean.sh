#!/bin/bash
# One device call: `python train.py` (1000 steps) keeping each saved checkpoint, then
# results/kmean_probe.py on the fresh initialization and every checkpoint: per layer the keys' shared
# component, the attention entropy, and the FP8 kernel's errors with and without the keys centred; and the
# whole model's step-gradient error both ways. Carry ".carry/tiktoken_cache". One archive to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=/tmp/s38k; mkdir -p "$logs"
export TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
start=$(date +%s)
python train.py > "$logs/train.log" 2>&1 &
pid=$!
last=""; n=0
while kill -0 $pid 2>/dev/null; do
    if [ -f out/ckpt.pt ]; then
        ino=$(stat -c %i out/ckpt.pt)
        if [ "$ino" != "$last" ]; then n=$((n+1)); mkdir -p "ckpts/$n" && ln out/ckpt.pt "ckpts/$n/ckpt.pt"; last=$ino; fi
    fi
    sleep 1
done
wait $pid; echo "train.py exit $? after $(( $(date +%s) - start )) s"
grep -E "val loss|^iter 990 " "$logs/train.log"
python results/kmean_probe.py --init --json="$logs/kmean.json" $(ls -d ckpts/* | sort -t/ -k2 -n | sed 's|$|/ckpt.pt|') 2>&1 | tee "$logs/kmean.txt"
echo "elapsed $(( $(date +%s) - start )) s"
tar -C "$logs" -czf "${OUT:-/tmp}/session38_kmean.tgz" .

#!/bin/bash
# Session 41, last device call: the Gluon forward with two tiles per loop iteration (results/fwd_unroll2.patch,
# in rev/unroll2 with main's attention_fp8.py) against main: the forward's output bit-identical, then GPU time per
# kernel. Before the call, here: mkdir -p rev/unroll2; cp attention_fp8.py rev/unroll2/;
# git show b7e946b:attention_fp8_hopper.py > rev/unroll2/attention_fp8_hopper.py; (cd rev/unroll2 && patch -p1 < ../../results/fwd_unroll2.patch)
set -uo pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/unroll2.txt"
timeout 60 python - <<'PY' 2>&1 | grep -v -i warn | tee -a "$OUT/unroll2.txt"
import torch, bench_attention as BA, attention_fp8 as A
R = BA.load_revision("rev/unroll2", 1)
A.HOPPER_FORWARD_MIN_SCORES = R.HOPPER_FORWARD_MIN_SCORES = 0     # the Gluon forward at every size
for B, H, N, D in [(2, 4, 1000, 128), (1, 8, 4096, 128), (2, 4, 777, 64), (1, 8, 4096, 64)]:
    q, k, v, do = BA.inputs(B, H, N, D)
    for causal in (True, False):
        o1 = A.attention(q, k, v, causal=causal)
        o2 = R.attention(q, k, v, causal=causal)
        print(B, H, N, D, causal, "bit-identical" if torch.equal(o1, o2) else f"DIFFERENT max {(o1 - o2).abs().max().item():.3g}")
PY
timeout 150 python bench_attention.py --compare rev/unroll2 --kernels --shapes 4x16x4096x128 2x16x8192x128 4x16x4096x64 2>&1 \
    | grep -v -i warn | tee -a "$OUT/unroll2.txt"

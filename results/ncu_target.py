"""One forward+backward per shape between cudaProfilerStart/Stop, for
`ncu --profile-from-start off ... python results/ncu_target.py {matched|stale} BxHxNxD ...`
(run from the repository root with PYTHONPATH=.). Two warm-up calls first, outside the profiled
range, so that ncu sees compiled kernels only. The backward runs in one pass (SPLIT_BYTES = inf):
one launch of each kernel."""
import sys

import torch

import attention_fp8
from attention_fp8 import attention

attention_fp8.SPLIT_BYTES = float("inf")
delta = sys.argv[1]
for s in sys.argv[2:]:
    B, H, N, D = map(int, s.split("x"))
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    for _ in range(2):
        attention(q, k, v, delta=delta).backward(do)
    q.grad = k.grad = v.grad = None     # else the profiled backward adds into the warm-ups' grads (3 extra kernels)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    attention(q, k, v, delta=delta).backward(do)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(s, "done", flush=True)

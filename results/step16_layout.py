"""Why step 16 cut the model-layout fwd+bwd GPU time: per-kernel GPU time with outputs in q's layout
(step 16, current) vs contiguous (B, H, N, D) outputs (before step 16), for (a) leaf q, k, v in (B, N, H, D) memory
(bench_attention --graphs --model-layout) and (b) the GPT's own path: qkv split, transpose, attention,
transpose back and reshape to (B, T, C)."""
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
import attention_fp8 as A

HEAD_EMPTY_AS = A._empty_as
def contiguous_empty(x):
    return torch.empty(x.shape, device=x.device, dtype=x.dtype)

def kernels(step, iters=5):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    k = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            c, t = k.get(e.name, (0, 0.0))
            k[e.name] = (c + 1, t + e.time_range.elapsed_us())
    return {n: (c / iters, t / iters) for n, (c, t) in k.items()}

for B, H, N, D in [(64, 12, 1024, 64), (16, 12, 4096, 64)]:
    torch.manual_seed(0)
    C = H * D
    leaf = [torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3)]
    do_leaf = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    qkv = torch.randn(B, N, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, N, C, device="cuda", dtype=torch.bfloat16)

    def step_leaf():
        for x in leaf:
            x.grad = None
        A.attention(*leaf).backward(do_leaf)

    def step_model():
        qkv.grad = None
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, N, H, D).transpose(1, 2) for t in (q, k, v))
        y = A.attention(q, k, v).transpose(1, 2).contiguous().view(B, N, C)
        y.backward(dy)

    for label, empty in (("current (outputs in q's layout)", HEAD_EMPTY_AS), ("contiguous outputs (before step 16)", contiguous_empty)):
        A._empty_as = empty
        for path, step in (("leaf q,k,v", step_leaf), ("model path", step_model)):
            ks = kernels(step)
            total = sum(t for _, t in ks.values())
            print(f"\n{B}x{H}x{N}x{D} {label}, {path}: {total:.0f} us of kernels per fwd+bwd")
            for n, (c, t) in sorted(ks.items(), key=lambda kv: -kv[1][1]):
                print(f"  {c:4.1f} x {t / c:7.1f} = {t:7.1f} us  {n[:90]}")
    A._empty_as = HEAD_EMPTY_AS

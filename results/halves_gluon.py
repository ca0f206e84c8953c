"""Halves vs one pass, and the Gluon dK/dV kernel in halves: GPU time (CUDA graph replay) and peak memory."""
import copy, statistics, sys
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attention_fp8 as A

ROUNDS = 5
ORIG_HALVES = A._halves


def batch_halves(q, k, pieces):
    B = q.shape[0]
    if B >= 2:
        return [(slice(0, B // 2), slice(None)), (slice(B // 2, B), slice(None))]
    return ORIG_HALVES(q, k, 2)


def setv(split=None, bwd_min=None, halves=None):
    A.SPLIT_BYTES = 128 * 2**20 if split is None else split
    A.HOPPER_BACKWARD_MIN_SCORES = 2**29 if bwd_min is None else bwd_min
    A._halves = halves or ORIG_HALVES


def fp8(**kw):
    def f(q, k, v):
        setv(**kw)
        return A.attention(q, k, v, causal=True)
    return f


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


VARIANTS = {
    "default": fp8(),
    "halves_gluon": fp8(bwd_min=0),
    "batch_halves_gluon": fp8(bwd_min=0, halves=batch_halves),
    "one_pass": fp8(split=float("inf")),
    "cudnn": cudnn,
}
SHAPES = [((64, 12, 1024, 64), True), ((16, 12, 4096, 64), True), ((4, 16, 4096, 64), False),
          ((4, 16, 4096, 128), False), ((2, 16, 8192, 128), False), ((1, 16, 16384, 128), False)]

print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
for (B, H, N, D), model_layout in SHAPES:
    torch.manual_seed(0)
    if model_layout:
        q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(4))
    else:
        q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    flops = 3.5 * 4 * B * H * N * N * D * 0.5
    graphs, keep, outs, peak = {}, [], {}, {}
    for name, f in VARIANTS.items():
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

        def step():
            f(qg, kg, vg).backward(do)
        step()
        torch.cuda.synchronize()
        qg.grad = kg.grad = vg.grad = None
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
        outs[name] = [x.grad.float().clone() for x in (qg, kg, vg)]
        qg.grad = kg.grad = vg.grad = None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        qg.grad = kg.grad = vg.grad = None
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        graphs[name] = g
        keep.append((qg, kg, vg))
    setv()
    ref = outs["one_pass"]
    times = {n: [] for n in graphs}
    for r in range(ROUNDS):
        for n, g in graphs.items():
            times[n].append(triton.testing.do_bench(g.replay, warmup=10, rep=100))
    cud = statistics.median(times["cudnn"])
    dft = statistics.median(times["default"])
    print(f"\n{B}x{H}x{N}x{D} causal, {'model' if model_layout else 'contiguous'} layout, CUDA-graph fwd+bwd, "
          f"medians of {ROUNDS} rounds; peak MiB above inputs (eager)")
    for n, ts in times.items():
        t = statistics.median(ts)
        eq = all(torch.equal(a, b) for a, b in zip(outs[n], ref))
        print(f"  {n:>18} {t * 1e3:8.1f} us {flops / t * 1e-9:6.0f} TFLOP/s  x cudnn {cud / t:.3f}  x default {dft / t:.3f}  "
              f"[{min(ts)*1e3:.1f}-{max(ts)*1e3:.1f}]  peak {peak[n]:7.1f} MiB  equal to one_pass: {eq}", flush=True)
    del graphs, keep, outs
    torch.cuda.empty_cache()

"""Run from the repository root on a GPU: python results/host_probe_fast_launch.py (results/host_h200.txt).
Host time per call with FAST_LAUNCH on and off, and do_bench at 8x16x1024x64 against flash."""
import os, statistics, sys, time
import torch, torch.nn.functional as F, triton
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, os.getcwd())
import attention_fp8 as A


def host_us(fn, n=200, warm=20):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def rep(label, fn):
    v = [host_us(fn) for _ in range(5)]
    print(f"{label:>52}: median {statistics.median(v):7.1f} us (min {min(v):7.1f}, max {max(v):7.1f})", flush=True)


for shape in ((1, 2, 128, 64), (8, 16, 1024, 64)):
    B, H, N, D = shape
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    s = D ** -0.5
    o, lse = A._forward(q, k, v, True, s)
    for fast in (False, True):
        A.FAST_LAUNCH = fast
        print(f"\n{shape} FAST_LAUNCH={fast}", flush=True)
        rep("attention + autograd.grad", lambda: torch.autograd.grad(A.attention(qg, kg, vg), (qg, kg, vg), do))
        with torch.autograd.set_multithreading_enabled(False):
            rep("... single-threaded autograd", lambda: torch.autograd.grad(A.attention(qg, kg, vg), (qg, kg, vg), do))
        with torch.no_grad():
            rep("attention, no_grad", lambda: A.attention(q, k, v))
        rep("_forward", lambda: A._forward(q, k, v, True, s))
        rep("_backward", lambda: A._backward(do, q, k, v, None, lse, True, s, "matched"))
        rep("_quantize K, V", lambda: A._quantize([(k, True, True), (v, True, False)], 128))
        if D == 64 and N == 1024:
            flash = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True)
            for r in range(2):
                with torch.no_grad():
                    t_f = triton.testing.do_bench(lambda: A.attention(q, k, v), warmup=25, rep=150)
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        t_ff = triton.testing.do_bench(lambda: flash(q, k, v), warmup=25, rep=150)
                t_fb = triton.testing.do_bench(lambda: torch.autograd.grad(A.attention(qg, kg, vg), (qg, kg, vg), do),
                                               warmup=25, rep=150)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    t_flash = triton.testing.do_bench(lambda: torch.autograd.grad(flash(qg, kg, vg), (qg, kg, vg), do),
                                                      warmup=25, rep=150)
                print(f"do_bench round {r}: fwd fp8 {t_f:.3f} ms, flash {t_ff:.3f} | fwd+bwd fp8 {t_fb:.3f}, "
                      f"flash {t_flash:.3f}", flush=True)

import cProfile, pstats, io
B, H, N, D = 1, 2, 128, 64
q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
A.FAST_LAUNCH = True
o, lse = A._forward(q, k, v, True, D ** -0.5)
for label, fn in (("attention no_grad", lambda: A.attention(q, k, v)),
                  ("_backward", lambda: A._backward(do, q, k, v, None, lse, True, D ** -0.5, "matched"))):
    with torch.no_grad():
        for _ in range(20):
            fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            fn()
        pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(18)
    print(f"\n--- cProfile, 200 x {label}, FAST_LAUNCH ---\n" + out.getvalue()[-3500:], flush=True)

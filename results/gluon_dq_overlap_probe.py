"""Gluon dQ kernel (results/gluon_dq_overlap.py) against the Triton one on the same FP8 copies: delta and dQ
differences, and GPU time of each (CUDA events, medians of interleaved rounds)."""
import os, sys, statistics
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "results"))
import torch, triton
import attention_fp8 as A
import gluon_dq_overlap as G

def setup(B, H, H_kv, N, D, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, N, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, H_kv, N, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, H_kv, N, D, device="cuda", generator=g).bfloat16()
    do = torch.randn(B, H, N, D, device="cuda", generator=g).bfloat16()
    sm_scale = D ** -0.5
    o, lse = A._forward(q, k, v, causal, sm_scale)
    tile = A.tiles(D)
    (q8, qt8, sq), (do8, dot8, sdo) = A._quantize([(q, True, True), (do, True, True)], tile["q"], True)
    (k8, kt8, sk), (v8, _, sv) = A._quantize([(k, True, True), (v, True, False)], tile["k"], permute_cols=True)
    n_pad = A._padded(N)
    return dict(q=q, do=do, o=o, lse=lse, q8=q8, sq=sq, do8=do8, sdo=sdo, k8=k8, kt8=kt8, sk=sk, v8=v8, sv=sv,
                n_pad=n_pad, B=B, H=H, H_kv=H_kv, N=N, D=D, causal=causal, sm_scale=sm_scale)

def run_triton(x, matched):
    B, H, N, D = x["B"], x["H"], x["N"], x["D"]
    delta = torch.empty((B * H, x["n_pad"]), device="cuda", dtype=torch.float32)
    dq = torch.empty_like(x["q"])
    cfg = A.CONFIGS[D]["dq"]
    do, o, lse = x["do"], x["o"], x["lse"]
    section, grid = A._grid(triton.cdiv(N, cfg["BLOCK_M"]), B * H, 3 * x["n_pad"] * D, x["causal"])
    A._launch(A._bwd_dq_kernel, grid,
              (x["q8"], x["sq"], x["k8"], x["sk"], x["kt8"], x["v8"], x["sv"], x["do8"], x["sdo"], do, o, lse,
               lse.stride(0), delta, dq, delta, x["sm_scale"], x["sm_scale"] * A.LOG2E, N, x["n_pad"], H, x["H_kv"],
               *do.stride(), *o.stride()[:3], *dq.stride()[:3]),
              D=D, CAUSAL=x["causal"], MATCHED=matched, DEBUG=False, G=section, **cfg)
    return dq, delta

def run_gluon(x, matched, **cfg):
    B, H, N, D = x["B"], x["H"], x["N"], x["D"]
    delta = torch.empty((B * H, x["n_pad"]), device="cuda", dtype=torch.float32)
    dq = torch.empty_like(x["q"])
    G.dq(x["q8"], x["sq"], x["k8"], x["sk"], x["kt8"], x["v8"], x["sv"], x["do8"], x["sdo"], x["do"], x["o"],
         x["lse"], delta, dq, x["causal"], matched, x["sm_scale"], x["sm_scale"] * A.LOG2E, **cfg)
    return dq, delta

def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()

print("## correctness: Gluon vs Triton on the same FP8 copies")
for shape in [] if "--time-only" in sys.argv else [(1, 4, 4, 1000, 64, True), (1, 4, 4, 1000, 64, False), (2, 8, 2, 2048, 64, True), (1, 4, 4, 4096, 64, True),
              (1, 4, 1, 777, 128, False), (2, 8, 2, 2048, 128, True), (1, 4, 4, 4096, 128, True)]:
    x = setup(*shape)
    N = shape[3]
    for matched in (True, False):
        dq_t, de_t = run_triton(x, matched)
        dq_g, de_g = run_gluon(x, matched)
        torch.cuda.synchronize()
        dl = rel(de_g[:, :N], de_t[:, :N])
        print(shape, "matched" if matched else "stale  ", f"delta rel diff {dl:.2e}  dq rel diff {rel(dq_g, dq_t):.2e}",
              "finite" if torch.isfinite(dq_g).all().item() else "NONFINITE")

print("## GPU time per launch, us (CUDA events, 20 launches per sample, medians of 5 interleaved rounds)")
def timeit(f, reps=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    f(); torch.cuda.synchronize()
    s.record()
    for _ in range(reps): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps * 1000
for shape in [(4, 16, 16, 4096, 64, True), (2, 16, 16, 8192, 64, True), (4, 16, 16, 4096, 128, True), (2, 16, 16, 8192, 128, True)]:
    x = setup(*shape)
    arms = {"triton matched": lambda: run_triton(x, True), "gluon matched": lambda: run_gluon(x, True),
            "triton stale": lambda: run_triton(x, False), "gluon stale": lambda: run_gluon(x, False),
            **({"gluon matched r168": lambda: run_gluon(x, True, maxnreg=168)} if shape[4] == 64 else {})}
    times = {k: [] for k in arms}
    for _ in range(5):
        for k, f in arms.items():
            times[k].append(timeit(f))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(shape, "  ".join(f"{k} {v:7.1f}" for k, v in med.items()),
          f"| gluon/triton matched {med['triton matched'] / med['gluon matched']:.3f}x, stale {med['triton stale'] / med['gluon stale']:.3f}x,"
          + (f" r168 {med['triton matched'] / med['gluon matched r168']:.3f}x" if "gluon matched r168" in med else ""))

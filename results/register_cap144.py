"""D = 64 Gluon forward / dK/dV register caps (168 now: 3 programs per SM; 144 / 128: 4): fwd+bwd GPU time."""
import copy, statistics
import torch, triton
import attention_fp8 as A
import attention_fp8_hopper as AH

F0, K0 = copy.deepcopy(AH.CONFIGS), copy.deepcopy(AH.DKDV_CONFIGS)


def setv(fwd=168, dkdv=168):
    AH.CONFIGS = copy.deepcopy(F0)
    AH.DKDV_CONFIGS = copy.deepcopy(K0)
    AH.CONFIGS[64]["maxnreg"] = fwd
    AH.DKDV_CONFIGS[64]["maxnreg"] = dkdv


VARIANTS = {"base": {}, "fwd144": dict(fwd=144), "fwd128": dict(fwd=128), "dkdv144": dict(dkdv=144),
            "dkdv128": dict(dkdv=128), "both144": dict(fwd=144, dkdv=144)}
SHAPES = [((64, 12, 1024, 64), True), ((16, 12, 4096, 64), True), ((4, 16, 4096, 64), False), ((2, 16, 8192, 64), False)]
ROUNDS = 5
print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
for (B, H, N, D), model in SHAPES:
    torch.manual_seed(0)
    if model:
        q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(4))
    else:
        q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    flops = 3.5 * 4 * B * H * N * N * D * 0.5
    graphs, fgraphs, keep, outs = {}, {}, [], {}
    for name, kw in VARIANTS.items():
        setv(**kw)
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

        def step():
            A.attention(qg, kg, vg).backward(do)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    qg.grad = kg.grad = vg.grad = None
                    step()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            outs[name] = [x.grad.clone() for x in (qg, kg, vg)]
            qg.grad = kg.grad = vg.grad = None
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            graphs[name] = g
            fg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(fg):
                A._forward(q, k, v, True, D ** -0.5)
            fgraphs[name] = fg
            keep.append((qg, kg, vg))
        except Exception as e:
            print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
    setv()
    times = {n: [] for n in graphs}
    ftimes = {n: [] for n in graphs}
    for r in range(ROUNDS):
        for n in graphs:
            times[n].append(triton.testing.do_bench(graphs[n].replay, warmup=10, rep=100))
            ftimes[n].append(triton.testing.do_bench(fgraphs[n].replay, warmup=10, rep=100))
    t0, f0 = statistics.median(times["base"]), statistics.median(ftimes["base"])
    print(f"\n{B}x{H}x{N}x{D} causal {'model' if model else 'contiguous'} layout, CUDA graph, medians of {ROUNDS} rounds")
    for n in graphs:
        t, f = statistics.median(times[n]), statistics.median(ftimes[n])
        eq = all(torch.equal(a, b) for a, b in zip(outs[n], outs["base"]))
        print(f"  {n:>8} fwd+bwd {t * 1e3:8.1f} us x base {t0 / t:.3f}  fwd {f * 1e3:7.1f} us x base {f0 / f:.3f}  "
              f"grads equal to base: {eq}", flush=True)
    del graphs, fgraphs, keep, outs
    torch.cuda.empty_cache()

"""Run from the repository root on a GPU: python results/host_probe_thread.py (results/host_h200.txt, third probe).
What is slow in autograd's device thread: Python itself, GIL releases (torch ops), or launches?"""
import statistics, sys, time
import torch, triton, triton.language as tl

print(torch.__version__, triton.__version__, sys.version.split()[0], flush=True)


@triton.jit
def _one(X):
    tl.store(X, 1.0)


x_dev = torch.zeros(16, device="cuda")
compiled = _one[(1,)](x_dev)
torch.cuda.synchronize()
run, func, meta = compiled.run, compiled.function, compiled.packed_metadata
ptr = x_dev.data_ptr()


def work(kind, n):
    if kind == "none":
        return
    if kind == "py":
        s = 0
        for i in range(n * 300):
            s += i
    elif kind == "empty":
        for _ in range(n):
            torch.empty(1 << 20, device="cuda", dtype=torch.uint8)
    elif kind == "sleep0":
        for _ in range(n):
            time.sleep(0)
    elif kind == "jit":
        for _ in range(n):
            _one[(1,)](x_dev)
    elif kind == "direct":
        for _ in range(n):
            run(1, 1, 1, torch._C._cuda_getCurrentRawStream(0), func, meta, None, None, None, ptr)


class Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kind, n):
        ctx.kind, ctx.n = kind, n
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        work(ctx.kind, ctx.n)
        return g, None, None


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


def med(fn):
    return statistics.median(host_us(fn) for _ in range(5))


xg = torch.randn(1024, device="cuda", requires_grad=True)
g = torch.randn(1024, device="cuda")
N = 20
for interval in (None, 1e-5, 0.05):
    if interval:
        sys.setswitchinterval(interval)
    print(f"\nswitch interval {sys.getswitchinterval()}", flush=True)
    for kind in ("none", "py", "empty", "sleep0", "jit", "direct"):
        main = med(lambda: work(kind, N))
        auto = med(lambda: torch.autograd.grad(Probe.apply(xg, kind, N), (xg,), g))
        with torch.autograd.set_multithreading_enabled(False):
            single = med(lambda: torch.autograd.grad(Probe.apply(xg, kind, N), (xg,), g))
        print(f"{kind:>7} x{N}: in main thread {main:7.1f} us | fwd+bwd autograd {auto:7.1f} us, "
              f"single-threaded autograd {single:7.1f} us", flush=True)

"""dQ/dK errors of an older attention_fp8.py (argv[1]) and the current one, matched and stale, on inputs
that stress delta (results/one_pass_dq_h200.txt). Run from the repository root: python results/one_pass_dq_accuracy.py OLD.py"""
import os, sys, math, importlib.util, tempfile
import torch
GPU = torch.cuda.is_available()
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
if not GPU:
    import triton_shim; triton_shim.install()
def load(path, name):
    src = open(path).read().replace("fp8_attention::", f"fp8_attention_{name}::")
    d = tempfile.mkdtemp(); p = os.path.join(d, name + ".py"); open(p, "w").write(src)
    spec = importlib.util.spec_from_file_location(name, p); m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m; spec.loader.exec_module(m); return m
import attention_fp8 as NEW
OLD = load(sys.argv[1], "oldrev")
import test_attention as T
dev = "cuda" if GPU else "cpu"
def grads(mod, q, k, v, do, causal, arm):
    q, k, v = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = mod.attention(q, k, v, causal=causal, delta=arm); o.backward(do)
    return q.grad, k.grad, v.grad
def case(name, B, H, N, D, causal=True, seed=0, qs=1.0, koff=0.0, vmean=0.0, sink=0.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g) * qs
    k = torch.randn(B, H, N, D, generator=g) + koff * torch.randn(D, generator=g)
    v = torch.randn(B, H, N, D, generator=g) + vmean
    do = torch.randn(B, H, N, D, generator=g)
    if sink:
        u = q.mean((0, 1, 2)); u = u / u.norm()
        k[:, :, 0] += sink * u
        q += sink * 0.3 * u
    q, k, v, do = [x.bfloat16().to(dev) for x in (q, k, v, do)]
    sm = 1 / math.sqrt(D)
    deq = T.dequantized_reference(q, k, v, do, causal, sm)
    ex = T.reference_grads(q, k, v, do, causal, sm)
    out = {}
    for label, mod in (("old", OLD), ("new", NEW)):
        for arm in ("matched", "stale"):
            dq, dk, dv = grads(mod, q, k, v, do, causal, arm)
            out[label + arm[0]] = (T.rel_err(dq, deq["dq"]), T.rel_err(dk, deq["dk"]), T.rel_err(dq, ex["dq"]))
    print(f"{name:34s} {B}x{H}x{N}x{D} | " + " | ".join(f"{k} " + " ".join(f"{x:.4f}" for x in v) for k, v in out.items()),
          flush=True)
print("columns: dQ err vs dequantized-input ref, dK err vs it, dQ err vs original-input ref (old = two-pass, new = one-pass; m = matched, s = stale)")
N, D = (2048, 128) if GPU else (512, 64)
B, H = (2, 4) if GPU else (1, 2)
case("normal", B, H, N, D)
case("normal D64" if GPU else "normal N300 D128 full", *((B, H, N, 64) if GPU else (1, 2, 300, 128)), causal=GPU)
case("key offset 2", B, H, N, D, koff=2.0)
case("v mean 1", B, H, N, D, vmean=1.0)
case("v mean 3", B, H, N, D, vmean=3.0)
case("sharp q*3", B, H, N, D, qs=3.0)
case("sharp q*5", B, H, N, D, qs=5.0)
case("sink 8", B, H, N, D, sink=8.0)
case("sink 8 + vmean 2 + koff 2", B, H, N, D, sink=8.0, vmean=2.0, koff=2.0)

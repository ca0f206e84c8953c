"""Benchmark FP8 Delta-Matching attention against PyTorch SDPA (cuDNN and flash backends, BF16).

One run prints, per shape: forward and forward+backward TFLOP/s of FP8 matched, FP8 stale, cuDNN
and flash SDPA, the ratios to cuDNN, the share of matched time the Delta-Matching pre-pass costs
(1 - stale / matched: a difference of two wall-time means, which moves by a point or two from run to
run; --kernels gives it in GPU time), peak memory, and each method's error against an FP32 reference
on the same inputs.

    python bench_attention.py                      # causal, DEFAULT_SHAPES (the speed targets' shapes)
    python bench_attention.py --shapes 4x16x4096x128 --no-causal
    python bench_attention.py --sweep [dkdv ...]   # first try the tilings of SWEEP (all kernels, or these)
    python bench_attention.py --compare /tmp/old.py  # older revision (git show REV:attention_fp8.py) vs current
    python bench_attention.py --compare /tmp/rev     # ... with its Gluon kernels too (git worktree add /tmp/rev REV)
    python bench_attention.py --compare /tmp/rev --rounds 5 --shapes 2x16x8192x128   # interleaved rounds, medians
    python bench_attention.py --compare /tmp/rev --kernels   # GPU time per kernel instead of wall time (less noise)
    python bench_attention.py --profile            # per-kernel GPU time vs wall time of fp8 forward+backward
    python bench_attention.py --graphs             # forward+backward replayed from CUDA graphs: no host time
    python bench_attention.py --graphs --model-layout --shapes 64x12x1024x64   # as the GPT passes its tensors
    python bench_attention.py --mean 1 --shapes 1x16x16384x128   # v and dO with a mean: sums that grow with N

FLOPs are counted as the Triton tutorial and FlashAttention do: forward = 4*B*H*N^2*D, halved when
causal; forward+backward = 3.5x forward (2.5x for the backward's five matmuls, not counting the
pre-pass's two extra, nor recomputation). Times are triton.testing.do_bench means.
"""
import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import re
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
import triton
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile as torch_profile

import attention_fp8 as A
from data.common import atomic_write

DEFAULT_SHAPES = ["8x16x1024x64", "4x16x2048x128", "4x16x4096x64", "2x16x8192x128", "1x16x16384x128",
                  "4x16x4096x128"]


def sdpa(backend):
    def f(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return f


def fp8(delta):
    return lambda q, k, v, causal: A.attention(q, k, v, causal=causal, delta=delta)


METHODS = {"fp8_matched": fp8("matched"), "fp8_stale": fp8("stale"),
           "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}


def rel_err(x, ref):
    return ((x.float() - ref).norm() / ref.norm()).item()


# --model-layout: inputs laid out in memory as (B, N, H, D) and seen as (B, H, N, D), as the GPT
# (model.py) passes them; then O and the gradients come back in that layout too.
MODEL_LAYOUT = False
# --mean: a common mean added to v and do. N(0, 1) values keep the sums over keys (P V) and over
# queries (P^T dO) near zero; with a mean they grow with N, as with real activations. The kernels'
# sums in the tensor cores (SPEED.md, step 17) were wrong by up to 16% there and right on N(0, 1).
MEAN = 0.0


def inputs(B, H, N, D, device="cuda"):
    """q, k, v and the upstream gradient do: N(0, 1) in bf16 (v and do + MEAN), the same for every
    method and revision."""
    torch.manual_seed(0)
    if MODEL_LAYOUT:
        xs = [torch.randn(B, N, H, D, device=device, dtype=torch.bfloat16).transpose(1, 2) for _ in range(4)]
    else:
        xs = [torch.randn(B, H, N, D, device=device, dtype=torch.bfloat16) for _ in range(4)]
    if MEAN:
        for x in xs[2:]:
            x.add_(MEAN)        # in place: the layout stays
    return xs


def bench_shape(B, H, N, D, causal, with_errors=True):
    q, k, v, do = inputs(B, H, N, D)
    fwd_flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
    row = {"shape": f"{B}x{H}x{N}x{D}", "causal": causal}
    ref = None
    if with_errors:   # fp32 reference on the same inputs (memory-efficient SDPA runs fp32 in O(N) memory)
        qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            of = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
        of.backward(do.float())
        ref = {"o": of.detach(), "dq": qf.grad, "dk": kf.grad, "dv": vf.grad}
        del qf, kf, vf, of
    for name, f in METHODS.items():
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        try:
            with torch.no_grad():
                t_fwd = triton.testing.do_bench(lambda: f(q, k, v, causal), warmup=50, rep=300)

            def fwd_bwd():
                o = f(qg, kg, vg, causal)
                o.backward(do)
            fwd_bwd()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fwd_bwd()
            peak = torch.cuda.max_memory_allocated() - base
            t_all = triton.testing.do_bench(fwd_bwd, warmup=50, rep=300, grad_to_none=[qg, kg, vg])
        except (RuntimeError, ValueError) as e:   # a backend that does not take this shape (ours: ValueError)
            print(f"  {name}: {first_line(e)}", file=sys.stderr)
            continue
        r = {"fwd_ms": t_fwd, "fwd_tflops": fwd_flops / t_fwd * 1e-9,
             "fwdbwd_ms": t_all, "fwdbwd_tflops": 3.5 * fwd_flops / t_all * 1e-9, "peak_mib": peak / 2**20}
        if ref is not None:
            qg.grad = kg.grad = vg.grad = None
            o = f(qg, kg, vg, causal)
            o.backward(do)
            r.update({f"err_{n}": rel_err(x, ref[n]) for n, x in
                      (("o", o.detach()), ("dq", qg.grad), ("dk", kg.grad), ("dv", vg.grad))})
        row[name] = r
    if "fp8_matched" in row and "fp8_stale" in row:
        row["prepass_share"] = 1 - row["fp8_stale"]["fwdbwd_ms"] / row["fp8_matched"]["fwdbwd_ms"]
    return row


def print_table(rows):
    print(f"\n{'shape':>16} {'c':>1} | {'fwd TFLOP/s: fp8':>16} {'cudnn':>6} {'flash':>6} {'fp8/cudnn':>9} | "
          f"{'fwd+bwd: matched':>16} {'stale':>6} {'cudnn':>6} {'flash':>6} {'match/cudnn':>11} {'prepass':>7} | "
          f"{'peak MiB fp8/cudnn':>18}")
    for r in rows:
        g = lambda m, k: r.get(m, {}).get(k, float("nan"))
        print(f"{r['shape']:>16} {'y' if r['causal'] else 'n':>1} | {g('fp8_matched', 'fwd_tflops'):16.0f} "
              f"{g('cudnn', 'fwd_tflops'):6.0f} {g('flash', 'fwd_tflops'):6.0f} "
              f"{g('fp8_matched', 'fwd_tflops') / g('cudnn', 'fwd_tflops'):9.2f} | "
              f"{g('fp8_matched', 'fwdbwd_tflops'):16.0f} {g('fp8_stale', 'fwdbwd_tflops'):6.0f} "
              f"{g('cudnn', 'fwdbwd_tflops'):6.0f} {g('flash', 'fwdbwd_tflops'):6.0f} "
              f"{g('fp8_matched', 'fwdbwd_tflops') / g('cudnn', 'fwdbwd_tflops'):11.2f} "
              f"{100 * r.get('prepass_share', float('nan')):6.1f}% | "
              f"{g('fp8_matched', 'peak_mib'):8.0f} / {g('cudnn', 'peak_mib'):<8.0f}")
    errs = [r for r in rows if "err_o" in r.get("fp8_matched", {})]
    if errs:
        print(f"\nrelative error vs FP32 (Frobenius) {'':>4} " + " ".join(f"{m + ' ' + t:>16}" for m in ("matched", "stale", "cudnn") for t in ("O", "dQ", "dK")))
        for r in errs:
            vals = []
            for m in ("fp8_matched", "fp8_stale", "cudnn"):
                for t in ("o", "dq", "dk"):
                    vals.append(f"{r.get(m, {}).get('err_' + t, float('nan')):16.4f}")
            print(f"{r['shape']:>24} {'y' if r['causal'] else 'n':>14} " + " ".join(vals))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="BxHxNxD ...")
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--no-errors", action="store_true", help="skip the FP32 reference")
    p.add_argument("--model-layout", action="store_true", help="inputs laid out as (B, N, H, D) in memory, seen as "
                   "(B, H, N, D): what the GPT of model.py passes (default: contiguous (B, H, N, D))")
    p.add_argument("--mean", type=float, default=0.0, help="add this to v and do (default 0: N(0, 1) inputs); "
                   "errors then show sums that lose precision as N grows")
    p.add_argument("--sweep", nargs="*", metavar="KERNEL", default=None, choices=list(SWEEP),
                   help="time the tilings of SWEEP first (for these kernels, default all) and use the fastest")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--compare", nargs="+", metavar="FILE", help="instead of the table: time these copies of older "
                      "attention_fp8.py revisions (or directories with both kernel files of one) against the "
                      "current one (and cuDNN) on the same inputs")
    p.add_argument("--rounds", type=int, default=None, help="--compare and --kernels: interleaved rounds per "
                   "shape, medians taken (default 3 for --compare, 5 for --kernels)")
    p.add_argument("--kernels", action="store_true", help="instead of the table, or with --compare: GPU time per "
                   "kernel (torch profiler), matched and stale, with the pre-pass's share of GPU time; free of the "
                   "host's noise")
    only.add_argument("--profile", action="store_true", help="instead of the table: per-kernel GPU time of fp8 "
                      "forward+backward (matched, stale) against its wall time")
    only.add_argument("--graphs", action="store_true", help="instead of the table: forward+backward of every method "
                      "in eager mode and replayed from a CUDA graph (which takes the host's share away)")
    args = p.parse_args()
    # checked here, not shape by shape: a bad one last in the list used to stop the run after the others,
    # with no table and no --json written
    bad = [s for s in args.shapes if not re.fullmatch(r"[1-9]\d*x[1-9]\d*x[1-9]\d*x[1-9]\d*", s)]
    if bad:
        p.error(f"--shapes {' '.join(bad)}: expected BxHxNxD, four positive integers (e.g. 2x16x8192x128)")
    if args.rounds is not None and args.rounds < 1:
        p.error(f"--rounds {args.rounds}: must be at least 1")
    if args.kernels and (args.profile or args.graphs):
        p.error("--kernels runs with the table's shapes or --compare, not with --profile or --graphs")
    # options that one mode would take and the others pass over in silence: refused where they do nothing
    if args.rounds is not None and not (args.compare or args.kernels):
        p.error("--rounds is for --compare and --kernels (the table takes one mean per method)")
    if args.no_errors and (args.compare or args.kernels or args.profile or args.graphs):
        p.error("--no-errors is for the table; --compare, --kernels, --profile and --graphs compute no errors")
    if args.json and (args.profile or args.graphs or args.kernels):
        p.error("--json writes the table's or --compare's rows; --profile, --graphs and --kernels only print")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        p.error(f"--json {args.json}: no folder {os.path.dirname(os.path.abspath(args.json))} to write it in "
                "(checked before the run, not after it)")
    if args.sweep is not None and (args.compare or args.profile or args.graphs or args.kernels):
        p.error("--sweep tunes the tilings for the table; it does not run with --compare, --kernels, --profile "
                "or --graphs")
    global MODEL_LAYOUT, MEAN
    MODEL_LAYOUT, MEAN = args.model_layout, args.mean
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU")
    print(f"GPU {torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"cuDNN {torch.backends.cudnn.version()} | inputs {'(B, N, H, D) in memory' if MODEL_LAYOUT else 'contiguous'}"
          + (f" | v and dO + {MEAN:g}" if MEAN else ""))
    if args.profile:
        return profile(args.shapes, not args.no_causal)
    if args.graphs:
        return graphed(args.shapes, not args.no_causal)
    if args.kernels:
        return compare_kernels(args.compare or [], args.shapes, not args.no_causal, args.rounds or 5)
    if args.compare:
        rows = compare(args.compare, args.shapes, not args.no_causal, args.rounds or 3)
    else:
        if args.sweep is not None:
            sweep(args.sweep or list(SWEEP))
        rows = []
        for s in args.shapes:
            B, H, N, D = map(int, s.split("x"))
            rows.append(bench_shape(B, H, N, D, not args.no_causal, with_errors=not args.no_errors))
            print(json.dumps(rows[-1]), flush=True)
        print_table(rows)
    if args.json:
        write_json(args.json, rows, args)


def run_settings(args):
    """What a row's numbers depend on beyond its shape: the machine, the versions, the inputs' settings."""
    return {"command": " ".join(["python", "bench_attention.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cudnn": torch.backends.cudnn.version(), "causal": not args.no_causal, "mean": args.mean,
            "model_layout": args.model_layout, "errors": not (args.no_errors or args.compare),
            "compare": args.compare, "rounds": (args.rounds or 3) if args.compare else None}


def write_json(path, rows, args):
    """{"settings": run_settings, "rows": one per shape}, through a temporary file and a rename: a run
    stopped while writing leaves the earlier file whole. NaN (no such figure, e.g. cuDNN's pre-pass
    share) is written as null: strict JSON."""
    text = json.dumps({"settings": run_settings(args), "rows": nan_to_none(rows)}, indent=1, allow_nan=False)
    atomic_write(path, lambda f: f.write(text), mode="w")


def nan_to_none(x):
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [nan_to_none(v) for v in x]
    return x


SWEEP = {   # (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel; dkdv's BLOCK_M is its query block
    "fwd": [(64, 128, 4, 3), (64, 128, 4, 2), (128, 128, 8, 3), (64, 64, 4, 3), (64, 64, 4, 4), (32, 128, 4, 3)],
    "dq": [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 4),
           (32, 64, 4, 3), (64, 32, 4, 3), (32, 128, 4, 3), (64, 64, 8, 3)],
    "dkdv": [(64, 128, 8, 3), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 4, 3), (32, 128, 4, 3), (64, 64, 4, 3),
             (64, 64, 4, 2), (32, 64, 4, 3), (64, 64, 8, 3)],
}


def compiled_stats(kernel):
    """Registers per thread, spilled registers and shared memory of each compiled variant of a Triton kernel."""
    out = []
    for cache, *_ in kernel.device_caches.values():
        for ck in cache.values():
            out.append(f"{ck.n_regs} regs, {ck.n_spills} spills, {ck.metadata.shared // 1024} KiB smem")
    return out


def sweep(kernels):
    """Time candidate tilings per kernel (SWEEP) on one large causal shape per head dim, in the order
    fwd, dq, dkdv, keeping the fastest of each; tilings that attention_fp8.tiles refuses are skipped.
    (test_attention.py::test_other_tilings checks that other tilings compute the same function.)"""
    jit_fns = {"fwd": A._fwd_kernel, "dq": A._bwd_dq_kernel, "dkdv": A._bwd_dkdv_kernel}
    # The shapes below take the Gluon forward and dK/dV kernels on Hopper, which CONFIGS does not tile:
    # the Triton kernels alone while sweeping, or every candidate would time the same Gluon kernel.
    hopper = A.HOPPER_FORWARD, A.HOPPER_BACKWARD
    A.HOPPER_FORWARD = A.HOPPER_BACKWARD = ()
    try:
        _sweep(kernels, jit_fns)
    finally:
        A.HOPPER_FORWARD, A.HOPPER_BACKWARD = hopper


def _sweep(kernels, jit_fns):
    for D in (64, 128):
        B, H, N = 2, 16, 8192
        q, k, v, do = inputs(B, H, N, D)
        flops = 4 * B * H * N * N * D * 0.5
        for kernel, cands in SWEEP.items():
            if kernel not in kernels:
                continue
            best_t, best = float("inf"), A.CONFIGS[D][kernel]
            flags = {k: v for k, v in best.items() if k not in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
            for bm, bn, w, st in cands:
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, **flags)     # flags such as SCALES_AHEAD stay
                A.CONFIGS[D][kernel] = cfg
                try:
                    A.tiles(D)
                except ValueError:
                    continue
                for cache, *_ in jit_fns[kernel].device_caches.values():
                    cache.clear()     # so compiled_stats below sees this tiling alone
                try:
                    o, lse = A._forward(q, k, v, True, D ** -0.5)
                    if kernel == "fwd":
                        fn, count = (lambda: A._forward(q, k, v, True, D ** -0.5)), 1.0
                    else:
                        fn, count = (lambda: A._backward(do, q, k, v, o, lse, True, D ** -0.5, "matched")), 2.5
                    t = triton.testing.do_bench(fn, warmup=25, rep=150)
                except Exception as e:   # e.g. out of shared memory for this tiling
                    print(f"D={D} {kernel} {cfg}: {first_line(e)}", flush=True)
                    continue
                print(f"D={D} {kernel} {cfg}: {count * flops / t * 1e-9:.0f} TFLOP/s "
                      f"({'forward' if kernel == 'fwd' else 'whole matched backward, 5-matmul count'}) "
                      f"[{'; '.join(compiled_stats(jit_fns[kernel]))}]", flush=True)
                if t < best_t:
                    best_t, best = t, cfg
            A.CONFIGS[D][kernel] = best
        print(f"D={D} best: {A.CONFIGS[D]}", flush=True)


def first_line(e):
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def load_revision(path, i):
    """Import a copy of an older attention_fp8.py as a module of its own. Every revision registers the
    custom ops fp8_attention::fwd/bwd at import and a name registers only once per process, so this
    copy gets the namespace fp8_attention_rev{i}. It is imported from a temp file rather than exec'd
    from a string because @triton.jit reads its functions' source through inspect.

    path may also be a directory holding both files of a revision (git worktree add DIR REV): then
    the copy imports that revision's attention_fp8_hopper.py, as attention_fp8_hopper_rev{i}, instead
    of the current one, so older Gluon kernels are compared too; that file in turn imports the
    revision's attention_fp8, not the current one."""
    tmp_dir = tempfile.mkdtemp(prefix="bench_attention_")
    if os.path.isdir(path):
        hopper = os.path.join(path, "attention_fp8_hopper.py")
        path = os.path.join(path, "attention_fp8.py")
    else:
        hopper = None
    with open(path) as f:
        src = f.read().replace("fp8_attention::", f"fp8_attention_rev{i}::")
    if hopper and os.path.exists(hopper):
        hopper_name = f"attention_fp8_hopper_rev{i}"
        with open(hopper) as f, open(os.path.join(tmp_dir, hopper_name + ".py"), "w") as out:
            # and the revision's Gluon file uses the revision's attention_fp8 (its _grid, its _launch)
            out.write(re.sub(r"^import attention_fp8\b", f"import attention_fp8_rev{i} as attention_fp8", f.read(),
                             flags=re.M))
        src = re.sub(r"import attention_fp8_hopper\b", f"import {hopper_name} as attention_fp8_hopper", src)
        sys.path.insert(0, tmp_dir)     # a fresh directory per revision
    name = f"attention_fp8_rev{i}"
    tmp = os.path.join(tmp_dir, name + ".py")
    with open(tmp, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod     # as a normal import would; code that looks a function's module up finds it
    spec.loader.exec_module(mod)
    return mod


def revisions(files):
    """(label, module) of each older revision in files, then ("current", attention_fp8). A label is the
    file's or folder's name, or, where that is taken (two attention_fp8.py of different folders; a folder
    called current), the path as given, then with its place in the list: times are kept by label, and
    two revisions under one label would share one median."""
    mods, taken = [], {"current", "cudnn"}
    for i, path in enumerate(files):
        label = os.path.basename(os.path.normpath(path))
        if label in taken:
            label = os.path.normpath(path)
        if label in taken:
            label = f"{label} #{i + 1}"
        taken.add(label)
        try:
            mods.append((label, load_revision(path, i)))
        except Exception as e:  # a revision that no longer imports: say so, time the others
            print(f"  {path}: {first_line(e)}", file=sys.stderr)
    return mods + [("current", A)]


def compare(files, shapes, causal, rounds=3):
    """Forward, forward+backward (matched) and forward+backward (stale) time of each older revision,
    the current attention_fp8 and cuDNN, on identical inputs; speedups are against the first label
    (the first FILE). The labels take turns, `rounds` times (the order reversed every other round,
    so that neither clock drift nor a neighbour's heat favours one), and each time is the median."""
    mods = revisions(files)
    fns = [(label, lambda q, k, v, causal, delta="matched", m=m: m.attention(q, k, v, causal=causal, delta=delta))
           for label, m in mods] + [("cudnn", lambda q, k, v, causal, delta=None: METHODS["cudnn"](q, k, v, causal))]
    base, w = fns[0][0], max(len(label) for label, _ in fns)
    print(f"\nspeedups are against {base}; medians of {rounds} interleaved rounds\n"
          f"{'label':>{w}} {'shape':>16} {'c':>1} | {'fwd ms':>8} {'TFLOP/s':>7} | {'fwd+bwd ms':>10} {'TFLOP/s':>7} | "
          f"{'fwd speedup':>11} {'fwd+bwd speedup':>15} | {'pre-pass share':>14}", flush=True)
    rows = []
    for s in shapes:
        B, H, N, D = map(int, s.split("x"))
        q, k, v, do = inputs(B, H, N, D)
        fwd_flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
        times, live = {}, []
        for label, f in fns:    # compile and warm up; a revision that fails here is reported and left out
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            try:
                f(qg, kg, vg, causal).backward(do)
                live.append((label, f))
                times[label] = {"fwd": [], "matched": [], "stale": []}
            except Exception as e:
                print(f"  {label} {s}: {first_line(e)}", file=sys.stderr)
        for r in range(rounds):
            for label, f in (live if r % 2 == 0 else live[::-1]):
                qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
                with torch.no_grad():
                    times[label]["fwd"].append(triton.testing.do_bench(lambda: f(q, k, v, causal), warmup=10, rep=60))
                for delta in ("matched", "stale") if label != "cudnn" else ("matched",):
                    def fwd_bwd():
                        f(qg, kg, vg, causal, delta=delta).backward(do)
                    times[label][delta].append(triton.testing.do_bench(fwd_bwd, warmup=10, rep=60,
                                                                       grad_to_none=[qg, kg, vg]))
        med = {label: {key: statistics.median(ts) if ts else float("nan") for key, ts in t.items()}
               for label, t in times.items()}
        for label, _ in live:
            t_fwd, t_all, t_stale = med[label]["fwd"], med[label]["matched"], med[label]["stale"]
            first = med.get(base)
            r = {"label": label, "shape": f"{B}x{H}x{N}x{D}", "causal": causal, "rounds": rounds,
                 "fwd_ms": t_fwd, "fwd_tflops": fwd_flops / t_fwd * 1e-9,
                 "fwdbwd_ms": t_all, "fwdbwd_tflops": 3.5 * fwd_flops / t_all * 1e-9,
                 "fwd_speedup": first["fwd"] / t_fwd if first else float("nan"),
                 "fwdbwd_speedup": first["matched"] / t_all if first else float("nan"),
                 "prepass_share": (t_all - t_stale) / t_all}
            rows.append(r)
            print(f"{label:>{w}} {r['shape']:>16} {'y' if causal else 'n':>1} | {t_fwd:8.3f} {r['fwd_tflops']:7.0f} | "
                  f"{t_all:10.3f} {r['fwdbwd_tflops']:7.0f} | {r['fwd_speedup']:11.3f} {r['fwdbwd_speedup']:15.3f} | "
                  f"{r['prepass_share']:14.1%}", flush=True)
    return rows


def back_to_back_us(fn, n):
    """Mean microseconds per call of fn over n calls issued back to back: the larger of host and GPU time."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t0) / n


def graphed(shapes, causal):
    """Forward+backward of each method, eager and replayed from a CUDA graph captured once. A replay
    launches the recorded kernels with no Python, autograd or launch overhead, so small shapes, which
    are bound by host time in eager mode, show their GPU time; every method gets the same treatment."""
    print(f"\n{'method':>12} {'shape':>16} {'c':>1} | {'eager ms':>8} {'TFLOP/s':>7} | {'graph ms':>8} {'TFLOP/s':>7}")
    for s in shapes:
        B, H, N, D = map(int, s.split("x"))
        q, k, v, do = inputs(B, H, N, D)
        fwd_bwd_flops = 3.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
        for name, f in METHODS.items():
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

            def step():
                f(qg, kg, vg, causal).backward(do)
            try:
                t_eager = triton.testing.do_bench(step, warmup=25, rep=150, grad_to_none=[qg, kg, vg])
                side = torch.cuda.Stream()      # capture needs its warm-up on a side stream
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        step()
                torch.cuda.current_stream().wait_stream(side)
                qg.grad = kg.grad = vg.grad = None      # allocated by the graph, rewritten by each replay
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                t_graph = triton.testing.do_bench(graph.replay, warmup=25, rep=150)
            except (RuntimeError, ValueError) as e:     # ValueError: a shape the FP8 kernel refuses
                print(f"  {name} {s}: {first_line(e)}", file=sys.stderr)
                continue
            print(f"{name:>12} {s:>16} {'y' if causal else 'n':>1} | {t_eager:8.3f} {fwd_bwd_flops / t_eager * 1e-9:7.0f} | "
                  f"{t_graph:8.3f} {fwd_bwd_flops / t_graph * 1e-9:7.0f}", flush=True)


KERNEL_KINDS = (("fwd", "_fwd_kernel"), ("dq", "_bwd_dq_kernel"), ("dkdv", "dkdv_kernel"), ("quant", "_quantize"))


def compare_kernels(files, shapes, causal, rounds, calls=6):
    """As compare() (cuDNN left out), but each label's time is the GPU time of its kernels (torch
    profiler), summed over `calls` forward+backward calls, by kernel (forward, dQ with the pre-pass,
    dK/dV, quantize) and in all; medians of `rounds` interleaved rounds. Host time and launch gaps are left out, so differences
    of 1% show (the same code twice reads within about 0.3% on the H200, where wall-time --compare
    runs can swing the identical forward by several percent). Stale rows give the pre-pass's share
    of GPU time: (matched - stale) / matched."""
    runs = [(label + suffix, m, delta) for label, m in revisions(files)
            for suffix, delta in (("", "matched"), (" stale", "stale"))]
    for s in shapes:
        B, H, N, D = map(int, s.split("x"))
        q, k, v, do = inputs(B, H, N, D)
        q, k, v = (x.requires_grad_() for x in (q, k, v))

        def fwd_bwd(m, delta):
            q.grad = k.grad = v.grad = None     # no grad-accumulation kernels
            m.attention(q, k, v, causal=causal, delta=delta).backward(do)
        live = []
        for label, m, delta in runs:     # compile and warm up; a revision that fails is reported and left out
            try:
                fwd_bwd(m, delta)
                live.append((label, m, delta))
            except Exception as e:
                print(f"  {label} {s}: {first_line(e)}", file=sys.stderr)
        if not live:
            continue
        times = {label: {kind: [] for kind, _ in KERNEL_KINDS + (("all", ""),)} for label, _, _ in live}
        for r in range(rounds):
            for label, m, delta in (live if r % 2 == 0 else live[::-1]):
                torch.cuda.synchronize()
                with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(calls):
                        fwd_bwd(m, delta)
                    torch.cuda.synchronize()
                per_kind = dict.fromkeys(times[label], 0.0)
                for e in prof.events():
                    if e.device_type == DeviceType.CUDA:
                        kind = next((kind for kind, key in KERNEL_KINDS if key in e.name), None)
                        if kind:
                            per_kind[kind] += e.time_range.elapsed_us() / calls
                        per_kind["all"] += e.time_range.elapsed_us() / calls
                for kind, t in per_kind.items():
                    times[label][kind].append(t)
        med = {label: {kind: statistics.median(ts) for kind, ts in t.items()} for label, t in times.items()}
        base = med[live[0][0]]
        print(f"\n{s} causal={'y' if causal else 'n'}: GPU us per forward+backward by kernel (medians of {rounds} "
              f"interleaved rounds of {calls} calls; speedups against {live[0][0]})")
        for label, _, delta in live:
            t = med[label]
            share = ""
            if delta == "stale" and label[:-len(" stale")] in med:
                matched = med[label[:-len(" stale")]]["all"]
                share = f" | pre-pass {(matched - t['all']) / matched:.1%} of GPU time"
            print(f"{label:>16}: " + "  ".join(f"{kind} {t[kind]:8.1f} ({base[kind] / t[kind]:.3f}x)"
                                               for kind in t if base[kind] > 0 and t[kind] > 0) + share, flush=True)


def profile(shapes, causal, iters=5):
    """Per CUDA kernel, calls and mean GPU time per fp8 forward+backward, and the sum against the wall time
    per iteration: the difference is what kernel launches and the CPU side (autograd, glue) add. Also the
    back-to-back time by entry path (eager autograd.Function, custom op, cuDNN) and a cProfile of the host."""
    for s in shapes:
        B, H, N, D = map(int, s.split("x"))
        q, k, v, do = inputs(B, H, N, D)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        # Host time by entry path (eager attention() goes through a plain autograd.Function; the
        # custom op is what torch.compile calls, and on Hopper it takes the Gluon kernels at every
        # size, so below 2^29 scores it times other kernels too), timed back to back.
        paths = {"attention() in eager mode": lambda: A.attention(q, k, v, causal=causal),
                 "the custom op fp8_attention::fwd": lambda: A._fwd_op(q, k, v, causal, D ** -0.5, "matched")[0],
                 "cuDNN SDPA": lambda: METHODS["cudnn"](q, k, v, causal)}
        print(f"\n{B}x{H}x{N}x{D} causal={'y' if causal else 'n'}, back-to-back forward+backward by entry path:")
        for name, f in paths.items():
            def step():
                q.grad = k.grad = v.grad = None
                f().backward(do)
            for _ in range(10):
                step()
            print(f"  {name:>34}: {back_to_back_us(step, 10 * iters):7.1f} us", flush=True)
        for delta in ("matched", "stale"):
            def fwd_bwd():
                q.grad = k.grad = v.grad = None     # as do_bench's grad_to_none: no grad-accumulation kernels
                A.attention(q, k, v, causal=causal, delta=delta).backward(do)
            wall = 1e3 * triton.testing.do_bench(fwd_bwd, warmup=25, rep=150)    # also compiles, outside the profile
            host = back_to_back_us(fwd_bwd, 4 * iters)
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(iters):
                    fwd_bwd()
                torch.cuda.synchronize()
            kern = {}
            for e in prof.events():
                if e.device_type == DeviceType.CUDA:
                    c, t = kern.get(e.name, (0, 0.0))
                    kern[e.name] = (c + 1, t + e.time_range.elapsed_us())
            total = sum(t for _, t in kern.values()) / iters
            print(f"\n{B}x{H}x{N}x{D} causal={'y' if causal else 'n'} delta={delta}, per forward+backward "
                  f"({iters} profiled)\n{'calls':>6} {'mean us':>9} {'total us':>9}  kernel")
            for name, (c, t) in sorted(kern.items(), key=lambda kv: -kv[1][1]):
                print(f"{c / iters:6.1f} {t / c:9.1f} {t / iters:9.1f}  {name[:100]}")
            print(f"{'':>16} {total:9.1f}  sum of kernel times\n"
                  f"wall: do_bench {wall:.1f} us (L2 flushed before each call), back-to-back {host:.1f} us -> "
                  f"not in kernels (launches, CPU side, gaps): {wall - total:.1f} / {host - total:.1f} us", flush=True)
            # where the host time goes: Python functions by own time over 4 * iters calls
            prof_host = cProfile.Profile()
            prof_host.enable()
            for _ in range(4 * iters):
                fwd_bwd()
            prof_host.disable()
            torch.cuda.synchronize()
            out = io.StringIO()
            pstats.Stats(prof_host, stream=out).sort_stats("tottime").print_stats(12)
            print(f"host side, {4 * iters} calls (cProfile, tottime first; it sees the main thread only, and the "
                  f"backward runs in autograd's device thread):\n" +
                  "\n".join(line for line in out.getvalue().splitlines() if line.strip()
                            and not line.lstrip().startswith(("Ordered", "List reduced"))), flush=True)


if __name__ == "__main__":
    main()

"""Registers and spills of the attention kernels as ptxas builds them for Hopper (sm_90a), on any
machine: no GPU needed. Triton compiles each kernel to PTX for the target, and the ptxas that ships
with Triton reports its registers per thread and the bytes it spills; "per SM" is how many programs
of the kernel fit on one SM at once (registers, shared memory, warps). The backward is register-bound
(SPEED.md), and more programs per SM hide more latency (step 11), so this is the first thing to look
at after changing a kernel.

    python kernel_registers.py                   # attention_fp8.py and the Gluon kernels of attention_fp8_hopper.py
    python kernel_registers.py --file old.py     # another revision (git show REV:attention_fp8.py > old.py)
    python kernel_registers.py --hopper ''        # the Triton kernels only
    python kernel_registers.py --section 12      # compiled for sections of 12 heads (G, attention_fp8._grid; 4 if not given)
    python kernel_registers.py --target 89       # the Triton kernels for Ada (89), B200 (100) or RTX 50xx (120),
                                                 # tiled as attention_fp8.config() tiles them there

It exits with an error if a kernel asks for more shared memory per block than the target has: such
a kernel compiles, but the GPU refuses to launch it.

Integer arguments are compiled as the launcher specializes them at the benchmark shapes (divisible
by 16, head counts not, and head_dim's stride, 1 in every launch, a constant), so the numbers come
within a few registers and spilled bytes of what the H200 reads back after a real launch
(results/registers_h200.txt). The quantize kernel is compiled for each of its three launches.
"""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

FP8_POINTERS = {"Q8", "QT8", "K8", "KT8", "V8", "VT8", "DO8", "DOT8", "X8", "X8T", "Y8", "Y8T"}
ACT_POINTERS = {"Q", "O", "DO", "DQ", "DK", "DV", "X", "Y"}      # bf16 activations and gradients
FLOAT_SCALARS = {"sm_scale", "qk_scale"}
INTS = {"N", "H", "H_KV"}         # capitals that are not pointers
UNSPECIALIZED = {"H", "H_KV"}     # head counts: small numbers, not divisible by 16
# head_dim's stride: 1 in every launch (the kernels read rows of D contiguous elements), and Triton
# compiles an integer argument equal to 1 as the constant 1 (vector loads; as an i32 the quantize
# kernel at D = 128 read back 255 registers and 120 spilled bytes, against 241 and none as launched)
STRIDE_ONE = {"stride_qd", "stride_dod", "sxd", "syd"}
COMPILE_OPTIONS = {}              # the compile options of the file under test (its COMPILE_OPTIONS), set by main()
SECTION = 4                       # the kernels' G (section()), set by main()
# Per target (compute capability): the shared memory a block may ask for and an SM holds, in bytes,
# and the most warps an SM holds (CUDA C Programming Guide, "Compute Capabilities"). All have 64K
# registers per SM. The FP8 GPUs: Ada, Hopper, B200, consumer Blackwell.
TARGETS = {89: dict(block=101376, sm=102400, warps=48), 90: dict(block=232448, sm=233472, warps=64),
           100: dict(block=232448, sm=233472, warps=64), 120: dict(block=101376, sm=102400, warps=48)}
TARGET = 90                       # set by main()


def arg_type(name):
    """Triton signature type of a kernel argument, from the naming convention of attention_fp8."""
    if name in FP8_POINTERS:
        return "*fp8e4nv"
    if name in ACT_POINTERS:
        return "*bf16"
    if name.isupper() and name not in INTS:     # scales, LSE, delta, row sums
        return "*fp32"
    return "fp32" if name in FLOAT_SCALARS else "i32"


def section(fn):
    """The constexpr G of a kernel that starts its programs in sections of G heads (attention_fp8._grid;
    a revision before sections has none): --section, 4 unless given. A launch compiles its own G, 1 to
    128 at the benchmark's shapes, and the registers can differ with it."""
    return {"G": SECTION} if any(p.name == "G" for p in fn.params) else {}


def compile_for_target(fn, constexprs, num_warps, num_stages, descriptors=None, maxnreg=None):
    """fn compiled for TARGET as its launch compiles it (results/fwd_sass.py reads its SASS).
    descriptors: {argument name: (block shape, shared layout)} of a Gluon kernel's TMA descriptors;
    maxnreg: the register cap the launch asks for, if any."""
    names = fn.arg_names
    constexprs = {**{n: 1 for n in names if n in STRIDE_ONE}, **constexprs}
    signature = {n: "constexpr" if n in constexprs else arg_type(n) for n in names}
    for n, (block, layout) in (descriptors or {}).items():
        signature[n] = f"tensordesc<fp8e4nv{list(block)},{layout!r}>"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n].startswith("*") or (signature[n] == "i32" and n not in UNSPECIALIZED)}
    source = GluonASTSource if descriptors else ASTSource
    src = source(fn, signature, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages, **COMPILE_OPTIONS,
                   **({"maxnreg": maxnreg} if maxnreg else {}))
    return triton.compile(src, target=GPUTarget("cuda", TARGET, 32), options=options)


def resources(fn, constexprs, num_warps, num_stages, descriptors=None, maxnreg=None):
    """(registers per thread, spill store bytes, shared memory bytes) of fn compiled for TARGET
    (arguments as compile_for_target's), from ptxas -v."""
    kernel = compile_for_target(fn, constexprs, num_warps, num_stages, descriptors, maxnreg)
    ptxas = ptxas_path()
    gpu_name = re.search(r"^\.target\s+(sm_\w+)", kernel.asm["ptx"], re.M).group(1)     # sm_90a, sm_89, ...
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        log = subprocess.run([ptxas, "-v", f"--gpu-name={gpu_name}", ptx, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    return regs, spills, kernel.metadata.shared


def ptxas_path():
    """The ptxas Triton itself runs for the target: Triton 3.9 ships two and takes the newer one from sm_90 up."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(TARGET).path
    except (ImportError, AttributeError, TypeError):     # a Triton without it: its one ptxas
        return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def cap(maxnreg):
    return f" r{maxnreg}" if maxnreg else ""


def programs_per_sm(regs, shared, warps):
    """How many programs of a kernel an SM of the target holds at once: 64K registers, allocated per
    warp in steps of 256 (8 per thread); its shared memory (228 KiB on an H100/H200), of which each
    program also takes 1 KiB for the system; its warps (64). Registers are what keeps the backward at
    two on Hopper (SPEED.md, step 11)."""
    by_regs = 65536 // (-(-regs // 8) * 8 * 32 * warps)
    by_shared = TARGETS[TARGET]["sm"] // (shared + 1024)
    return min(by_regs, by_shared, TARGETS[TARGET]["warps"] // warps)


TOO_BIG = []        # the kernels that ask for more shared memory per block than the target has


def row(D, name, tiling, regs, spills, shared, warps):
    fits = shared <= TARGETS[TARGET]["block"]
    if not fits:
        TOO_BIG.append(f"D={D} {name} ({tiling}): {shared:,} bytes of shared memory, the most is {TARGETS[TARGET]['block']:,}")
    print(f"{D:>4} {name:>10} {tiling:>36} | {regs:>9} {spills:>13} {shared / 1024:>10.1f} "
          f"{programs_per_sm(regs, shared, warps) if fits else 'none':>11}", flush=True)


def load(path, name="attention_fp8_under_test"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_fp8.py"))
    p.add_argument("--hopper", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_fp8_hopper.py"),
                   help="the Gluon kernels' file ('' to leave them out)")
    p.add_argument("--head-dims", type=int, nargs="+", default=None)
    p.add_argument("--target", type=int, choices=sorted(TARGETS), default=90,
                   help="compute capability to build for (the Gluon kernels only for 90)")
    p.add_argument("--section", type=int, default=4, help="G, the heads per section the kernels are compiled for")
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("kernel_registers.py: unset TRITON_INTERPRET; the interpreter does not compile kernels")
    A = load(args.file)
    global COMPILE_OPTIONS, TARGET, SECTION
    COMPILE_OPTIONS = getattr(A, "COMPILE_OPTIONS", {})     # what that file's launches ask of Triton
    TARGET, SECTION = args.target, args.section
    shared_bytes = TARGETS[TARGET]["block"]
    # the tilings the launchers take on such a GPU (attention_fp8.config); older revisions have one for all
    tiled_by_gpu = hasattr(A, "config")
    H = None
    if args.hopper and TARGET == 90:     # the Gluon kernels (Gluon has no interpreter: this compile is CPU CI's check of them)
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.hopper)))
        H = load(args.hopper, "attention_fp8_hopper_under_test")
    print(f"{args.file}: triton {triton.__version__}, target sm_{TARGET}, causal, matched delta")
    print(f"{'D':>4} {'kernel':>10} {'tiling':>36} | {'registers':>9} {'spilled bytes':>13} {'shared KiB':>10} "
          f"{'per SM':>11}")
    for D in args.head_dims or A.HEAD_DIMS:
        # the quantizer as attention_fp8 launches it: the forward's K^ and V^T, the backward's Q^, Q^T, dO^,
        # dO^T, then its K^, K^T and V^. The token-major copies are permuted within each 32 tokens for the
        # Gluon kernels (with --hopper on sm_90, as at the benchmark's sizes) and always for K^T.
        tile = A.tiles(D, shared_bytes) if tiled_by_gpu else A.tiles(D)
        gluon = H is not None
        launches = (("K, V^T", tile["k"], (True, False, False, True), gluon),
                    ("Q, dO, both", tile["q"], (True, True, True, True), gluon),
                    ("K, K^T, V", tile["k"], (True, True, True, False), True))
        for what, t, (x_rows, x_cols, y_rows, y_cols), permuted in launches:
            regs, spills, shared = resources(A._quantize_kernel, dict(TILE=t, D=D, X_ROWS=x_rows, X_COLS=x_cols,
                                                                      Y_ROWS=y_rows, Y_COLS=y_cols,
                                                                      PERMUTE_COLS=permuted), 4, 1)
            row(D, "quantize", f"TILE={t} w4 {what}" + (" permuted" if permuted else ""), regs, spills, shared, 4)
        kernels = {"fwd": (A._fwd_kernel, dict(CAUSAL=True)),     # with section(): G = 4 where a kernel takes G
                   "dq": (A._bwd_dq_kernel, dict(CAUSAL=True, MATCHED=True, DEBUG=False)),
                   "dkdv": (A._bwd_dkdv_kernel, dict(CAUSAL=True))}
        for name, (fn, flags) in kernels.items():
            cfg = dict(A.config(D, name, shared_bytes) if tiled_by_gpu else A.CONFIGS[D][name])
            num_warps, num_stages, maxnreg = cfg.pop("num_warps"), cfg.pop("num_stages"), cfg.pop("maxnreg", None)
            regs, spills, shared = resources(fn, dict(D=D, **flags, **section(fn), **cfg), num_warps, num_stages,
                                             maxnreg=maxnreg)
            tiling = " ".join(f"{k.removeprefix('BLOCK_')}={v}" if k.startswith("BLOCK_") else k.lower()
                              for k, v in cfg.items() if v is not False) + f" w{num_warps} s{num_stages}" + cap(maxnreg)
            row(D, name, tiling, regs, spills, shared, num_warps)
        if H is not None:      # the Gluon forward and dK/dV kernel for Hopper (attention_fp8_hopper.py)
            cfg = dict(H.CONFIGS[D])
            maxnreg = cfg.pop("maxnreg", None)
            regs, spills, shared = resources(H._fwd_kernel_hopper, dict(D=D, CAUSAL=True, **section(H._fwd_kernel_hopper),
                                                                        **cfg), cfg["BLOCK_M"] // 16,
                                             1, H.descriptor_blocks(D, cfg["BLOCK_N"]), maxnreg)
            tiling = f"M={cfg['BLOCK_M']} N={cfg['BLOCK_N']} w{cfg['BLOCK_M'] // 16} s{cfg['STAGES']}" + cap(maxnreg)
            row(D, "fwd-gluon", tiling, regs, spills, shared, cfg["BLOCK_M"] // 16)
            cfg = dict(H.DKDV_CONFIGS[D])
            maxnreg = cfg.pop("maxnreg", None)
            regs, spills, shared = resources(H._dkdv_kernel_hopper, dict(D=D, CAUSAL=True, **section(H._dkdv_kernel_hopper),
                                                                         **cfg), cfg["BLOCK_N"] // 16,
                                             1, H.dkdv_descriptor_blocks(D, cfg["BLOCK_M"]), maxnreg)
            tiling = (f"N={cfg['BLOCK_N']} M={cfg['BLOCK_M']} w{cfg['BLOCK_N'] // 16} s2"
                      + (f" flush{cfg['DV_FLUSH']}" if cfg.get("DV_FLUSH") else "")
                      + (" rows-cp.async" if cfg.get("ROWS_CP_ASYNC") else "")
                      + (" flush-under-dots" if cfg.get("FLUSH_UNDER_DOTS") else "") + cap(maxnreg))
            row(D, "dkdv-gluon", tiling, regs, spills, shared, cfg["BLOCK_N"] // 16)
    if TOO_BIG:
        sys.exit("kernel_registers.py: too much shared memory for sm_%d, which would refuse to launch:\n  %s"
                 % (TARGET, "\n  ".join(TOO_BIG)))


if __name__ == "__main__":
    main()

"""Hash the PTX of every Triton kernel as kernel_registers.py compiles them (no GPU needed), with the
line-number and debug information left out, so a change to comments or host code can be shown to leave
the device code alone: run it on the old and the new attention_fp8.py and compare the lines.

    python results/ptx_hash.py --file OLD/attention_fp8.py --hopper ""     # from the repository root
    python results/ptx_hash.py --hopper ""                                 # (any kernel_registers.py flags)

Prints one (kernel, hash) pair per compiled kernel, in kernel_registers.py's order (head dims 64, 128).
"""
import hashlib
import re
import runpy
import sys

import triton

compile_ = triton.compile
hashes = []


def compile_and_hash(src, target=None, options=None):
    kernel = compile_(src, target=target, options=options)
    ptx = re.split(r"^\s*\.section\s+\.debug", kernel.asm["ptx"], flags=re.M)[0]
    ptx = "\n".join(line for line in ptx.splitlines() if not re.match(r"\s*\.(loc|file)\b", line))
    hashes.append((getattr(getattr(src, "fn", None), "__name__", "?"), hashlib.sha1(ptx.encode()).hexdigest()[:12]))
    return kernel


triton.compile = compile_and_hash
sys.argv = ["kernel_registers.py"] + sys.argv[1:]
try:
    runpy.run_path("kernel_registers.py", run_name="__main__")
finally:
    print("\n".join(f"{name} {h}" for name, h in hashes))

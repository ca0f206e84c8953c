"""Offline, no GPU: the Gluon forward (attention_fp8_hopper._fwd_kernel_hopper) compiled for sm_90a as its
launch compiles it (CONFIGS[D], causal, G = 4), its registers and spills from ptxas, and its SASS
(nvdisasm) written to OUT/fwd_dD.sass. Used for SPEED.md's note on the loop's register copies
(session 41, results/fwd_unroll2.patch). Run from the root of the checkout to study, under the Triton
the GPU has:

    PYTHONPATH=/tmp/t36lib python results/fwd_sass.py 128 [OUT]
    python results/sass_ops.py OUT/fwd_d128.sass 0x40d0 0x66b0    # instructions by opcode in a range
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.getcwd())
import triton

import attention_fp8 as A
import attention_fp8_hopper as H
import kernel_registers as KR

D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
out_dir = sys.argv[2] if len(sys.argv) > 2 else "/tmp/sass"
os.makedirs(out_dir, exist_ok=True)
KR.TARGET, KR.SECTION, KR.COMPILE_OPTIONS = 90, 4, getattr(A, "COMPILE_OPTIONS", {})
cfg = dict(H.CONFIGS[D])
maxnreg = cfg.pop("maxnreg", None)
fn = H._fwd_kernel_hopper
constexprs = dict(D=D, CAUSAL=True, G=4, **cfg)
kernel = KR.compile_for_target(fn, constexprs, num_warps=cfg["BLOCK_M"] // 16, num_stages=1,
                               descriptors=H.descriptor_blocks(D, cfg["BLOCK_N"]), maxnreg=maxnreg)

out = os.path.join(out_dir, f"fwd_d{D}")
with open(out + ".cubin", "wb") as f:
    f.write(kernel.asm["cubin"])
with open(out + ".ptx", "w") as f:
    f.write(kernel.asm["ptx"])
nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
with open(out + ".sass", "w") as f:
    f.write(subprocess.run([nvdisasm, "-c", "-g", out + ".cubin"], capture_output=True, text=True, check=True).stdout)
log = subprocess.run([KR.ptxas_path(), "-v", "--gpu-name=sm_90a", out + ".ptx", "-o", os.devnull],
                     capture_output=True, text=True, check=True).stderr
found = re.findall(r"Used \d+ registers|\d+ bytes spill stores", log)
print(f"triton {triton.__version__}, D = {D}: {', '.join(found)}; SASS in {out}.sass")

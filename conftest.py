"""pytest set-up shared by every test.

Without a CUDA GPU the Triton kernels run under the Triton interpreter (TRITON_INTERPRET=1, which
must be set before any @triton.jit function is defined, hence here), with the test-only shim that
makes the interpreter round fp8 and bf16 like the GPU (tests/triton_shim.py).
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":     # on a GPU machine too, when asked for
    try:
        import triton_shim
    except ImportError:     # triton missing: the kernel tests skip themselves, the rest runs
        triton_shim = None
    if triton_shim is not None:
        triton_shim.install()


def pytest_configure(config):
    # the interpreter's own numpy deprecation noise, once per kernel op
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.runtime.interpreter")

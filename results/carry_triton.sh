#!/bin/bash
# Run the kernels on the GPU machine under another Triton than the one installed there (it has 3.6, no
# network, and takes 64 MiB per call; `pip install -r requirements.txt` brings 3.8): the steps that
# results/triton38_h200.txt took by hand, written down after them.
#
#   bash results/carry_triton.sh build 3.8.0 [3.12]    here: .carry/triton-3.8.0.tar.xz (~53 MB), for Python 3.12
#   bash results/carry_triton.sh run 3.8.0 CMD ...     there (carry ".carry/triton-3.8.0.tar.xz"): CMD with that
#                                                      Triton first on the path (extracted on first use)
#
# The wheel loses what the kernels never use (profilers, AMD backend, the other ptxas) and its debug
# symbols (libtriton.so 483 -> 192 MB). The machine's own Triton registers its backends by entry
# point; TRITON_BACKENDS_IN_TREE=1 makes the carried one find its own.
set -euo pipefail
mode=$1 ver=$2
root=$(cd "$(dirname "$0")/.." && pwd)
archive=$root/.carry/triton-$ver.tar.xz
dir=$root/.carry/triton-$ver
if [ "$mode" = build ]; then
    py=${3:-3.12}
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    pip download -q --no-deps --only-binary=:all: --python-version "$py" --platform manylinux_2_27_x86_64 \
        "triton==$ver" -d "$work"
    python -m zipfile -e "$work"/triton-*.whl "$work/x"
    cd "$work/x/triton"
    rm -rf backends/amd instrumentation FileCheck backends/nvidia/lib/cupti*
    # sm_90 compiles with bin/ptxas up to 3.8; 3.9 takes the newer of its two (kernel_registers.ptxas_path)
    case "$ver" in 3.[0-8].*) rm -f backends/nvidia/bin/ptxas-blackwell ;; esac
    strip --strip-unneeded _C/*.so
    mkdir -p "$root/.carry"
    tar cf - -C "$work/x" triton | xz -9 -T2 > "$archive"
    ls -l "$archive"
elif [ "$mode" = run ]; then
    shift 2
    if [ ! -d "$dir/triton" ]; then    # extracted beside it, then renamed: a cut extraction is never used
        rm -rf "$dir.part" && mkdir -p "$dir.part"
        python -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$archive" "$dir.part"
        chmod +x "$dir.part"/triton/backends/nvidia/bin/*     # zip extraction drops the executable bits
        rm -rf "$dir" && mv "$dir.part" "$dir"
    fi
    # The archive has no ptxas-blackwell (above), which kernel_registers.py --target 100 / 120 needs
    # (test_kernels_fit_shared_memory): borrow the machine's own Triton's, if it has one.
    if [ ! -e "$dir/triton/backends/nvidia/bin/ptxas-blackwell" ] && [ -z "${TRITON_PTXAS_BLACKWELL_PATH:-}" ]; then
        own=$(python -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'ptxas-blackwell'))" 2>/dev/null || true)
        if [ -n "$own" ] && [ -x "$own" ]; then export TRITON_PTXAS_BLACKWELL_PATH=$own; fi
    fi
    PYTHONPATH="$dir:$root${PYTHONPATH:+:$PYTHONPATH}" TRITON_BACKENDS_IN_TREE=1 "$@"
else
    echo "usage: $0 build VERSION [PYTHON] | run VERSION CMD ..." >&2
    exit 2
fi

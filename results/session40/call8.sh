#!/bin/bash
# Session 40, device call 8: the flattened grid (branch flat-grid: sections on the grid (G * tiles,
# heads / G), G a constexpr, the tile index from the first axis) against main before step 23 (rev/before,
# 06254ac) and step 23 as first built (rev/lpt3d, bab18b6: grid (G, tiles, heads / G)); then the
# Gluon section mutants and the kernel tests that launch every grid. Before the call, here:
#   mkdir -p rev/before rev/lpt3d; git show 06254ac:F > rev/before/F; git show bab18b6:F > rev/lpt3d/F
#   (F = attention_fp8.py, attention_fp8_hopper.py), and rev/lpt3d's Gluon file given a 3-axis _grid of
#   its own (sed 's/attention_fp8\._grid(/_grid_here(/' and a _grid_here as bab18b6's _grid).
set -uo pipefail
logs=/tmp/flat; mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python bench_attention.py --compare rev/before rev/lpt3d --kernels 2>&1 | grep -v Warn | tee "$logs/kernels.txt"
timeout 150 python tests/mutate_kernel.py --gluon -k section 2>&1 | tee "$logs/mutants_gluon.txt"
timeout 90 python -m pytest -q -x test_attention.py -k "launch or program or against_fp32" > "$logs/tests.txt" 2>&1
tail -2 "$logs/tests.txt"
tar -C "$logs" -czf "${OUT:-/tmp}/flat.tgz" .

"""Do the kernel tests catch a broken kernel? Plant one bug at a time in a copy of attention_fp8.py and
run test_attention.py on it: each bug should fail at least one test ("caught"). The copy without
a bug runs first and must pass. A bug that kills the test process (tiles read past a tensor can abort
the interpreter) is "crashed": the suite fails, but no test names it.

    python tests/mutate_kernel.py             # every bug, two at a time (~5 minutes on 2 CPU cores)
    python tests/mutate_kernel.py -k dq_gain  # the bugs whose names contain dq_gain

On a CPU the tests run under the Triton interpreter, so this checks the Triton kernels. The Gluon
kernels of attention_fp8_hopper.py run only on a Hopper GPU:

    python tests/mutate_kernel.py --gluon     # their bugs, against the tests with the Gluon kernels at
                                              # every size (FP8_GLUON_EVERYWHERE=1)

A bug whose text no longer matches the source is reported as stale: edit it here along with the kernel.
tests/mutate_trainer.py does the same for the trainer, model and data code with this file's runner.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (text in attention_fp8.py, what it becomes, what the bug is)
BUGS = {
    "section_of_head": ("    return tile, tl.program_id(1) * G + pid % G",
                        "    return tile, pid % G",
                        "every section of heads takes the first section's heads"),
    "head_of_section": ("    return tile, tl.program_id(1) * G + pid % G",
                        "    return tile, tl.program_id(1) * G",
                        "every program of a section of heads takes its first head"),
    "tile_of_section_unscaled": ("        tile = tl.num_programs(0) // G - 1 - tile",
                                 "        tile = tl.num_programs(0) - 1 - tile",
                                 "query tiles counted back from G x the tiles (the grid's length, not the tiles)"),
    "delta_gain": ("pdp += tl.sum(p * dp_raw, 1) * c ", "pdp += tl.sum(p * dp_raw, 1) * c * 1.001 ",
                   "the matched delta 0.1% too large"),
    "delta_without_r": ("delta = tl.where(row_ok, pdp / tl.where(row_ok, r, 1.0), 0.0)",
                        "delta = tl.where(row_ok, pdp, 0.0)",
                        "delta not divided by sum_j P_ij"),
    "prepass_diagonal_unmasked": (
        "offs_m, n_free, n_end, N,\n                              D, BLOCK_N, CAUSAL, True, SCALES_AHEAD)",
        "offs_m, n_free, n_end, N,\n                              D, BLOCK_N, CAUSAL, False, SCALES_AHEAD)",
        "the pre-pass counts masked keys of the diagonal tile"),
    "stale_runs_the_prepass": ("    if MATCHED:\n        # The Delta-Matching pre-pass", "    if True:\n        # The Delta-Matching pre-pass",
                               "the ablation arm gets the matched delta"),
    "causal_mask_strict": ("keep = keep & (offs_n[None, :] <= offs_m[:, None])\n        qk = tl.where",
                           "keep = keep & (offs_n[None, :] < offs_m[:, None])\n        qk = tl.where",
                           "a query does not see its own key (forward and dQ kernel)"),
    "dkdv_mask_strict": ("qkT = tl.where(offs_m[None, :] >= offs_n[:, None], qkT", "qkT = tl.where(offs_m[None, :] > offs_n[:, None], qkT",
                         "the dK/dV kernel's causal mask drops the diagonal"),
    "dq_skips_diagonal": ("offs_m, n_free, n_end, N, N_pad, D, BLOCK_N, CAUSAL, True, DEBUG)",
                          "offs_m, n_free, n_free, N, N_pad, D, BLOCK_N, CAUSAL, True, DEBUG)",
                          "dQ leaves out the masked key tiles"),
    "dkdv_delta_of_next_row": ("delta = tl.load(DELTA + offs_m)", "delta = tl.load(DELTA + offs_m + 1)",
                               "the dK/dV kernel reads each query's delta one row off"),
    "gqa_first_head_only": ("    for g in range(group):\n        h = hk * group + g", "    for g in range(1):\n        h = hk * group + g",
                            "dK, dV summed over one of the query heads that share a KV head"),
    "dq_gain": ("dq += tl.dot(ds8, k) * (amax * (sk / 448.0))[:, None]",
                "dq += tl.dot(ds8, k) * (amax * (sk / 448.0) * 1.01)[:, None]", "dQ 1% too large"),
    "dk_gain": ("(amax * (sq / (448.0 * 256.0)))[:, None]", "(amax * (sq / (448.0 * 256.0)) * 1.01)[:, None]",
                "dK 1% too large"),
    "dv_gain": ("dv += tl.dot(pT.to(tl.float8e4nv), do) * (sdo / 256.0)",
                "dv += tl.dot(pT.to(tl.float8e4nv), do) * (sdo / 256.0 * 1.01)", "dV 1% too large"),
    "dv_first_tile_scale": ("dv += tl.dot(pT.to(tl.float8e4nv), do) * (sdo / 256.0)",
                            "dv += tl.dot(pT.to(tl.float8e4nv), do) * (tl.load(SDO) / 256.0)",
                            "dV takes dO's first tile scale for every tile"),
    "o_divided_by_l": ("o = acc / w_i[:, None]", "o = acc / l_i[:, None]",
                       "O divided by the sum of the unrounded weights"),
    "w_not_rescaled": ("w_i = w_i * alpha + tl.sum(p8.to(tl.float32), 1)", "w_i = w_i + tl.sum(p8.to(tl.float32), 1)",
                       "the sum of the weights not rescaled when the row max moves"),
    "lse_off": ("m_i + tl.math.log2(l_i) - 8.0, mask=row_ok)", "m_i + tl.math.log2(l_i) - 8.001, mask=row_ok)",
                "LSE off by 0.001 (the backward's P 0.07% too large)"),
    "forward_q_scale": ("q = (q * tl.where(live, 448.0 / tl.maximum(amax, 1e-30), 0.0)).to(tl.float8e4nv)\n    qs = ",
                        "q = (q * tl.where(live, 440.0 / tl.maximum(amax, 1e-30), 0.0)).to(tl.float8e4nv)\n    qs = ",
                        "the forward's Q^ made with another scale than the one it multiplies back"),
    "dq_keys_unpermuted": ("ds8 = _permuted_cols((ds * (448.0 / amax)[:, None]).to(tl.float8e4nv))",
                           "ds8 = (ds * (448.0 / amax)[:, None]).to(tl.float8e4nv)",
                           "dS^ not permuted as K^T's keys are: each key's dS meets another key's row"),
    "dk_without_tau": ("tl.store(DK + out, (dk * sm_scale)", "tl.store(DK + out, (dk * 1.0)", "dK without the softmax scale"),
    "forward_diagonal_unmasked": ("n_free = (start_m // BLOCK_N) * BLOCK_N      # key blocks start at multiples of BLOCK_N\n        acc",
                                  "n_free = (start_m // BLOCK_N + 1) * BLOCK_N\n        acc",
                                  "the forward's diagonal key tile taken as unmasked"),
    "quantize_scale": ("c = tl.where(live, 448.0 / tl.maximum(amax, 1e-30), 0.0)\n    x8 = (x * c)",
                       "c = tl.where(live, 440.0 / tl.maximum(amax, 1e-30), 0.0)\n    x8 = (x * c)",
                       "the quantize kernel's copies 1.8% small for their scales"),
    "halves_count_kv_copies_at_q_heads": ("        pieces = 2 if (4 * H + 3 * H_kv) * B * _padded(N) * D > SPLIT_BYTES else 1",
                                          "        pieces = 2 if (4 * H + 3 * H) * B * _padded(N) * D > SPLIT_BYTES else 1",
                                          "grouped-query K, K^T and V copies counted at q's heads: small calls split in halves"),
    "tiling_not_a_power_of_two": ("all(16 <= b <= PAD and b & (b - 1) == 0 for b in blocks)",
                                  "all(16 <= b <= PAD for b in blocks)",
                                  "a swept tiling with a block that is not a power of two is taken (scale tiles split)"),
    "sm_scale_symbolic_isfinite": ("    if not (0 <= scale < math.inf):     # NaN fails both",
                                   "    if not (math.isfinite(scale) and scale >= 0):",
                                   "math.isfinite on sm_scale: q.size(-1) ** -0.5 under torch.compile(dynamic=True, "
                                   "fullgraph=True) stops the compilation"),
    "causal_numpy_bool_refused": ("    if not isinstance(causal, (bool, int, np.bool_)):",
                                  "    if not isinstance(causal, (bool, int)):",
                                  "causal=np.bool_(False) (read from an array or a config) refused with a TypeError"),
    "quantize_zero_tile_tiny_scale": ("tl.zeros([TILE], tl.float32) + tl.where(live, amax / 448.0, 0.0))",
                                      "tl.zeros([TILE], tl.float32) + tl.maximum(amax, 1e-30) / 448.0)",
                                      "an all-zero tile gets a tiny scale, not 0 (the Gluon kernels divide by it)"),
    "quantize_transpose_of_x8": ("        x8t = (tl.trans(x_in).to(tl.float32) * c).to(tl.float8e4nv)",
                                 "        x8t = tl.trans(x8)",
                                 "the transposed copy from an 8-bit transpose, which Triton 3.8 miscompiles on the "
                                 "H200 (same bytes on the interpreter)"),
    # session 52: a review of the comments against the code
    "tiling_dq_rows_unchecked": ('            and dq["BLOCK_M"] % dkdv["BLOCK_M"] == 0 and dq["BLOCK_N"] >= 32):',
                                 '            and dq["BLOCK_N"] >= 32):',
                                 "dQ blocks smaller than the dK/dV kernel's leave delta rows unwritten that it reads"),
    "tiling_dq_narrow_unchecked": ('            and dq["BLOCK_M"] % dkdv["BLOCK_M"] == 0 and dq["BLOCK_N"] >= 32):',
                                   '            and dq["BLOCK_M"] % dkdv["BLOCK_M"] == 0):',
                                   "a dQ BLOCK_N of 16 taken: _permuted_cols needs columns of 32"),
    "gluon_on_foreign_key_tile": ('tile["q"] % dkdv["BLOCK_M"] == 0 and tile["k"] % fwd["BLOCK_N"] == 0',
                                  'tile["q"] % dkdv["BLOCK_M"] == 0',
                                  "the Gluon forward on K scales per 64 keys: its blocks of 128 read one scale"),
    # session 53: the precision losses session 52's mutant hunt found passing every test
    "ds_scale_per_tile_dq": ("amax = tl.maximum(tl.max(tl.abs(ds), 1), 1e-30)",
                             "amax = tl.maximum(tl.zeros_like(delta) + tl.max(tl.abs(ds)), 1e-30)",
                             "dS^ in the dQ kernel scaled per tile (one amax for the block), not per query row"),
    "ds_scale_per_tile_dk": ("amax = tl.maximum(tl.max(tl.abs(dsT), 1), 1e-30)",
                             "amax = tl.maximum(tl.sum(tl.abs(dsT), 1) * 0.0 + tl.max(tl.abs(dsT)), 1e-30)",
                             "dS^T in the dK/dV kernel scaled per tile, not per key row"),
    "o_stored_as_bf16": ("o.to(O.dtype.element_ty), mask=row_ok[:, None])", "o.to(tl.bfloat16), mask=row_ok[:, None])",
                         "O rounded to bf16 before the store, also for fp16 inputs"),
    "fwd_p_unlifted_before_cast": ("        p8 = p.to(tl.float8e4nv)", "        p8 = (p / 256.0).to(tl.float8e4nv)",
                                   "the forward's P~ cast to e4m3 without its 256 lift (acc / w cancels the factor; "
                                   "small weights fall into e4m3's subnormals)"),
    # session 53: a second mutant hunt's survivors (host code: checks, kernel choice, the compiled path)
    'tiling_dkdv_block_spans_query_tiles': ('b & (b - 1) == 0 for b in blocks) and q_tile % dkdv["BLOCK_M"] == 0\n',
                                           'b & (b - 1) == 0 for b in blocks)\n',
                                           'query tiles of 32 under dK/dV blocks of 64 taken: one Q scale read for two tiles'),
    'tiling_block_over_pad': ('all(16 <= b <= PAD and b & (b - 1) == 0 for b in blocks)',
                             'all(16 <= b and b & (b - 1) == 0 for b in blocks)',
                             "a block of 256 rows taken, past the 128-row padding: the FP8 copies' last tile unwritten"),
    'fp8_supported_refuses_ada': ('and torch.cuda.get_device_capability(device) >= (8, 9))',
                                 'and torch.cuda.get_device_capability(device) >= (9, 0))',
                                 'Ada (8.9) refused: FP8 attention asked for Hopper'),
    'is_hopper_takes_blackwell': ('torch.cuda.get_device_capability(device)[0] != 9:',
                                 'torch.cuda.get_device_capability(device)[0] < 9:',
                                 'the Gluon (Hopper-only) kernels chosen on Blackwell (10.x, 12.x)'),
    'gluon_head_dims_ignored': ('if not (D in head_dims and B * H * N * N >= min_scores',
                               'if not (B * H * N * N >= min_scores',
                               'the Gluon kernels chosen at head dims not asked for (HOPPER_FORWARD = () no longer turns them off)'),
    'gluon_q_tile_unchecked': ('return (tile["q"] == fwd["BLOCK_M"] and tile["q"] % dkdv["BLOCK_M"] == 0',
                              'return (tile["q"] % dkdv["BLOCK_M"] == 0',
                              'the Gluon kernels taken with query tiles of 128 (their forward quantizes Q per 64)'),
    'gluon_dq_rows_unchecked': (' and config(D, "dq")["BLOCK_M"] % dkdv["BLOCK_M"] == 0)',
                               ')',
                               'the Gluon dK/dV kernel taken with dQ blocks of 32 (it reads delta in blocks of 64)'),
    'custom_op_forward_always_causal': ('    return _forward(q, k, v, causal, sm_scale, compiled=True)',
                                       '    return _forward(q, k, v, True, sm_scale, compiled=True)',
                                       'the compiled forward always causal'),
    'custom_op_backward_default_scale': ('dq, dk, dv = _bwd_op(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale, ctx.delta)',
                                        'dq, dk, dv = _bwd_op(do, q, k, v, o, lse, ctx.causal, q.shape[-1] ** -0.5, ctx.delta)',
                                        'the compiled backward at 1 / sqrt(D), not the sm_scale asked for'),
    'halves_batch_split_at_two_kv_heads': ('    if H_kv > 1:\n        return [(slice(None), slice(0, H_kv // 2))',
                                          '    if H_kv > 2:\n        return [(slice(None), slice(0, H_kv // 2))',
                                          'two kv heads split by batch: at B = 1 one half is empty'),
    'quantize_grid_from_n': ('_launch(_quantize_kernel, (n_pad // tile, B * H, len(specs))',
                            '_launch(_quantize_kernel, (_cdiv(N, tile), B * H, len(specs))',
                            "quantize's grid stops at x's last tile: a whole padding tile left as torch.empty had it"),
}


# The same for attention_fp8_hopper.py (D = 128 takes the flush at the end of a tile and LSE, delta
# through shared memory; D = 64 under Triton 3.6 the flush under the next tile's wgmmas)
GLUON_BUGS = {
    "gluon_section_of_head": ("    return tile, gl.program_id(1) * G + pid % G",
                              "    return tile, pid % G",
                              "every section of heads takes the first section's heads (Gluon kernels)"),
    "gluon_head_of_section": ("    return tile, gl.program_id(1) * G + pid % G",
                              "    return tile, gl.program_id(1) * G",
                              "every program of a section of heads takes its first head (Gluon kernels)"),
    "gluon_tile_of_section_unscaled": ("        tile = gl.num_programs(0) // G - 1 - tile",
                                       "        tile = gl.num_programs(0) - 1 - tile",
                                       "query tiles counted back from G x the tiles (Gluon kernels)"),
    "gluon_dkdv_mask_strict": ("sT = gl.where(offs_m[None, :] >= offs_n[:, None], sT",
                               "sT = gl.where(offs_m[None, :] > offs_n[:, None], sT",
                               "the Gluon dK/dV kernel's causal mask drops the diagonal"),
    "gluon_dv_flush_gain": ("dv_smem.store(dv_smem.load(o_layout) + dv * sdo_new)",
                            "dv_smem.store(dv_smem.load(o_layout) + dv * sdo_new * 1.01)",
                            "dV's flush into fp32 1% too large (D = 128)"),
    "gluon_dv_units_kept": ("dv * gl.where(sdo_new > 0, sdo_u / sdo_new, 1.0), is_async=True)",
                            "dv, is_async=True)", "dV's running sum not moved to the new tile's dO units"),
    "gluon_dk_gain": ("row_scale = gl.convert_layout(amax * (sq / (448.0 * 256.0))",
                      "row_scale = gl.convert_layout(amax * (sq / (448.0 * 256.0)) * 1.01", "dK 1% too large"),
    "gluon_delta_is_lse": ("delta = rows_smem.slice(BLOCK_M, BLOCK_M).load(", "delta = rows_smem.slice(0, BLOCK_M).load(",
                           "the dK/dV kernel reads LSE for delta (D = 128)"),
    "gluon_forward_mask_strict": (
        "            keep = keep & (offs_n[None, :] <= offs_m[:, None])\n        s = gl.where(keep, s, float(\"-inf\"))",
        "            keep = keep & (offs_n[None, :] < offs_m[:, None])\n        s = gl.where(keep, s, float(\"-inf\"))",
        "the Gluon forward's causal mask drops the diagonal"),
    "gluon_w_not_rescaled": ("        w_i = w_i * alpha + gl.convert_layout(gl.max(w, 1), s_rows)\n        sk_j = sk_next",
                             "        w_i = w_i + gl.convert_layout(gl.max(w, 1), s_rows)\n        sk_j = sk_next",
                             "the Gluon forward's sum of the weights not rescaled"),
    "gluon_o_not_rescaled": ("acc = acc * c[:, None] + pv           # in fp32", "acc = acc + pv           # in fp32",
                             "the Gluon forward's O not rescaled when the row max moves"),
}
GLUON_TESTS = ["-k", "against_fp32 or hopper or zero or weighted or dv_is or invariant or launch_order"]


def run(name, bug, timeout, tests, env=None):
    """Plants `bug` = (file, text, what it becomes) in a copy of the repository (None: no bug, the
    baseline) and runs pytest with `tests` there. Returns (name, verdict, detail)."""
    with tempfile.TemporaryDirectory() as tmp:
        # the code, tests and presets; not data shards, results, checkpoints or the git history
        repo = os.path.join(tmp, "repo")
        shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", ".carry", "results", "out*", "*.bin", "*.pt",
                                                                  "__pycache__", ".pytest_cache", ".benchmarks"))
        if bug:
            target, old, new = bug
            path = os.path.join(repo, target)
            with open(path) as f:
                source = f.read()
            if source.count(old) != 1:
                return name, "stale", f"its text occurs {source.count(old)} times in {target}"
            with open(path, "w") as f:
                f.write(source.replace(old, new))
        try:
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=repo,
                               capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
        except subprocess.TimeoutExpired:
            return name, "timeout", f"the tests ran past {timeout} s"
        failed = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("FAILED")]
        if r.returncode == 1 and failed:
            return name, "caught", failed[0]
        if r.returncode == 0:
            return name, "NOT CAUGHT", "every test passed"
        if r.returncode < 0:    # killed by a signal: the suite fails, though no test reports it (CI goes red)
            return name, "crashed", f"the test process died of {signal.Signals(-r.returncode).name}"
        return name, "error", (r.stdout + r.stderr).strip().splitlines()[-1]


def run_all(bugs, tests, args, env=None):
    """The baseline, then every bug of `bugs` ({name: (file, text, becomes, what)}) whose name contains
    args.k (or any of its comma-separated parts), args.j at a time, printed as they finish (a run cut short
    keeps what it has)."""
    names = [n for n in bugs if any(part in n for part in args.k.split(","))]
    if not names:   # before the baseline's minutes: a -k that names no bug would otherwise pass in silence
        sys.exit(f"-k {args.k}: no bug's name contains it (or, with commas, any of its parts)")
    # The copy without a bug must pass: else every bug would look caught.
    _, verdict, detail = run(None, None, args.timeout, tests, env)
    if verdict != "NOT CAUGHT":
        sys.exit(f"the tests fail on the copy without a bug ({verdict}: {detail}); fix that first")
    print("the copy without a bug passes the tests", flush=True)
    with ThreadPoolExecutor(args.j) as pool:
        for done in as_completed([pool.submit(run, n, bugs[n][:3], args.timeout, tests, env) for n in names]):
            name, verdict, detail = done.result()
            print(f"{name:<28} {verdict:<11} {bugs[name][3]}: {detail}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", default="", help="only the bugs whose names contain this (a,b: either)")
    p.add_argument("-j", type=int, default=2, help="bugs tested at once")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per bug")
    p.add_argument("--gluon", action="store_true", help="the Gluon kernels' bugs (a Hopper GPU)")
    args = p.parse_args()
    if args.gluon:
        import torch
        if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
            sys.exit("--gluon: the Gluon kernels run on a Hopper GPU (sm_90) only")
        bugs = {n: ("attention_fp8_hopper.py", *b) for n, b in GLUON_BUGS.items()}
        run_all(bugs, ["test_attention.py", *GLUON_TESTS], args, {"FP8_GLUON_EVERYWHERE": "1"})
    else:
        run_all({n: ("attention_fp8.py", *b) for n, b in BUGS.items()}, ["test_attention.py"], args)


if __name__ == "__main__":
    main()

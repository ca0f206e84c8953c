"""(hunt copy: new bugs only; runs test_attention.py and tests/test_host_code.py)
Do the kernel tests catch a broken kernel? Plant one bug at a time in a copy of attention_fp8.py and
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
# A mutation hunt (report-only): new single-edit bugs, none of them in mutate_kernel.py's BUGS.
BUGS = {
    "ds_scale_per_tile_dq": ("amax = tl.maximum(tl.max(tl.abs(ds), 1), 1e-30)",
                             "amax = tl.maximum(tl.zeros_like(delta) + tl.max(tl.abs(ds)), 1e-30)",
                             "dS^ in the dQ kernel scaled per tile (one amax for the block), not per row"),
    "ds_scale_per_tile_dk": ("amax = tl.maximum(tl.max(tl.abs(dsT), 1), 1e-30)",
                             "amax = tl.maximum(tl.sum(tl.abs(dsT), 1) * 0.0 + tl.max(tl.abs(dsT)), 1e-30)",
                             "dS^T in the dK/dV kernel scaled per tile, not per key row"),
    "ds_amax_without_delta": ("amax = tl.maximum(tl.max(tl.abs(ds), 1), 1e-30)",
                              "amax = tl.maximum(tl.max(tl.abs(p * dp_raw), 1) * c, 1e-30)",
                              "dQ's dS row scale from |P dP| (delta left out): rows where |dS| > |P dP| saturate"),
    "dq_do_scale_of_block_start": ("    sdo = tl.load(SDO + pid_bh * N_pad + offs_m)",
                                   "    sdo = tl.load(SDO + pid_bh * N_pad + start_m + 0 * offs_m)",
                                   "dQ kernel takes dO's scale of its block's first row for every row (wrong where "
                                   "BLOCK_M spans two dO tiles: D = 128)"),
    "dq_q_scale_of_block_start": ("    qs = tl.load(SQ + pid_bh * N_pad + offs_m) * qk_scale",
                                  "    qs = tl.load(SQ + pid_bh * N_pad + start_m + 0 * offs_m) * qk_scale",
                                  "dQ kernel takes Q's scale of its block's first row for every row"),
    "gqa_dq_head_mod": ("    bh_kv = b * H_KV + h // (H // H_KV)\n    start_m",
                        "    bh_kv = b * H_KV + h % H_KV\n    start_m",
                        "dQ kernel maps query head h to kv head h % H_kv, not h // group"),
    "gqa_dkdv_interleaved": ("        h = hk * group + g", "        h = g * H_KV + hk",
                             "dK/dV kernel sums the query heads g * H_kv + hk (interleaved), not hk * group + g"),
    "stale_o_batch_stride_of_do": ("o_hi = tl.load(O + b * stride_ob", "o_hi = tl.load(O + b * stride_dob",
                                   "the stale delta reads O at dO's batch stride"),
    "fwd_q_strides_of_o": ("q = tl.load(Q + b * stride_qb + h * stride_qh", "q = tl.load(Q + b * stride_ob + h * stride_oh",
                           "the forward reads q at O's batch and head strides (O is laid out as q... unless q has gaps)"),
    "o_stored_as_bf16": ("o.to(O.dtype.element_ty), mask=row_ok[:, None])", "o.to(tl.bfloat16), mask=row_ok[:, None])",
                         "O rounded to bf16 before the store, also for fp16 inputs"),
    "dkdv_diag_end_floor": ("diag_end = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, m_end)",
                            "diag_end = tl.minimum((start_n + BLOCK_N) // BLOCK_M * BLOCK_M, m_end)",
                            "dK/dV causal band end rounded down: a query block that straddles the diagonal goes unmasked"),
    "dq_causal_end_by_block_n": ("        n_end = tl.minimum(start_m + BLOCK_M, N_pad)",
                                 "        n_end = tl.minimum(start_m + BLOCK_N, N_pad)",
                                 "dQ kernel's causal key range ends BLOCK_N past the block start, not BLOCK_M"),
    "dkdv_mask_one_query_early": ("qkT = tl.where(offs_m[None, :] >= offs_n[:, None], qkT",
                                  "qkT = tl.where(offs_m[None, :] + 1 >= offs_n[:, None], qkT",
                                  "dK/dV causal mask lets query j-1 see key j"),
    "lse_from_rounded_weights": ("m_i + tl.math.log2(l_i) - 8.0, mask=row_ok)", "m_i + tl.math.log2(w_i) - 8.0, mask=row_ok)",
                                 "LSE from the sum of the e4m3-rounded weights, not the exact row sum"),
    "halves_overlap": ("slice(H_kv // 2, H_kv))]", "slice((H_kv - 1) // 2, H_kv))]",
                       "the second half of the kv heads starts one early: a head computed twice (even H_kv)"),
    "debug_rowabs_of_ds": ("rowabs += tl.sum(tl.abs(p * (dp_raw * c[:, None])), 1)", "rowabs += tl.sum(tl.abs(ds), 1)",
                           "debug sum_j |P dP| computed from dS"),
    "gluon_threshold_counts_n_once": ("B * H * N * N >= min_scores", "B * H * N >= min_scores",
                                      "the Gluon kernels' size threshold counts B H N, not B H N^2 scores"),
    "stale_delta_sign": ("        delta = tl.sum(do_hi * o_hi, 1)", "        delta = -tl.sum(do_hi * o_hi, 1)",
                         "the stale arm's delta with the wrong sign"),
    "fwd_p_unlifted_before_cast": ("        p8 = p.to(tl.float8e4nv)", "        p8 = (p / 256.0).to(tl.float8e4nv)",
                                   "the forward's P~ cast to e4m3 without its 256 lift (O = acc / w cancels the factor; "
                                   "small weights fall into e4m3's subnormals)"),
    "dv_p_unlifted_before_cast": ("dv += tl.dot(pT.to(tl.float8e4nv), do) * (sdo / 256.0)",
                                  "dv += tl.dot((pT / 256.0).to(tl.float8e4nv), do) * sdo",
                                  "dV's P cast to e4m3 without its 256 lift (the scale undone first)"),
    "dq_reset_before_diagonal": ("_dq_inner(dq, rowsum, rowabs, rowp, delta, q, qs, do, sdo, lse, K8, SK, KT8, V8, SV,\n"
                                 "                                   offs_m, n_free, n_end",
                                 "_dq_inner(tl.zeros_like(dq), rowsum, rowabs, rowp, delta, q, qs, do, sdo, lse, K8, SK, KT8, V8, SV,\n"
                                 "                                   offs_m, n_free, n_end",
                                 "dQ's accumulator restarted for the masked key tiles: the unmasked tiles' dQ dropped"),
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
        run_all({n: ("attention_fp8.py", *b) for n, b in BUGS.items()}, ["test_attention.py", "tests/test_host_code.py"], args)


if __name__ == "__main__":
    main()

"""Do the kernel tests catch a broken kernel? Plant one bug at a time in a copy of attention_fp8.py and
run test_attention.py on it: each bug should fail at least one test ("caught").

    python tests/mutate_kernel.py             # every bug, two at a time (~10 minutes on 2 CPU cores)
    python tests/mutate_kernel.py -k dq_gain  # the bugs whose names contain dq_gain

On a CPU the tests run under the Triton interpreter, so this checks the Triton kernels; the Gluon
kernels of attention_fp8_hopper.py run only on the GPU. A bug whose text no longer matches the
source is reported as stale: edit it here along with the kernel.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (text in attention_fp8.py, what it becomes, what the bug is)
BUGS = {
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
}


def run(name, timeout):
    old, new, _ = BUGS[name]
    with tempfile.TemporaryDirectory() as tmp:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
        for f in files:
            os.makedirs(os.path.join(tmp, os.path.dirname(f)), exist_ok=True)
            shutil.copy(os.path.join(ROOT, f), os.path.join(tmp, f))
        path = os.path.join(tmp, "attention_fp8.py")
        source = open(path).read()
        if source.count(old) != 1:
            return name, "stale", f"its text occurs {source.count(old)} times in attention_fp8.py"
        open(path, "w").write(source.replace(old, new))
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "test_attention.py"],
                           cwd=tmp, capture_output=True, text=True, timeout=timeout)
        failed = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("FAILED")]
        if r.returncode == 1 and failed:
            return name, "caught", failed[0]
        if r.returncode == 0:
            return name, "NOT CAUGHT", "every test passed"
        return name, "error", (r.stdout + r.stderr).strip().splitlines()[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", default="", help="only the bugs whose names contain this")
    p.add_argument("-j", type=int, default=2, help="bugs tested at once")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per bug")
    args = p.parse_args()
    names = [n for n in BUGS if args.k in n]
    with ThreadPoolExecutor(args.j) as pool:
        for name, verdict, detail in pool.map(lambda n: run(n, args.timeout), names):
            print(f"{name:<28} {verdict:<11} {BUGS[name][2]}: {detail}", flush=True)


if __name__ == "__main__":
    main()

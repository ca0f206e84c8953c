"""The accuracy figures the README quotes from test_attention.py, printed instead of only asserted:
errors against the dequantized-input and the exact fp64 reference at the suite's CASES (with the
least-squares gain against the former, TOL_GAIN's figure), the
key-translation figures (dQ error, key-gradient sum) and the per-row invariant, matched and stale.
On the CPU the kernels run in Triton's interpreter with the rounding shim, at the CPU CASES.

    python results/test_figures.py        (from the repository root; results/test_figures_cpu.txt)
"""
import math
import os
import sys

import torch

GPU = torch.cuda.is_available()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"     # before any @triton.jit is defined
    import triton_shim
    triton_shim.install()

import attention_fp8 as A  # noqa: E402
import test_attention as T  # noqa: E402

print(f"device {torch.cuda.get_device_name() if GPU else 'cpu (Triton interpreter, rounding shim)'} | "
      f"torch {torch.__version__} | triton {__import__('triton').__version__}")


def p_rounding_dv(q, k, do, causal, sm_scale, H, H_kv):
    """dV in fp64 from the dequantized inputs with only P (times 256) rounded to e4m3."""
    qd, kd, dod = (T.dequantize(x, n).double() for x, n in ((q, "q"), (k, "k"), (do, "do")))
    s = qd @ kd.repeat_interleave(H // H_kv, 1).transpose(-1, -2) * sm_scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p8 = (s.softmax(-1) * 256).to(torch.float8_e4m3fn).double() / 256
    B, N, D = q.shape[0], q.shape[2], q.shape[3]
    return (p8.transpose(-1, -2) @ dod).view(B, H_kv, H // H_kv, N, D).sum(2)


dv_gains = []
print("\nrelative error vs fp64 on the dequantized inputs / on the original inputs (test_against_fp32_reference)")
for (B, H, H_kv, N, D, causal), name in zip(T.CASES, T.CASE_IDS):
    q, k, v, do = T.make_inputs(B, H, H_kv, N, D, seed=N + D)
    sm_scale = 1.0 / math.sqrt(D)
    out = T.run_kernel(q, k, v, do, causal)
    deq = T.dequantized_reference(q, k, v, do, causal, sm_scale)
    exact = T.reference_grads(q, k, v, do, causal, sm_scale)
    names = ("o", "dv") if N == 1 else ("o", "dq", "dk", "dv")   # N = 1: exact dQ, dK are zero
    dv_gains.append((name, T.gain(out["dv"], deq["dv"]), T.gain(p_rounding_dv(q, k, do, causal, sm_scale, H, H_kv), deq["dv"])))
    print(f"{name:28s} " + "  ".join(f"{x} {T.rel_err(out[x], deq[x]):.4f} / {T.rel_err(out[x], exact[x]):.4f}"
                                      f" (gain {T.gain(out[x], deq[x]):.4f})" for x in names))

print("\nkey translation (test_key_translation: every key + one vector of norm ~2 sqrt(D))")
B, H, H_kv, N, D = (2, 4, 2, 1024, 64) if T.ON_GPU else (1, 2, 1, 256, 64)
q, k, v, do = T.make_inputs(B, H, H_kv, N, D, seed=11, key_offset=2.0)
deq = T.dequantized_reference(q, k, v, do, True, 1.0 / math.sqrt(D))
for arm in ("matched", "stale"):
    out = T.run_kernel(q, k, v, do, True, delta=arm)
    dk = out["dk"].double()
    rho = (dk.sum(2).norm(dim=-1) / dk.norm(dim=-1).sum(2)).max().item()
    print(f"{B}x{H}x{N}x{D} (H_kv {H_kv}) {arm:8s} dQ error vs dequantized {T.rel_err(out['dq'], deq['dq']):.4f}  "
          f"key-gradient sum ||sum_j dK_j|| / sum_j ||dK_j|| {rho:.2e}")

print("\nper-row invariant max_i |sum_j dS_ij| / sum_j |P_ij dP_ij| (test_invariants_matched_vs_stale)")
for (B, H, H_kv, N, D, causal), name in zip(T.CASES, T.CASE_IDS):
    if N == 1:
        continue
    q, k, v, do = T.make_inputs(B, H, H_kv, N, D, seed=7)
    stats = A.delta_stats(q, k, v, do, causal=causal)
    print(f"{name:28s} matched {stats['ds_rowsum_matched']:.1e}  stale {stats['ds_rowsum_stale']:.1e}  "
          f"(key-gradient sum {stats['key_grad_sum_matched']:.1e} / {stats['key_grad_sum_stale']:.1e})")


print("\ndV's gain: the kernel's, and that of rounding P (times 256) to e4m3 alone, simulated in fp64 from the "
      "dequantized inputs (TOL_GAIN; the rounding biases dV low)")
for name, kernel, alone in dv_gains:
    print(f"{name:28s} kernel {kernel:.4f}  P's rounding alone {alone:.4f}")

"""Tests for attention_fp8: gradients against an fp32/fp64 reference, and the invariants that tell a
matched delta from a stale one. Most check the kernels' outputs; a few check the launch plumbing
around them (tilings, grids, the order programs start in, the halves of the backward) directly.

On a CUDA GPU with FP8 tensor cores they run the compiled kernels at realistic shapes; elsewhere
they run under the Triton interpreter (conftest.py sets TRITON_INTERPRET=1 and installs the
rounding shim) at small shapes. Tolerances were calibrated on the kernel (see README) and sit at
about 1.5x the measured error, so a wrong scale, mask or index fails them.

    python -m pytest test_attention.py -q
"""
import ast
import inspect
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
import attention_fp8 as A  # noqa: E402
from attention_fp8 import attention  # noqa: E402

ON_GPU = torch.cuda.is_available() and A.fp8_supported("cuda")
DEVICE = "cuda" if ON_GPU else "cpu"
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no FP8 GPU and no Triton interpreter", allow_module_level=True)

HOPPER = ON_GPU and A._is_hopper(torch.device("cuda"))
# On Hopper the Gluon kernels of attention_fp8_hopper.py take over from 2^29 scores (B H N^2), beyond the shapes
# below. FP8_GLUON_EVERYWHERE=1 runs them at every N and head dim instead, so the whole suite checks
# them too: on the H200, run it once each way.
if HOPPER and os.environ.get("FP8_GLUON_EVERYWHERE") == "1":
    A.HOPPER_FORWARD = A.HOPPER_BACKWARD = A.HEAD_DIMS
    A.HOPPER_FORWARD_MIN_SCORES = A.HOPPER_BACKWARD_MIN_SCORES = 0

# (B, H, H_kv, N, D, causal): batches and heads > 1, grouped-query attention, N below, across and
# not a multiple of the 128-row tiles, both head dims. The interpreter costs ~40 ms per tile pair.
if ON_GPU:
    CASES = [(2, 4, 4, 1000, 64, True), (2, 4, 2, 777, 128, False), (1, 8, 2, 2048, 128, True),
             (3, 2, 1, 333, 64, False), (1, 2, 2, 1, 128, True), (4, 16, 16, 1024, 64, True)]
else:
    CASES = [(2, 4, 2, 100, 64, True), (1, 4, 2, 200, 64, False), (1, 2, 1, 130, 128, True),
             (1, 2, 2, 257, 64, True), (1, 1, 1, 1, 64, True)]
CASE_IDS = [f"B{b}-H{h}-Hkv{hk}-N{n}-D{d}-{'causal' if c else 'full'}" for b, h, hk, n, d, c in CASES]

# Relative Frobenius errors. "deq": against fp64 attention on the dequantized FP8 inputs (what the
# kernel claims to compute, up to its rounding of P and dS); "exact": against the original inputs.
# Measured on N(0,1) inputs at these CASES, N > 1 (python results/test_figures.py): interpreter
# O 0.016-0.021 / 0.042-0.051, grads 0.018-0.026 / 0.047-0.064; H100 O 0.019-0.023 / 0.047-0.053,
# grads 0.017-0.028 / 0.049-0.064 (per-row dS scales; per-tile ones gave 0.024-0.027 / 0.050-0.066).
TOL_DEQ = {"o": 0.03, "dq": 0.04, "dk": 0.04, "dv": 0.04}
TOL_EXACT = {"o": 0.07, "dq": 0.09, "dk": 0.09, "dv": 0.075}
# |sum_j P_ij - 1| for the backward's P: fp32 rounding and exp2 on the interpreter; on the GPU the
# FP8 tensor cores' short accumulator can round S differently between differently-tiled kernels.
P_ROWSUM_TOL = 5e-3 if ON_GPU else 1e-5
# Gain: the least-squares factor g in kernel ~= g * reference, against the dequantized-input
# reference. FP8 rounding errors are nearly independent, so they hardly move g, while a wrong scale
# factor moves it by its whole size: a dQ or dK 1% too large passes TOL_DEQ (its error adds in
# quadrature to the 2-3% of rounding), but not this. Measured on the interpreter, N(0,1) inputs, at
# the CPU CASES (python results/test_figures.py): |g - 1| <= 0.0008 for O, dQ and dK, <= 0.0032 for
# dV, whose gain rounding P to e4m3 pulls low: 0.9968 at N = 257, as an fp64 simulation of that
# rounding alone gives (same script).
TOL_GAIN = 0.004


def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def gain(x, ref):
    """g minimizing ||x - g ref||: 1 for an unbiased kernel, 1.01 for one whose scale is 1% off."""
    x, ref = x.double().flatten(), ref.double().flatten()
    return (x @ ref / (ref @ ref).clamp_min(1e-300)).item()


def describe(x, ref):
    d = (x.double() - ref.double()).abs()
    return f"rel {rel_err(x, ref):.4f}, max abs {d.max().item():.3e}, mean abs {d.mean().item():.3e}"


def reference(q, k, v, causal, sm_scale):
    """Plain attention in the inputs' precision (we call it in fp64). GQA by repeating k, v."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * sm_scale
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def reference_grads(q, k, v, do, causal, sm_scale):
    q, k, v = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o, lse = reference(q, k, v, causal, sm_scale)
    o.backward(do.double())
    return {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def dequantize(x, which):
    """What the kernel sees of x ("q", "k", "v" or "do"): its e4m3 copy times its block scales."""
    B, H, N, D = x.shape
    x8, _, scale = A.quantize(x, A.tiles(D)[which])
    return (x8.double() * scale[..., None].double())[:, :N].reshape(B, H, N, D)


def dequantized_reference(q, k, v, do, causal, sm_scale):
    """fp64 attention and gradients on what the kernel sees: its dequantized FP8 inputs."""
    return reference_grads(dequantize(q, "q"), dequantize(k, "k"), dequantize(v, "v"), dequantize(do, "do"),
                           causal, sm_scale)


def make_inputs(B, H, H_kv, N, D, seed, dtype=torch.bfloat16, key_offset=0.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g)
    k = torch.randn(B, H_kv, N, D, generator=g) + key_offset * torch.randn(D, generator=g)
    v = torch.randn(B, H_kv, N, D, generator=g)
    do = torch.randn(B, H, N, D, generator=g)
    return [x.to(DEVICE, dtype) for x in (q, k, v, do)]


def run_kernel(q, k, v, do, causal, delta="matched", sm_scale=None):
    q, k, v = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = attention(q, k, v, causal=causal, sm_scale=sm_scale, delta=delta)
    o.backward(do)
    return {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


@pytest.mark.parametrize("B,H,H_kv,N,D,causal", CASES, ids=CASE_IDS)
def test_against_fp32_reference(B, H, H_kv, N, D, causal):
    """O, dQ, dK, dV (and LSE) against full-precision attention, computed in fp64 (at least as exact as
    the FP32 reference the name promises): from the kernel's own dequantized inputs, with tight
    tolerances and a least-squares gain held to 1, and from the original inputs, loosely."""
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=N + D)
    sm_scale = 1.0 / math.sqrt(D)
    out = run_kernel(q, k, v, do, causal)
    deq = dequantized_reference(q, k, v, do, causal, sm_scale)
    exact = reference_grads(q, k, v, do, causal, sm_scale)
    failures = []
    for name in ("o", "dq", "dk", "dv"):
        assert out[name].shape == exact[name].shape and out[name].dtype == q.dtype
        assert torch.isfinite(out[name]).all(), f"{name} has non-finite values"
        if N == 1 and name in ("dq", "dk"):
            # softmax over a single key is constant: the exact dQ and dK are zero, and the kernel's
            # must be zero up to rounding (a stale delta leaves dS = dP - delta_stale != 0 here)
            if out[name].abs().max().item() > 1e-5:
                failures.append(f"{name} must vanish for N = 1: max abs {out[name].abs().max().item():.3e}")
            continue
        if rel_err(out[name], deq[name]) > TOL_DEQ[name]:
            failures.append(f"{name} vs dequantized-input reference: {describe(out[name], deq[name])} > {TOL_DEQ[name]}")
        if abs(gain(out[name], deq[name]) - 1) > TOL_GAIN:
            failures.append(f"{name} is {gain(out[name], deq[name]):.4f} x the dequantized-input reference "
                            f"(least squares; tolerance 1 +- {TOL_GAIN}): a scale factor is off")
        if rel_err(out[name], exact[name]) > TOL_EXACT[name]:
            failures.append(f"{name} vs original-input reference: {describe(out[name], exact[name])} > {TOL_EXACT[name]}")
    # LSE involves no rounding of P: it must match the dequantized reference to fp32 accuracy.
    _, lse2 = A._forward(q, k, v, causal, sm_scale)
    lse = lse2.double() * math.log(2.0)
    lse_err = (lse - deq["lse"]).abs().max().item()
    if lse_err > 1e-4 * max(1.0, deq["lse"].abs().max().item()):
        failures.append(f"LSE vs dequantized-input reference: max abs error {lse_err:.3e}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("B,H,H_kv,N,D,causal", CASES[:3], ids=CASE_IDS[:3])
def test_invariants_matched_vs_stale(B, H, H_kv, N, D, causal):
    """(*) sum_j dS_ij = 0 holds for the matched delta to fp32 rounding and breaks for the stale one;
    dV does not involve delta, so it is bit-identical between the arms."""
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=7)
    sm_scale = 1.0 / math.sqrt(D)
    o, lse = A._forward(q, k, v, causal, sm_scale)
    dv, residual, p_rowsum = {}, {}, {}
    for arm in ("matched", "stale"):
        *grads, info = A._backward(do, q, k, v, o, lse, causal, sm_scale, arm, debug=True)
        dv[arm] = grads[2]
        residual[arm] = (info["ds_rowsum"].abs() / info["pdp_abs_rowsum"].clamp_min(1e-30)).max().item()
        p_rowsum[arm] = info["p_rowsum"]
        # the debug pass must not change the gradients
        for name, g, plain in zip(("dQ", "dK", "dV"), grads, A._backward(do, q, k, v, o, lse, causal, sm_scale, arm)):
            assert torch.equal(g, plain), f"{arm}: {name} differs with debug=True"
    assert torch.equal(dv["matched"], dv["stale"]), "dV differs between delta arms"
    # The backward's P, from S recomputed on the same Q^, K^ and the forward's LSE, sums to 1 per
    # row: the forward and backward see the same FP8 operands and agree on the softmax.
    p_err = (p_rowsum["matched"].double() - 1).abs().max().item()
    assert p_err < P_ROWSUM_TOL, f"backward P rows sum to 1 +- {p_err:.3e} (tolerance {P_ROWSUM_TOL:.0e})"
    assert residual["matched"] < 1e-6, f"matched: max |sum_j dS_ij| / sum_j |P dP| = {residual['matched']:.3e}"
    assert residual["stale"] > 1e-3, f"stale delta unexpectedly consistent: residual {residual['stale']:.3e}"


def test_invariant_holds_where_p_does_not_sum_to_one():
    """The pre-pass divides by r_i = sum_j P_ij, so (*) holds even where the backward's P does not sum to
    1 (on the GPU, differently tiled FP8 dots may round S apart: P_ROWSUM_TOL). An LSE raised by 0.1
    (in log2 units) makes every row of P sum to 2^-0.1 = 0.933; without the division, each row of dS
    would sum to delta_i (1 - r_i)."""
    B, H, N, D, causal = 1, 2, 150, 64, True
    q, k, v, do = make_inputs(B, H, H, N, D, seed=11)
    sm_scale = 1.0 / math.sqrt(D)
    o, lse = A._forward(q, k, v, causal, sm_scale)
    info = A._backward(do, q, k, v, o, lse + 0.1, causal, sm_scale, "matched", debug=True)[3]
    p_gap = (info["p_rowsum"].double() - 1).abs().min().item()
    assert p_gap > 0.03, f"the raised LSE should move every row sum of P by about 0.067; the least moved {p_gap:.3e}"
    residual = (info["ds_rowsum"].abs() / info["pdp_abs_rowsum"].clamp_min(1e-30)).max().item()
    assert residual < 1e-6, f"max |sum_j dS_ij| / sum_j |P dP| = {residual:.3e} where P rows sum to 0.933"


def test_matched_delta_equals_definition():
    """The pre-pass's delta is sum_j P_ij dP_ij / sum_j P_ij over the backward's own FP8 operands."""
    B, H, N, D, causal = 1, 2, 150, 64, True
    q, k, v, do = make_inputs(B, H, H, N, D, seed=3)
    sm_scale = 1.0 / math.sqrt(D)
    o, lse = A._forward(q, k, v, causal, sm_scale)
    info = A._backward(do, q, k, v, o, lse, causal, sm_scale, "matched", debug=True)[3]
    qd, kd, vd, dod = (dequantize(q, "q"), dequantize(k, "k"), dequantize(v, "v"),
                       dequantize(do, "do"))
    s = (qd @ kd.transpose(-1, -2)) * sm_scale
    p = torch.softmax(s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=DEVICE).triu(1), float("-inf")), -1)
    delta_ref = (p * (dod @ vd.transpose(-1, -2))).sum(-1)
    stale = (do.double() * o.double()).sum(-1)
    err = (info["delta"].double() - delta_ref).abs().max().item()
    gap = (stale - delta_ref).abs().max().item()
    # The interpreter accumulates FP8 products in exact fp32; Hopper's FP8 tensor cores accumulate
    # with fewer mantissa bits (about 14, per DeepSeek-V3's report), which moves S and dP by ~1e-4
    # relative: measured 1.3e-4 of max|delta| on the H200 here, 1.4e-7 on the interpreter.
    bound = (3e-4 if ON_GPU else 1e-6) * delta_ref.abs().max().item()
    assert err < bound, f"matched delta off by {err:.3e} (bound {bound:.3e}); stale is off by {gap:.3e}"
    assert gap > 30 * err, f"stale delta is no further from the definition ({gap:.3e}) than matched ({err:.3e})"
    # The stale arm's delta (computed in the dQ kernel) is FlashAttention's rowsum(dO * O).
    info = A._backward(do, q, k, v, o, lse, causal, sm_scale, "stale", debug=True)[3]
    stale_err = (info["delta"].double() - stale).abs().max().item()
    assert stale_err < 1e-5 * stale.abs().max().item(), f"stale delta is not rowsum(dO * O): off by {stale_err:.3e}"


def test_key_translation():
    """Adding one vector c to every key leaves softmax, hence the exact dQ, unchanged, and makes the
    key gradients sum to zero per (batch, kv head). A stale delta leaves a coherent error in both:
    rho = ||sum_j dK_j|| / sum_j ||dK_j|| (the matched arm keeps only the residue of rounding dS to
    FP8), and the dQ error against the exact gradient of the kernel's own (dequantized) inputs."""
    B, H, H_kv, N, D = (2, 4, 2, 1024, 64) if ON_GPU else (1, 2, 1, 256, 64)
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=11, key_offset=2.0)
    sm_scale = 1.0 / math.sqrt(D)
    deq = dequantized_reference(q, k, v, do, True, sm_scale)
    rho, dq_err = {}, {}
    for arm in ("matched", "stale"):
        out = run_kernel(q, k, v, do, True, delta=arm)
        dk = out["dk"].double()
        rho[arm] = (dk.sum(2).norm(dim=-1) / dk.norm(dim=-1).sum(2)).max().item()
        dq_err[arm] = rel_err(out["dq"], deq["dq"])
    msg = (f"rho matched {rho['matched']:.2e} stale {rho['stale']:.2e}; "
           f"dQ error matched {dq_err['matched']:.3f} stale {dq_err['stale']:.3f}")
    print(msg)
    assert rho["matched"] < 0.75 * rho["stale"], msg
    assert dq_err["matched"] < 0.7 * dq_err["stale"], msg


def test_large_inputs_stay_finite():
    """Inputs 1000x N(0,1), scores of order 1e6. The block scales absorb the size, so the FP8 copies are
    those of the 1x inputs up to rounding, and no cast sees an out-of-range value; what is tested is the
    fp32 side around them: softmax rows that are one-hot, exponents that must stay reduced by the row max,
    dS's per-row scales at this range, and outputs that must stay finite, O accurate."""
    B, H, N, D = 1, 2, 200, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=5)
    q, k, v = q * 1000, k * 1000, v * 1000
    for arm in ("matched", "stale"):
        out = run_kernel(q, k, v, do * 1000, True, delta=arm)
        for name, x in out.items():
            assert torch.isfinite(x).all(), f"{arm}: {name} has non-finite values"
    # Scores ~1e6 make softmax one-hot, so a rounding of S can flip the winning key against the
    # original inputs; against the kernel's own dequantized inputs the output must still hold.
    deq = dequantized_reference(q, k, v, do, True, 1.0 / math.sqrt(D))
    assert rel_err(out["o"], deq["o"]) < TOL_DEQ["o"], describe(out["o"], deq["o"])


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("order", ["rising", "falling"])
def test_tiles_of_very_different_scales(order, causal):
    """Every scale is one tile's: tiles of V and dO 100x apart must keep the accuracy of every
    128-row block. With the causal mask the first query rows see only the first V tile, and the
    last keys only the last dO tile, so any scheme that shares a scale across tiles fails here:
    V's and dO's scales folded into the FP8 P relative to the head's largest scale (to let the
    tensor cores accumulate P V and P^T dO directly; tried, SPEED.md) measured dV 0.053 > 0.04 on the
    last block."""
    B, H, N, D = 1, 2, 384, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=23)
    scales = [0.1, 1.0, 10.0] if order == "rising" else [10.0, 1.0, 0.1]
    blocks = [slice(i * 128, (i + 1) * 128) for i in range(3)]
    v = torch.cat([v[:, :, rows] * s for rows, s in zip(blocks, scales)], 2)
    do = torch.cat([do[:, :, rows] * s for rows, s in zip(blocks, reversed(scales))], 2)
    out = run_kernel(q, k, v, do, causal)
    deq = dequantized_reference(q, k, v, do, causal, 1.0 / math.sqrt(D))
    failures = [f"{name} rows {rows.start}-{rows.stop}: {describe(out[name][:, :, rows], deq[name][:, :, rows])}"
                for name in ("o", "dq", "dk", "dv") for rows in blocks
                if rel_err(out[name][:, :, rows], deq[name][:, :, rows]) > TOL_DEQ[name]]
    assert not failures, "\n".join(failures)


# The next four tests aim at precision that the N(0,1) tests above cannot see: each was written for a
# one-edit bug that left every other test green (session 52's mutant hunt, results/session52/NOTES.txt),
# and fails on it (tests/mutate_kernel.py). Figures are the interpreter's, clean kernel / that bug.

def check_even_and_odd_rows(out, deq, name):
    """TOL_DEQ on the even and on the odd rows (queries of dQ, keys of dK) separately: the tests below
    make one of the two kinds small, which the error over all rows, set by the other kind, would hide."""
    for rows in (slice(0, None, 2), slice(1, None, 2)):
        x, ref = out[name][:, :, rows], deq[name][:, :, rows]
        assert rel_err(x, ref) < TOL_DEQ[name], f"{name}, rows {rows}: {describe(x, ref)}"


def test_dq_keeps_query_rows_of_small_gradient():
    """The dQ kernel scales dS^ by its row's largest |dS|, one scale per query row. Here every other
    query row's dO is 1e-4 times its neighbours', and so is its row of dS: with one scale per tile those
    rows fall into e4m3's subnormals. dQ's error on them: 0.018 per row, 0.134 per tile."""
    B, H, N, D = 1, 2, 200, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=31)
    do = do.clone()
    do[:, :, 1::2] *= 1e-4
    out = run_kernel(q, k, v, do, True)
    check_even_and_odd_rows(out, dequantized_reference(q, k, v, do, True, 1.0 / math.sqrt(D)), "dq")


def test_dk_keeps_keys_that_score_low():
    """The dK/dV kernel's rows are keys, and it scales dS^T by each key row's largest |dS|. Here every
    other key scores 12 lower for every query (a key nearly no query attends to, as padding), so its row
    of dS^T is about e^-12 of its neighbours'. dK's error on those keys: 0.019 per row, 0.73 per tile."""
    B, H, N, D = 1, 2, 200, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=32)
    q, k = q.clone(), k.clone()
    # Coordinate 0 carries the offset alone: tau q_0 k_0 = 4 * -24 / 8 = -12 for the odd keys, 0 for the rest.
    q[..., 0], k[..., 0] = 4.0, 0.0
    k[:, :, 1::2, 0] = -24.0
    out = run_kernel(q, k, v, do, False)
    check_even_and_odd_rows(out, dequantized_reference(q, k, v, do, False, 1.0 / math.sqrt(D)), "dk")


def test_fp16_outputs_keep_fp16_precision():
    """fp16 has three more mantissa bits than bf16. An output rounded through bf16 on its way out loses
    them, an error of about 2^-9 that the FP8 tolerances cannot see, but every such value lands on
    bf16's grid. An fp16 value with a random mantissa lies there one time in eight: 0.12-0.13 measured
    for O, dQ, dK and dV; O stored through bf16 gave 1.0."""
    q, k, v, do = make_inputs(1, 2, 2, 100, 128, seed=9, dtype=torch.float16)
    out = run_kernel(q, k, v, do, True)
    for name, x in out.items():
        assert x.dtype == torch.float16, f"{name} is {x.dtype}"
        on_bf16_grid = (x.to(torch.bfloat16).to(torch.float16) == x).double().mean().item()
        assert on_bf16_grid < 0.25, f"{name}: {on_bf16_grid:.0%} of its values lie on bf16's grid"


def test_attention_sink():
    """A sink: key 0 scores 8 above every other key for every query and carries a zero value, as
    trained language models learn, so O is made of weights of e^-8 and below. The forward's 256 lift
    keeps these in e4m3's normal range (256 e^-8 = 0.086 > 2^-6); cast without it they fall below
    its subnormals' step, 2^-9: O's error 0.028 with the lift, 0.27 without.
    The bound on O is its own, not TOL_DEQ's: the sink's weight, the only one e4m3 holds exactly
    (256), multiplies a zero, so O's error is the rounding of P~ alone, above the 0.016-0.023 of N(0,1)
    rows, whose largest weight is exact. The gradients keep TOL_DEQ."""
    B, H, N, D = 1, 2, 200, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=33)
    q, k, v = q.clone(), k.clone(), v.clone()
    q[..., 0], k[..., 0] = 4.0, 0.0
    k[:, :, 0, 0] = 16.0            # tau q_0 k_0 = 4 * 16 / 8 = 8
    v[:, :, 0] = 0.0
    out = run_kernel(q, k, v, do, True)
    deq = dequantized_reference(q, k, v, do, True, 1.0 / math.sqrt(D))
    assert rel_err(out["o"], deq["o"]) < 0.045, describe(out["o"], deq["o"])
    for name in ("dq", "dk", "dv"):
        assert rel_err(out[name], deq[name]) < TOL_DEQ[name], f"{name}: {describe(out[name], deq[name])}"


def gluon_at_every_size(monkeypatch):
    """On Hopper: the Gluon kernels at D = 128 however small the problem (HOPPER_*_MIN_SCORES)."""
    if HOPPER:
        monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", 0)
        monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", 0)


def test_nonfinite_inputs_reach_the_rows_the_readme_says():
    """README ("The kernel in your own model"): a NaN stays in its own element's rows of O, as with SDPA,
    while an inf turns its whole scale tile (64 queries, 128 keys) into NaN."""
    B, H, N, D = 1, 1, 130, 64
    q, k, v, _ = make_inputs(B, H, H, N, D, seed=37)

    def poke(x, row, value):
        x = x.clone()
        x[0, 0, row, 3] = value
        return x

    def nan_rows(q, k):
        return set(attention(q, k, v)[0, 0].isnan().any(-1).nonzero().flatten().tolist())

    nan, inf = float("nan"), float("inf")
    assert nan_rows(poke(q, 70, nan), k) == {70}
    assert nan_rows(poke(q, 70, inf), k) == set(range(64, 128))     # its query tile
    assert nan_rows(q, poke(k, 100, nan)) == set(range(100, N))     # the queries that see key 100, as SDPA
    assert nan_rows(q, poke(k, 100, inf)) == set(range(N))          # every query sees keys of its tile 0-127


def test_zero_tiles(monkeypatch):
    """Whole tiles of zeros: a key tile of V and a query tile of dO (no loss reaches those rows:
    padding, or masked positions in the last layer), with large V and dO. The quantizer flushes such
    tiles to zero with scale 0, and the Gluon kernels, which carry O (forward) and dV (dK/dV kernel)
    in the units of V's and dO's tile scales, keep their units across them. With the tiny floor
    scale the quantizer used to write there, switching units into such a tile would overflow fp32
    here (by the bound O l / scale ~ 1e40 at N = 4096; not run on that old code)."""
    gluon_at_every_size(monkeypatch)
    B, H, N, D = (1, 2, 4096, 128) if ON_GPU else (1, 2, 384, 64)
    q, k, v, do = make_inputs(B, H, H, N, D, seed=31)
    v, do = v * 1e4, do * 1e5
    v[:, :, N - 256:N - 128] = 0.0                # a whole key tile
    do[:, :, N // 2:N // 2 + 64] = 0.0            # a whole query tile
    out = run_kernel(q, k, v, do, True)
    deq = dequantized_reference(q, k, v, do, True, 1.0 / math.sqrt(D))
    for name in ("o", "dq", "dk", "dv"):
        assert torch.isfinite(out[name]).all(), f"{name} has non-finite values"
        assert rel_err(out[name], deq[name]) < TOL_DEQ[name], f"{name}: {describe(out[name], deq[name])}"


@pytest.mark.parametrize("causal", [True, False])
def test_zero_query_and_key_tiles(causal, monkeypatch):
    """A whole tile of zeros in Q or in K gets scale 0 from the quantizer, so the product of the
    scales that turns the FP8 dot into S is 0 there, and a masked -inf times 0 is NaN: a zero query
    tile on the causal diagonal made O and every gradient NaN (muP-style zero-initialized query
    projections give exactly that at step 0). S of such a tile is zero whatever that factor is, so
    the kernels floor it; softmax over those rows is then uniform, as in the reference."""
    gluon_at_every_size(monkeypatch)
    B, H, N, D = (1, 2, 4196, 128) if ON_GPU else (1, 2, 350, 64)    # N past a tile: the last is masked
    q, k, v, do = make_inputs(B, H, H, N, D, seed=33)
    q[:, :, 128:256] = 0.0                 # two query tiles of 64 rows (one 128-row block of the D = 128 dQ kernel)
    k[:, :, N // 128 * 128:] = 0.0         # the last key tile: on the diagonal, and cut by N
    out = run_kernel(q, k, v, do, causal)
    deq = dequantized_reference(q, k, v, do, causal, 1.0 / math.sqrt(D))
    for name in ("o", "dq", "dk", "dv"):
        assert torch.isfinite(out[name]).all(), f"{name} has non-finite values"
        assert rel_err(out[name], deq[name]) < TOL_DEQ[name], f"{name}: {describe(out[name], deq[name])}"


@pytest.mark.parametrize("causal", [True, False])
def test_output_is_a_weighted_mean_of_v(causal, monkeypatch):
    """O_i = sum_j w_ij V_j / sum_j w_ij with the very weights w = P~^ (e4m3) that multiply V: a
    convex combination of the rows of V. Normalized by the sum of the unrounded P~ instead, O comes
    out scaled by (sum P~^ / sum P~), which is not 1 where a row's weights round alike: near-uniform
    rows put every P~ just below 256, and they all round to 240 or to 256. Two checks: keys that all
    carry one value vector give back that vector, and near-uniform rows (small Q, V = 1 + noise)
    carry no bias in O's mean. Before the fix (interpreter, N = 512, D = 64, Q * 0.01) the first
    was off by 0.0091 and the second by +0.69%; after it, 0.0015 and -0.01%. On the H200 the Gluon
    forward, which summed P~^ V^ in the tensor cores across key tiles (their running sum keeps about
    14 bits), was off by 0.034 and -2.6% at this test's N = 4096 (0.17 and -11% at N = 16384)."""
    gluon_at_every_size(monkeypatch)
    B, H, N, D = (1, 4, 4096, 128) if ON_GPU else (1, 2, 384, 64)
    sm_scale = 1.0 / math.sqrt(D)
    q, k, v, _ = make_inputs(B, H, H, N, D, seed=71)
    q = q * 0.01                                         # near-uniform attention over all keys
    v_one = v[:, :, :1].expand(B, H, N, D).contiguous()  # every key carries the same vector
    o = attention(q, k, v_one, causal=causal).double()
    # what the kernel sees of that vector: every 128-key tile has the same amax, so the same e4m3 row
    v_seen = dequantize(v_one, "v")[:, :, :1]
    # to BF16 rounding of O: half a unit in the last place is at most 2^-8 of a value (measured: 0.0014-0.0015)
    assert rel_err(o, v_seen.expand_as(o)) < 3e-3, f"O of a constant V: {describe(o, v_seen.expand_as(o))}"
    v_near = (1.0 + 0.1 * v.float()).to(v.dtype)
    o = attention(q, k, v_near, causal=causal).double()
    ref = reference(dequantize(q, "q"), dequantize(k, "k"), dequantize(v_near, "v"), causal, sm_scale)[0]
    bias = ((o - ref).mean() / ref.abs().mean()).item()
    assert abs(bias) < 1e-3, f"O's mean is off by {bias:+.3%} on near-uniform rows"
    assert rel_err(o, ref) < TOL_DEQ["o"], describe(o, ref)


@pytest.mark.parametrize("gluon", [False, pytest.param(True, marks=pytest.mark.skipif(not HOPPER, reason="needs sm_90"))],
                         ids=["triton", "gluon"])
def test_dv_is_a_weighted_sum_of_do(gluon, monkeypatch):
    """dV_j = sum_i P_ij dO_i. Where every query's dO is one vector c, dV_j = (sum_i P_ij) c: a sum of
    same-signed terms that grows with every query tile. The Triton kernel adds each tile's FP8 dot to
    dV in fp32. The Gluon kernel sums dV in the tensor cores, whose FP8 running sum keeps about 14 bits;
    without its flush into fp32 every DV_FLUSH tiles it was off by 0.035 here on the H200 (N = 4096),
    and dO = 1 + 0.1 N(0,1) came out 3.6% low (15% at N = 16384), against the Triton kernel's 0.002 and
    -0.1% (P's rounding to e4m3)."""
    B, H, N, D = (1, 4, 4096, 128) if ON_GPU else (1, 2, 384, 64)
    monkeypatch.setattr(A, "HOPPER_BACKWARD", (D,) if gluon else ())
    monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", 0)
    sm_scale = 1.0 / math.sqrt(D)
    q, k, v, do = make_inputs(B, H, H, N, D, seed=73)
    q = q * 0.01                                           # near-uniform P: every key gets many queries
    do_one = do[:, :, :1].expand(B, H, N, D).contiguous()
    dv = run_kernel(q, k, v, do_one, True)["dv"]
    ref = dequantized_reference(q, k, v, do_one, True, sm_scale)["dv"]
    assert rel_err(dv, ref) < 4e-3, f"dV of a constant dO: {describe(dv, ref)}"
    do_near = (1.0 + 0.1 * do.float()).to(do.dtype)
    dv = run_kernel(q, k, v, do_near, True)["dv"].double()
    ref = dequantized_reference(q, k, v, do_near, True, sm_scale)["dv"]
    bias = ((dv - ref).mean() / ref.abs().mean()).item()
    assert abs(bias) < 3e-3, f"dV's mean is off by {bias:+.3%}"


def test_kernels_compile_for_hopper():
    """The interpreter runs code that Triton's compiler may refuse. Compile every kernel for sm_90a
    too, which needs no GPU (kernel_registers.py; Triton ships the ptxas it calls)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, os.path.join(root, "kernel_registers.py")], cwd=root, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.split()[:1] in (["64"], ["128"])]
    # the quantize kernel once per launch: the forward's K, V^T and the backward's Q, dO and K, K^T, V
    assert [(r[0], r[1]) for r in rows] == [(d, k) for d in ("64", "128")
                                                for k in ("quantize",) * 3 + ("fwd", "dq", "dkdv", "fwd-gluon", "dkdv-gluon")], \
        run.stdout


@pytest.mark.parametrize("target", [89, 100, 120])
def test_kernels_fit_shared_memory(target):
    """The FP8 GPUs other than Hopper: Ada (89) and consumer Blackwell (120) give a block 99 KiB of
    shared memory, B200 (100) 227 KiB. Triton compiles a kernel that asks for more, and the GPU then
    refuses to launch it; the dQ kernel at D = 128 did so until it got a tiling of its own there
    (attention_fp8.SMALL_SHARED_CONFIGS). Compile the Triton kernels, tiled as each GPU would take them,
    and hold them to its limit (kernel_registers.py exits with an error otherwise)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, os.path.join(root, "kernel_registers.py"), "--target", str(target), "--hopper", ""],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.split()[:1] in (["64"], ["128"])]
    assert [(r[0], r[1]) for r in rows] == [(d, k) for d in ("64", "128")
                                                for k in ("quantize",) * 3 + ("fwd", "dq", "dkdv")], run.stdout


def test_tiling_by_shared_memory():
    """Where a GPU gives a block less shared memory than Hopper, the launchers take
    SMALL_SHARED_CONFIGS, with the same scale tiles (so the same FP8 copies)."""
    hopper, small = A.HOPPER_SHARED_BYTES, 101376
    for D in A.HEAD_DIMS:
        assert A.tiles(D, small) == A.tiles(D, hopper)
        for kernel in ("fwd", "dq", "dkdv"):
            assert A.config(D, kernel, hopper) is A.CONFIGS[D][kernel]
            if (D, kernel) != (128, "dq"):      # the one tiling that does not fit 99 KiB
                assert A.config(D, kernel, small) is A.CONFIGS[D][kernel], f"D = {D}, {kernel}"
    # the D = 128 dQ kernel steps over 64 keys there, half its Hopper step (attention_fp8, Shared memory)
    assert A.config(128, "dq", small)["BLOCK_N"] == 64 < A.CONFIGS[128]["dq"]["BLOCK_N"]


def check_tiling(q, k, v, do, causal, out):
    """A tiling other than CONFIGS computes the same function: run_kernel's out within TOL_DEQ of the
    reference on the dequantized inputs, and every row of the matched dS sums to zero."""
    sm_scale = 1.0 / math.sqrt(q.shape[-1])
    deq = dequantized_reference(q, k, v, do, causal, sm_scale)
    for name in ("o", "dq", "dk", "dv"):
        assert rel_err(out[name], deq[name]) < TOL_DEQ[name], f"{name}: {describe(out[name], deq[name])}"
    o, lse = A._forward(q, k, v, causal, sm_scale)
    info = A._backward(do, q, k, v, o, lse, causal, sm_scale, "matched", debug=True)[3]
    assert (info["ds_rowsum"].abs() / info["pdp_abs_rowsum"]).max() < 1e-6


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU with FP8 tensor cores")
def test_gpu_shared_memory_limit():
    """The limit the launchers read is the one Triton holds launches to, and a Hopper GPU takes the
    tilings measured on the H200 (CONFIGS), not the smaller ones."""
    import triton
    device = torch.device("cuda", torch.cuda.current_device())
    assert A._shared_bytes(device) == triton.runtime.driver.active.utils.get_device_properties(device.index)["max_shared_mem"]
    if HOPPER:
        assert A._shared_bytes(device) >= A.HOPPER_SHARED_BYTES
        assert A.config(128, "dq", A._shared_bytes(device)) is A.CONFIGS[128]["dq"]


@pytest.mark.parametrize("causal", [True, False])
def test_small_shared_memory_tiling(causal, monkeypatch):
    """The kernels as a 99 KiB GPU (Ada, RTX 50xx) runs them: D = 128, the dQ kernel over 64 keys."""
    B, H, H_kv, N, D = 1, 2, 1, 200, 128
    monkeypatch.setattr(A, "_shared_bytes", lambda device: 101376)
    launched, launch = [], A._launch       # which tiling each launch took
    monkeypatch.setattr(A, "_launch", lambda kernel, grid, args, **c: (launched.append((kernel, c)), launch(kernel, grid, args, **c)))
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=31)
    out = run_kernel(q, k, v, do, causal)
    assert [c["BLOCK_N"] for kernel, c in launched if kernel is A._bwd_dq_kernel] == [64]
    check_tiling(q, k, v, do, causal, out)


def test_fp16_and_explicit_scale():
    B, H, N, D = 1, 2, 100, 128
    q, k, v, do = make_inputs(B, H, H, N, D, seed=9, dtype=torch.float16)
    out = run_kernel(q, k, v, do, False, sm_scale=0.05)
    exact = reference_grads(q, k, v, do, False, 0.05)
    assert out["o"].dtype == torch.float16
    for name in ("o", "dq", "dk", "dv"):
        assert rel_err(out[name], exact[name]) < TOL_EXACT[name], f"{name}: {describe(out[name], exact[name])}"


def test_non_contiguous_inputs():
    B, H, N, D = 2, 2, 70, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=13)
    contiguous = run_kernel(q, k, v, do, True)
    # (B, N, H, D) storage seen as (B, H, N, D), the layout a model's reshape produces
    qt, kt, vt, dot = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v, do)]
    assert not qt.is_contiguous()
    strided = run_kernel(qt, kt, vt, dot, True)
    for name in contiguous:
        assert torch.equal(contiguous[name], strided[name]), f"{name} depends on the input strides"


@pytest.mark.parametrize("delta,causal,sm_scale", [("matched", True, None), ("stale", True, None), ("matched", False, 0.05)],
                         ids=["matched", "stale", "full-scale-0.05"])
def test_torch_compile_fullgraph(delta, causal, sm_scale, monkeypatch):
    B, H, N, D = 1, 2, 64, 64
    # Compiled calls take the Gluon kernels on Hopper from COMPILED_MIN_SCORES, eager ones from a larger
    # size: the eager reference below takes the compiled path's kernels, so that they must agree bit for bit.
    monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", A.COMPILED_MIN_SCORES)
    monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", A.COMPILED_MIN_SCORES)
    # keys with a common offset, so that the two arms' gradients differ: a compiled call that ran the
    # other delta than the one asked for fails below
    q, k, v, do = make_inputs(B, H, H, N, D, seed=17, key_offset=1.0)

    def f(q, k, v):
        return attention(q, k, v, causal=causal, sm_scale=sm_scale, delta=delta) * 2.0

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager" if not ON_GPU else "inductor")
    qc, kc, vc = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = compiled(qc, kc, vc)
        o.backward(do)
    # e.g. Dynamo's warning about tracing through a functools.lru_cache in _check_inputs, which
    # every compiled training run used to print
    ours = [str(w.message) for w in caught if "attention_fp8" in str(w.message) or "attention_fp8" in w.filename]
    assert not ours, f"torch.compile warned about attention_fp8: {ours}"
    eager = run_kernel(q, k, v, do * 2.0, causal, delta=delta, sm_scale=sm_scale)
    other = run_kernel(q, k, v, do * 2.0, causal, delta="stale" if delta == "matched" else "matched", sm_scale=sm_scale)
    assert not torch.equal(eager["dq"], other["dq"])
    assert torch.equal(o.detach(), eager["o"] * 2.0)
    for name, x in (("dq", qc.grad), ("dk", kc.grad), ("dv", vc.grad)):
        assert torch.equal(x, eager[name]), f"compiled {name} differs from eager delta={delta!r}"


def test_torch_compile_dynamic_with_a_scale_from_the_head_dim(monkeypatch):
    """torch.compile(fullgraph=True, dynamic=True) around attention(..., sm_scale=q.size(-1) ** -0.5), the
    usual way to write the scale: under dynamic shapes it is a SymFloat, and the check on it used
    math.isfinite, which Dynamo cannot trace (an error with fullgraph=True, a graph break without)."""
    # eager calls take the compiled path's kernels (as in test_torch_compile_fullgraph): bit for bit
    monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", A.COMPILED_MIN_SCORES)
    monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", A.COMPILED_MIN_SCORES)
    q, k, v, do = make_inputs(1, 2, 2, 64, 64, seed=5)

    def f(q, k, v):
        return attention(q, k, v, causal=True, sm_scale=q.size(-1) ** -0.5)

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager" if not ON_GPU else "inductor")
    qc, kc, vc = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = compiled(qc, kc, vc)
    o.backward(do)
    eager = run_kernel(q, k, v, do, True, sm_scale=0.125)
    assert torch.equal(o.detach(), eager["o"])
    for name, x in (("dq", qc.grad), ("dk", kc.grad), ("dv", vc.grad)):
        assert torch.equal(x, eager[name]), f"compiled {name} differs from eager"


def test_bad_inputs_raise_clear_errors(monkeypatch):
    q = torch.randn(1, 2, 16, 64, device=DEVICE, dtype=torch.bfloat16)

    def expect(exc, match, *args, **kwargs):
        with pytest.raises(exc, match=match):
            attention(*args, **kwargs)

    expect(ValueError, "4-D", q[0], q[0], q[0])
    expect(TypeError, "bfloat16 and torch.float16", q.float(), q.float(), q.float())
    expect(TypeError, "bfloat16 and torch.float16", q.to(torch.int32), q.to(torch.int32), q.to(torch.int32))
    expect(TypeError, "share one dtype", q, q.half(), q.half())
    expect(ValueError, "batch, seq_len and head_dim", q, q[:, :, :8], q[:, :, :8])
    expect(ValueError, "same shape", q, q, q[:, :1])
    expect(ValueError, "multiple of", torch.randn(1, 3, 16, 64, device=DEVICE, dtype=torch.bfloat16), q, q)
    expect(ValueError, "head_dim 32 is not supported", q[..., :32], q[..., :32], q[..., :32])
    expect(ValueError, "delta must be", q, q, q, delta="fresh")
    expect(TypeError, "torch.Tensor", q.tolist(), q, q)
    expect(TypeError, "causal must be True or False, got 'False'", q, q, q, causal="False")
    for scale in (-0.125, float("nan"), float("inf")):     # a negative one would meet the kernels' floor
        expect(ValueError, "sm_scale must be a finite number >= 0", q, q, q, sm_scale=scale)
    # a tensor would lose its gradient to float(), a string would be parsed
    expect(TypeError, "sm_scale must be a Python number or None, got Tensor .* pass float", q, q, q,
           sm_scale=torch.tensor(0.125, requires_grad=True))
    expect(TypeError, "sm_scale must be a Python number or None, got str", q, q, q, sm_scale="0.125")
    with pytest.raises(ValueError, match="sm_scale must be"):
        A.delta_stats(q, q, q, q, sm_scale=-1.0)
    with pytest.raises(TypeError, match="causal must be True or False"):
        A.delta_stats(q, q, q, q, causal="False")
    for tile in (48, 256):          # not a power of two; larger than the padding (a grid of no programs)
        with pytest.raises(ValueError, match="tile must be 16, 32, 64 or 128 rows"):
            A.quantize(q, tile)
    # 2^31 elements (zero strides: no memory): the kernels' 32-bit offsets would wrap around
    huge = torch.zeros(1, 1, 1, 64, device=DEVICE, dtype=torch.bfloat16).expand(2**14, 2, 1024, 64)
    expect(ValueError, "32-bit offsets", huge, huge, huge)
    short = huge[:, :, :1000]      # under 2^31 elements, but its FP8 copy has N_pad = 1024 rows per head
    expect(ValueError, "32-bit offsets", short, short, short)
    # 65,536 (batch, head) pairs: over the launch grid's second axis (zero strides: no memory)
    wide = torch.zeros(1, 1, 1, 64, device=DEVICE, dtype=torch.bfloat16).expand(2**15, 2, 16, 64)
    with pytest.raises(ValueError, match="65,536 is over 65,535"):
        A._check_inputs(wide, wide, wide, "matched")    # the check itself: a kernel let through would run for ages here
    with pytest.raises(ValueError, match="delta_stats: do must be a tensor like q"):
        A.delta_stats(q, q, q, q[:, :, :8])
    with pytest.raises(ValueError, match="got NoneType"):
        A.delta_stats(q, q, q, None)
    if ON_GPU:
        expect(ValueError, "one device", q, q.cpu(), q.cpu())
    monkeypatch.setattr(A, "INTERPRETED", False)    # kernels built for the GPU: CPU tensors are refused
    expect(ValueError, "TRITON_INTERPRET=1", q.cpu(), q.cpu(), q.cpu())


def test_numpy_bool_causal_is_taken_as_its_value():
    """causal read from a numpy array or config (np.bool_, neither bool nor int) means what it says."""
    q, k, v = (torch.randn(1, 1, 16, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    for flag in (False, True):
        assert torch.equal(attention(q, k, v, causal=np.bool_(flag)), attention(q, k, v, causal=flag))
    assert not torch.equal(attention(q, k, v, causal=False), attention(q, k, v, causal=True))


def test_quantize_roundtrip_and_saturation():
    """Block scales: each 64-row tile's amax maps to 448 exactly; dequantized values within e4m3's
    relative step (2^-4) of the input; all-zero tiles stay zero; padding rows are zero."""
    x = torch.randn(1, 2, 100, 64, device=DEVICE) * torch.logspace(-3, 3, 100, device=DEVICE)[:, None]
    x[:, :, 64:] = 0.0
    x = x.bfloat16()
    x8, x8t, scale = A.quantize(x, 64, cols=True)
    assert torch.equal(x8.transpose(1, 2), x8t), "the token-contiguous copy differs from the row copy"
    deq = x8.float() * scale[..., None]
    assert (deq[:, 100:] == 0).all() and (deq[:, 64:100] == 0).all()
    # the zero tile's scale is 0 itself, not a tiny floor: the Gluon kernels move accumulators between
    # tiles by the ratio of two scales, which a floor of ~2e-33 overflows (test_zero_tiles)
    assert (scale[:, 64:] == 0).all(), "an all-zero tile (or the padding) got a nonzero scale"
    xf = x.float().reshape(2, 100, 64)
    tile = deq[:, :64]
    assert torch.allclose(tile.abs().amax((1, 2)), xf[:, :64].abs().amax((1, 2)), rtol=1e-6)
    big = xf[:, :64].abs() > xf[:, :64].abs().amax() * 2 ** -6   # normal range of the tile's e4m3
    assert ((tile - xf[:, :64]).abs() <= 2 ** -4 * xf[:, :64].abs() + 1e-30)[big].all()


def test_quantize_zeroes_every_padding_tile(monkeypatch):
    """quantize's copies are padded to PAD rows with zeros (its docstring), whole tiles of padding too:
    at N = 40 and tiles of 64 the second tile holds no row of x. No kernel of attention() reads it, so
    only quantize's own promise sees a grid that stops at the last tile of x (the buffers come from
    torch.empty, here filled with NaN)."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    x = torch.randn(1, 2, 40, 64, dtype=torch.bfloat16, device=DEVICE)
    x8, x8t, scale = A.quantize(x, 64, cols=True)
    assert x8.shape[1] == x8t.shape[-1] == A.PAD
    assert (x8[:, 40:].float() == 0).all() and (x8t[..., 40:].float() == 0).all(), "padding rows not zero"
    assert (scale[:, 64:] == 0).all(), "the padding tile's scales are not zero"     # one scale per row


def test_transposed_copy_is_quantized_from_the_input():
    """_quantize_tile builds its token-contiguous copy by transposing the tile in the input's own type,
    then quantizing it. Transposing the e4m3 tile instead gives the same bytes on the interpreter, but
    Triton 3.8 miscompiles that 8-bit transpose on the H200 (triton-lang/triton#11111; dQ scrambled):
    no CPU run can tell the two apart, so the source is held to the first."""
    source = A._quantize_tile.src if hasattr(A._quantize_tile, "src") else inspect.getsource(A._quantize_tile.fn)
    code = [line.split("#")[0].strip() for line in source.splitlines()]
    assert "x8t = (tl.trans(x_in).to(tl.float32) * c).to(tl.float8e4nv)" in code
    assert not any("tl.trans(x8" in line for line in code), "an 8-bit transpose (triton-lang/triton#11111)"


def test_quantize_refuses_bad_input():
    """quantize is public (tests build references with it): a tensor it cannot tile gets an error that
    names the problem, not an unpacking error or a Triton compile failure."""
    x = torch.randn(1, 2, 100, 64, device=DEVICE).bfloat16()
    with pytest.raises(ValueError, match="tile must be 16, 32, 64 or 128"):
        A.quantize(x, 48)
    with pytest.raises(ValueError, match=r"4-D floating-point tensor \(B, H, N, D\), got shape \(2, 100, 64\)"):
        A.quantize(x[0], 64)
    with pytest.raises(ValueError, match="4-D floating-point tensor .* got shape .* torch.int64"):
        A.quantize(torch.ones(1, 2, 100, 64, dtype=torch.int64, device=DEVICE), 64)
    with pytest.raises(ValueError, match="got list"):
        A.quantize([1.0], 64)
    for D in (48, 8):
        with pytest.raises(ValueError, match=f"head dim D = {D} must be a power of two, at least 16"):
            A.quantize(torch.randn(1, 2, 100, D, device=DEVICE).bfloat16(), 64)


def permuted_order(n, device):
    """The token each position of a permuted copy holds (A._permuted_cols): position k of each 32
    holds token pi(k), pi taking bits (k4, k1, k3, k2, k0) to (c4, c3, c2, c1, c0)."""
    k = torch.arange(n)
    bit = lambda i: (k >> i) & 1    # noqa: E731
    return ((k & ~31) | bit(4) << 4 | bit(1) << 3 | bit(3) << 2 | bit(2) << 1 | bit(0)).to(device)


@pytest.mark.parametrize("tile", [64, 128])
def test_quantize_permuted_cols(tile):
    """The Gluon forward reads V^T (tiles of 128 keys), and the Gluon dK/dV kernel Q^T and dO^T
    (tiles of 64 queries), with each 32 tokens permuted (attention_fp8_hopper._p_operand): position
    k holds token pi(k), pi taking bits (k4, k1, k3, k2, k0) to (c4, c3, c2, c1, c0). The permuted
    copy must hold the plain copy's columns in exactly that order, scales unchanged."""
    x = torch.randn(2, 3, 200, 64, device=DEVICE).bfloat16()
    (_, plain, s_plain), = A._quantize([(x, False, True)], tile)
    (_, perm, s_perm), = A._quantize([(x, False, True)], tile, permute_cols=True)
    pi = permuted_order(plain.shape[-1], "cpu")
    assert sorted(pi.tolist()) == list(range(plain.shape[-1]))
    assert torch.equal(perm, plain[:, :, pi.to(plain.device)]), "permuted V^T copy is not the plain one reordered by pi"
    assert torch.equal(s_perm, s_plain)


@pytest.mark.parametrize("D", [64, 128])
def test_quantize_launches_write_agreeing_copies(D):
    """Every quantize launch the kernels' callers make, with the tiles they use at head dim D: the
    token-contiguous copy of each tensor is its row copy transposed (each 32 tokens reordered by pi
    where the launch permutes). Triton 3.8 compiled the first version of this for the H200 with the
    transposed copy scrambled whenever a tile wrote both copies (Q and dO, and K, in the backward):
    dQ came out wrong or NaN, and every other test here then failed downstream of it."""
    x, y = (torch.randn(1, 3, 200, D, device=DEVICE).bfloat16() for _ in range(2))
    pi = permuted_order(A._padded(200), x.device)
    tile = A.tiles(D)
    launches = [([(x, True, True), (y, True, True)], tile["q"], False),    # backward: Q and dO
                ([(x, True, True), (y, True, True)], tile["q"], True),     # ... for the Gluon dK/dV kernel
                ([(x, True, True), (y, True, False)], tile["k"], True),    # backward: K (and V's rows)
                ([(x, True, False), (y, False, True)], tile["k"], True),   # Gluon forward: K's rows, V^T
                ([(x, True, False), (y, False, True)], tile["k"], False),  # Triton forward: K's rows, V^T
                ([(x, True, True)], tile["q"], False)]                     # quantize(..., cols=True)
    for specs, t, permute in launches:
        for (src, rows, cols), (x8, x8t, _) in zip(specs, A._quantize(specs, t, permute)):
            if not rows:        # V^T alone: compare with V's row copy from a launch of its own
                x8 = A._quantize([(src, True, False)], t)[0][0]
            if cols:
                want = x8.transpose(1, 2)[:, :, pi] if permute else x8.transpose(1, 2)
                assert torch.equal(x8t.view(torch.uint8), want.view(torch.uint8)), \
                    f"tile {t}, permute {permute}, rows {rows}: the token-contiguous copy is not the row copy transposed"


def test_quantize_pairs_for_one_tma_copy():
    """The Gluon dK/dV kernel brings a tile of Q^ and of dO^ (of Q^T and dO^T) in with one TMA copy
    of a [2, ...] box (attention_fp8_hopper._pair), which holds only if _quantize puts the two
    copies one after the other in one buffer: each pair must read back as itself through _pair,
    and two copies that are not such a pair must be refused, not read wrongly."""
    pytest.importorskip("triton.experimental.gluon")
    import attention_fp8_hopper as AH
    q, do = (torch.randn(2, 3, 200, 64, device=DEVICE).bfloat16() for _ in range(2))
    (q8, qt8, _), (do8, dot8, _) = A._quantize([(q, True, True), (do, True, True)], 64)
    for x, y in ((q8, do8), (qt8, dot8)):
        pair = AH._pair(x, y)
        bits = lambda t: t.view(torch.uint8)     # noqa: E731
        assert torch.equal(bits(pair[0]).view_as(x), bits(x)) and torch.equal(bits(pair[1]).view_as(y), bits(y))
    (lone8, _, _), = A._quantize([(do, True, False)], 64)
    with pytest.raises(ValueError, match="halves of one buffer"):
        AH._pair(q8, lone8)


# Shapes for the Gluon kernels against the Triton ones: GQA, N = 1, N not a multiple of the tiles,
# N >= 4096 at both head dims.
HOPPER_CASES = [(2, 4, 2, 1000, 64, True), (1, 2, 2, 129, 128, True), (2, 3, 1, 777, 128, False),
                (1, 4, 4, 4096, 128, True), (1, 4, 2, 4096, 64, True), (4, 2, 2, 77, 64, False), (1, 2, 2, 1, 64, True)]


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("B,H,H_kv,N,D,causal", HOPPER_CASES)
def test_gpu_hopper_forward_matches_triton(B, H, H_kv, N, D, causal, monkeypatch):
    """The Gluon forward (attention_fp8_hopper.py, the default on Hopper) against the Triton forward
    on the same FP8 copies: the same LSE up to fp32 rounding, and an O that differs by less than the
    BF16 rounding of O itself. test_gpu_hopper_forward_then_backward runs it through attention();
    the other cases here are smaller than HOPPER_FORWARD_MIN_SCORES and run the Triton forward."""
    q, k, v, _ = make_inputs(B, H, H_kv, N, D, seed=51)
    monkeypatch.setattr(A, "HOPPER_FORWARD", (D,))
    monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", 0)
    o_gluon, lse_gluon = A._forward(q, k, v, causal, D ** -0.5)
    monkeypatch.setattr(A, "HOPPER_FORWARD", ())
    o_triton, lse_triton = A._forward(q, k, v, causal, D ** -0.5)
    assert (lse_gluon - lse_triton).abs().max().item() < 1e-4, "LSE differs"
    assert rel_err(o_gluon, o_triton) < 4e-3, f"O: {describe(o_gluon, o_triton)}"


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("B,H,H_kv,N,D,causal", [(2, 4, 2, 777, 128, False), (1, 8, 2, 2048, 128, True)])
def test_gpu_hopper_forward_then_backward(B, H, H_kv, N, D, causal, monkeypatch):
    """Forward + backward through attention() with the Gluon forward at every N: the matched backward
    reads only the forward's LSE, which the two forwards compute alike, so the gradients agree with
    the Triton forward's path (and match the fp64 reference like every other case here)."""
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=52)
    monkeypatch.setattr(A, "HOPPER_FORWARD", (D,))
    monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", 0)
    gluon = run_kernel(q, k, v, do, causal)
    monkeypatch.setattr(A, "HOPPER_FORWARD", ())
    triton_fwd = run_kernel(q, k, v, do, causal)
    exact = reference_grads(q, k, v, do, causal, D ** -0.5)
    for name in ("dq", "dk", "dv"):
        assert rel_err(gluon[name], triton_fwd[name]) < 1e-3, f"{name}: {describe(gluon[name], triton_fwd[name])}"
    for name in ("o", "dq", "dk", "dv"):
        assert rel_err(gluon[name], exact[name]) < TOL_EXACT[name], f"{name}: {describe(gluon[name], exact[name])}"


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("B,H,H_kv,N,D,causal", HOPPER_CASES)
def test_gpu_hopper_dkdv_matches_triton(B, H, H_kv, N, D, causal, monkeypatch):
    """The Gluon dK/dV kernel (the default on Hopper from HOPPER_BACKWARD_MIN_SCORES) against the Triton
    one, held to the Triton kernel's accuracy against the fp64 reference. Neither gradient is
    bit-equal: dK's dS^T has a row scale per 64 queries (the Triton kernel's per 32 at D = 128), and
    dV accumulates across query tiles inside the tensor cores, whose FP8 accumulation keeps fewer
    bits than fp32 (0.12-0.39% apart from the Triton kernel's dV at N = 2048-32768 on the H200)."""
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=53)
    monkeypatch.setattr(A, "HOPPER_BACKWARD", (D,))
    monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", 0)
    gluon = run_kernel(q, k, v, do, causal)
    monkeypatch.setattr(A, "HOPPER_BACKWARD", ())
    triton_bwd = run_kernel(q, k, v, do, causal)
    assert torch.equal(gluon["dq"], triton_bwd["dq"]), "dQ comes from the same kernel in both"
    exact = reference_grads(q, k, v, do, causal, D ** -0.5)
    for name, worse in (("dv", 1.02), ("dk", 1.1)):
        if name == "dk" and N == 1:      # softmax over one key: the exact dK is zero
            assert gluon["dk"].abs().max().item() < 1e-5
            continue
        errors = [rel_err(x[name], exact[name]) for x in (gluon, triton_bwd)]
        assert errors[0] < min(TOL_EXACT[name], worse * errors[1]), \
            f"{name} error: gluon {errors[0]:.4f}, triton {errors[1]:.4f}"


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU with FP8 tensor cores")
@pytest.mark.parametrize("gluon", [False, pytest.param(True, marks=pytest.mark.skipif(not HOPPER, reason="needs sm_90"))],
                         ids=["triton", "gluon"])
@pytest.mark.parametrize("B,H,H_kv,N,D,causal", [(2, 4, 2, 1000, 64, True), (1, 3, 1, 333, 128, False)],
                         ids=["gqa-causal-d64", "mqa-d128"])
def test_gpu_fast_launch_matches_plain_launch(B, H, H_kv, N, D, causal, gluon, monkeypatch):
    """_launch calls the compiled kernels' launchers itself (FAST_LAUNCH): it must launch the very
    kernels kernel[grid](...) launches, with the same arguments, so every output is bit-identical;
    a stale cache entry (wrong N, strides or dtype reused) would not be. Inputs with strides of their
    own (a transposed view, as the GPT block passes) and one 2-byte-misaligned input, which must go
    the plain path, are both checked; gluon=True runs the Gluon forward and dK/dV kernels (their TMA
    descriptors go through the same launcher) at these sizes."""
    monkeypatch.setattr(A, "HOPPER_FORWARD", (D,) if gluon else ())     # whatever FP8_GLUON_EVERYWHERE says
    monkeypatch.setattr(A, "HOPPER_BACKWARD", (D,) if gluon else ())
    if gluon:
        import attention_fp8_hopper as AH
        monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", 0)
        monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", 0)
    monkeypatch.setattr(A, "_launchers", {})      # the first fast run starts from an empty cache
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=51)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)          # (B, N, H, D) memory
    k_flat = torch.empty(k.numel() + 1, device=k.device, dtype=k.dtype)
    k_misaligned = k_flat[1:].view(k.shape)                             # data_ptr % 16 == 2
    k_misaligned.copy_(k)
    runs = {}
    for fast in (False, True, True):        # the second fast run is served from the launcher cache
        monkeypatch.setattr(A, "FAST_LAUNCH", fast)
        for arm in ("matched", "stale"):
            for name, (qq, kk) in {"plain": (q, k), "strided": (q_strided, k), "misaligned": (q, k_misaligned)}.items():
                runs.setdefault((arm, name), []).append(run_kernel(qq, kk, v, do, causal, delta=arm))
    kernels = [A._quantize_kernel] + ([AH._fwd_kernel_hopper, AH._dkdv_kernel_hopper] if gluon else [A._fwd_kernel])
    for kernel in kernels:
        assert any(key[0] == id(kernel) for key in A._launchers), f"{kernel.__name__}: the fast path was never taken"
    for (arm, name), (plain, fast, cached) in runs.items():
        for t in plain:
            assert torch.equal(plain[t], fast[t]) and torch.equal(plain[t], cached[t]), \
                f"{arm} {name}: {t} differs between the plain and the fast launch"


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU with FP8 tensor cores")
def test_gpu_deterministic():
    B, H, N, D = 2, 8, 2048, 128
    q, k, v, do = make_inputs(B, H, H, N, D, seed=21)
    a, b = run_kernel(q, k, v, do, True), run_kernel(q, k, v, do, True)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs between two identical runs (race?)"


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU with FP8 tensor cores")
@pytest.mark.parametrize("split_bytes", [float("inf"), 0], ids=["one-pass", "halves"])
def test_gpu_cuda_graph_capture(split_bytes, monkeypatch):
    """Forward+backward captured once in a CUDA graph (what removes the host time of small shapes)
    and replayed on new inputs gives exactly what eager mode gives on them: no host sync, no
    allocation or launch argument that the graph would freeze with stale values."""
    monkeypatch.setattr(A, "SPLIT_BYTES", split_bytes)
    B, H, H_kv, N, D = 2, 4, 2, 1000, 64
    static = [x.clone() for x in make_inputs(B, H, H_kv, N, D, seed=41)]
    q, k, v = [x.requires_grad_() for x in static[:3]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):           # warm-up (compilation) outside the capture
        for _ in range(2):
            attention(q, k, v).backward(static[3])
    torch.cuda.current_stream().wait_stream(side)
    q.grad = k.grad = v.grad = None         # the graph allocates them from its own pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = attention(q, k, v)
        o.backward(static[3])
    fresh = make_inputs(B, H, H_kv, N, D, seed=42)
    with torch.no_grad():
        for x, y in zip(static, fresh):
            x.copy_(y)
    graph.replay()
    eager = run_kernel(*fresh, True)
    for name, x in (("o", o), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert torch.equal(x.detach(), eager[name]), f"{name} from the replayed graph differs from eager mode"


@pytest.mark.parametrize("B,H,H_kv,causal", [(2, 4, 2, True), (2, 2, 1, False), (1, 3, 3, True), (3, 2, 1, True),
                                             (1, 4, 2, True)],
                         ids=["kv-head-halves", "batch-halves", "odd-kv-heads", "odd-batch", "one-batch-two-kv-heads"])
def test_backward_in_halves_is_bit_identical(B, H, H_kv, causal):
    """The backward runs on two halves of the kv heads (or of the batch, with one kv head) to keep
    its FP8 copies small. Heads are independent, so the halves must give exactly what one pass gives:
    a wrong head offset, query-head group or LSE stride would not, nor a half of an odd count (3 kv
    heads split 1 + 2, a batch of 3 likewise) that skipped the middle head and left it unwritten."""
    N, D = 100, 64
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=31)
    sm_scale = 1.0 / math.sqrt(D)
    o, lse = A._forward(q, k, v, causal, sm_scale)
    for arm, o_saved in (("matched", None), ("stale", o)):
        whole = A._backward(do, q, k, v, o_saved, lse, causal, sm_scale, arm, pieces=1)
        halves = A._backward(do, q, k, v, o_saved, lse, causal, sm_scale, arm, pieces=2)
        for name, x, y in zip(("dq", "dk", "dv"), whole, halves):
            assert torch.equal(x, y), f"{arm}: {name} from two halves differs from one pass"


def test_launch_grid_sections():
    """_grid: G divides the heads and is the largest that keeps G heads' operands within SECTION_BYTES,
    but at least MIN_SECTION where the heads allow; G = 1 without a causal mask; the grid (G * tiles,
    heads / G) covers every (tile, head) once."""
    mib = 2**20
    assert (A.SECTION_BYTES, A.MIN_SECTION) == (16 * mib, 4)
    assert A._grid(64, 64, 1 * mib, True) == (16, (1024, 4))     # 16 heads of 1 MiB
    assert A._grid(64, 48, 1 * mib, True) == (16, (1024, 3))
    assert A._grid(64, 24, 1 * mib, True) == (12, (768, 2))      # 16 does not divide 24: 12 does
    assert A._grid(64, 13, 1 * mib, True) == (13, (832, 1))      # all of them fit
    assert A._grid(64, 17, 1 * mib, True) == (1, (64, 17))       # 17 is prime: one head at a time
    assert A._grid(8, 8, 64 * mib, True) == (4, (32, 2))         # heads over the bound: MIN_SECTION of them
    assert A._grid(8, 6, 64 * mib, True) == (3, (24, 2))
    assert A._grid(3, 6, 1, True) == (6, (18, 1))
    assert A._grid(64, 64, 1 * mib, False) == (1, (64, 64))      # no causal mask: one head at a time


@triton.jit
def _record_program_tile(OUT, G: tl.constexpr, LONGEST_LAST: tl.constexpr):
    tile, head = A._program_tile(G, LONGEST_LAST)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(OUT + 2 * pid, tile)
    tl.store(OUT + 2 * pid + 1, head)


@pytest.mark.parametrize("longest_last", [True, False])
def test_programs_start_longest_tile_first_in_sections(longest_last):
    """What _program_tile gives the k-th program to start (CUDA starts a grid's programs with the first
    axis fastest): the sections of G heads in turn; within one, the longest tile of each of its heads, then
    the next longest. Query tiles are longest last (LONGEST_LAST), key tiles longest first."""
    tiles, heads = 5, 12
    for G in (1, 3, 4, 12):
        out = torch.full((tiles * heads, 2), -1, dtype=torch.int32, device=DEVICE)
        _record_program_tile[(G * tiles, heads // G)](out, G=G, LONGEST_LAST=longest_last)
        expect = [((tiles - 1 - t) if longest_last else t, s * G + h)
                  for s in range(heads // G) for t in range(tiles) for h in range(G)]
        assert [tuple(r) for r in out.tolist()] == expect, f"G = {G}"


def test_every_kernel_starts_its_longest_tiles_first():
    """The start order changes no output, so no output test sees a kernel that takes its tiles in the
    wrong order, or a Gluon _program_tile that differs from the Triton one, which
    test_programs_start_longest_tile_first_in_sections records. So: the Gluon twin has the Triton
    body (gl for tl), and each kernel asks for its own order, query tiles reversed under a causal mask
    (their last tile sees the most keys), key tiles as they come (their first sees the most queries)."""
    pytest.importorskip("triton.experimental.gluon")
    import attention_fp8_hopper as AH

    def source(fn):     # a JIT function's, or under the interpreter the wrapped function's
        return fn.src if hasattr(fn, "src") else inspect.getsource(fn.fn)

    def body(fn):       # the statements after the docstring
        statements = ast.parse(source(fn).replace("gl.", "tl.")).body[0].body[1:]
        return [ast.unparse(x) for x in statements]
    assert body(AH._program_tile) == body(A._program_tile)
    for fn in (A._fwd_kernel, A._bwd_dq_kernel, AH._fwd_kernel_hopper):
        assert "= _program_tile(G, CAUSAL)" in source(fn), fn
    for fn in (A._bwd_dkdv_kernel, AH._dkdv_kernel_hopper):
        assert "= _program_tile(G, False)" in source(fn), fn


def test_launch_order_is_bit_identical(monkeypatch):
    """The programs of a causal launch start in sections of G heads, longest tiles first (SECTION_BYTES).
    The order changes nothing computed: G = 1 (one head after another), G in between and G = all heads
    give the same outputs and gradients, bit for bit. A head or tile index taken wrongly from the grid
    would leave some (tile, head) unwritten or written twice, and these would differ. At this shape the
    four settings give the forward G = 1, 2, 12, 12, the dQ kernel 1, 1, 6, 12, the dK/dV kernel 1, 1,
    2, 4 (of 12 query heads and 4 kv heads). Non-causal launches keep G = 1 at every setting (their
    programs are equally long), so the other tests cover their one order."""
    B, H, H_kv, N, D = 2, 6, 2, 200, 64
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=37)
    gluon_at_every_size(monkeypatch)
    results = {}
    for least, section in ((1, 0), (1, 65536), (1, 393216), (A.MIN_SECTION, 2**62)):
        monkeypatch.setattr(A, "MIN_SECTION", least)
        monkeypatch.setattr(A, "SECTION_BYTES", section)
        assert A._grid(4, B * H, 1, causal=False) == (1, (4, B * H)), "a non-causal launch took sections of heads"
        for arm in ("matched", "stale"):
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            o = attention(qg, kg, vg, causal=True, delta=arm)
            o.backward(do)
            results.setdefault(arm, []).append((o, qg.grad, kg.grad, vg.grad))
    for arm, runs in results.items():
        for run in runs[1:]:
            for name, x, y in zip(("o", "dq", "dk", "dv"), runs[0], run):
                assert torch.equal(x, y), f"{arm}: {name} depends on the launch order"


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
def test_gpu_halves_choose_the_dkdv_kernel_by_the_whole_call(monkeypatch):
    """HOPPER_BACKWARD_MIN_SCORES counts the scores of the whole call: a call over the threshold runs
    the Gluon dK/dV kernel in both halves even where each half is under it (the model's training
    shape at T = 1024 ran 1.14x slower while the halves were counted apart), and a call under it runs
    the Triton kernel. dkdv_calls counts the Gluon launches (the real kernel still runs)."""
    import attention_fp8_hopper as AH
    B, H, H_kv, N, D = 2, 4, 2, 1000, 64
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=57)
    sm_scale = 1.0 / math.sqrt(D)
    o, lse = A._forward(q, k, v, True, sm_scale)
    dkdv_calls = []
    real_dkdv = AH.dkdv
    monkeypatch.setattr(AH, "dkdv", lambda *args, **kw: dkdv_calls.append(1) or real_dkdv(*args, **kw))
    monkeypatch.setattr(A, "HOPPER_BACKWARD", (D,))
    scores = B * H * N * N
    for threshold, gluon_calls in ((scores // 2 + 1, 2), (scores + 1, 0)):     # over each half / over the call
        monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", threshold)
        dkdv_calls.clear()
        halves = A._backward(do, q, k, v, None, lse, True, sm_scale, "matched", pieces=2)
        assert len(dkdv_calls) == gluon_calls, f"threshold {threshold}: {len(dkdv_calls)} Gluon dK/dV launches"
        whole = A._backward(do, q, k, v, None, lse, True, sm_scale, "matched", pieces=1)
        for name, x, y in zip(("dq", "dk", "dv"), whole, halves):
            assert torch.equal(x, y), f"threshold {threshold}: {name} from two halves differs from one pass"


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
def test_gpu_compiled_calls_take_the_gluon_kernels(monkeypatch):
    """Under torch.compile (the custom ops) the Gluon forward and dK/dV kernel run at every size on
    Hopper (COMPILED_MIN_SCORES), while eager calls of the same size, under HOPPER_*_MIN_SCORES, run
    the Triton ones. The counters wrap the Gluon entry points (the real kernels still run)."""
    import attention_fp8_hopper as AH
    B, H, N, D = 2, 4, 300, 128          # 2^19.5 scores, far under the eager threshold
    monkeypatch.setattr(A, "HOPPER_FORWARD", A.HEAD_DIMS)
    monkeypatch.setattr(A, "HOPPER_BACKWARD", A.HEAD_DIMS)
    monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", 2**29)     # the defaults, whatever FP8_GLUON_EVERYWHERE says
    monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", 2**29)
    calls = []
    for name in ("forward", "dkdv"):
        real = getattr(AH, name)
        monkeypatch.setattr(AH, name, lambda *args, real=real, name=name, **kw: calls.append(name) or real(*args, **kw))
    q, k, v, do = make_inputs(B, H, H, N, D, seed=58)
    sm_scale = 1.0 / math.sqrt(D)
    _, lse = A._fwd_op(q, k, v, True, sm_scale, "matched")
    A._bwd_op(do, q, k, v, None, lse, True, sm_scale, "matched")
    assert calls == ["forward", "dkdv"], f"the custom ops launched the Gluon entry points {calls}, not both once"
    calls.clear()
    _, lse = A._forward(q, k, v, True, sm_scale)
    A._backward(do, q, k, v, None, lse, True, sm_scale, "matched")
    assert calls == [], f"an eager call under the threshold launched the Gluon entry points {calls}"


def test_backward_splits_only_big_problems():
    """SPLIT_BYTES decides: one pass for small problems (launch-bound), halves for big ones."""
    meta = lambda B, H, N, D: torch.empty(B, H, N, D, device="meta")
    assert len(A._halves(meta(4, 16, 2048, 128), meta(4, 16, 2048, 128), None)) == 0     # 112 MiB of copies
    assert len(A._halves(meta(4, 16, 4096, 128), meta(4, 16, 4096, 128), None)) == 2     # 224 MiB
    assert len(A._halves(meta(2, 16, 4096, 128), meta(2, 2, 4096, 128), None)) == 0      # GQA: 70 MiB
    assert len(A._halves(meta(4, 16, 4096, 128), meta(4, 2, 4096, 128), None)) == 2      # GQA: 140 MiB
    assert len(A._halves(meta(6, 16, 2048, 128), meta(6, 2, 2048, 128), None)) == 0      # GQA: 105 MiB (168 if
    # K, K^T and V were counted at q's heads)
    assert len(A._halves(meta(1, 1, 2**20, 128), meta(1, 1, 2**20, 128), None)) == 0     # nothing to split


@pytest.mark.parametrize("gluon", [False, pytest.param(True, marks=pytest.mark.skipif(not HOPPER, reason="needs sm_90"))],
                         ids=["triton", "gluon"])
def test_outputs_are_laid_out_as_the_inputs(gluon, monkeypatch):
    """O, dQ, dK and dV come back in the memory layout of q, k and v, as SDPA's do: the GPT passes
    (B, T, H, D) tensors seen as (B, H, T, D), and an O laid out so goes back to (B, T, H * D)
    without a copy. The layout does not change a value. A q whose D is not its unit stride gets a
    contiguous O (the kernels write D with stride 1). gluon=True: the Gluon forward and dK/dV kernel."""
    D = 64
    monkeypatch.setattr(A, "HOPPER_FORWARD", (D,) if gluon else ())     # whatever FP8_GLUON_EVERYWHERE says
    monkeypatch.setattr(A, "HOPPER_BACKWARD", (D,) if gluon else ())
    monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", 0)
    monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", 0)
    B, H, H_kv, N = 2, 4, 2, 200 if ON_GPU else 40
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=59)
    sm_scale = 1.0 / math.sqrt(D)
    bthd = lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)     # (B, T, H, D) memory
    o, lse = A._forward(q, k, v, True, sm_scale)
    grads = A._backward(do, q, k, v, None, lse, True, sm_scale, "matched")
    o_t, lse_t = A._forward(bthd(q), bthd(k), bthd(v), True, sm_scale)
    grads_t = A._backward(bthd(do), bthd(q), bthd(k), bthd(v), None, lse_t, True, sm_scale, "matched")
    assert o_t.stride() == bthd(q).stride(), f"O strides {o_t.stride()}, q's {bthd(q).stride()}"
    for name, x, like in zip(("dq", "dk", "dv"), grads_t, (q, k, v)):
        assert x.stride() == bthd(like).stride(), f"{name} strides {x.stride()}, its input's {bthd(like).stride()}"
    assert torch.equal(o_t, o) and torch.equal(lse_t, lse)
    for name, x, y in zip(("dq", "dk", "dv"), grads_t, grads):
        assert torch.equal(x, y), f"{name} differs with the inputs laid out as (B, T, H, D)"
    # v laid out otherwise than k: the kernels write dV as dK, and _backward hands it back as v is
    grads_v = A._backward(do, q, k, bthd(v), None, lse, True, sm_scale, "matched")
    assert grads_v[2].stride() == bthd(v).stride(), f"dv strides {grads_v[2].stride()}, v's {bthd(v).stride()}"
    assert grads_v[1].stride() == k.stride() and all(torch.equal(x, y) for x, y in zip(grads_v, grads))
    q_dn = q.transpose(-1, -2).contiguous().transpose(-1, -2)      # D is the slowest dimension
    o_dn, _ = A._forward(q_dn, k, v, True, sm_scale)
    assert o_dn.is_contiguous() and torch.equal(o_dn, o)


@pytest.mark.skipif(not ON_GPU or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs with FP8 tensor cores")
def test_gpu_tensors_on_another_gpu_than_the_current_one():
    """Triton launches on the current device: a call whose tensors live on cuda:1 while cuda:0 is
    current must still run there (attention_fp8._launch switches) and give what it gives with cuda:1 current."""
    q, k, v, do = make_inputs(2, 4, 2, 300, 64, seed=61)
    q, k, v, do = (x.to("cuda:1") for x in (q, k, v, do))
    with torch.cuda.device(0):
        away = run_kernel(q, k, v, do, True)
        stats_away = A.delta_stats(q, k, v, do)
    with torch.cuda.device(1):
        home = run_kernel(q, k, v, do, True)
        stats_home = A.delta_stats(q, k, v, do)
    for name in home:
        assert away[name].device == q.device and torch.equal(away[name], home[name]), name
    assert stats_away == stats_home


def test_matched_backward_does_not_keep_the_output():
    """Only the stale delta reads O; the matched arm must not hold it until the backward."""
    q, k, v, do = make_inputs(1, 2, 2, 16, 64, seed=37)
    for arm, kept in (("matched", False), ("stale", True)):
        qg = q.detach().clone().requires_grad_()
        o = attention(qg, k, v, delta=arm)
        saved = [t for t in o.grad_fn.saved_tensors if t is not None]
        assert any(t.data_ptr() == o.data_ptr() for t in saved) == kept, f"{arm}: O kept = {not kept}"
        o.backward(do)
        assert torch.isfinite(qg.grad).all()


def test_double_backward_raises():
    """The backward is made of FP8 kernels, not of differentiable ops: gradients of it (create_graph=True,
    e.g. a gradient penalty) must fail loudly. Left alone, autograd treats dQ as a constant, and a loss
    plus a penalty on dQ backpropagates the loss alone, silently. (Under torch.compile AOTAutograd
    refuses double backward itself.)"""
    q, k, v, do = make_inputs(1, 1, 1, 64, 64, seed=41)
    for compiled in (False, True):
        qg = q.detach().clone().requires_grad_()
        f = (lambda q: attention(q, k, v))
        if compiled:
            f = torch.compile(f, fullgraph=True, backend="aot_eager")
        o = f(qg)
        with pytest.raises(RuntimeError, match="double backward"):
            (dq,) = torch.autograd.grad(o, qg, do, create_graph=True)
            ((o.float() * do.float()).sum() + dq.float().pow(2).sum()).backward()


ALT_TILINGS = [   # (query tile, key tile) = (64, 128), (128, 64), (32, 64), (64, 128)
    {"fwd": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2),
     "dq": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2),
     "dkdv": dict(BLOCK_N=128, BLOCK_M=64, num_warps=4, num_stages=2)},
    {"fwd": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
     "dq": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
     "dkdv": dict(BLOCK_N=64, BLOCK_M=128, num_warps=8, num_stages=2)},
    {"fwd": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),      # dQ rows = 4 query tiles
     "dq": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
     "dkdv": dict(BLOCK_N=64, BLOCK_M=32, num_warps=4, num_stages=2)},
    {"fwd": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),      # blocks inside the scale tiles:
     "dq": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),       # two fwd/dq key blocks per key tile,
     "dkdv": dict(BLOCK_N=128, BLOCK_M=32, num_warps=4, num_stages=2)},   # two dK/dV query blocks per query tile
]


def test_inconsistent_tiling_is_refused(monkeypatch):
    """Scales are per tile, so a kernel's block must lie inside one scale tile; a sweep that breaks
    this must get an error, not silently wrong scales."""
    good = {k: dict(v) for k, v in A.CONFIGS[64].items()}     # each case breaks one rule of this tiling
    A.tiles(64)
    for kernel, block, value in (("dkdv", "BLOCK_M", 2 * good["fwd"]["BLOCK_M"]),   # spans 2 query tiles
                                 ("dq", "BLOCK_N", 96),                             # not a power of two
                                 ("fwd", "BLOCK_N", 8),                             # below wgmma's 16
                                 # dQ blocks of 32 write delta for rows the dK/dV kernel's last block of 64
                                 # reads past them: dK NaN where the allocator left NaN there
                                 ("dq", "BLOCK_M", good["dkdv"]["BLOCK_M"] // 2),
                                 ("dq", "BLOCK_N", 16),                             # dS^ permuted by 32 columns
                                 # query tiles of 32 under dK/dV blocks of 64 (dQ's 64 still a multiple):
                                 # each block would read one Q scale for two tiles (dK 0.18-0.33 off)
                                 ("fwd", "BLOCK_M", good["dkdv"]["BLOCK_M"] // 2),
                                 # past the padding of 128 rows: the FP8 copies' last tile goes unwritten
                                 # (NaN outputs at N = 300)
                                 ("fwd", "BLOCK_N", 2 * A.PAD)):
        bad = {k: dict(v) for k, v in good.items()}
        bad[kernel][block] = value
        monkeypatch.setitem(A.CONFIGS, 64, bad)
        with pytest.raises(ValueError, match="powers of two.*must divide the query tile"):
            A.tiles(64)


def test_gluon_kernels_run_only_where_the_scale_tiles_fit_them(monkeypatch):
    """On Hopper the Gluon forward reads one K and V scale per 128 keys and one Q scale per 64 queries, and
    its dK/dV kernel reads delta for whole blocks of 64 queries. A swept tiling whose scale tiles are other
    (every Triton BLOCK_N 64: one K scale per 64 keys) must run the Triton kernels there; the Gluon forward
    took it, with the wrong scale for half its keys. (The decision alone, on any machine: _is_hopper made
    true; the Gluon module imports without a GPU.)"""
    pytest.importorskip("attention_fp8_hopper")
    monkeypatch.setattr(A, "_is_hopper", lambda device: True)
    q = torch.empty(1, 1, 64, 64, dtype=torch.bfloat16, device=DEVICE)
    for head_dims in (A.HOPPER_FORWARD, A.HOPPER_BACKWARD):
        assert A._gluon(q, head_dims, 0), "CONFIGS as shipped must run the Gluon kernels on Hopper"
    # the head dims they are asked for (HOPPER_FORWARD = () turns them off: the GPU tests that compare
    # them with the Triton kernels rely on it)
    assert not A._gluon(q, (), 0) and not A._gluon(q, (128,), 0)
    good = {k: dict(v) for k, v in A.CONFIGS[64].items()}
    for change in ({"fwd": dict(BLOCK_N=64), "dq": dict(BLOCK_N=64), "dkdv": dict(BLOCK_N=64)},   # K tile 64
                   {"fwd": dict(BLOCK_M=32), "dkdv": dict(BLOCK_M=32), "dq": dict(BLOCK_M=32)},   # Q tile 32
                   {"fwd": dict(BLOCK_M=128), "dq": dict(BLOCK_M=128)},    # Q tile 128, the Gluon forward's 64
                   {"dq": dict(BLOCK_M=32), "dkdv": dict(BLOCK_M=32)}):    # delta in blocks of 32, not 64
        bad = {k: dict(v, **change.get(k, {})) for k, v in good.items()}
        monkeypatch.setitem(A.CONFIGS, 64, bad)
        A.tiles(64)      # a tiling the Triton kernels take
        for head_dims in (A.HOPPER_FORWARD, A.HOPPER_BACKWARD):
            assert not A._gluon(q, head_dims, 0), f"{change}: the Gluon kernels ran on scale tiles not theirs"


def test_fp8_supported_by_compute_capability(monkeypatch):
    """FP8 tensor cores from compute capability 8.9 (Ada) on: 8.6 is refused, 8.9 and every later one
    taken. Only the capability is asked, so this runs anywhere."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    for cap, ok in (((8, 6), False), ((8, 9), True), ((9, 0), True), ((10, 0), True), ((12, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert A.fp8_supported("cuda") is ok, cap


def test_gluon_kernels_only_on_hopper(monkeypatch):
    """The Gluon kernels use Hopper's wgmma and TMA: sm_90 alone, not Ada and not Blackwell (10.x, 12.x)."""
    pytest.importorskip("attention_fp8_hopper")
    for cap, ok in (((8, 9), False), ((9, 0), True), ((10, 0), False), ((12, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert A._is_hopper.__wrapped__(torch.device("cuda")) is ok, cap


@pytest.mark.parametrize("tiling", range(len(ALT_TILINGS)))
@pytest.mark.parametrize("causal", [True, False])
def test_other_tilings(tiling, causal, monkeypatch):
    """The benchmark's sweep may pick other tiles (BLOCK_M < BLOCK_N, the reverse, several query
    tiles per dQ program, several blocks per scale tile): they must compute the same function
    (causal band alignment, scale tiles, padding)."""
    B, H, H_kv, N, D = 1, 2, 1, 200, 64
    monkeypatch.setitem(A.CONFIGS, D, ALT_TILINGS[tiling])
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=23)
    check_tiling(q, k, v, do, causal, run_kernel(q, k, v, do, causal))


def test_delta_stats_monitor():
    B, H, N, D = 1, 2, 200, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=29, key_offset=1.0)
    s = A.delta_stats(q, k, v, do, causal=True)
    assert s["ds_rowsum_matched"] < 1e-6 < 1e-3 < s["ds_rowsum_stale"], s
    assert s["key_grad_sum_matched"] < s["key_grad_sum_stale"], s
    assert 1e-4 < s["delta_mismatch"] < 1.0, s
    # delta_mismatch is ||delta_stale - delta_matched|| / ||delta_matched||, of the backward's own deltas
    sm_scale = 1.0 / math.sqrt(D)
    o, lse = A._forward(q, k, v, True, sm_scale)
    d = {arm: A._backward(do, q, k, v, o, lse, True, sm_scale, arm, debug=True)[3]["delta"].double()
         for arm in ("matched", "stale")}
    want = ((d["stale"] - d["matched"]).norm() / d["matched"].norm()).item()
    assert s["delta_mismatch"] == pytest.approx(want, rel=1e-5), (s["delta_mismatch"], want)

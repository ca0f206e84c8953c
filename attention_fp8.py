"""
FP8 attention with Delta-Matching, forward and backward, in Triton.

Every one of the seven attention-core matmuls runs on FP8 tensor cores (e4m3 operands, fp32
accumulation), and the backward's `delta` is computed from exactly the P and dP that form dS.

    from attention_fp8 import attention
    o = attention(q, k, v, causal=True)     # q (B, H, N, D), k and v (B, H_kv, N, D), bf16 or fp16, D 64 or 128
    o = attention(q, k, v, delta="stale")   # the ablation arm: FlashAttention's delta = rowsum(dO * O)

H_kv must divide H (grouped-query attention: each kv head serves H / H_kv query heads). Also public:
delta_stats (what the stale delta gets wrong on given inputs: the worst row's dS sum, the key-gradient
sums and the two deltas' mismatch, for the trainer's monitor), quantize (the tests build their
references from its dequantized inputs) and fp8_supported.

The math (one head, tau = softmax scale, i = query row, j = key row)
--------------------------------------------------------------------
    S = tau Q K^T (+ causal mask)    P = softmax_row(S)    O = P V        (forward, saves LSE)
    dV = P^T dO      dP = dO V^T      dS = P * (dP - delta)      dQ = tau dS K     dK = tau dS^T Q

with delta_i = sum_j P_ij dP_ij. The subtraction of delta is the softmax Jacobian: softmax is blind
to adding a constant to a row of S, so the gradient it passes back must be blind too, i.e.

    sum_j dS_ij = delta_i - delta_i * sum_j P_ij = 0.                                  (*)

FlashAttention computes delta the cheap way, delta_i = rowsum(dO_i * O_i), which equals
sum_j P_ij dP_ij only when O is exactly P V with the backward's own P, V and dO. In FP8 it is
not: the forward rounded P and V to FP8 to form O, O was stored in BF16, and the backward rounds
dO and V differently to form dP. The mismatch eps_i = delta_stale_i - delta_i breaks (*): every
row of dS then sums to -eps_i, which adds a *coherent* error -tau * eps_i * (P-weighted mean key)
to dQ_i and -tau * sum_i eps_i P_ij Q_i to dK_j (it piles onto keys that many queries attend to,
such as attention sinks). Elementwise FP8 rounding noise averages out over j; this does not.

Delta-Matching (`delta="matched"`, the default) runs a pre-pass that recomputes S, P and
dP = dO^ V^T from the very FP8 buffers and scales the main backward uses and accumulates
delta_i = sum_j P_ij dP_ij / sum_j P_ij, so (*) holds to fp32 rounding. (Dividing by
r_i = sum_j P_ij, which is 1 up to rounding, keeps (*) to fp32 rounding where the backward's P
differs from the forward's by more: on the GPU, differently tiled FP8 dots may round S apart, e.g.
the Gluon forward on Hopper against the dQ kernel.) It costs two extra FP8 matmuls per tile pair:
the backward runs 9 against 7 with `delta="stale"`, which uses rowsum(dO * O) and is otherwise
identical, the ablation arm. dV does not involve delta, so it is bit-identical between the two.

(*) is a property of dS in fp32, before dS is rounded to e4m3 for the dQ and dK dots: delta and
dS use P in fp32, and only dV's P is rounded. That rounding of dS adds elementwise noise that
averages out over j and that no choice of delta removes, so the matched arm's sum over keys of dK
(delta_stats) is small but not zero. The tests that hold the method to this, in test_attention.py:
test_invariants_matched_vs_stale (|sum_j dS_ij| / sum_j |P_ij dP_ij| under 1e-6 matched, over 1e-3
stale), test_invariant_holds_where_p_does_not_sum_to_one, test_matched_delta_equals_definition and
test_key_translation.

The seven FP8 matmuls, and where each operand's format and scale come from
------------------------------------------------------------------------------
Notation: X^ is X rounded to e4m3 after division by its block scale; the value it stands for is the
e4m3 number times the scale. K^^T is K^ transposed; X^T^ is X^T rounded, with scales of its own (the
dK/dV kernels round dS^T with a scale per key, where the dQ kernel rounds dS with one per query).
In the kernels X8 holds X^'s e4m3 bytes laid out as X is (a row per token), XT8 the token-contiguous
copy that a dot reducing over tokens reads ("Hopper's FP8 tensor cores", below), and SX the scales.
P~ is the softmax numerator before division by its row sum. The kernels work in base 2: the forward
saves LSE2 = LSE * log2(e), called lse in the code.

    forward   S  = Q^ K^^T     reads K8     Q: one fp32 scale per 64 rows (the kernel quantizes its tile);
                                            K: one per 128 rows (per batch, kv head)
              O  = P~^ V^      reads VT8    P~ = exp(S - running max) in [0, 1], times 256, e4m3;
                                            V: one scale per 128 keys (the key tile)
    backward  S  = Q^ K^^T     reads K8     from the same Q^, K^ and scales as the forward (the same S
                                            up to the rounding of differently tiled dots: r_i above)
              dP = dO^ V^^T    reads V8     dO: one scale per 64 rows
              dV = P^T^ dO^    reads DOT8   P = exp(S - LSE) times 256, e4m3 (only here is P rounded)
              dQ = dS^ K^      reads KT8    dS: e4m3, a dynamic scale per row of each tile (its amax)
              dK = dS^T^ Q^    reads QT8    (rows of dS^T, i.e. per key, in the dK kernel)
    pre-pass  S and dP again (the two extra matmuls of Delta-Matching)

The forward divides O by w = sum_j P~^_ij, the sum of the rounded weights, not by the exact row sum,
so O stays a weighted mean of V's rows after rounding (see the forward's comment).

The forward, step by step (_forward): quantize K (rows) and V (token-contiguous) in one launch ->
_fwd_kernel, which quantizes its own tile of Q. The backward (_backward): quantize Q, dO and K (both
layouts) and V (rows) -> the query-owned kernel _bwd_dq_kernel, whose first loop is the pre-pass
(delta_i, stored) and whose second forms dS and dQ -> the key-owned kernel _bwd_dkdv_kernel, which
reads that delta and forms dV and dK. So S and dP are computed three times per tile pair: pre-pass,
dQ loop, and transposed in dK/dV.

Why these choices:
- e4m3 everywhere. With block scales the scale takes care of range, so the extra mantissa bit of
  e4m3 (3 bits vs e5m2's 2) is worth more than e5m2's wider exponent, gradients included (the
  argument; e5m2 gradients were not measured here).
- Block scales. A scale is amax(tile) / 448 (448 is e4m3's largest value), so one outlier only
  coarsens its own tile (64 rows of Q or dO, 128 of K or V). Scales multiply the fp32 accumulator
  after each dot: a scale that is constant along the dot's reduction dimension factors out of the
  sum. Q, K, V, dO rows carry per-row scales (a row's scale is its tile's), which factor out of S
  and dP because those reduce over the head dimension. Where a dot reduces over tokens (P V, P^T dO,
  dS K, dS^T Q), the kernel's block lies inside one token tile of the stored operand, so its scale is
  one number per dot.
- P needs no dynamic scale: its values lie in [0, 1]. A static 256 lifts small probabilities out
  of e4m3's subnormal range (smallest normal 2^-6) so rows dominated by one key (an attention sink)
  keep their small entries; 256 * 1 = 256 < 448 never overflows.
- dS is tiny (it shrinks roughly like 1/sequence length), so it gets a dynamic scale, one per row
  of each tile: dQ = dS K reduces over keys and dK = dS^T Q over queries, so a scale per row of the
  dot's A operand factors out, and a row amax needs no reduction across warps (a tile amax would).
  "Each tile" is the kernel's block (CONFIGS: BLOCK_N keys in the dQ kernel, BLOCK_M queries in the
  dK/dV kernel), so the dS scales' granularity follows the tiling and can differ between GPUs and
  between the Triton and the Gluon dK/dV kernel.
- Hopper's FP8 tensor cores want the B operand of a dot contiguous along the reduction dimension
  ("K-major"; wgmma transposes only 16-bit operands), so a B stored otherwise would have to be
  transposed on its way in. Q K^T and dO V^T reduce over the head dimension and read Q, K, V, dO as
  stored. P V, P^T dO, dS K and dS^T Q reduce over tokens, so the quantize kernel also writes
  token-contiguous copies (VT8, DOT8, KT8, QT8).

All casts saturate (|x| > 448 -> 448), so outputs and gradients stay finite for finite inputs whose
scores sm_scale * q.k fit fp32 (a larger sm_scale, 1e37 on N(0, 1) inputs, overflows them, and the
outputs are NaN, as in any fp32 softmax). Scores of 1e5 and more (sm_scale * q.k) make the backward's recomputed P
coarse, as in any kernel that recomputes it in fp32: the base-2 score is then about 1.4e5, whose
fp32 spacing is 2^-6, so P is rounded by up to about 0.5%.
The forward saves LSE (in base 2) and recomputes P in the backward: no N x N buffer anywhere.

Layout of the code: quantize kernel -> forward kernel -> backward pre-pass + dQ kernel ->
dK/dV kernel -> Python launchers -> torch.library custom op (for torch.compile) and a plain
autograd.Function (for eager mode, less host time) -> `attention()`, the public entry point,
which checks its inputs. On Hopper, for eager calls from 2^29 scores and for every call under
torch.compile, the forward and the dK/dV kernel (head dims in HOPPER_FORWARD, HOPPER_BACKWARD) run
the Gluon kernels of attention_fp8_hopper.py instead: the same FP8 operands and scales, scheduled
with Hopper's asynchronous wgmma and TMA.

To change the method (say, dS's scaling or the pre-pass), note that a compiled model on Hopper runs
those Gluon kernels for the forward and dK/dV; only the pre-pass and dQ are this file's everywhere.
Set HOPPER_FORWARD = HOPPER_BACKWARD = () to run this file's kernels alone while experimenting, and
change both files before comparing. dS is quantized in _dq_inner, _dkdv_inner and the Gluon dK/dV
kernel. P's static 256 is the "- (m_new - 8.0)" in the exp2 and the "- 8.0" in the saved LSE of both
forwards (_fwd_inner and _fwd_kernel, _softmax_tile and _fwd_kernel_hopper), and the "lse - 8.0" and
"/ 256" of dV's and dK's scales in both dK/dV kernels (_dkdv_inner; _dkdv_tile and the final dV).
"""

import functools
import math
import numbers
import warnings
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# In the kernels, 448.0 is e4m3's largest finite value (a scale is amax / 448) and 256.0 is P's static scale.
FP8 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634
PAD = 128           # token buffers are padded to a multiple of the largest tile
HEAD_DIMS = (64, 128)

# Tiles and launch settings per head dim, read at every call (the benchmark sweeps them).
# Every scale covers one tile of rows, and a kernel's block must lie inside one scale tile wherever
# the scale should come out of a dot as one number (see the docstring). There are two scale tiles:
#   the query tile (Q, Q^T, dO, dO^T) = fwd BLOCK_M: the forward quantizes Q in the kernel, and the
#       backward quantizes Q with the same tile, so both see the same Q^ and K^ and compute the same S;
#       the dK/dV kernel's BLOCK_M must divide it (its Q^T and dO^T scales are one number per block);
#   the key tile (K, K^T, V, V^T) = the largest BLOCK_N of the three kernels; every BLOCK_N divides it
#       (block sizes are powers of two). On Hopper the Gluon kernels (attention_fp8_hopper.py) read one K
#       and V scale per 128 keys (forward) or 64 (dK/dV) and one Q scale per 64 queries: a tiling whose
#       scale tiles do not fit theirs runs the Triton kernels there (_gluon).
# The dQ kernel reads per-row scales of Q and dO, so its BLOCK_M is free of the scale tiles; but it writes
# delta for the rows of its own blocks, and each dK/dV kernel reads delta for every row of its last
# query block, so the dQ kernel's BLOCK_M must be a multiple of theirs (32 and 64 on Hopper). Its
# BLOCK_N is at least 32: dS^ is permuted in columns of 32 (_permuted_cols).
# SCALES_AHEAD (dQ kernel): the pre-pass loads K's and V's tile scales a tile ahead, issued after each
# tile's S dot, instead of before the dots: faster at D = 64, slower at D = 128 (SPEED.md, step 12).
# dq[64]'s maxnreg (a compile option the sweep does not vary) caps registers at 168, so that three
# programs fit on an SM.
CONFIGS = {   # the fastest of bench_attention.py --sweep on the H200 (2x16x8192xD, causal), 2026-12-02
    64: {"fwd": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
         "dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, SCALES_AHEAD=True, maxnreg=168),
         "dkdv": dict(BLOCK_N=64, BLOCK_M=64, num_warps=4, num_stages=3)},
    128: {"fwd": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
          "dq": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, SCALES_AHEAD=False),
          "dkdv": dict(BLOCK_N=128, BLOCK_M=32, num_warps=8, num_stages=3)},
}
# Shared memory. Hopper and B200 let a block ask for 227 KiB; Ada (sm_89) and consumer Blackwell
# (sm_120) for 99 KiB. The dQ kernel at D = 128 above, pipelining K^, V^ and K^T tiles of 128 keys,
# needs 128 KiB of shared memory compiled for sm_89 with this tiling, which those GPUs cannot
# launch (Triton: "out of resource: shared memory"). There it steps over 64 keys (80 KiB); 64
# divides the key tile, so the FP8 copies and their scales are the same. test_kernels_fit_shared_memory
# compiles every kernel, as each GPU would tile it, for sm_89, sm_100 and sm_120 and holds it to that
# GPU's limit. No such GPU has run them, nor timed this tiling.
HOPPER_SHARED_BYTES = 232448    # shared memory per block on sm_90 and sm_100
SMALL_SHARED_CONFIGS = {128: {"dq": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, SCALES_AHEAD=False)}}


def config(D, kernel, shared_bytes=HOPPER_SHARED_BYTES):
    """The tiling of `kernel` ("fwd", "dq" or "dkdv") at head dim D on a GPU that gives a block
    shared_bytes of shared memory: CONFIGS, or SMALL_SHARED_CONFIGS where that is less than Hopper's."""
    if shared_bytes < HOPPER_SHARED_BYTES:
        return SMALL_SHARED_CONFIGS.get(D, {}).get(kernel, CONFIGS[D][kernel])
    return CONFIGS[D][kernel]


def tiles(D, shared_bytes=HOPPER_SHARED_BYTES):
    """Rows per scale of Q, K, V and dO for head dim D (see CONFIGS), after checking the tilings."""
    fwd, dq, dkdv = (config(D, k, shared_bytes) for k in ("fwd", "dq", "dkdv"))
    blocks = [c[b] for c in (fwd, dq, dkdv) for b in ("BLOCK_M", "BLOCK_N")]
    q_tile = fwd["BLOCK_M"]
    k_tile = max(fwd["BLOCK_N"], dq["BLOCK_N"], dkdv["BLOCK_N"])
    if not (all(16 <= b <= PAD and b & (b - 1) == 0 for b in blocks) and q_tile % dkdv["BLOCK_M"] == 0
            and dq["BLOCK_M"] % dkdv["BLOCK_M"] == 0 and dq["BLOCK_N"] >= 32):
        raise ValueError(f"CONFIGS[{D}] = {dict(fwd=fwd, dq=dq, dkdv=dkdv)}: block sizes must be powers of two in "
                         f"[16, {PAD}]; the dK/dV kernel's BLOCK_M must divide the query tile (the forward's "
                         "BLOCK_M) and the dQ kernel's BLOCK_M (whose blocks write the delta it reads); the dQ "
                         "kernel's BLOCK_N must be at least 32")
    return {"q": q_tile, "k": k_tile, "v": k_tile, "do": q_tile}


# ---------------------------------------------------------------------------------------------
# Quantize: X (B, H, N, D), any strides -> X^ (B*H, N_pad, D) and/or X^T (B*H, D, N_pad) in e4m3,
# scale (B*H, N_pad) fp32, with X ~= X^ * scale[row]. One scale per TILE rows: amax(tile) / 448.
# Rows >= N are written as zeros, so kernels can read whole tiles without masks. One launch does
# two tensors of the same shape (grid axis 2 picks X or Y): launches cost more than these tiles.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _permuted_cols(x):
    """x (rows, 32 c columns) with the columns of each 32 in the order pi: position k (bits k4..k0)
    holds column c with c4 = k4, c3 = k1, c2 = k3, c1 = k2, c0 = k0. An FP8 tile formed in a
    wgmma accumulator (P~ in the Gluon forward, dS in the dQ kernel) holds, in each thread, the
    columns 8 u1 + 2 t + u0 (+16) of each 32, and the A operand of the next wgmma wants k = 4 t + u
    (+16); permuted by pi, the registers it holds are the operand's, so no shuffles are needed. The
    other operand (V^T, K^T) is stored with its tokens in the same order, and the dot sums over
    them in any order alike (attention_fp8_hopper._p_operand). The Gluon dK/dV kernel does the same
    with P^T and dS^T against Q^T and dO^T."""
    x = tl.reshape(x, [x.shape[0], x.shape[1] // 32, 2, 2, 2, 2, 2])    # (row, 32s, c4, c3, c2, c1, c0)
    return tl.reshape(tl.permute(x, (0, 1, 2, 4, 5, 3, 6)), [x.shape[0], x.shape[1] * 32])


@triton.jit
def _quantize_tile(X, stride_b, stride_h, stride_n, stride_d, X8, X8T, SCALE, N, N_pad, H,
                   TILE: tl.constexpr, D: tl.constexpr, WRITE_ROWS: tl.constexpr, WRITE_COLS: tl.constexpr,
                   PERMUTE_COLS: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rows = pid_t * TILE + tl.arange(0, TILE)
    cols = tl.arange(0, D)
    x_in = tl.load(X + b * stride_b + h * stride_h + rows[:, None] * stride_n + cols[None, :] * stride_d,
                   mask=rows[:, None] < N, other=0.0)
    x = x_in.to(tl.float32)
    # A tile whose amax is below 1e-30 (all zero, say: padding, or dO where no loss reaches) is
    # flushed to zero with scale 0. So a zero scale means a zero tile, and every other scale lies
    # within fp32's range of any other: the Gluon kernels carry accumulators in the units of a
    # tile's scale and switch units by the ratio of two scales (attention_fp8_hopper.py).
    amax = tl.max(tl.abs(x))
    live = amax >= 1e-30
    c = tl.where(live, 448.0 / tl.maximum(amax, 1e-30), 0.0)
    x8 = (x * c).to(tl.float8e4nv)
    if WRITE_ROWS:
        tl.store(X8 + pid_bh * N_pad * D + rows[:, None] * D + cols[None, :], x8)
    if WRITE_COLS:
        # Transposed in the input's own type, then quantized: the same products as x8's, so the
        # same bytes. Transposing x8 itself is the obvious way, but with Triton 3.8 (its bundled
        # ptxas 12.9; triton-lang/triton#11111) that 8-bit transpose comes out scrambled on the H200
        # when the tile also writes its rows (the backward's Q, dO and K), and dQ with it
        # (results/triton38_h200.txt).
        x8t = (tl.trans(x_in).to(tl.float32) * c).to(tl.float8e4nv)
        if PERMUTE_COLS:    # each 32 tokens in the order the dot operands want (_permuted_cols)
            x8t = _permuted_cols(x8t)
        tl.store(X8T + pid_bh * D * N_pad + cols[:, None] * N_pad + rows[None, :], x8t)
    tl.store(SCALE + pid_bh * N_pad + rows, tl.zeros([TILE], tl.float32) + tl.where(live, amax / 448.0, 0.0))


@triton.jit
def _quantize_kernel(X, sxb, sxh, sxn, sxd, X8, X8T, SX, Y, syb, syh, syn, syd, Y8, Y8T, SY, N, N_pad, H,
                     TILE: tl.constexpr, D: tl.constexpr, X_ROWS: tl.constexpr, X_COLS: tl.constexpr,
                     Y_ROWS: tl.constexpr, Y_COLS: tl.constexpr, PERMUTE_COLS: tl.constexpr = False):
    if tl.program_id(2) == 0:
        _quantize_tile(X, sxb, sxh, sxn, sxd, X8, X8T, SX, N, N_pad, H, TILE, D, X_ROWS, X_COLS, PERMUTE_COLS)
    else:
        _quantize_tile(Y, syb, syh, syn, syd, Y8, Y8T, SY, N, N_pad, H, TILE, D, Y_ROWS, Y_COLS, PERMUTE_COLS)


# ---------------------------------------------------------------------------------------------
# Forward: O_i = sum_j softmax(S)_ij V_j with S = tau Q^ K^^T, online softmax in base 2.
#   qk = Q^ . K^ (the raw FP8 dot); f = Q's row scale * K's tile scale * tau * log2(e)
#   m = running row max of qk * f; p~ = exp2(qk * f - m + 8) = 256 exp2(s - m), so P~^ = e4m3(p~)
#   l = running sum of p~; LSE2 = m + log2(l) - 8 (the backward's P = exp2(qk * f - LSE2) sums to 1)
#   w = running sum of P~^, the rounded weights;  acc += (P~^ V^) * V's tile scale;  O = acc / w
# (the 256 = 2^8 lifts small probabilities out of e4m3's subnormals; it cancels in acc / w)
# O is divided by w, not l, so that it is a weighted mean of V^'s rows with the very weights that
# multiplied them. Near-uniform rows put every p~ just below 256, where they all round alike (to 240
# or to 256), and acc / l would come out scaled by w / l, biased by about half a percent, where acc / w
# is off only by BF16 rounding (test_output_is_a_weighted_mean_of_v).
# Each tile's P~^ V^ is a fresh dot added to acc in fp32: the FP8 tensor cores keep only about 14
# bits of a running sum, too few for one that grows over thousands of keys (attention_fp8_hopper).
# ---------------------------------------------------------------------------------------------
@triton.jit
def _qk_tile(q, K8, start_n, offs_m, N, D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
             MASK: tl.constexpr):
    """The raw FP8 dot Q^ K^^T for one key tile, -inf where masked. The forward and the dQ kernel
    both form S through here, by the same code (on tiles of their own shapes)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kT = tl.load(K8 + offs_n[None, :] * D + offs_d[:, None])                     # (D, BLOCK_N)
    qk = tl.dot(q, kT)
    if MASK:
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk, float("-inf"))
    return qk


@triton.jit
def _fwd_inner(acc, l_i, w_i, m_i, q, qs, K8, SK, VT8, SVT, offs_m, lo, hi, N, N_pad,
               D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr):
    offs_d = tl.arange(0, D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        qk = _qk_tile(q, K8, start_n, offs_m, N, D, BLOCK_N, CAUSAL, MASK)      # (BLOCK_M, BLOCK_N)
        # A zero tile of Q or K has scale 0 (_quantize_tile), which would make f = 0 and a masked
        # -inf * f = NaN. Its S is zero whatever f is, so f is floored instead; every kernel that
        # forms S * f does the same (a zero query tile made every gradient NaN before).
        f = tl.maximum(qs * tl.load(SK + start_n), 1e-30)                         # (BLOCK_M,)
        m_new = tl.maximum(m_i, tl.max(qk, 1) * f)      # f > 0, so max(qk) * f = max(qk * f)
        p = tl.math.exp2(qk * f[:, None] - (m_new - 8.0)[:, None])               # one FMA, then exp2
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        p8 = p.to(tl.float8e4nv)
        v = tl.load(VT8 + offs_d[None, :] * N_pad + offs_n[:, None])             # (BLOCK_N, D), token-contiguous
        acc = acc * alpha[:, None] + tl.dot(p8, v) * tl.load(SVT + start_n)
        w_i = w_i * alpha + tl.sum(p8.to(tl.float32), 1)      # the weights as they multiplied V
        m_i = m_new
    return acc, l_i, w_i, m_i


@triton.jit
def _fwd_kernel(Q, stride_qb, stride_qh, stride_qn, stride_qd, K8, SK, VT8, SVT, O, LSE, qk_scale, N, N_pad, H, H_KV,
                stride_ob, stride_oh, stride_on,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                G: tl.constexpr):
    # Causal: the last query tiles see the most keys; start them first so the short ones fill the tail.
    pid_m, pid_bh = _program_tile(G, CAUSAL)
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * H_KV + h // (H // H_KV)        # grouped-query attention: H // H_KV query heads share a KV head
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < N

    # Q^ is made here, exactly as _quantize_tile makes it (BLOCK_M is the query tile).
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(q))
    live = amax >= 1e-30
    q = (q * tl.where(live, 448.0 / tl.maximum(amax, 1e-30), 0.0)).to(tl.float8e4nv)
    qs = tl.zeros([BLOCK_M], tl.float32) + tl.where(live, amax / 448.0, 0.0) * qk_scale   # Q's scale times tau * log2(e)
    K8 += bh_kv * N_pad * D
    SK += bh_kv * N_pad
    VT8 += bh_kv * D * N_pad
    SVT += bh_kv * N_pad

    m_i = tl.zeros([BLOCK_M], tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], tl.float32)
    w_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # Key tiles that need no mask first, then the ones that do (the diagonal, or the last partial
    # tile). Every row has an unmasked key in the first tile it sees, so m_i is finite from then on.
    if CAUSAL:
        n_free = (start_m // BLOCK_N) * BLOCK_N      # key blocks start at multiples of BLOCK_N
        acc, l_i, w_i, m_i = _fwd_inner(acc, l_i, w_i, m_i, q, qs, K8, SK, VT8, SVT, offs_m, 0, n_free,
                                       N, N_pad, D, BLOCK_N, CAUSAL, False)
        acc, l_i, w_i, m_i = _fwd_inner(acc, l_i, w_i, m_i, q, qs, K8, SK, VT8, SVT, offs_m, n_free,
                                       tl.minimum(start_m + BLOCK_M, N_pad), N, N_pad, D, BLOCK_N, CAUSAL, True)
    else:
        n_full = (N // BLOCK_N) * BLOCK_N
        acc, l_i, w_i, m_i = _fwd_inner(acc, l_i, w_i, m_i, q, qs, K8, SK, VT8, SVT, offs_m, 0, n_full,
                                       N, N_pad, D, BLOCK_N, CAUSAL, False)
        acc, l_i, w_i, m_i = _fwd_inner(acc, l_i, w_i, m_i, q, qs, K8, SK, VT8, SVT, offs_m, n_full, N_pad,
                                       N, N_pad, D, BLOCK_N, CAUSAL, True)
    o = acc / w_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + pid_bh * N + offs_m, m_i + tl.math.log2(l_i) - 8.0, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# Backward, query-owned: the Delta-Matching pre-pass, then dQ.
# For a tile of query rows i, over key tiles j:
#   P_ij = exp2(qk_ij * f_i - LSE2_i) (S recomputed from Q^, K^ exactly as in the forward)
#   dP_ij = (dO^_i . V^_j) * c_i, c_i = dO's row scale * V's tile scale
#   pre-pass:  delta_i = sum_j P_ij dP_ij / sum_j P_ij                  (MATCHED)
#              delta_i = sum_d dO_id O_id, from the BF16 dO and O       (stale)
#   main loop: dS_ij = P_ij (dP_ij - delta_i);  dQ_i = tau sum_j dS^_ij K^_j
# ---------------------------------------------------------------------------------------------
@triton.jit
def _p_tile(q, qs, lse, K8, sk, start_n, offs_m, N,
            D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr):
    """P from S = Q^ K^^T and K's tile scale sk."""
    qk = _qk_tile(q, K8, start_n, offs_m, N, D, BLOCK_N, CAUSAL, MASK)
    return tl.math.exp2(qk * tl.maximum(qs * sk, 1e-30)[:, None] - lse[:, None])     # f floored: see _fwd_inner


@triton.jit
def _dp_tile(do, V8, start_n, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The raw dot dO^ V^^T (dP = raw * dO's row scale * V's tile scale)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    vT = tl.load(V8 + offs_n[None, :] * D + offs_d[:, None])                     # (D, BLOCK_N)
    return tl.dot(do, vT)


@triton.jit
def _delta_inner(pdp, r, q, qs, do, sdo, lse, K8, SK, V8, SV, offs_m, lo, hi, N,
                 D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
                 SCALES_AHEAD: tl.constexpr):
    # Delta-Matching: over this row tile's key tiles, pdp_i += sum_j P_ij dP_ij and r_i += sum_j P_ij,
    # with P and dP from the same e4m3 operands and scales as _dq_inner's; the caller stores
    # delta_i = pdp_i / r_i.
    # Triton's pipeliner leaves the loads of K's and V's tile scales synchronous in this loop (not in
    # _dq_inner's). Loaded where they are used, each waited out a trip to global memory after a dot,
    # on every tile. So they come before the dots, or a tile ahead, issued after the S dot
    # (SCALES_AHEAD), whichever ran faster at the head dim (CONFIGS; SPEED.md, step 12).
    if SCALES_AHEAD:
        sk_next = tl.load(SK + lo, mask=lo < hi, other=0.0)
        sv_next = tl.load(SV + lo, mask=lo < hi, other=0.0)
    for start_n in range(lo, hi, BLOCK_N):
        if SCALES_AHEAD:
            sk = sk_next
            sv = sv_next
        else:
            sk = tl.load(SK + start_n)
            sv = tl.load(SV + start_n)
        p = _p_tile(q, qs, lse, K8, sk, start_n, offs_m, N, D, BLOCK_N, CAUSAL, MASK)
        if SCALES_AHEAD:
            sk_next = tl.load(SK + start_n + BLOCK_N, mask=start_n + BLOCK_N < hi, other=0.0)
            sv_next = tl.load(SV + start_n + BLOCK_N, mask=start_n + BLOCK_N < hi, other=0.0)
        dp_raw = _dp_tile(do, V8, start_n, D, BLOCK_N)
        c = sdo * sv
        pdp += tl.sum(p * dp_raw, 1) * c       # c is constant along the row: scale the row sum once
        r += tl.sum(p, 1)
    return pdp, r


@triton.jit
def _dq_inner(dq, rowsum, rowabs, rowp, delta, q, qs, do, sdo, lse, K8, SK, KT8, V8, SV, offs_m, lo, hi, N, N_pad,
              D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
              DEBUG: tl.constexpr):
    offs_d = tl.arange(0, D)
    for start_n in range(lo, hi, BLOCK_N):
        sk = tl.load(SK + start_n)      # here the pipeliner loads the scales ahead itself
        sv = tl.load(SV + start_n)
        p = _p_tile(q, qs, lse, K8, sk, start_n, offs_m, N, D, BLOCK_N, CAUSAL, MASK)
        dp_raw = _dp_tile(do, V8, start_n, D, BLOCK_N)
        c = sdo * sv
        ds = p * (dp_raw * c[:, None] - delta[:, None])
        if DEBUG:   # the invariant (*) and its natural size, for tests
            rowsum += tl.sum(ds, 1)
            rowabs += tl.sum(tl.abs(p * (dp_raw * c[:, None])), 1)
            rowp += tl.sum(p, 1)       # 1 if the forward's LSE fits the backward's S
        # one dynamic scale per row of the tile: dQ reduces over keys, so it factors out of the dot
        amax = tl.maximum(tl.max(tl.abs(ds), 1), 1e-30)
        ds8 = _permuted_cols((ds * (448.0 / amax)[:, None]).to(tl.float8e4nv))    # K^T's keys are permuted alike
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(KT8 + offs_d[None, :] * N_pad + offs_n[:, None])             # (BLOCK_N, D), token-contiguous
        dq += tl.dot(ds8, k) * (amax * (sk / 448.0))[:, None]
    return dq, rowsum, rowabs, rowp


@triton.jit
def _bwd_dq_kernel(Q8, SQ, K8, SK, KT8, V8, SV, DO8, SDO, DO, O, LSE, stride_lb, DELTA, DQ, ROWSUM, sm_scale, qk_scale,
                   N, N_pad, H, H_KV, stride_dob, stride_doh, stride_don, stride_dod, stride_ob, stride_oh, stride_on,
                   stride_dqb, stride_dqh, stride_dqn,
                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                   MATCHED: tl.constexpr, DEBUG: tl.constexpr, G: tl.constexpr, SCALES_AHEAD: tl.constexpr = False):
    pid_m, pid_bh = _program_tile(G, CAUSAL)      # longest rows first, as in the forward
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * H_KV + h // (H // H_KV)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < N

    q = tl.load(Q8 + pid_bh * N_pad * D + offs_m[:, None] * D + offs_d[None, :])
    qs = tl.load(SQ + pid_bh * N_pad + offs_m) * qk_scale
    do = tl.load(DO8 + pid_bh * N_pad * D + offs_m[:, None] * D + offs_d[None, :])
    sdo = tl.load(SDO + pid_bh * N_pad + offs_m)
    # Padding rows get LSE = +inf, hence P = 0: they contribute nothing anywhere.
    lse = tl.load(LSE + b * stride_lb + h * N + offs_m, mask=row_ok, other=float("inf"))
    K8 += bh_kv * N_pad * D
    SK += bh_kv * N_pad
    KT8 += bh_kv * D * N_pad
    V8 += bh_kv * N_pad * D
    SV += bh_kv * N_pad

    # Key tiles [0, n_free) need no mask; [n_free, n_end) do (causal diagonal or padding).
    if CAUSAL:
        n_free = (start_m // BLOCK_N) * BLOCK_N      # key blocks start at multiples of BLOCK_N
        n_end = tl.minimum(start_m + BLOCK_M, N_pad)
    else:
        n_free = (N // BLOCK_N) * BLOCK_N
        n_end = N_pad

    if MATCHED:
        # The Delta-Matching pre-pass: the same P and dP tiles the main loop below forms dS from.
        pdp = tl.zeros([BLOCK_M], tl.float32)
        r = tl.zeros([BLOCK_M], tl.float32)
        pdp, r = _delta_inner(pdp, r, q, qs, do, sdo, lse, K8, SK, V8, SV, offs_m, 0, n_free, N,
                              D, BLOCK_N, CAUSAL, False, SCALES_AHEAD)
        pdp, r = _delta_inner(pdp, r, q, qs, do, sdo, lse, K8, SK, V8, SV, offs_m, n_free, n_end, N,
                              D, BLOCK_N, CAUSAL, True, SCALES_AHEAD)
        delta = tl.where(row_ok, pdp / tl.where(row_ok, r, 1.0), 0.0)
    else:           # FlashAttention's delta from the forward's output: stale under FP8
        do_hi = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod,
                        mask=row_ok[:, None], other=0.0).to(tl.float32)
        o_hi = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                       mask=row_ok[:, None], other=0.0).to(tl.float32)
        delta = tl.sum(do_hi * o_hi, 1)
    tl.store(DELTA + pid_bh * N_pad + offs_m, delta)     # for the dK/dV kernel

    dq = tl.zeros([BLOCK_M, D], tl.float32)
    rowsum = tl.zeros([BLOCK_M], tl.float32)
    rowabs = tl.zeros([BLOCK_M], tl.float32)
    rowp = tl.zeros([BLOCK_M], tl.float32)
    dq, rowsum, rowabs, rowp = _dq_inner(dq, rowsum, rowabs, rowp, delta, q, qs, do, sdo, lse, K8, SK, KT8, V8, SV,
                                   offs_m, 0, n_free, N, N_pad, D, BLOCK_N, CAUSAL, False, DEBUG)
    dq, rowsum, rowabs, rowp = _dq_inner(dq, rowsum, rowabs, rowp, delta, q, qs, do, sdo, lse, K8, SK, KT8, V8, SV,
                                   offs_m, n_free, n_end, N, N_pad, D, BLOCK_N, CAUSAL, True, DEBUG)
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])
    if DEBUG:
        tl.store(ROWSUM + pid_bh * N_pad * 3 + offs_m * 3, rowsum)
        tl.store(ROWSUM + pid_bh * N_pad * 3 + offs_m * 3 + 1, rowabs)
        tl.store(ROWSUM + pid_bh * N_pad * 3 + offs_m * 3 + 2, rowp)


# ---------------------------------------------------------------------------------------------
# Backward, key-owned: dK and dV for a tile of keys j, over every query tile i (and, for
# grouped-query attention, every query head that shares this KV head). Transposed orientation;
# BLOCK_N keys lie in one key tile and BLOCK_M queries in one query tile, so every scale below
# is one number:
#   256 P^T_ji = exp2(qk_ji * f - LSE2_i + 8)  (the dQ kernel's P, times 256, equal to it up to fp32
#                                               rounding: f's factors multiply in another order)
#   dV_j += sum_i (256 P_ij)^ dO^_i * dO's tile scale / 256
#   dP^T_ji = (V^_j . dO^_i) * c, c = V's tile scale * dO's tile scale;  256 dS^T_ji = 256 P_ij (dP_ij - delta_i)
#   dK_j += tau sum_i (256 dS^T_ji)^ Q^_i * (row scale / 256) * Q's tile scale, row scale = amax_j / 448
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dkdv_inner(dk, dv, k, sk_qk, v, sv, Q8, SQ, QT8, DO8, SDO, DOT8, LSE, DELTA,
                offs_n, lo, hi, N, N_pad,
                D: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr):
    offs_d = tl.arange(0, D)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qT = tl.load(Q8 + offs_m[None, :] * D + offs_d[:, None])                 # (D, BLOCK_M)
        sq = tl.load(SQ + start_m)
        lse = tl.load(LSE + offs_m, mask=offs_m < N, other=float("inf"))
        qkT = tl.dot(k, qT)                                                      # (BLOCK_N, BLOCK_M)
        if MASK:
            qkT = tl.where(offs_m[None, :] >= offs_n[:, None], qkT, float("-inf"))
        pT = tl.math.exp2(qkT * tl.maximum(sk_qk * sq, 1e-30) - (lse - 8.0)[None, :])     # 256 P^T (f floored)
        do = tl.load(DOT8 + offs_d[None, :] * N_pad + offs_m[:, None])           # (BLOCK_M, D), token-contiguous
        sdo = tl.load(SDO + start_m)
        dv += tl.dot(pT.to(tl.float8e4nv), do) * (sdo / 256.0)
        doT = tl.load(DO8 + offs_m[None, :] * D + offs_d[:, None])               # (D, BLOCK_M)
        delta = tl.load(DELTA + offs_m)
        dsT = pT * (tl.dot(v, doT) * (sv * sdo) - delta[None, :])                # 256 dS^T
        # one dynamic scale per key row: dK reduces over queries, so it factors out of the dot
        amax = tl.maximum(tl.max(tl.abs(dsT), 1), 1e-30)
        ds8 = (dsT * (448.0 / amax)[:, None]).to(tl.float8e4nv)
        q = tl.load(QT8 + offs_d[None, :] * N_pad + offs_m[:, None])             # (BLOCK_M, D), token-contiguous
        dk += tl.dot(ds8, q) * (amax * (sq / (448.0 * 256.0)))[:, None]
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q8, SQ, QT8, K8, SK, V8, SV, DO8, SDO, DOT8, LSE, stride_lb, DELTA, DK, DV,
                     sm_scale, qk_scale, N, N_pad, H, H_KV, stride_kb, stride_kh, stride_kn,
                     D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
                     G: tl.constexpr):
    pid_n, pid_bhk = _program_tile(G, False)      # causal: the first key tiles see the most queries
    b = pid_bhk // H_KV
    hk = pid_bhk % H_KV
    group = H // H_KV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)

    k = tl.load(K8 + pid_bhk * N_pad * D + offs_n[:, None] * D + offs_d[None, :])
    sk_qk = tl.load(SK + pid_bhk * N_pad + start_n) * qk_scale
    v = tl.load(V8 + pid_bhk * N_pad * D + offs_n[:, None] * D + offs_d[None, :])
    sv = tl.load(SV + pid_bhk * N_pad + start_n)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    # Query rows past N have LSE = +inf (P = 0) and dO = 0: no mask needed for them. Key rows past N
    # are computed but never stored.
    m_end = tl.cdiv(N, BLOCK_M) * BLOCK_M
    for g in range(group):
        h = hk * group + g
        bh = b * H + h
        lse_bh = LSE + b * stride_lb + h * N
        rows = bh * N_pad * D      # offset of this head's (N_pad, D) and (D, N_pad) FP8 buffers
        vec = bh * N_pad           # offset of its per-row scales and delta
        if CAUSAL:
            # queries i < start_n see none of these keys; query tiles that overlap the diagonal band
            # [start_n, start_n + BLOCK_N) need the mask (query blocks start at multiples of BLOCK_M)
            m_lo = (start_n // BLOCK_M) * BLOCK_M
            diag_end = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, m_end)
            dk, dv = _dkdv_inner(dk, dv, k, sk_qk, v, sv, Q8 + rows, SQ + vec, QT8 + rows, DO8 + rows, SDO + vec,
                                 DOT8 + rows, lse_bh, DELTA + vec, offs_n, m_lo, diag_end, N, N_pad,
                                 D, BLOCK_M, True)
            dk, dv = _dkdv_inner(dk, dv, k, sk_qk, v, sv, Q8 + rows, SQ + vec, QT8 + rows, DO8 + rows, SDO + vec,
                                 DOT8 + rows, lse_bh, DELTA + vec, offs_n, diag_end, m_end, N, N_pad,
                                 D, BLOCK_M, False)
        else:
            dk, dv = _dkdv_inner(dk, dv, k, sk_qk, v, sv, Q8 + rows, SQ + vec, QT8 + rows, DO8 + rows, SDO + vec,
                                 DOT8 + rows, lse_bh, DELTA + vec, offs_n, 0, m_end, N, N_pad,
                                 D, BLOCK_M, False)
    key_ok = offs_n[:, None] < N
    out = b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=key_ok)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=key_ok)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------
# Whether the kernels above were built for Triton's CPU interpreter: @triton.jit decides it when it runs,
# by TRITON_INTERPRET=1 at import, so setting the variable later changes nothing here.
INTERPRETED = isinstance(_quantize_kernel, InterpretedFunction)


@triton.jit
def _e4m3_probe_kernel(X, Y, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(Y + i, tl.load(X + i).to(tl.float8e4nv).to(tl.float32))


_INTERPRETER_ROUNDING = {}


def _check_interpreter_rounding():
    """Under the interpreter, warn once if it casts to e4m3 unlike the GPU. The stock Triton 3.6 / 3.8
    interpreter rounds half-up with no sticky bit and does not saturate; the kernels then run, but their
    errors against FP32 come out 2.4-3x a GPU's (4.4% -> 10.7% for O), which a measurement on the CPU
    would report as the kernel's. tests/triton_shim.py makes it round as the GPU does (cvt.rn.satfinite)."""
    if "ok" in _INTERPRETER_ROUNDING:
        return
    gen = torch.Generator().manual_seed(0)
    # ties (1.0625: nearest-even 1.0, half-up 1.125), a carry out of the mantissa (1.97), saturation (500),
    # and random values, of which the stock cast gets about 8% wrong
    x = torch.cat([torch.tensor([1.0625, -1.0625, 1.97, 500.0, -1e4, 3.0e-3]), 4 * torch.randn(58, generator=gen)])
    y = torch.empty_like(x)
    _e4m3_probe_kernel[(1,)](x, y, 64)
    _INTERPRETER_ROUNDING["ok"] = ok = torch.equal(y, x.clamp(-448, 448).to(FP8).float())
    if not ok:
        warnings.warn("attention_fp8: Triton's CPU interpreter casts to e4m3 unlike the GPU (half-up, no "
                      "saturation), so errors measured here come out 2.4-3x a GPU's; install "
                      "tests/triton_shim.py first, as the tests do (from the repository root: "
                      "from tests import triton_shim; triton_shim.install())",
                      stacklevel=4)


def _cdiv(a, b):
    # triton.cdiv is a ConstexprFunction in Triton 3.6 and 3.8: 1.75 us per host call against 0.05 for
    # this, and an eager forward + backward makes about ten such calls
    return -(-a // b)


def _padded(n):
    return _cdiv(n, PAD) * PAD


# The order a launch's programs start in. In a causal launch a program's work grows with its tile (a
# query tile sees every key before it, a key tile every query after it), and the GPU starts programs
# in grid order as earlier ones finish. Run one head after another, the last heads' longest tiles
# would start when most of the launch is done, and the launch would end on them (a tail of 6-7% of
# the kernel at D = 128, N = 4096 and 8192 in a model of that schedule: results/launch_order_model.py).
# So programs run in sections of G heads: the longest tile of each of the G heads, then the next
# longest, and so on, so that every head's short tiles come last (longest processing time first, as
# FlashAttention-3's scheduler does). The grid is (G * tiles, sections): CUDA starts programs along
# the first axis first. G is a constexpr of each kernel, so _program_tile divides by a constant, and
# the tile comes from the first axis (taken from the second, the Triton kernels spilled more and ran
# slower: SPEED.md, step 23). G divides the heads and is the largest that keeps the G heads' FP8
# operands within SECTION_BYTES, so that their tiles, read by G heads' worth of programs at once,
# can stay in L2 (50 MB on the H100 and H200), or else the largest divisor up to MIN_SECTION (few or
# large heads, as in grouped-query dK/dV launches, would keep most of the tail otherwise). Non-causal
# launches, whose programs are equally long, keep one head after another (G = 1). Outputs are
# bit-identical for every G.
SECTION_BYTES = 16 * 2**20
MIN_SECTION = 4


def _grid(tiles, heads, bytes_per_head, causal):
    """(G, grid) of a launch whose programs of one head read bytes_per_head of FP8 operands (see
    SECTION_BYTES): sections of G heads on the grid (G * tiles, heads / G)."""
    G = _largest_divisor(heads, max(MIN_SECTION, SECTION_BYTES // bytes_per_head)) if causal else 1
    return G, (G * tiles, heads // G)


@functools.lru_cache(maxsize=4096)
def _largest_divisor(n, most):
    """The largest divisor of n that is at most `most` (cached: a call's host time counts at small shapes)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return max(d for d in small + [n // d for d in small] if d <= most)


@triton.jit
def _program_tile(G: tl.constexpr, LONGEST_LAST: tl.constexpr):
    """(tile, head) of this program in a _grid of sections of G heads. LONGEST_LAST: the kernel's last
    tile is its longest (query tiles; key tiles are longest first), and starts first."""
    pid = tl.program_id(0)
    tile = pid // G
    if LONGEST_LAST:
        tile = tl.num_programs(0) // G - 1 - tile
    return tile, tl.program_id(1) * G + pid % G


# Host time. `kernel[grid](...)` binds and specializes each of the 20-40 arguments, builds a cache
# key, and asks the driver about every pointer: 11-15 us per launch of a trivial kernel against 5 us
# through its compiled launcher on the H200 host (Triton 3.6, results/host_h200.txt). A forward +
# backward launches six kernels, and at small shapes (8x16x1024x64) the GPU waits on the host. _launch
# does that work once per argument signature and then calls the compiled kernel's launcher itself
# with the pointers as integers, plus the key below (SPEED.md, step 9). Same compiled kernel, same
# arguments, bit-identical results; FAST_LAUNCH = False is the plain path.
# The launcher's calling convention is Triton's own, not a public API: it is used with the Tritons
# it was checked against (3.6 and 3.8: test_gpu_fast_launch_matches_plain_launch), and Triton's
# launch hooks (proton) do not see these launches. The Triton interpreter (TRITON_INTERPRET=1, which
# also takes CUDA tensors) has no compiled kernels.
FAST_LAUNCH = triton.__version__.startswith(("3.6.", "3.8.")) and not INTERPRETED
_launchers = {}
# The kernels are written for fused multiply-adds: qk * f - m is one FMA before each exp2, and the
# accumulator updates are FMAs too. Triton has contracted such expressions by default, but 3.9 warns
# that 3.10 will stop unless asked (TRITON_DEFAULT_FP_FUSION), so every launch asks. Same code as
# the default today: the compiled kernels do not change.
COMPILE_OPTIONS = {"enable_fp_fusion": True}


def _launch(kernel, grid, args, **constexprs):
    """kernel[grid](*args, **constexprs). args: the runtime arguments in the kernel's order (tensors,
    ints, floats, Gluon TensorDescriptors); constexprs: the rest, by name, and num_warps / num_stages."""
    constexprs = {**COMPILE_OPTIONS, **constexprs}
    first = args[0] if isinstance(args[0], torch.Tensor) else args[0].base    # a tensor or a TMA descriptor
    if not first.is_cuda:
        kernel[grid](*args, **constexprs)       # the Triton interpreter on the CPU takes this path
        return
    device = torch.cuda.current_device()
    if first.device.index != device:    # Triton launches on the current device; PyTorch ops on their tensors'
        with torch.cuda.device(first.device):
            return _launch(kernel, grid, args, **constexprs)
    if not FAST_LAUNCH:
        kernel[grid](*args, **constexprs)
        return
    # The key holds every value Triton specializes on (each int's value, each tensor's dtype) and
    # more, so one key never meets two specializations. Pointers are left out of it: Triton only
    # asks whether they are 16-byte aligned, and unaligned ones go the plain path.
    key, flat, low_bits = [id(kernel), device, *constexprs.items()], [], 0
    for a in args:
        if isinstance(a, torch.Tensor):
            ptr = a.data_ptr()
            low_bits |= ptr
            key.append(a.dtype)
            flat.append(ptr)
        elif isinstance(a, (int, float)):
            key.append(a)
            flat.append(a)
        else:   # a Gluon TMA descriptor (16-byte aligned by construction): the launcher encodes it
            key.append((a.base.dtype, tuple(a.block_shape), a.layout, a.padding))    # what Triton specializes on
            flat.append(a)
    key = tuple(key)
    entry = _launchers.get(key)
    if entry is None or low_bits % 16:
        compiled = kernel[grid](*args, **constexprs)     # compiles on first use, and launches
        if low_bits % 16 == 0:
            if len(_launchers) >= 4096:     # e.g. many sequence lengths: start over rather than grow
                _launchers.clear()
            constants = [constexprs.get(p.name, p.default) for p in kernel.params[len(args):]]
            _launchers[key] = (compiled.run, compiled.function, compiled.packed_metadata, constants)
        return
    run, function, metadata, constants = entry
    gx, gy, gz = (*grid, 1, 1)[:3]
    run(gx, gy, gz, _driver().get_current_stream(device), function, metadata, None, None, None, *flat, *constants)


@functools.lru_cache(maxsize=None)
def _driver():
    return triton.runtime.driver.active


def _quantize(specs, tile, permute_cols=False):
    """specs: one or two (x, rows, cols) with x (B, H, N, D) of one shape; one launch for all.
    Returns a list of (x8 or None, x8T or None, scale), see quantize(). permute_cols: the x8T
    copies hold each 32 tokens in the order of _permuted_cols (for the Gluon forward's V^T, the
    dQ kernel's K^T, and the Gluon dK/dV kernel's Q^T and dO^T)."""
    B, H, N, D = specs[0][0].shape
    n_pad = _padded(N)
    device = specs[0][0].device
    # One buffer per layout for both specs, x's copy then y's: the Gluon dK/dV kernel brings a tile
    # of Q^ and of dO^ (of Q^T and dO^T) in with one TMA copy (attention_fp8_hopper.dkdv).
    rows_buf = torch.empty((sum(rows for _, rows, _ in specs), B * H, n_pad, D), device=device, dtype=FP8)
    cols_buf = torch.empty((sum(cols for _, _, cols in specs), B * H, D, n_pad), device=device, dtype=FP8)
    scales = torch.empty((len(specs), B * H, n_pad), device=device, dtype=torch.float32)
    rows_left, cols_left = iter(rows_buf), iter(cols_buf)
    args, flags, out = [], [], []
    for (x, rows, cols), scale in zip(specs, scales):
        assert x.shape == specs[0][0].shape
        x8 = next(rows_left) if rows else None
        x8t = next(cols_left) if cols else None
        args += [x, *x.stride(), x8 if rows else scale, x8t if cols else scale, scale]
        flags += [rows, cols]
        out.append((x8, x8t, scale))
    if len(specs) == 1:     # the Y half of the kernel is never launched
        args, flags = args * 2, flags * 2
    _launch(_quantize_kernel, (n_pad // tile, B * H, len(specs)), (*args, N, n_pad, H),
            TILE=tile, D=D, X_ROWS=flags[0], X_COLS=flags[1], Y_ROWS=flags[2], Y_COLS=flags[3],
            PERMUTE_COLS=permute_cols, num_warps=4)
    return out


def quantize(x, tile, rows=True, cols=False):
    """Block-scaled e4m3 copy of x (B, H, N, D), D a power of two, on a device attention() runs on:
    returns (x8 or None, x8T or None, scale), the copies asked for by rows and cols, with x8
    (B*H, N_pad, D) and x8T (B*H, D, N_pad) in torch.float8_e4m3fn and scale (B*H, N_pad) in fp32,
    N_pad = N rounded up to a multiple of PAD (128). One scale per `tile` rows, amax(tile) / 448,
    stored once per row; rows past N are zeros, and a tile whose amax is below 1e-30 (pad rows
    alone, say) is zeros with scale 0. So
    x.reshape(B*H, N, D) ~= x8[:, :N].float() * scale[:, :N, None], and x8T is x8 transposed.
    Public so tests can build references from the dequantized inputs."""
    if tile not in (16, 32, 64, PAD):       # the kernel's arange needs a power of two; N is padded to PAD
        raise ValueError(f"quantize: tile must be 16, 32, 64 or {PAD} rows, got {tile!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        got = f"shape {tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"quantize: x must be a 4-D floating-point tensor (B, H, N, D), got {got}")
    D = x.shape[-1]
    if D < 16 or D & (D - 1):       # the kernel's arange over D, and a 16-byte row for the FP8 dots
        raise ValueError(f"quantize: head dim D = {D} must be a power of two, at least 16")
    return _quantize([(x, rows, cols)], tile)[0]


# Head dims whose forward runs, on Hopper GPUs (sm_90), the Gluon kernel of attention_fp8_hopper.py
# instead of _fwd_kernel: the same FP8 operands and scales, so the same O and LSE up to fp32 rounding,
# but scheduled with asynchronous wgmma and TMA (README, "Speed"). () for _fwd_kernel everywhere.
# It needs the scale tiles to fit its own (CONFIGS; _gluon).
HOPPER_FORWARD = (64, 128)
# Head dims whose dK/dV kernel runs, on Hopper, the Gluon kernel of attention_fp8_hopper.py
# instead of _bwd_dkdv_kernel: the same FP8 operands and scales (at D = 128 dS^T's row scale per 64
# queries rather than 32). It sums dV in the tensor cores, whose FP8 running sum keeps about 14 bits, and
# flushes that sum into fp32 every DV_FLUSH query tiles; without the flush, dV came out 3.6% low at
# N = 4096 and 15% low at N = 16384 where dO has a nonzero mean (SPEED.md, step 17;
# test_dv_is_a_weighted_sum_of_do).
HOPPER_BACKWARD = (64, 128)
# ... for eager calls of at least this many scores, B * H * N^2 (masked ones counted; 2^29 is
# 2x16x4096). Below it an eager call waits on the host, and the Gluon launches cost more host time
# (TMA descriptors), so the Triton kernels finish first although the Gluon ones take less GPU time
# (0.81-0.85x replayed from a CUDA graph; SPEED.md, step 10). Work sets it, not N. The backward
# counts the scores of the whole call, also where it runs in halves (SPLIT_BYTES): counted per half,
# the model's training shape at T = 1024 took the Triton dK/dV kernel and ran 1.14x slower (step 15).
HOPPER_FORWARD_MIN_SCORES = 2**29
HOPPER_BACKWARD_MIN_SCORES = 2**29
# ... and under torch.compile (the custom op below), from this many: a compiled model queues its
# kernels well ahead of the GPU, so the host's time per call is hidden and GPU time is what counts,
# where the Gluon kernels win at every size measured (SPEED.md, step 22).
COMPILED_MIN_SCORES = 0


@functools.lru_cache(maxsize=None)
def _is_hopper(device):
    """Whether the Gluon kernels can run here: a Hopper GPU (sm_90), and a Triton with Gluon's Hopper API."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return False
    try:
        import attention_fp8_hopper  # noqa: F401
    except ImportError as e:  # attention_fp8.py copied alone, or a Triton without Gluon's Hopper API
        missing = ("attention_fp8_hopper.py beside attention_fp8.py, on the import path"
                   if e.name == "attention_fp8_hopper" else
                   f"Triton's Gluon API, which triton {triton.__version__} lacks ({e})")
        warnings.warn(f"attention_fp8: the Gluon kernels for Hopper need {missing}; the Triton kernels run "
                      "instead, more slowly")
        return False
    return True


@functools.lru_cache(maxsize=None)
def _shared_bytes(device):
    """Shared memory a block may ask for on this GPU, as Triton reads it when it checks a launch (the
    interpreter, on the CPU, has no limit)."""
    if device.type != "cuda":
        return HOPPER_SHARED_BYTES
    return _driver().utils.get_device_properties(device.index)["max_shared_mem"]


def _gluon(q, head_dims, min_scores):
    """Whether this call runs a Gluon kernel (HOPPER_FORWARD / HOPPER_BACKWARD and their thresholds). Only
    where CONFIGS' scale tiles fit the Gluon kernels' blocks (a tiling being swept may not): one Q scale per
    64 queries, and the K and V scales' tile a multiple of both Gluon kernels' BLOCK_N, whose blocks read one
    scale each; and the dQ kernel writing delta for every row of the Gluon dK/dV kernel's query blocks."""
    B, H, N, D = q.shape
    if not (D in head_dims and B * H * N * N >= min_scores and _is_hopper(q.device)):
        return False
    import attention_fp8_hopper       # by this name: bench_attention.py --compare renames the import
    tile, fwd, dkdv = tiles(D), attention_fp8_hopper.CONFIGS[D], attention_fp8_hopper.DKDV_CONFIGS[D]
    return (tile["q"] == fwd["BLOCK_M"] and tile["q"] % dkdv["BLOCK_M"] == 0 and tile["k"] % fwd["BLOCK_N"] == 0
            and tile["k"] % dkdv["BLOCK_N"] == 0 and config(D, "dq")["BLOCK_M"] % dkdv["BLOCK_M"] == 0)


def _empty_as(x):
    """An empty tensor of x's shape and dtype laid out in memory as x is, as SDPA lays out its output:
    the GPT passes q as a (B, T, H, D) tensor seen as (B, H, T, D), and an O laid out the same way
    makes its transpose back to (B, T, H * D) free instead of a copy. The kernels write outputs of any
    strides but D's, which must be 1 (inputs may have any strides: they are read through the quantize
    launch and their own strides)."""
    y = torch.empty_like(x)
    return y if y.stride(-1) == 1 else torch.empty(x.shape, device=x.device, dtype=x.dtype)


def _forward(q, k, v, causal, sm_scale, compiled=False):
    """Returns o, lse. compiled: called from torch.compile's custom op (COMPILED_MIN_SCORES)."""
    B, H, N, D = q.shape
    H_kv = k.shape[1]
    n_pad = _padded(N)
    shared = _shared_bytes(q.device)
    tile = tiles(D, shared)
    if _gluon(q, HOPPER_FORWARD, COMPILED_MIN_SCORES if compiled else HOPPER_FORWARD_MIN_SCORES):
        import attention_fp8_hopper       # Gluon; imported only where it runs
        # V^T's keys permuted within each 32, as the Gluon forward's P~^ operand wants them (_p_operand)
        (k8, _, sk), (_, vt8, sv) = _quantize([(k, True, False), (v, False, True)], tile["k"], permute_cols=True)
        return attention_fp8_hopper.forward(q, k8, sk, vt8, sv, causal, sm_scale * LOG2E)
    (k8, _, sk), (_, vt8, sv) = _quantize([(k, True, False), (v, False, True)], tile["k"])
    o = _empty_as(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    cfg = config(D, "fwd", shared)
    G, grid = _grid(_cdiv(N, cfg["BLOCK_M"]), B * H, 2 * n_pad * D, causal)     # K^, V^T
    _launch(_fwd_kernel, grid,
            (q, *q.stride(), k8, sk, vt8, sv, o, lse, sm_scale * LOG2E, N, n_pad, H, H_kv, *o.stride()[:3]),
            D=D, CAUSAL=causal, G=G, **cfg)
    return o, lse


# The backward's FP8 copies (Q, Q^T, dO, dO^T, K, K^T, V: 7 bytes per element of q when H_kv = H)
# are made for half of the heads at a time once they would exceed this. Heads are independent, so
# the results are bit-identical. The halves bring peak memory under SDPA's (whose fp32 dQ
# accumulator takes 4 bytes per element). Large problems pay no measurable GPU time for them, since
# causal launches start longest tile first (_grid), but an eager call at small shapes pays the second
# half's Python and launches in wall time (README, "Memory at small shapes"), so only big problems
# split. Set it to float("inf") for one pass always, or 0 for halves always (the leanest).
SPLIT_BYTES = 128 * 2**20


def _halves(q, k, pieces):
    """The pieces the backward runs in: [] for one pass over the tensors themselves, or two
    (batch, kv heads) slices, halves of the kv heads (of the batch if there is one kv head).
    `pieces` is 1, 2, or None to decide by SPLIT_BYTES."""
    B, H, N, D = q.shape
    H_kv = k.shape[1]
    if pieces is None:
        pieces = 2 if (4 * H + 3 * H_kv) * B * _padded(N) * D > SPLIT_BYTES else 1   # bytes of copies
    if pieces == 1 or B * H_kv == 1:
        return []           # one pass, on the tensors themselves
    if H_kv > 1:
        return [(slice(None), slice(0, H_kv // 2)), (slice(None), slice(H_kv // 2, H_kv))]
    return [(slice(0, B // 2), slice(None)), (slice(B // 2, B), slice(None))]


def _backward(do, q, k, v, o, lse, causal, sm_scale, delta, debug=False, pieces=None, compiled=False):
    """Returns dq, dk, dv (and, with debug=True, a dict of per-row figures: delta, and sum_j dS_ij,
    sum_j |P_ij dP_ij| and sum_j P_ij as the dQ kernel formed them).
    Runs in one pass or in two halves of the heads (see SPLIT_BYTES; `pieces` = 1 or 2 forces it).
    `o` is only read by the stale delta and may be None for the matched one. compiled: as in _forward."""
    B, H, N, D = q.shape
    H_kv = k.shape[1]
    group = H // H_kv
    dq = _empty_as(q)
    dk = _empty_as(k)
    dv = torch.empty_like(dk)    # the dK/dV kernels write both with dk's strides (one dtype: _check_inputs)
    if _span(do) >= 2**31:     # dO comes from autograd, laid out as it comes (_check_inputs saw q, k, v)
        do = do.contiguous()
    if o is None:
        assert delta == "matched", "the stale delta reads o"
        o = do          # a placeholder the matched kernel never reads
    if debug:
        pieces = 1      # the debug sums below are per launch
    # the Gluon dK/dV kernel or not is decided by the whole call's scores, halves or not
    gluon = _gluon(q, HOPPER_BACKWARD, COMPILED_MIN_SCORES if compiled else HOPPER_BACKWARD_MIN_SCORES)
    halves = _halves(q, k, pieces)
    if not halves:
        info = _backward_piece(do, q, k, v, o, lse, dq, dk, dv, causal, sm_scale, delta, gluon, debug)
    for bs, hs in halves:
        hq = slice(hs.start * group, hs.stop * group) if hs.start is not None else hs     # their query heads
        info = _backward_piece(do[bs, hq], q[bs, hq], k[bs, hs], v[bs, hs], o[bs, hq], lse[bs, hq],
                               dq[bs, hq], dk[bs, hs], dv[bs, hs], causal, sm_scale, delta, gluon, debug)
    if v.stride() != k.stride():    # v laid out otherwise than k (not in the GPT): dV as v is, at a copy
        dv = _empty_as(v).copy_(dv)
    return (dq, dk, dv, info) if debug else (dq, dk, dv)


def _backward_piece(do, q, k, v, o, lse, dq, dk, dv, causal, sm_scale, delta, gluon, debug):
    """The backward of some heads: q, do, o, lse and dq are views of the same heads of the full
    tensors, k, v, dk, dv of their kv heads. Writes dq, dk, dv; gluon: the Gluon dK/dV kernel."""
    B, H, N, D = q.shape
    H_kv = k.shape[1]
    n_pad = _padded(N)
    shared = _shared_bytes(q.device)
    tile = tiles(D, shared)
    if gluon:
        import attention_fp8_hopper       # Gluon; imported only where it runs
    # The Gluon dK/dV kernel reads Q^T and dO^T with each 32 queries permuted (its _p_operand).
    permuted = gluon
    # Same tiles as the forward for Q and K: bit-identical Q^, K^, hence the forward's S and LSE.
    (q8, qt8, sq), (do8, dot8, sdo) = _quantize([(q, True, True), (do, True, True)], tile["q"], permuted)
    # K^T's keys permuted as the dQ kernel's dS^ (_permuted_cols)
    (k8, kt8, sk), (v8, _, sv) = _quantize([(k, True, True), (v, True, False)], tile["k"], permute_cols=True)
    matched = delta == "matched"
    delta_buf = torch.empty((B * H, n_pad), device=q.device, dtype=torch.float32)
    # debug: per row, sum_j dS_ij, sum_j |P_ij dP_ij| and sum_j P_ij (without DEBUG the kernel never
    # touches ROWSUM; delta_buf only fills the argument)
    rowsum = torch.zeros((B * H, n_pad, 3), device=q.device, dtype=torch.float32) if debug else delta_buf
    qk_scale = sm_scale * LOG2E
    cfg = config(D, "dq", shared)
    G, grid = _grid(_cdiv(N, cfg["BLOCK_M"]), B * H, 3 * n_pad * D, causal)     # K^, K^T, V^
    _launch(_bwd_dq_kernel, grid,
            (q8, sq, k8, sk, kt8, v8, sv, do8, sdo, do, o, lse, lse.stride(0), delta_buf, dq, rowsum, sm_scale,
             qk_scale, N, n_pad, H, H_kv, *do.stride(), *o.stride()[:3], *dq.stride()[:3]),
            D=D, CAUSAL=causal, MATCHED=matched, DEBUG=debug, G=G, **cfg)
    if gluon:
        attention_fp8_hopper.dkdv(q8, sq, qt8, k8, sk, v8, sv, do8, sdo, dot8, lse, delta_buf, dk, dv, causal,
                                  sm_scale, qk_scale)
    else:
        cfg = config(D, "dkdv", shared)
        G, grid = _grid(_cdiv(N, cfg["BLOCK_N"]), B * H_kv, 4 * (H // H_kv) * n_pad * D, causal)  # Q^, Q^T, dO^, dO^T
        _launch(_bwd_dkdv_kernel, grid,
                (q8, sq, qt8, k8, sk, v8, sv, do8, sdo, dot8, lse, lse.stride(0), delta_buf, dk, dv,
                 sm_scale, qk_scale, N, n_pad, H, H_kv, *dk.stride()[:3]), D=D, CAUSAL=causal, G=G, **cfg)
    if not debug:
        return None
    return {"delta": delta_buf[:, :N].reshape(B, H, N),
            "ds_rowsum": rowsum[:, :N, 0].reshape(B, H, N),
            "pdp_abs_rowsum": rowsum[:, :N, 1].reshape(B, H, N),
            "p_rowsum": rowsum[:, :N, 2].reshape(B, H, N)}


# ---------------------------------------------------------------------------------------------
# torch.library custom op: torch.compile traces through the fake implementations, autograd
# through register_autograd. The real implementations launch the kernels above (on Hopper, the
# Gluon forward and dK/dV kernels at every size: COMPILED_MIN_SCORES). Eager mode goes through
# _Attention below instead (same launchers, less host time per call).
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("fp8_attention::fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
            delta: str) -> tuple[torch.Tensor, torch.Tensor]:
    if q.device.type == "cpu":
        _check_interpreter_rounding()       # here, not in _check_inputs, under torch.compile (see there)
    return _forward(q, k, v, causal, sm_scale, compiled=True)     # `delta` only matters to the backward


@_fwd_op.register_fake
def _(q, k, v, causal, sm_scale, delta):
    B, H, N, D = q.shape
    return _empty_as(q), q.new_empty((B, H, N), dtype=torch.float32)     # the real op's layouts


@torch.library.custom_op("fp8_attention::bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: Optional[torch.Tensor],
            lse: torch.Tensor, causal: bool, sm_scale: float, delta: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(do, q, k, v, o, lse, causal, sm_scale, delta, compiled=True)


@_bwd_op.register_fake
def _(do, q, k, v, o, lse, causal, sm_scale, delta):
    return _empty_as(q), _empty_as(k), _empty_as(v)     # the real op's layouts (_backward)


def _setup_context(ctx, inputs, output):
    q, k, v, ctx.causal, ctx.sm_scale, ctx.delta = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o if ctx.delta == "stale" else None, lse)   # see _Attention.forward
    ctx.mark_non_differentiable(lse)    # the backward gives no gradient through LSE: say so, not a silent 0


def _refuse_double_backward():
    """Autograd runs a backward with grad mode on only for create_graph=True, to differentiate the
    gradients again (a gradient penalty, a Hessian-vector product). Ours are FP8 kernels, which autograd
    cannot differentiate: it would take dQ, dK, dV for constants and drop those terms silently."""
    if torch.is_grad_enabled():
        raise RuntimeError("attention_fp8: gradients of the gradients (create_graph=True, double backward) are "
                           "not supported: the backward runs FP8 kernels that autograd cannot differentiate. "
                           "Use PyTorch SDPA for second-order gradients.")


def _fwd_op_backward(ctx, do, dlse):
    _refuse_double_backward()
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _bwd_op(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale, ctx.delta)
    return dq, dk, dv, None, None, None


_fwd_op.register_autograd(_fwd_op_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The eager path: the same launchers as the custom op, without the custom-op dispatch, whose
    host time small shapes feel (SPEED.md, step 2). torch.compile takes the custom op, which it does
    not trace into."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, delta):
        o, lse = _forward(q, k, v, causal, sm_scale)
        # Only the stale delta reads o. Not keeping it leaves its lifetime to the caller (a GPT
        # block's output projection keeps it as its input anyway); a caller that does not keep it
        # frees one activation per layer until the backward.
        ctx.save_for_backward(q, k, v, o if delta == "stale" else None, lse)
        ctx.causal, ctx.sm_scale, ctx.delta = causal, sm_scale, delta
        return o

    @staticmethod
    def backward(ctx, do):
        _refuse_double_backward()
        q, k, v, o, lse = ctx.saved_tensors
        return (*_backward(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale, ctx.delta), None, None, None)


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------
def fp8_supported(device=None):
    """Whether attention() can run on `device` (a torch.device, a str such as "cuda:1", or None for
    "cuda" where a GPU is visible, else "cpu"): an NVIDIA GPU with FP8 tensor cores (compute capability
    >= 8.9: Ada, Hopper, Blackwell), or the CPU when this module was imported with TRITON_INTERPRET=1
    (the Triton interpreter). Head dims are not checked here (HEAD_DIMS). ROCm GPUs, which PyTorch also calls "cuda",
    report other capabilities and other FP8 formats: not supported."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return (torch.cuda.is_available() and torch.version.hip is None
                and torch.cuda.get_device_capability(device) >= (8, 9))
    return device.type == "cpu" and INTERPRETED


_FP8_CUDA = {}


# Cached: the device query costs host time at every call. A dict rather than functools.lru_cache,
# and a constant to torch.compile, which would otherwise trace through the cache and warn about it.
@torch.compiler.assume_constant_result
def _fp8_cuda(device):
    if device not in _FP8_CUDA:
        _FP8_CUDA[device] = fp8_supported(device)
    return _FP8_CUDA[device]


def _span(x):
    """Elements from x's first to its last, as laid out in memory (x.numel() when it is dense)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()))


def _check_inputs(q, k, v, delta):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.is_nested or x.layout != torch.strided:
            raise ValueError(f"attention: {name} must be a dense (strided) tensor, got a "
                             f"{'nested' if x.is_nested else str(x.layout).replace('torch.', '')} one; pad the "
                             "sequences to one length (causal attention needs no mask for padding at the end)")
        if x.dim() != 4:
            raise ValueError(f"attention: {name} must be 4-D (batch, heads, seq_len, head_dim), got shape {tuple(x.shape)}")
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"attention: {name} has dtype {x.dtype}; accepted dtypes are torch.bfloat16 and torch.float16")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    (B, H, N, D), (Bk, Hk, Nk, Dk) = q.shape, k.shape
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if Bk != B or Nk != N or Dk != D:
        raise ValueError(f"attention: batch, seq_len and head_dim must match between q {tuple(q.shape)} and k/v {tuple(k.shape)}")
    if N == 0 or B == 0 or H == 0 or Hk == 0:   # before the head count's check, which would blame 0 heads
        raise ValueError(f"attention: empty input of shape {tuple(q.shape)} (k/v {tuple(k.shape)})")
    if H % Hk != 0:
        raise ValueError(f"attention: q's {H} heads must be a multiple of k/v's {Hk} heads (grouped-query attention)")
    if D not in HEAD_DIMS:
        raise ValueError(f"attention: head_dim {D} is not supported; supported head dims are {HEAD_DIMS}")
    # The quantize launches put the (batch, head) pairs on a grid's second axis, which CUDA caps at
    # 65,535 (the attention launches put sections of G of them there).
    if B * H > 65535:
        raise ValueError(f"attention: batch x heads = {B} x {H} = {B * H:,} is over 65,535, the most (batch, head) "
                         "pairs the kernels launch at once; split the batch across calls")
    # The kernels index memory with 32-bit integers (Triton's default for these arguments): each
    # tensor they touch must span fewer than 2^31 elements, or its offsets would wrap around and
    # read and write the wrong memory. The largest is an input as laid out, or the FP8 copy of Q
    # (B * H rows of N_pad x D; K's and V's have H_kv <= H).
    elements = max(_span(q), _span(k), _span(v), B * H * _padded(N) * D)
    if elements >= 2**31:
        raise ValueError(f"attention: q {tuple(q.shape)}, k/v {tuple(k.shape)} are too large for the kernels' "
                         f"32-bit offsets: one tensor spans {elements:,} elements (2^31 = 2,147,483,648 and over "
                         "do not fit); split the batch or the heads across calls")
    if delta not in ("matched", "stale"):
        raise ValueError(f"attention: delta must be 'matched' or 'stale', got {delta!r}")
    dev = q.device
    if dev.type == "cuda":
        if not _fp8_cuda(dev):
            if torch.version.hip is not None:  # ROCm reports its own capabilities (9.x on MI300) and FP8 formats
                raise RuntimeError(f"attention: {torch.cuda.get_device_name(dev)} is a ROCm GPU; the kernels are "
                                   "written for NVIDIA's (e4m3fn, compute capability 8.9 or newer). Use PyTorch SDPA.")
            cap = torch.cuda.get_device_capability(dev)
            raise RuntimeError(f"attention: {torch.cuda.get_device_name(dev)} (compute capability {cap[0]}.{cap[1]}) "
                               "has no FP8 tensor cores; FP8 attention needs compute capability 8.9 or newer "
                               "(Ada, Hopper, Blackwell). Use PyTorch SDPA on this GPU.")
    elif dev.type == "cpu":
        if not INTERPRETED:
            raise ValueError("attention: q, k, v are CPU tensors; the kernel runs on a CUDA GPU, or on the CPU only "
                             "under the Triton interpreter (set TRITON_INTERPRET=1 before importing attention_fp8)")
        # Dynamo cannot trace the probe (its torch.Generator): a first call that was compiled with
        # fullgraph=True failed. Compiled calls run it in _fwd_op's real implementation instead.
        if not torch.compiler.is_compiling():
            _check_interpreter_rounding()
    else:
        raise ValueError(f"attention: unsupported device {dev}; use a CUDA GPU")


def _causal_and_scale(q, causal, sm_scale):
    """causal as a bool and sm_scale as a float (default 1 / sqrt(D)), checked."""
    # numpy's bool (a mask's element) is neither a bool nor an int; bool("False") is True, hence no
    # bool() of anything else
    if not isinstance(causal, (bool, int, np.bool_)):
        raise TypeError(f"attention: causal must be True or False, got {causal!r}")
    if sm_scale is None:
        return bool(causal), 1.0 / math.sqrt(q.shape[-1])
    # A number, not a tensor: float() of one would drop its gradient (and of a str, parse it).
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"attention: sm_scale must be a Python number or None, got {type(sm_scale).__name__} "
                        f"{sm_scale!r}" + (" (the kernels take no gradient in sm_scale; pass float(t))"
                                           if isinstance(sm_scale, torch.Tensor) else ""))
    # The kernels floor the factor from an FP8 dot to S at 1e-30 (zero tiles, _fwd_inner): a negative
    # scale would come out as that floor, near-uniform attention, not as an error.
    scale = float(sm_scale)
    # comparisons, not math.isfinite: under torch.compile(dynamic=True) a scale made from q.size(-1) is
    # a SymFloat, which math.isfinite cannot take (a graph break, and with fullgraph=True an error)
    if not (0 <= scale < math.inf):     # NaN fails both
        raise ValueError(f"attention: sm_scale must be a finite number >= 0, got {sm_scale!r}")
    # the kernels take sm_scale * log2(e) as an fp32 number: past fp32's range it is inf, and every output NaN
    if scale * LOG2E > torch.finfo(torch.float32).max:
        raise ValueError(f"attention: sm_scale {sm_scale!r} is too large for the kernels' fp32 arithmetic "
                         f"(sm_scale * log2(e) must stay below {torch.finfo(torch.float32).max:.3g})")
    return bool(causal), scale


@torch.no_grad()
def delta_stats(q, k, v, do, causal=True, sm_scale=None):
    """What the stale delta would get wrong on these inputs, for a training monitor.

    Runs the FP8 forward and both backward arms on q, k, v and an upstream gradient do, and returns
      delta_mismatch: ||delta_stale - delta_matched|| / ||delta_matched|| (over all rows)
      ds_rowsum_matched, ds_rowsum_stale: the largest over all rows (b, h, i) of
        |sum_j dS_ij| / sum_j |P_ij dP_ij|, invariant (*), with dS in fp32 before its e4m3 rounding
      key_grad_sum_matched, key_grad_sum_stale: ||sum_j dK_j|| / sum_j ||dK_j||, worst (batch, kv
        head); exact gradients give 0, since adding one vector to every key changes nothing.
    All are Python floats. The inputs are checked as attention() checks them, and do must have q's
    shape, dtype and device (ValueError). The backwards run in one pass, not in halves (SPLIT_BYTES),
    so a call needs more memory than a training step's attention.
    """
    _check_inputs(q, k, v, "matched")
    if not (isinstance(do, torch.Tensor) and do.shape == q.shape and do.dtype == q.dtype and do.device == q.device):
        got = f"{tuple(do.shape)} {do.dtype} on {do.device}" if isinstance(do, torch.Tensor) else type(do).__name__
        raise ValueError(f"delta_stats: do must be a tensor like q ({tuple(q.shape)} {q.dtype} on {q.device}), got {got}")
    causal, sm_scale = _causal_and_scale(q, causal, sm_scale)
    o, lse = _forward(q, k, v, causal, sm_scale)
    stats = {}
    for arm in ("matched", "stale"):
        _, dk, _, info = _backward(do, q, k, v, o, lse, causal, sm_scale, arm, debug=True)
        dk = dk.float()
        stats[f"key_grad_sum_{arm}"] = (dk.sum(2).norm(dim=-1) / dk.norm(dim=-1).sum(2).clamp_min(1e-30)).max().item()
        stats[f"ds_rowsum_{arm}"] = (info["ds_rowsum"].abs() / info["pdp_abs_rowsum"].clamp_min(1e-30)).max().item()
        stats[f"delta_{arm}"] = info["delta"]
    matched, stale = stats.pop("delta_matched"), stats.pop("delta_stale")
    stats["delta_mismatch"] = ((stale - matched).norm() / matched.norm().clamp_min(1e-30)).item()
    return stats


def attention(q, k, v, causal=True, sm_scale=None, delta="matched"):
    """FP8 attention: softmax(sm_scale * q k^T [+ causal mask]) v with Delta-Matching in the backward.

    q: (B, H, N, D); k, v: (B, H_kv, N, D) with H % H_kv == 0; bf16 or fp16; D in {64, 128}; any
    strides, each tensor spanning fewer than 2^31 elements (32-bit offsets; larger calls raise).
    sm_scale >= 0, default 1 / sqrt(D). delta="matched" (Delta-Matching) or "stale" (rowsum(dO * O),
    the ablation arm). Returns o (B, H, N, D) in q's dtype and memory layout (contiguous where D's stride
    in q is not 1); differentiable in q, k, v
    once (no create_graph=True: the FP8 backward has no gradient of its own). An inf in q, k or v
    makes its whole scale tile NaN (64 queries, 128 keys), so more rows of o come out NaN than with
    SDPA, which spreads it only to the rows that attend to it; a NaN stays in its own element's row
    or column of the scores, as with SDPA (the tile's amax passes over it). A tile whose largest
    magnitude is below 1e-30 is taken as zero, and so is its part of the gradients (README, "Zero
    tiles"): scale losses and inputs into the range BF16 training uses.

    Runs on NVIDIA GPUs of compute capability 8.9 and newer, or on the CPU under the Triton
    interpreter (TRITON_INTERPRET=1 set before import). B * H must be at most 65,535, and the FP8
    copy of q (B * H x N rounded up to 128 x D) must span fewer than 2^31 elements too. Raises
    TypeError for an argument of the wrong type or dtype, ValueError for wrong shapes, devices,
    sizes, delta or sm_scale, and RuntimeError on a GPU without FP8 tensor cores."""
    _check_inputs(q, k, v, delta)
    causal, sm_scale = _causal_and_scale(q, causal, sm_scale)
    if torch.compiler.is_compiling():
        return _fwd_op(q, k, v, causal, sm_scale, delta)[0]
    return _Attention.apply(q, k, v, causal, sm_scale, delta)

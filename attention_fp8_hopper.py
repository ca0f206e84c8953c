"""
The FP8 attention forward and dK/dV kernel of attention_fp8.py, written in Gluon for Hopper (sm_90):
same inputs, same FP8 operands and scales. The forward gives the same O and LSE up to fp32 rounding;
the dK/dV kernel is described where it starts, below the forward.

Why a second forward. Triton issues a tile's dots, exp2 and casts in program order, so the
tensor cores idle while a warp does its softmax (SPEED.md). Gluon exposes Hopper's
asynchronous warpgroup MMA, TMA and mbarriers, so the schedule is written out:

    iteration j:  refill the slot tile j-1 used with tile j-1+STAGES       (TMA)
                  issue S_{j+1} = Q^ K_{j+1}^T                             (async, tensor cores)
                  softmax of S_j; P~_j^ in registers                       (CUDA cores, meanwhile)
                  issue P~_j^ V^_j and P~_j^ 1 (fresh accumulators); wait for all three dots
                  add them to acc and w in fp32

P~^ goes to the P V wgmma straight from the registers the softmax left it in: V^T's keys are
stored permuted within each 32 (_p_operand) so that no shuffles are needed. (P~^ through shared
memory instead, a store, a fence and a barrier per tile, ran 1.04-1.09x slower: SPEED.md, step 7.)

Letting P V run on into the next softmax too (FlashAttention-3's full overlap) makes ptxas
serialize every wgmma (advisory C7514), so each iteration ends on both dots. At head dim 64 it pays
only with three programs per SM (CONFIGS' register cap). Its speed against the Triton forward is in
SPEED.md (steps 4, 6, 7, 11 and 17).

The value of V's tile scale rides in the accumulator's units: acc holds O * w / sv_last, so
    acc <- acc * (alpha_j * sv_{j-1} / sv_j) + P~_j^ V^_j
is exact in real arithmetic (one FFMA per element), and O = acc * sv_last / w at the end, where w
is the sum of the rounded weights P~^ (attention_fp8.py's forward section says why w and not l).

Each tile's P~^ V^ is a fresh wgmma, added to acc in fp32, not accumulated in the tensor cores:
Hopper's FP8 MMA keeps about 14 bits of the running sum when it adds products to it (DeepSeek-V3
report, section 3.3.2), and a column of O whose V has a nonzero mean grows with every key, so the
later tiles' products lost their low bits: O of a V whose rows are all one vector had a mean bias
of 3.7% at N = 4096 and 14% at N = 16384 on the H200, and is now off by BF16 rounding, as the
Triton forward (SPEED.md, step 17). It cost the forward 4-10%.

One warpgroup (4 warps) owns 64 query rows (one query tile, one Q scale), and two programs (three
at head dim 64) share an SM, so one's softmax can run under the others' dots.

Gluon has no interpreter: CPU CI compiles these kernels for sm_90a (test_attention.py) and the GPU
tests compare them with the Triton kernels.
"""
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

import attention_fp8        # its _launch: the compiled kernel's launcher without Triton's per-call binding

# Names that moved between Triton versions. These kernels run on the H200 with Triton 3.6; CI compiles
# them with what a plain pip install brings (3.8 as of 2026-12), and they compile with 3.9 too.
# The barrier of all threads of a program (bar.sync): gl.thread_barrier in 3.6, gl.barrier from 3.8.
thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# A TMA copy of a tile from global to shared memory: tma.async_load, which Triton 3.9 requires and
# 3.8 also calls tma.async_copy_global_to_shared, the name Triton 3.6 knows it by.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# A copy from global to shared memory by each thread (cp.async): async_copy.async_load from 3.8 on
# (3.9 requires it), async_copy_global_to_shared in 3.6.
cp_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@triton.constexpr_function
def _q_layout(D, num_warps):
    """Coalesced loads and stores of a (rows, D) tile: 8 consecutive elements per thread along D."""
    tpw_d = min(D // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // tpw_d, tpw_d], [num_warps, 1], [1, 0])


@triton.constexpr_function
def _tree_levels(n):
    """Column bits of a wgmma accumulator above the lowest three (one register bit, two lane bits):
    all register bits, so halving along them moves no data."""
    return max(int(n).bit_length() - 4, 0)


@gluon.jit
def _row_reduce(x, MAX: gl.constexpr):
    """Row max (MAX) or row sum of a wgmma accumulator tile x (rows, 2^k columns), as a tree.
    gl.max(x, 1) folds a thread's values of a row one after another: at 128 columns a chain of 31
    dependent instructions per row, which two warps per scheduler cannot hide. Halving the
    columns along register bits gives levels of independent instructions instead; gl.max then
    finishes the last register pair and the four lanes of a row. Same instruction count."""
    rows: gl.constexpr = gl.SliceLayout(1, x.type.layout)
    for _ in gl.static_range(_tree_levels(x.shape[1])):
        x = gl.reshape(x, [x.shape[0], 2, x.shape[1] // 2])
        if MAX:
            x = gl.max(x, 1)
        else:
            x = gl.sum(x, 1)
    if MAX:
        x = gl.max(x, 1)
    else:
        x = gl.sum(x, 1)
    return gl.convert_layout(x, rows)     # the same rows in the same threads: no data moves


@gluon.jit
def _softmax_tile(s, m_i, l_i, sv, qs, sk_j, sv_j, offs_m, start_n, N, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  MASK: gl.constexpr, s_cols: gl.constexpr, o_rows: gl.constexpr):
    """One tile of the online softmax, in base 2 (see attention_fp8._fwd_inner), f = Q's row scale
    * K's tile scale sk_j * tau * log2(e) (sv_j: V's tile scale, as stored): returns p~ =
    exp2(qk * f - m + 8) in fp32, the new m and l, V's tile scale sv, c = alpha * sv_before / sv,
    the factor acc takes before P~ V is added, and alpha, the factor the sum of the weights takes."""
    f = gl.maximum(qs * sk_j, 1e-30)      # floored: a zero Q or K tile has scale 0 (attention_fp8._fwd_inner)
    if MASK:
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=s_cols)
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, _row_reduce(s, True) * f)
    p = gl.exp2(s * f[:, None] - (m_new - 8.0)[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + _row_reduce(p, False)
    # A zero tile of V (scale 0) adds nothing to acc: acc keeps its units. Before the first nonzero
    # tile acc is zero, and sv = 0 turns it into the new units as zero.
    sv_j = gl.where(sv_j > 0, sv_j, sv)
    return p, m_new, l_i, sv_j, gl.convert_layout(alpha * gl.where(sv_j > 0, sv / sv_j, 1.0), o_rows), alpha


@gluon.jit
def _program_tile(G: gl.constexpr, LONGEST_LAST: gl.constexpr):
    """attention_fp8._program_tile: (tile, head) of this program in an attention_fp8._grid."""
    pid = gl.program_id(0)
    tile = pid // G
    if LONGEST_LAST:
        tile = gl.num_programs(0) // G - 1 - tile
    return tile, gl.program_id(1) * G + pid % G


@gluon.jit
def _p_operand(p8, p_layout: gl.constexpr):
    """P~^ (rows, 32 c keys) from the S accumulator's registers to the A operand of the P V wgmma,
    with the keys of each 32 in the order pi that makes this a relabelling of registers, not a
    shuffle. Within 32 keys, a thread of the accumulator holds key columns 8 u1 + 2 t + u0 (+16),
    and the operand wants k = 4 t + u (+16) from it; so operand position k (bits k4..k0) holds key
    c with c4 = k4, c3 = k1, c2 = k3, c1 = k2, c0 = k0. V^T's keys are stored in that order
    (attention_fp8._quantize_tile, PERMUTE_COLS), and P~^ V^ sums over keys in any order alike."""
    x = gl.reshape(p8, [p8.shape[0], p8.shape[1] // 32, 2, 2, 2, 2, 2])     # (row, 32s, c4, c3, c2, c1, c0)
    x = gl.permute(x, (0, 1, 2, 4, 5, 3, 6))                                # (row, 32s, c4, c2, c1, c3, c0)
    return gl.convert_layout(gl.reshape(x, [p8.shape[0], p8.shape[1]]), p_layout)


@gluon.jit
def _fwd_kernel_hopper(Q, stride_qb, stride_qh, stride_qn, stride_qd, k_desc, SK, vt_desc, SVT, O, LSE, qk_scale,
                       N, N_pad, H, H_KV, stride_ob, stride_oh, stride_on,
                       D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                       STAGES: gl.constexpr, G: gl.constexpr):
    # One warpgroup (4 warps) per 64 rows, i.e. per query tile, which has one scale.
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "BLOCK_M: one or two query tiles of 64 rows")
    gl.static_assert(STAGES >= 3, "slots for the tile being freed, the tile in P V and the next tile's S")
    WARPS: gl.constexpr = BLOCK_M // 16
    # wgmma layouts: S (BLOCK_M, BLOCK_N) and O (BLOCK_M, D); FP8 operands reduce 32 at a time.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, D, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    # W = P~^ 1 for one tile: every column is the row sum of the weights that multiply V (8 columns,
    # wgmma's least). Summed over tiles in fp32 (w_i), not in the tensor cores: their FP8 MMA keeps about
    # 14 bits of a running sum, and a sum of positive weights grows with every tile (SPEED.md, step 17).
    w_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, 8, 32])
    pw_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=w_layout, k_width=4)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_layout: gl.constexpr = _q_layout(D, WARPS)

    pid_m, pid_bh = _program_tile(G, CAUSAL)      # longest rows first, as in attention_fp8
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * H_KV + h // (H // H_KV)
    start_m = pid_m * BLOCK_M

    # Q^, made exactly as attention_fp8._quantize_tile makes it, into shared memory for the dots.
    offs_qm = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_layout))
    q = gl.load(Q + b * stride_qb + h * stride_qh + offs_qm[:, None] * stride_qn + offs_qd[None, :] * stride_qd,
                mask=(offs_qm < N)[:, None], other=0.0).to(gl.float32)
    # one amax per 64-row query tile (two of them when BLOCK_M = 128)
    row_amax = gl.max(gl.abs(q), 1)
    first = offs_qm - start_m < 64
    amax = gl.where(first, gl.max(gl.where(first, row_amax, 0.0), 0), gl.max(gl.where(first, 0.0, row_amax), 0))
    live = amax >= 1e-30
    q8 = (q * gl.where(live, 448.0 / gl.maximum(amax, 1e-30), 0.0)[:, None]).to(gl.float8e4nv)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, D],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float8e4nv), q8)
    qs = gl.convert_layout(gl.where(live, amax / 448.0, 0.0) * qk_scale, s_rows)     # Q's row scale times tau * log2(e)
    SK += bh_kv * N_pad
    SVT += bh_kv * N_pad

    # K^ and V^T tiles: a ring of STAGES slots, one mbarrier each, filled by TMA.
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BLOCK_N], vt_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    # The B operand of W = P~^ 1 (stored as its transpose, K-major as FP8 wgmma wants it)
    ones_smem = gl.allocate_shared_memory(gl.float8e4nv, [8, BLOCK_N],
                                          gl.NVMMASharedLayout.get_default_for([8, BLOCK_N], gl.float8e4nv),
                                          gl.full([8, BLOCK_N], 0x38, gl.uint8, q_layout).to(gl.float8e4nv, bitcast=True))
    fence_async_shared()     # Q^ and the barriers, before the async proxy (TMA, wgmma) uses them
    thread_barrier()         # every warp's part of Q^ is written before any warp's wgmma reads it

    if CAUSAL:
        hi = gl.minimum(start_m + BLOCK_M, N)
    else:
        hi = N
    n_tiles = gl.cdiv(hi, BLOCK_N)
    k_row = bh_kv * N_pad
    v_row = bh_kv * D
    tile_bytes: gl.constexpr = 2 * BLOCK_N * D
    for t in gl.static_range(STAGES):
        mbarrier.expect(ready.index(t), tile_bytes, pred=t < n_tiles)
        tma_load(k_desc, [k_row + t * BLOCK_N, 0], ready.index(t), k_smem.index(t), pred=t < n_tiles)
        tma_load(vt_desc, [v_row, t * BLOCK_N], ready.index(t), v_smem.index(t), pred=t < n_tiles)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=s_rows)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    o_zero = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    w_zero = gl.zeros([BLOCK_M, 8], gl.float32, w_layout)
    w_i = gl.zeros([BLOCK_M], gl.float32, s_rows)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, s_rows)
    sv = gl.load(SVT)

    sk_j = gl.load(SK)
    sv_j = gl.load(SVT)
    mbarrier.wait(ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
    # Every tile but the last lies below the causal diagonal and inside N: no mask.
    for j in range(0, n_tiles - 1):
        # The next tile's scales, a tile ahead: loaded where they are used, their latency stalls
        # the softmax.
        sk_next = gl.load(SK + (j + 1) * BLOCK_N)
        sv_next = gl.load(SVT + (j + 1) * BLOCK_N)
        # Every warp is done with tile j - 1 (the wait at the end of the last iteration): refill its slot.
        thread_barrier()
        refill = j - 1 + STAGES
        slot = refill % STAGES
        load = (j >= 1) & (refill < n_tiles)
        mbarrier.expect(ready.index(slot), tile_bytes, pred=load)
        tma_load(k_desc, [k_row + refill * BLOCK_N, 0], ready.index(slot), k_smem.index(slot), pred=load)
        tma_load(vt_desc, [v_row, refill * BLOCK_N], ready.index(slot), v_smem.index(slot), pred=load)
        # S of the next tile runs on the tensor cores while this tile's softmax runs on the CUDA cores.
        nxt = j + 1
        mbarrier.wait(ready.index(nxt % STAGES), (nxt // STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        start_n = j * BLOCK_N
        p, m_i, l_i, sv, c, alpha = _softmax_tile(s, m_i, l_i, sv, qs, sk_j, sv_j, offs_m, start_n, N, BLOCK_N,
                                                  CAUSAL, False, s_cols, o_rows)
        # P~^ in registers, keys in V^T's permuted order: no shuffles (a convert_layout into the
        # operand layout without the permutation took ~250 instructions per tile, SPEED.md step 4).
        p8 = _p_operand(p.to(gl.float8e4nv), p_layout)
        pv = warpgroup_mma(p8, v_smem.index(j % STAGES).permute((1, 0)), o_zero, use_acc=False, is_async=True)
        w = warpgroup_mma(gl.convert_layout(p8, pw_layout), ones_smem.permute((1, 0)), w_zero, use_acc=False,
                          is_async=True)
        # All done before the next softmax. (Letting P V run on into it makes ptxas serialize every
        # wgmma: it gives the next S the registers the softmax still reads.)
        s, pv, w = warpgroup_mma_wait(0, deps=[s_next, pv, w])
        acc = acc * c[:, None] + pv           # in fp32: the tensor cores' running sum keeps ~14 bits
        w_i = w_i * alpha + gl.convert_layout(gl.max(w, 1), s_rows)
        sk_j = sk_next
        sv_j = sv_next

    # The last tile: the causal diagonal, or the end of the keys; masked.
    last = n_tiles - 1
    start_n = last * BLOCK_N
    p, m_i, l_i, sv, c, alpha = _softmax_tile(s, m_i, l_i, sv, qs, sk_j, sv_j, offs_m, start_n, N, BLOCK_N, CAUSAL,
                                              True, s_cols, o_rows)
    p8 = _p_operand(p.to(gl.float8e4nv), p_layout)
    pv = warpgroup_mma(p8, v_smem.index(last % STAGES).permute((1, 0)), o_zero, use_acc=False, is_async=True)
    w = warpgroup_mma(gl.convert_layout(p8, pw_layout), ones_smem.permute((1, 0)), w_zero, use_acc=False,
                      is_async=True)
    pv, w = warpgroup_mma_wait(0, deps=[pv, w])
    acc = acc * c[:, None] + pv
    w_i = w_i * alpha + gl.convert_layout(gl.max(w, 1), s_rows)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    # O = acc * sv / w: divided by the sum of the rounded weights, not by l (attention_fp8._fwd_inner)
    o = acc * gl.convert_layout(sv / w_i, o_rows)[:, None]
    o = gl.convert_layout(o.to(O.dtype.element_ty), q_layout)
    gl.store(O + b * stride_ob + h * stride_oh + offs_qm[:, None] * stride_on + offs_qd[None, :], o,
             mask=(offs_qm < N)[:, None])
    gl.store(LSE + pid_bh * N + offs_m, m_i + gl.log2(l_i) - 8.0, mask=offs_m < N)


# Tiles per head dim. BLOCK_M is one or two of attention_fp8's 64-row query tiles (one warpgroup
# each); BLOCK_N must lie inside its key tile. STAGES: K/V slots in flight.
# maxnreg (a compile option, not a tile): at D = 64 ptxas would take 244 registers per thread, so two
# programs per SM; capped at 168 (a few bytes spilled: `python kernel_registers.py`), three fit in
# the 64K registers of an SM, and more warps hide the softmax's latency (SPEED.md, step 11).
CONFIGS = {64: dict(BLOCK_M=64, BLOCK_N=128, STAGES=3, maxnreg=168),
           128: dict(BLOCK_M=64, BLOCK_N=128, STAGES=3)}


@functools.lru_cache(maxsize=None)
def descriptor_blocks(D, BLOCK_N):
    """Block shape and shared-memory layout of each TMA descriptor the kernel takes (cached: building
    the layouts costs tens of microseconds of host time, per call)."""
    blocks = {"k_desc": [BLOCK_N, D], "vt_desc": [D, BLOCK_N]}
    return {name: (block, gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)) for name, block in blocks.items()}


def forward(q, k8, sk, vt8, sv, causal, qk_scale):
    """O and LSE2 from BF16/FP16 q (B, H, N, D) and the FP8 copies k8 (B*H_kv, N_pad, D), vt8
    (B*H_kv, D, N_pad) with their scales, as attention_fp8._forward makes them (vt8's keys permuted
    within each 32, _p_operand); qk_scale = tau * log2(e)."""
    B, H, N, D = q.shape
    BH_kv, n_pad, _ = k8.shape
    cfg = dict(CONFIGS[D])
    blocks = descriptor_blocks(D, cfg["BLOCK_N"])
    k_desc = TensorDescriptor.from_tensor(k8.view(BH_kv * n_pad, D), *blocks["k_desc"])
    vt_desc = TensorDescriptor.from_tensor(vt8.view(BH_kv * D, n_pad), *blocks["vt_desc"])
    o = attention_fp8._empty_as(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    G, grid = attention_fp8._grid(attention_fp8._cdiv(N, cfg["BLOCK_M"]), B * H, 2 * n_pad * D, causal)   # K^, V^T
    attention_fp8._launch(_fwd_kernel_hopper, grid,
                          (q, *q.stride(), k_desc, sk, vt_desc, sv, o, lse, qk_scale, N, n_pad, H, BH_kv // B,
                           *o.stride()[:3]), D=D, CAUSAL=causal, G=G, num_warps=cfg["BLOCK_M"] // 16, **cfg)
    return o, lse


# ---------------------------------------------------------------------------------------------
# Backward, key-owned: dK and dV (the math of attention_fp8._bwd_dkdv_kernel, same FP8 operands
# and scales). Each warpgroup owns 64 keys; per query tile i (64 rows, one Q and one dO scale):
#
#     S^T = K^ Q^_i^T,  dP^T = V^ dO^_i^T         two async wgmmas, issued together
#     256 P^T = exp2(S^T f - LSE2_i + 8)          once S^T is in; P^T^ stays in registers
#     dV += (256 P^T)^ dO^_i                      async, runs while dS^T is formed
#     256 dS^T = 256 P^T (dP^T c - delta_i)       once dP^T is in; per-key-row amax -> dS^T^
#     T = dS^T^ Q^_i;  dK += T * (row scale)      the row scales differ per tile, so T is a
#                                                 separate accumulator, added in registers
#
# dV: dO's scale is one number per query tile, so dV sums in the tensor cores in the units of the
# last tile's scale (as O does in the forward): dv <- dv * sdo_before / sdo_i + P^T^ dO^_i.
# Hopper's FP8 MMA keeps only about 14 bits of that running sum (DeepSeek-V3 report, section 3.3.2),
# and small contributions added to a large dv lose their low bits. So each head's query tiles run
# from the last back to the diagonal: far queries, whose P is small, come first, and dv grows toward
# its final size (on N(0,1) inputs this matched the Triton kernel's dV error to four digits where
# diagonal-first did not). Where dO has a nonzero mean, dV's terms share a sign and the sum grows with
# every tile whatever the order (dV 3.6% low at N = 4096 and 15% at N = 16384 with dO = 1 + 0.1
# N(0,1); SPEED.md, step 17). So every DV_FLUSH query tiles the tensor cores' sum is added to an fp32
# dV in shared memory (32 KiB at D = 128) and restarts from zero. A second fp32 accumulator in
# registers, the forward's fix, does not fit: dK, dV and T alone take 192 of the 255 registers.
#
# Registers per thread at D = 128: dK and dV take 64 each, S^T and dP^T 32 each, T 64 (after
# S^T and dP^T are dead). One warpgroup per program (BLOCK_N = 64) and two programs per SM ran
# faster than two warpgroups on 128 keys (1.47x vs 1.27x the Triton kernel at 2x16x8192x128).
# Q^, dO^ and their token-contiguous copies come in by TMA into two slots, two copies per tile. Query
# tiles run over every query head of the kv head (grouped-query attention): tile `it` counts
# across heads. P^T^ and dS^T^ go to the dV and dK wgmmas as register operands, as P~^ does in the
# forward: Q^T and dO^T hold each 32 queries permuted (_p_operand).
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _dkdv_next(it, n_tiles, bh, start_m, m_lo, m_first, BLOCK_M: gl.constexpr):
    """(batch * H + query head, first query row) of the query tile after tile `it` at (bh, start_m):
    each head's tiles run from the last (m_first) back to the diagonal (m_lo, see above), then the
    next query head's. The last tile has none after it and gives itself. Carried from tile to tile
    rather than derived from `it`: dividing `it` by the tiles per head cost integer divisions in
    three places per tile, 63 of the loop's 749 instructions at D = 128 (SPEED.md, step 13)."""
    more = it + 1 < n_tiles
    wrap = more & (start_m == m_lo)
    return gl.where(wrap, bh + 1, bh), gl.where(wrap, m_first, gl.where(more, start_m - BLOCK_M, start_m))


@gluon.jit
def _dkdv_load(bh, start_m, slot, ready, qdo_desc, qdot_desc, qdo_smem, qdot_smem,
               N_pad, pred, D: gl.constexpr, BLOCK_M: gl.constexpr):
    bar = ready.index(slot)
    mbarrier.expect(bar, 4 * BLOCK_M * D, pred=pred)
    tma_load(qdo_desc, [0, bh * N_pad + start_m, 0], bar, qdo_smem.index(slot), pred=pred)
    tma_load(qdot_desc, [0, bh * D, start_m], bar, qdot_smem.index(slot), pred=pred)


@gluon.jit
def _dkdv_rows_copy(bh, start_m, rows_smem, b, H, LSE, stride_lb, DELTA, N, N_pad, BLOCK_M: gl.constexpr,
                    WARPS: gl.constexpr):
    """Starts copying the query tile's LSE and delta into rows_smem (cp.async, one group): LSE in its
    first BLOCK_M floats, delta in the next, one float per thread. Through shared memory rather than
    loaded into registers a tile ahead (step 12), because ptxas moved those loads: Nsight Compute
    found them issued after the tile's last wgmma wait, and the loop's back edge waiting on them
    (13.8% of the warps' samples on long scoreboard, 5.5% before step 18; SPEED.md, step 18). A copy
    has no register to wait on; this tile reads its rows from shared memory while its wgmmas run."""
    i = gl.arange(0, 2 * BLOCK_M, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    is_lse = i < BLOCK_M
    offs_m = start_m + gl.where(is_lse, i, i - BLOCK_M)
    ptr = gl.where(is_lse, LSE + b * stride_lb + (bh - b * H) * N + offs_m, DELTA + bh * N_pad + offs_m)
    cp_async_load(rows_smem, ptr, mask=(offs_m < N) | ~is_lse)
    async_copy.commit_group()


@gluon.jit
def _dkdv_rows(bh, start_m, b, H, LSE, stride_lb, DELTA, SQ, SDO, N, N_pad, BLOCK_M: gl.constexpr,
               s_layout: gl.constexpr):
    """LSE and delta of the query tile's rows, and its Q and dO scales, into registers."""
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    # Query rows past N get LSE = +inf, hence P = 0 (their dO^ rows are zero too).
    lse = gl.load(LSE + b * stride_lb + (bh - b * H) * N + offs_m, mask=offs_m < N, other=float("inf"))
    delta = gl.load(DELTA + bh * N_pad + offs_m)
    sq, sdo = _dkdv_scales(bh, start_m, SQ, SDO, N_pad)
    return lse, delta, sq, sdo


@gluon.jit
def _dkdv_scales(bh, start_m, SQ, SDO, N_pad):
    """The query tile's Q and dO scales."""
    return gl.load(SQ + bh * N_pad + start_m), gl.load(SDO + bh * N_pad + start_m)


@gluon.jit
def _dkdv_tile(it, n_tiles, bh, start_m, lse, delta, sq, sdo, dk, dv, sdo_u, dv_smem, rows_smem, k_smem, v_smem,
               qdo_smem, qdot_smem, ready, qdo_desc, qdot_desc, SQ, SDO, LSE, stride_lb, DELTA,
               sk_qk, sv, offs_n, m_lo, m_first, b, H, N, N_pad,
               D: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
               MASK: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
               p_layout: gl.constexpr, DV_FLUSH: gl.constexpr, ROWS_CP_ASYNC: gl.constexpr,
               FLUSH_UNDER_DOTS: gl.constexpr):
    # Two slots: this tile's and the next's. Every warp is done with tile it - 1 (the wait at the
    # end of its step), so its slot takes the next tile. With ROWS_CP_ASYNC this tile's LSE and delta
    # came in during the tile before (cp.async): each thread waits for its own part, the barrier for
    # everyone's.
    if ROWS_CP_ASYNC:
        async_copy.wait_group(0)
    thread_barrier()
    bh_n, start_m_n = _dkdv_next(it, n_tiles, bh, start_m, m_lo, m_first, BLOCK_M)
    _dkdv_load(bh_n, start_m_n, (it + 1) % 2, ready, qdo_desc, qdot_desc, qdo_smem, qdot_smem,
               N_pad, it + 1 < n_tiles, D, BLOCK_M)

    slot = it % 2
    mbarrier.wait(ready.index(slot), (it // 2) & 1)
    # Each slot holds the [2, ...] box of one TMA copy: Q^'s tile above dO^'s (Q^T's above dO^T's).
    qdo = qdo_smem.index(slot).reshape([2 * BLOCK_M, D])
    qdot = qdot_smem.index(slot).reshape([2 * D, BLOCK_M])
    q_smem = qdo.slice(0, BLOCK_M)
    do_smem = qdo.slice(BLOCK_M, BLOCK_M)
    qt_smem = qdot.slice(0, D)
    dot_smem = qdot.slice(D, D)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    sT = warpgroup_mma(k_smem, q_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dpT = warpgroup_mma(v_smem, do_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if FLUSH_UNDER_DOTS:
        if (it % DV_FLUSH == 0) & (it > 0):     # the flush after the tile before (end of this function)
            dv_smem.store(dv_smem.load(o_layout) + dv * sdo_u)
            dv = gl.zeros([BLOCK_N, D], gl.float32, o_layout)

    # While they run, the next tile's LSE, delta and scales: this tile's came a tile ago. Loaded
    # here for this tile, their trip to global memory outlasted the two wgmmas and stalled the
    # softmax on every tile (SPEED.md, step 12).
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    if ROWS_CP_ASYNC:   # LSE and delta through shared memory (_dkdv_rows_copy), the scales as above
        sq_n, sdo_n = _dkdv_scales(bh_n, start_m_n, SQ, SDO, N_pad)
        lse_n, delta_n = lse, delta     # unused: the loop drops them
        lse = rows_smem.slice(0, BLOCK_M).load(gl.SliceLayout(0, s_layout))
        delta = rows_smem.slice(BLOCK_M, BLOCK_M).load(gl.SliceLayout(0, s_layout))
        # Once every warp has them, the next tile's come in (one slot: two would not leave room for
        # two programs per SM at D = 128).
        thread_barrier()
        _dkdv_rows_copy(bh_n, start_m_n, rows_smem, b, H, LSE, stride_lb, DELTA, N, N_pad, BLOCK_M, BLOCK_N // 16)
        if start_m + BLOCK_M > N:   # query rows past N get LSE = +inf, hence P = 0 (their dO^ rows are zero too)
            lse = gl.where(offs_m < N, lse, float("inf"))
    else:
        lse_n, delta_n, sq_n, sdo_n = _dkdv_rows(bh_n, start_m_n, b, H, LSE, stride_lb, DELTA, SQ, SDO, N, N_pad,
                                                 BLOCK_M, s_layout)

    sT = warpgroup_mma_wait(1, deps=[sT])
    if MASK:
        sT = gl.where(offs_m[None, :] >= offs_n[:, None], sT, float("-inf"))
    pT = gl.exp2(sT * gl.maximum(sk_qk * sq, 1e-30) - (lse - 8.0)[None, :])    # 256 P^T (f floored, see above)
    # P^T^ to the dV wgmma from registers: dO^T's queries are stored permuted (_p_operand)
    p_op = _p_operand(pT.to(gl.float8e4nv), p_layout)
    # dV in the units of dO's scale (a zero tile of dO, scale 0, adds nothing: the units stay)
    sdo_new = gl.where(sdo > 0, sdo, sdo_u)
    dv = warpgroup_mma(p_op, dot_smem.permute((1, 0)),
                       dv * gl.where(sdo_new > 0, sdo_u / sdo_new, 1.0), is_async=True)

    dpT = warpgroup_mma_wait(1, deps=[dpT])
    dsT = pT * (dpT * (sv * sdo) - delta[None, :])                            # 256 dS^T
    # one dynamic scale per key row: dK reduces over queries, so it factors out of the dot
    amax = gl.maximum(gl.max(gl.abs(dsT), 1), 1e-30)
    ds8 = (dsT * (448.0 / amax)[:, None]).to(gl.float8e4nv)
    ds_op = _p_operand(ds8, p_layout)       # Q^T's queries permuted alike
    t = warpgroup_mma(ds_op, qt_smem.permute((1, 0)), gl.zeros([BLOCK_N, D], gl.float32, o_layout),
                      use_acc=False, is_async=True)
    t, dv = warpgroup_mma_wait(0, deps=[t, dv])
    # The tensor cores' running sum keeps about 14 bits: every DV_FLUSH tiles it is added, in dO's
    # units, to dV in fp32 in shared memory (each thread its own elements), and restarts. Here, with
    # no wgmma in flight; or (FLUSH_UNDER_DOTS) at the top of the next tile, once its S^T and dP^T are
    # issued, under them: the same sums bit for bit, faster at D = 64 only, under Triton 3.6 (DKDV_CONFIGS).
    if not FLUSH_UNDER_DOTS:
        if it % DV_FLUSH == DV_FLUSH - 1:
            dv_smem.store(dv_smem.load(o_layout) + dv * sdo_new)
            dv = gl.zeros([BLOCK_N, D], gl.float32, o_layout)
    row_scale = gl.convert_layout(amax * (sq / (448.0 * 256.0)), gl.SliceLayout(1, o_layout))
    return lse_n, delta_n, sq_n, sdo_n, dk + t * row_scale[:, None], dv, sdo_new


@gluon.jit
def _dkdv_kernel_hopper(qdo_desc, SQ, qdot_desc, K8, SK, V8, SV, SDO, LSE, stride_lb, DELTA, DK, DV,
                        sm_scale, qk_scale, N, N_pad, H, H_KV, stride_kb, stride_kh, stride_kn,
                        D: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
                        DV_FLUSH: gl.constexpr, G: gl.constexpr, ROWS_CP_ASYNC: gl.constexpr = False,
                        FLUSH_UNDER_DOTS: gl.constexpr = False):
    gl.static_assert(DV_FLUSH >= 1, "query tiles per flush of dV's tensor-core sum into fp32")
    gl.static_assert(BLOCK_M == 64, "BLOCK_M is the 64-row query tile: one Q and one dO scale per tile")
    gl.static_assert(BLOCK_N % 64 == 0, "one warpgroup per 64 keys")
    WARPS: gl.constexpr = BLOCK_N // 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_M, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, D, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    io_layout: gl.constexpr = _q_layout(D, WARPS)

    pid_n, pid_bhk = _program_tile(G, False)      # causal: the first key tiles see the most queries
    b = pid_bhk // H_KV
    hk = pid_bhk % H_KV
    group = H // H_KV
    start_n = pid_n * BLOCK_N

    # K^ and V^ of this program's keys, into shared memory once
    offs_kn = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, io_layout))
    offs_kd = gl.arange(0, D, layout=gl.SliceLayout(0, io_layout))
    kv_off = pid_bhk * N_pad * D + offs_kn[:, None] * D + offs_kd[None, :]
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float8e4nv)
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_N, D], kv_layout, gl.load(K8 + kv_off))
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_N, D], kv_layout, gl.load(V8 + kv_off))
    sk_qk = gl.load(SK + pid_bhk * N_pad + start_n) * qk_scale
    sv = gl.load(SV + pid_bhk * N_pad + start_n)

    # Q^, dO^ (rows) and Q^T, dO^T (token-contiguous) tiles: two slots, one mbarrier each. Q^ and dO^
    # are the two halves of one buffer (attention_fp8._quantize), so one TMA copy of a [2, 64, D] box
    # brings both tiles (and one of [2, D, 64] Q^T's and dO^T's): two copies per tile instead of four.
    # The four, with their predicates, descriptor addresses and barriers, held about 16% of this
    # kernel's stall samples (ncu); two made it 1.05x faster (SPEED.md, step 13).
    qdo_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, 2, BLOCK_M, D], qdo_desc.layout)
    qdot_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, 2, D, BLOCK_M], qdot_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
    # dV in fp32, in true units: the tensor cores' sum is flushed into it every DV_FLUSH tiles
    # Swizzled: the accumulator layout gives each thread 2 adjacent columns of 8 rows spaced D
    # floats apart, so unswizzled the 4 rows of a half-warp's 64-bit access fall in one 8-bank group
    # (a 4-way conflict). XOR-ing 8-column groups with (row % 4) spreads them over all 32 banks.
    dv_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, D], gl.SwizzledSharedLayout(8, 1, 4, [1, 0]))
    # LSE and delta of the next query tile, copied in during this one (_dkdv_rows_copy)
    rows_smem = gl.allocate_shared_memory(gl.float32, [2 * BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    fence_async_shared()     # K^, V^ and the barriers, before the async proxy (TMA, wgmma) uses them
    thread_barrier()

    # Query tiles per head: from the diagonal (causal) or 0 to the end; query rows past N have
    # LSE = +inf (P = 0) and dO^ = 0, so the last tile needs no mask. Causal: the tiles that overlap
    # the key band [start_n, start_n + BLOCK_N) need the mask, the rest do not.
    m_end = gl.cdiv(N, BLOCK_M) * BLOCK_M
    if CAUSAL:
        m_lo = start_n
        n_diag = gl.minimum(BLOCK_N // BLOCK_M, (m_end - m_lo) // BLOCK_M)
    else:
        m_lo = 0
        n_diag = 0
    n_m = (m_end - m_lo) // BLOCK_M
    n_tiles = group * n_m
    bh0 = b * H + hk * group        # the kv head's first query head
    m_first = m_end - BLOCK_M       # each head's first query tile (see above)
    _dkdv_load(bh0, m_first, 0, ready, qdo_desc, qdot_desc, qdo_smem, qdot_smem,
               N_pad, True, D, BLOCK_M)

    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    dk = gl.zeros([BLOCK_N, D], gl.float32, o_layout)
    dv = gl.zeros([BLOCK_N, D], gl.float32, o_layout)
    if ROWS_CP_ASYNC:
        _dkdv_rows_copy(bh0, m_first, rows_smem, b, H, LSE, stride_lb, DELTA, N, N_pad, BLOCK_M, WARPS)
        sq, sdo = _dkdv_scales(bh0, m_first, SQ, SDO, N_pad)
        lse = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(0, s_layout))     # unused: read from rows_smem
        delta = lse
    else:
        lse, delta, sq, sdo = _dkdv_rows(bh0, m_first, b, H, LSE, stride_lb, DELTA, SQ, SDO, N, N_pad, BLOCK_M, s_layout)
    sdo_u = sdo     # dv's units: the first tile's dO scale
    dv_smem.store(dv)
    for g in range(group):
        for j in range(0, n_m - n_diag):     # away from the diagonal: no mask
            lse, delta, sq, sdo, dk, dv, sdo_u = _dkdv_tile(
                g * n_m + j, n_tiles, bh0 + g, m_first - j * BLOCK_M, lse, delta, sq, sdo, dk, dv, sdo_u, dv_smem,
                rows_smem, k_smem, v_smem, qdo_smem, qdot_smem, ready, qdo_desc, qdot_desc,
                SQ, SDO, LSE, stride_lb, DELTA, sk_qk, sv, offs_n, m_lo, m_first, b, H, N, N_pad, D, BLOCK_N, BLOCK_M,
                False, s_layout, o_layout, p_layout, DV_FLUSH, ROWS_CP_ASYNC, FLUSH_UNDER_DOTS)
        for j in range(n_m - n_diag, n_m):
            lse, delta, sq, sdo, dk, dv, sdo_u = _dkdv_tile(
                g * n_m + j, n_tiles, bh0 + g, m_first - j * BLOCK_M, lse, delta, sq, sdo, dk, dv, sdo_u, dv_smem,
                rows_smem, k_smem, v_smem, qdo_smem, qdot_smem, ready, qdo_desc, qdot_desc,
                SQ, SDO, LSE, stride_lb, DELTA, sk_qk, sv, offs_n, m_lo, m_first, b, H, N, N_pad, D, BLOCK_N, BLOCK_M,
                CAUSAL, s_layout, o_layout, p_layout, DV_FLUSH, ROWS_CP_ASYNC, FLUSH_UNDER_DOTS)
    for i in gl.static_range(2):
        mbarrier.invalidate(ready.index(i))
    if ROWS_CP_ASYNC:
        async_copy.wait_group(0)     # the last tile's copy of rows it never reads

    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, io_layout))
    out = b * stride_kb + hk * stride_kh + offs_kn[:, None] * stride_kn + offs_d[None, :]
    key_ok = (offs_kn < N)[:, None]
    gl.store(DK + out, gl.convert_layout((dk * sm_scale).to(DK.dtype.element_ty), io_layout), mask=key_ok)
    thread_barrier()    # the last tile's flush, if it had one, is written (as each tile's barrier orders the rest)
    dv = (dv_smem.load(o_layout) + dv * sdo_u) * (1.0 / 256.0)
    gl.store(DV + out, gl.convert_layout(dv.to(DV.dtype.element_ty), io_layout), mask=key_ok)


# BLOCK_N keys per program (one warpgroup per 64), inside attention_fp8's key tile; BLOCK_M is
# the 64-row query tile. Two query tiles in flight: a third slot ran no faster when it fit
# (results/dkdv_stages3_h200.txt), and beside dV's 32 KiB fp32 buffer it would leave one program per
# SM at D = 128.
# maxnreg: as for the forward, three programs per SM at D = 64, which made this kernel faster than
# the Triton one there (SPEED.md, step 11), for some spilled bytes (`python kernel_registers.py`).
# At D = 128 dK and dV alone take 128 registers per thread: two programs per SM is all that fits.
# DV_FLUSH: query tiles per flush of dV's tensor-core sum into fp32 (above). Where dO has a mean,
# dV's bias is -0.11% with 2 (the Triton kernel's, from P's rounding), about -0.2% with 4 and -0.5%
# with 8; 4 runs 1.04-1.06x faster than 2, and 8 only 1.02-1.03x faster than 4
# (results/dkdv_flush_swizzle_h200.txt).
# ROWS_CP_ASYNC: each query tile's LSE and delta come through shared memory (_dkdv_rows_copy) rather
# than loaded into registers a tile ahead. FLUSH_UNDER_DOTS: the flush of dV waits for the next tile's
# S^T and dP^T wgmmas and runs under them (_dkdv_tile). Each computes the same dV bit for bit, and
# each wins or loses a few percent depending on the head dim and on the ptxas that Triton bundles, so
# the choice follows both (results/dkdv_rows_cp_async_h200.txt, dkdv_flush_under_dots_h200.txt;
# SPEED.md, steps 19-20): under Triton 3.6, cp.async at D = 128 only and the flush under the dots at
# D = 64 only.
DKDV_CONFIGS = {64: dict(BLOCK_N=64, BLOCK_M=64, DV_FLUSH=4, ROWS_CP_ASYNC=False,
                         FLUSH_UNDER_DOTS=True, maxnreg=168),
                128: dict(BLOCK_N=64, BLOCK_M=64, DV_FLUSH=4, ROWS_CP_ASYNC=True,
                          FLUSH_UNDER_DOTS=False)}
# Triton 3.8 bundles ptxas 12.9 for Hopper (3.6: 12.8), which spills far more in the D = 64 kernel as
# configured above under the 168-register cap (496 bytes, 140 under 3.6); with ROWS_CP_ASYNC on and
# FLUSH_UNDER_DOTS off it ran 1.18x faster there (results/triton38_h200.txt, section 8), where under
# 3.6 that way lost (0.929x, step 19).
if tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 8):
    DKDV_CONFIGS[64].update(ROWS_CP_ASYNC=True, FLUSH_UNDER_DOTS=False)


@functools.lru_cache(maxsize=None)
def dkdv_descriptor_blocks(D, BLOCK_M):
    blocks = {"qdo_desc": [2, BLOCK_M, D], "qdot_desc": [2, D, BLOCK_M]}
    return {name: (block, gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)) for name, block in blocks.items()}


def _pair(x, y):
    """x and y, the two halves of one buffer (attention_fp8._quantize makes them so), as one
    (2, rows, cols) tensor: a TMA box of [2, ...] brings a tile of each in one copy."""
    if not (x.is_contiguous() and y.is_contiguous() and y.data_ptr() - x.data_ptr() == x.numel()):
        raise ValueError("attention_fp8_hopper.dkdv: Q^ and dO^ (Q^T and dO^T) must be the halves of one buffer")
    return x.as_strided((2, x.numel() // x.shape[-1], x.shape[-1]), (x.numel(), x.shape[-1], 1))


def dkdv(q8, sq, qt8, k8, sk, v8, sv, do8, sdo, dot8, lse, delta, dk, dv, causal, sm_scale, qk_scale):
    """dK and dV into dk, dv (B, H_kv, N, D), which must share strides (dv is written with dk's), from
    the FP8 copies attention_fp8._backward_piece makes (q8, do8 (B*H, N_pad, D) and qt8, dot8 (B*H, D,
    N_pad), each pair the two halves of one buffer (_pair), qt8's and dot8's queries permuted within
    each 32 (_p_operand); k8, v8 (B*H_kv, N_pad, D); scales per row),
    lse (B, H, N) and delta (B*H, N_pad)."""
    B, H_kv, N, D = dk.shape
    BH, n_pad, _ = q8.shape
    cfg = dict(DKDV_CONFIGS[D])
    blocks = dkdv_descriptor_blocks(D, cfg["BLOCK_M"])
    descs = {name: TensorDescriptor.from_tensor(_pair(x, y), *blocks[name])
             for name, x, y in (("qdo_desc", q8, do8), ("qdot_desc", qt8, dot8))}
    # a kv head's programs read Q^, Q^T, dO^ and dO^T of its group of query heads
    G, grid = attention_fp8._grid(attention_fp8._cdiv(N, cfg["BLOCK_N"]), B * H_kv, 4 * (BH // (B * H_kv)) * n_pad * D, causal)
    attention_fp8._launch(_dkdv_kernel_hopper, grid,
                          (descs["qdo_desc"], sq, descs["qdot_desc"], k8, sk, v8, sv, sdo,
                           lse, lse.stride(0), delta, dk, dv, sm_scale, qk_scale, N, n_pad,
                           BH // B, H_kv, *dk.stride()[:3]), D=D, CAUSAL=causal, G=G, num_warps=cfg["BLOCK_N"] // 16, **cfg)

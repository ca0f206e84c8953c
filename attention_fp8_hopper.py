"""
The FP8 attention forward of attention_fp8.py, written in Gluon for Hopper (sm_90): same inputs,
same FP8 operands and scales, same O and LSE up to fp32 rounding, so the backward runs unchanged.

Why a second forward. Triton issues a tile's dots, exp2 and casts in program order, so the
tensor cores idle while a warp does its softmax (README, "Speed"). Gluon exposes Hopper's
asynchronous warpgroup MMA, TMA and mbarriers, so the schedule is written out:

    iteration j:  refill the slot tile j-1 used with tile j-1+STAGES       (TMA)
                  issue S_{j+1} = Q^ K_{j+1}^T                             (async, tensor cores)
                  softmax of S_j; P~_j^ to shared memory                   (CUDA cores, meanwhile)
                  issue O += P~_j^ V^_j; wait for both dots

Letting P V run on into the next softmax too (FlashAttention-3's full overlap) makes ptxas
serialize every wgmma (advisory C7514), so each iteration ends on both dots. On the H200 this is
1.08-1.10x the Triton forward at head dim 128 and N >= 4096, and slower at head dim 64 (README,
step 4), hence attention_fp8.HOPPER_FORWARD.

The value of V's tile scale rides in the accumulator's units: acc holds O * l / sv_last, so
    acc <- acc * (alpha_j * sv_{j-1} / sv_j) + P~_j V^_j
is exact in real arithmetic (one fp32 multiply per row instead of a second accumulator), and
O = acc * sv_last / l at the end.

One warpgroup (4 warps) owns 64 query rows (one query tile, one Q scale), and two programs share
an SM, so one's softmax can run under the other's dots.

Gluon has no interpreter: CPU CI compiles this kernel for sm_90a (test_attention.py) and the GPU
tests compare it with the Triton forward.
"""
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@triton.constexpr_function
def _q_layout(D, num_warps):
    """Coalesced loads of a (BLOCK_M, D) BF16 tile: 16 bytes per thread along D."""
    tpw_d = min(D // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // tpw_d, tpw_d], [num_warps, 1], [1, 0])


@gluon.jit
def _softmax_tile(s, m_i, l_i, sv, qs, SK, SVT, offs_m, start_n, N, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  MASK: gl.constexpr, s_cols: gl.constexpr, o_rows: gl.constexpr):
    """One tile of the online softmax, in base 2 (see attention_fp8._fwd_inner), f = Q's row scale
    * K's tile scale * tau * log2(e): returns p~ = exp2(qk * f - m + 8) in fp32, the new m and l,
    V's tile scale sv, and c = alpha * sv_before / sv, the factor acc takes before P~ V is added."""
    f = qs * gl.load(SK + start_n)
    if MASK:
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=s_cols)
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * f)
    p = gl.exp2(s * f[:, None] - (m_new - 8.0)[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    sv_j = gl.load(SVT + start_n)
    return p, m_new, l_i, sv_j, gl.convert_layout(alpha * (sv / sv_j), o_rows)


@gluon.jit
def _fwd_kernel_hopper(Q, stride_qb, stride_qh, stride_qn, stride_qd, k_desc, SK, vt_desc, SVT, O, LSE, qk_scale,
                       N, N_pad, H, H_KV, stride_ob, stride_oh, stride_on,
                       D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                       STAGES: gl.constexpr):
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
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_layout: gl.constexpr = _q_layout(D, WARPS)

    pid_m = gl.program_id(0)
    if CAUSAL:      # longest rows first, as in attention_fp8
        pid_m = gl.num_programs(0) - 1 - pid_m
    pid_bh = gl.program_id(1)
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
    amax = gl.maximum(amax, 1e-30)
    q8 = (q * (448.0 / amax)[:, None]).to(gl.float8e4nv)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, D],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float8e4nv), q8)
    qs = gl.convert_layout((amax / 448.0) * qk_scale, s_rows)     # Q's row scale times tau * log2(e)
    SK += bh_kv * N_pad
    SVT += bh_kv * N_pad

    # K^ and V^T tiles: a ring of STAGES slots, one mbarrier each, filled by TMA.
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BLOCK_N], vt_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    # P~^ of the tile in flight, for the P V wgmma
    p_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.float8e4nv))
    fence_async_shared()     # Q^ and the barriers, before the async proxy (TMA, wgmma) uses them
    gl.thread_barrier()      # every warp's part of Q^ is written before any warp's wgmma reads it

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
        tma.async_copy_global_to_shared(k_desc, [k_row + t * BLOCK_N, 0], ready.index(t), k_smem.index(t),
                                        pred=t < n_tiles)
        tma.async_copy_global_to_shared(vt_desc, [v_row, t * BLOCK_N], ready.index(t), v_smem.index(t),
                                        pred=t < n_tiles)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=s_rows)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, s_rows)
    sv = gl.load(SVT)

    mbarrier.wait(ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
    # Every tile but the last lies below the causal diagonal and inside N: no mask.
    for j in range(0, n_tiles - 1):
        # Every warp is done with tile j - 1 (the wait at the end of the last iteration): refill its slot.
        gl.thread_barrier()
        refill = j - 1 + STAGES
        slot = refill % STAGES
        load = (j >= 1) & (refill < n_tiles)
        mbarrier.expect(ready.index(slot), tile_bytes, pred=load)
        tma.async_copy_global_to_shared(k_desc, [k_row + refill * BLOCK_N, 0], ready.index(slot), k_smem.index(slot),
                                        pred=load)
        tma.async_copy_global_to_shared(vt_desc, [v_row, refill * BLOCK_N], ready.index(slot), v_smem.index(slot),
                                        pred=load)
        # S of the next tile runs on the tensor cores while this tile's softmax runs on the CUDA cores.
        nxt = j + 1
        mbarrier.wait(ready.index(nxt % STAGES), (nxt // STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        start_n = j * BLOCK_N
        p, m_i, l_i, sv, c = _softmax_tile(s, m_i, l_i, sv, qs, SK, SVT, offs_m, start_n, N, BLOCK_N, CAUSAL, False,
                                           s_cols, o_rows)
        # The wgmma reads P~^ from shared memory: handing it over in registers needs ~250 shuffle
        # instructions per tile into the operand layout (measured slower, README).
        p_smem.store(p.to(gl.float8e4nv))
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(p_smem, v_smem.index(j % STAGES).permute((1, 0)), acc * c[:, None], is_async=True)
        # Both done before the next softmax. (Letting P V run on into it makes ptxas serialize every
        # wgmma: it gives the next S the registers the softmax still reads.)
        s, acc = warpgroup_mma_wait(0, deps=[s_next, acc])

    # The last tile: the causal diagonal, or the end of the keys; masked.
    last = n_tiles - 1
    start_n = last * BLOCK_N
    p, m_i, l_i, sv, c = _softmax_tile(s, m_i, l_i, sv, qs, SK, SVT, offs_m, start_n, N, BLOCK_N, CAUSAL, True,
                                       s_cols, o_rows)
    p8 = gl.convert_layout(p.to(gl.float8e4nv), p_layout)
    acc = warpgroup_mma(p8, v_smem.index(last % STAGES).permute((1, 0)), acc * c[:, None])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    o = acc * gl.convert_layout(sv / l_i, o_rows)[:, None]
    o = gl.convert_layout(o.to(O.dtype.element_ty), q_layout)
    gl.store(O + b * stride_ob + h * stride_oh + offs_qm[:, None] * stride_on + offs_qd[None, :], o,
             mask=(offs_qm < N)[:, None])
    gl.store(LSE + pid_bh * N + offs_m, m_i + gl.log2(l_i) - 8.0, mask=offs_m < N)


# Tiles per head dim. BLOCK_M is one or two of attention_fp8's 64-row query tiles (one warpgroup
# each); BLOCK_N must lie inside its key tile. STAGES: K/V slots in flight.
CONFIGS = {64: dict(BLOCK_M=64, BLOCK_N=128, STAGES=3), 128: dict(BLOCK_M=64, BLOCK_N=128, STAGES=3)}


@functools.lru_cache(maxsize=None)
def descriptor_blocks(D, BLOCK_N):
    """Block shape and shared-memory layout of each TMA descriptor the kernel takes (cached: building
    the layouts costs tens of microseconds of host time, per call)."""
    blocks = {"k_desc": [BLOCK_N, D], "vt_desc": [D, BLOCK_N]}
    return {name: (block, gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)) for name, block in blocks.items()}


def forward(q, k8, sk, vt8, sv, causal, qk_scale, config=None):
    """O and LSE2 from BF16/FP16 q (B, H, N, D) and the FP8 copies k8 (B*H_kv, N_pad, D), vt8
    (B*H_kv, D, N_pad) with their scales, as attention_fp8._forward makes them; qk_scale = tau * log2(e)."""
    B, H, N, D = q.shape
    BH_kv, n_pad, _ = k8.shape
    cfg = dict(config or CONFIGS[D])
    blocks = descriptor_blocks(D, cfg["BLOCK_N"])
    k_desc = TensorDescriptor.from_tensor(k8.view(BH_kv * n_pad, D), *blocks["k_desc"])
    vt_desc = TensorDescriptor.from_tensor(vt8.view(BH_kv * D, n_pad), *blocks["vt_desc"])
    o = torch.empty((B, H, N, D), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    _fwd_kernel_hopper[(triton.cdiv(N, cfg["BLOCK_M"]), B * H)](
        q, *q.stride(), k_desc, sk, vt_desc, sv, o, lse, qk_scale, N, n_pad, H, BH_kv // B, *o.stride()[:3],
        D=D, CAUSAL=causal, num_warps=cfg["BLOCK_M"] // 16, **cfg)
    return o, lse

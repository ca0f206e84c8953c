"""A Gluon dQ kernel (pre-pass + dQ) for Hopper: the math of attention_fp8._bwd_dq_kernel, one warpgroup
per 64 query rows, K^, V^ and K^T tiles through one TMA ring across both passes, and the next key
tile's S and dP issued while this tile's softmax (and dS, and in the main pass its dQ wgmma) runs."""
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

import attention_fp8
from attention_fp8_hopper import _p_operand, _q_layout, _row_reduce, thread_barrier, tma_load


@gluon.jit
def _dq_load(g, n_pre, total, k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, ready, k_row, kt_row,
             BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    """Global tile g (the pre-pass's n_pre tiles, then the main pass's) into its slot: K^ and V^,
    and K^T in the main pass."""
    pred = g < total
    main = g >= n_pre
    j = gl.where(main, g - n_pre, g)
    slot = g % STAGES
    bar = ready.index(slot)
    mbarrier.expect(bar, 2 * BLOCK_N * D, pred=pred & (g < n_pre))
    mbarrier.expect(bar, 3 * BLOCK_N * D, pred=pred & main)
    tma_load(k_desc, [k_row + j * BLOCK_N, 0], bar, k_smem.index(slot), pred=pred)
    tma_load(v_desc, [k_row + j * BLOCK_N, 0], bar, v_smem.index(slot), pred=pred)
    tma_load(kt_desc, [kt_row, j * BLOCK_N], bar, kt_smem.index(slot), pred=pred & main)


@gluon.jit
def _dq_tile(s, dp, dq, pdp, r, delta, qs, sdo, lse, sk, sv, offs_m, j, g, kt_smem, N,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK: gl.constexpr,
             MAIN: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    """Tile j of a pass from its S and dP (raw dots): the pre-pass adds to pdp and r; the main pass
    issues dS^ K^ (async) and returns it for the caller to wait on with the next tile's dots."""
    s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    if MASK:
        offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=s_cols)
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        s = gl.where(keep, s, float("-inf"))
    p = gl.exp2(s * gl.maximum(qs * sk, 1e-30)[:, None] - lse[:, None])
    c = sdo * sv
    if MAIN:
        ds = p * (dp * c[:, None] - delta[:, None])
        amax = gl.maximum(_row_reduce(gl.abs(ds), True), 1e-30)
        ds8 = _p_operand((ds * (448.0 / amax)[:, None]).to(gl.float8e4nv), p_layout)
        t = warpgroup_mma(ds8, kt_smem.index(g % STAGES).permute((1, 0)),
                          gl.zeros([BLOCK_M, D], gl.float32, o_layout), use_acc=False, is_async=True)
        return t, amax * (sk / 448.0), pdp, r
    else:
        pdp += _row_reduce(p * dp, False) * c
        r += _row_reduce(p, False)
        return dq, sk, pdp, r


@gluon.jit
def _dq_pass(g0, n_tiles, n_pre, total, dq, pdp, r, delta, q_smem, do_smem, qs, sdo, lse, SK, SV, offs_m, N,
             k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, ready, k_row, kt_row,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
             CAUSAL: gl.constexpr, MAIN: gl.constexpr,
             s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(ready.index(g0 % STAGES), (g0 // STAGES) & 1)
    s = warpgroup_mma(q_smem, k_smem.index(g0 % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(do_smem, v_smem.index(g0 % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s, dp = warpgroup_mma_wait(0, deps=[s, dp])
    sk = gl.load(SK)
    sv = gl.load(SV)
    # Every tile but the last lies below the causal diagonal and inside N: no mask.
    for j in range(0, n_tiles - 1):
        g = g0 + j
        sk_next = gl.load(SK + (j + 1) * BLOCK_N)
        sv_next = gl.load(SV + (j + 1) * BLOCK_N)
        # Every warp is done with tile g - 1 (the wait at the end of its step): refill its slot.
        thread_barrier()
        _dq_load(g - 1 + STAGES, n_pre, gl.where(g >= 1, total, 0), k_desc, v_desc, kt_desc, k_smem, v_smem,
                 kt_smem, ready, k_row, kt_row, BLOCK_N, D, STAGES)
        nxt = g + 1
        mbarrier.wait(ready.index(nxt % STAGES), (nxt // STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        dp_next = warpgroup_mma(do_smem, v_smem.index(nxt % STAGES).permute((1, 0)), s_zero, use_acc=False,
                                is_async=True)
        t, t_scale, pdp, r = _dq_tile(s, dp, dq, pdp, r, delta, qs, sdo, lse, sk, sv, offs_m, j, g, kt_smem, N,
                                      BLOCK_M, BLOCK_N, D, STAGES, CAUSAL, False, MAIN, s_layout, o_layout, p_layout)
        if MAIN:
            s, dp, t = warpgroup_mma_wait(0, deps=[s_next, dp_next, t])
            dq += t * gl.convert_layout(t_scale, o_rows)[:, None]
        else:
            s, dp = warpgroup_mma_wait(0, deps=[s_next, dp_next])
        sk = sk_next
        sv = sv_next
    # The last tile: the causal diagonal, or the end of the keys; masked.
    j = n_tiles - 1
    g = g0 + j
    thread_barrier()
    _dq_load(g - 1 + STAGES, n_pre, gl.where(g >= 1, total, 0), k_desc, v_desc, kt_desc, k_smem, v_smem,
             kt_smem, ready, k_row, kt_row, BLOCK_N, D, STAGES)
    t, t_scale, pdp, r = _dq_tile(s, dp, dq, pdp, r, delta, qs, sdo, lse, sk, sv, offs_m, j, g, kt_smem, N,
                                  BLOCK_M, BLOCK_N, D, STAGES, CAUSAL, True, MAIN, s_layout, o_layout, p_layout)
    if MAIN:
        t = warpgroup_mma_wait(0, deps=[t])
        dq += t * gl.convert_layout(t_scale, o_rows)[:, None]
    return dq, pdp, r


@gluon.jit
def _dq_kernel_hopper(Q8, SQ, k_desc, SK, kt_desc, v_desc, SV, DO8, SDO, DO, O, LSE, stride_lb, DELTA, DQ,
                      sm_scale, qk_scale, N, N_pad, H, H_KV,
                      stride_dob, stride_doh, stride_don, stride_dod, stride_ob, stride_oh, stride_on,
                      stride_dqb, stride_dqh, stride_dqn,
                      D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                      MATCHED: gl.constexpr, STAGES: gl.constexpr):
    gl.static_assert(BLOCK_M == 64, "one warpgroup per 64 query rows")
    gl.static_assert(STAGES >= 3, "slots for the tile being freed, the tile in use and the next")
    WARPS: gl.constexpr = BLOCK_M // 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, D, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    io_layout: gl.constexpr = _q_layout(D, WARPS)

    pid_m = gl.program_id(0)
    if CAUSAL:      # longest rows first
        pid_m = gl.num_programs(0) - 1 - pid_m
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    bh_kv = b * H_KV + h // (H // H_KV)
    start_m = pid_m * BLOCK_M

    offs_qm = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, io_layout))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, io_layout))
    qo_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float8e4nv)
    rows = pid_bh * N_pad * D + offs_qm[:, None] * D + offs_qd[None, :]
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, D], qo_layout, gl.load(Q8 + rows))
    do_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, D], qo_layout, gl.load(DO8 + rows))
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=s_rows)
    row_ok = offs_m < N
    qs = gl.load(SQ + pid_bh * N_pad + offs_m) * qk_scale
    sdo = gl.load(SDO + pid_bh * N_pad + offs_m)
    lse = gl.load(LSE + b * stride_lb + h * N + offs_m, mask=row_ok, other=float("inf"))
    SK += bh_kv * N_pad
    SV += bh_kv * N_pad

    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D], v_desc.layout)
    kt_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BLOCK_N], kt_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()
    thread_barrier()

    if CAUSAL:
        hi = gl.minimum(start_m + BLOCK_M, N)
    else:
        hi = N
    n_tiles = gl.cdiv(hi, BLOCK_N)
    n_pre = n_tiles if MATCHED else 0
    total = n_pre + n_tiles
    k_row = bh_kv * N_pad
    kt_row = bh_kv * D
    for t in gl.static_range(STAGES):
        _dq_load(t, n_pre, total, k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, ready, k_row, kt_row,
                 BLOCK_N, D, STAGES)

    dq = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    pdp = gl.zeros([BLOCK_M], gl.float32, s_rows)
    r = gl.zeros([BLOCK_M], gl.float32, s_rows)
    if MATCHED:
        # The Delta-Matching pre-pass: the same P and dP tiles the main pass forms dS from.
        dq, pdp, r = _dq_pass(0, n_tiles, n_pre, total, dq, pdp, r, pdp, q_smem, do_smem, qs, sdo, lse, SK, SV,
                              offs_m, N, k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, ready, k_row, kt_row,
                              BLOCK_M, BLOCK_N, D, STAGES, CAUSAL, False, s_layout, o_layout, p_layout)
        delta = gl.where(row_ok, pdp / gl.where(row_ok, r, 1.0), 0.0)
    else:           # FlashAttention's delta from the forward's output: stale under FP8
        do_hi = gl.load(DO + b * stride_dob + h * stride_doh + offs_qm[:, None] * stride_don + offs_qd[None, :] * stride_dod,
                        mask=(offs_qm < N)[:, None], other=0.0).to(gl.float32)
        o_hi = gl.load(O + b * stride_ob + h * stride_oh + offs_qm[:, None] * stride_on + offs_qd[None, :],
                       mask=(offs_qm < N)[:, None], other=0.0).to(gl.float32)
        delta = gl.convert_layout(gl.sum(do_hi * o_hi, 1), s_rows)
    gl.store(DELTA + pid_bh * N_pad + offs_m, delta)     # for the dK/dV kernel

    dq, pdp, r = _dq_pass(n_pre, n_tiles, n_pre, total, dq, pdp, r, delta, q_smem, do_smem, qs, sdo, lse, SK, SV,
                          offs_m, N, k_desc, v_desc, kt_desc, k_smem, v_smem, kt_smem, ready, k_row, kt_row,
                          BLOCK_M, BLOCK_N, D, STAGES, CAUSAL, True, s_layout, o_layout, p_layout)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    out = gl.convert_layout((dq * sm_scale).to(DQ.dtype.element_ty), io_layout)
    gl.store(DQ + b * stride_dqb + h * stride_dqh + offs_qm[:, None] * stride_dqn + offs_qd[None, :], out,
             mask=(offs_qm < N)[:, None])


DQ_CONFIGS = {64: dict(BLOCK_M=64, BLOCK_N=64, STAGES=3), 128: dict(BLOCK_M=64, BLOCK_N=64, STAGES=3)}


@functools.lru_cache(maxsize=None)
def dq_descriptor_blocks(D, BLOCK_N):
    blocks = {"k_desc": [BLOCK_N, D], "v_desc": [BLOCK_N, D], "kt_desc": [D, BLOCK_N]}
    return {name: (block, gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)) for name, block in blocks.items()}


def dq(q8, sq, k8, sk, kt8, v8, sv, do8, sdo, do, o, lse, delta_buf, dq_out, causal, matched, sm_scale, qk_scale,
       config=None, **extra):
    BH, n_pad, D = q8.shape
    BH_kv = k8.shape[0]
    B, H, N, _ = dq_out.shape
    cfg = dict(config or DQ_CONFIGS[D], **extra)
    blocks = dq_descriptor_blocks(D, cfg["BLOCK_N"])
    k_desc = TensorDescriptor.from_tensor(k8.view(BH_kv * n_pad, D), *blocks["k_desc"])
    v_desc = TensorDescriptor.from_tensor(v8.view(BH_kv * n_pad, D), *blocks["v_desc"])
    kt_desc = TensorDescriptor.from_tensor(kt8.reshape(BH_kv * D, n_pad), *blocks["kt_desc"])
    attention_fp8._launch(_dq_kernel_hopper, (triton.cdiv(N, cfg["BLOCK_M"]), B * H),
                          (q8, sq, k_desc, sk, kt_desc, v_desc, sv, do8, sdo, do, o, lse, lse.stride(0), delta_buf,
                           dq_out, sm_scale, qk_scale, N, n_pad, H, BH_kv // B, *do.stride(), *o.stride()[:3],
                           *dq_out.stride()[:3]),
                          D=D, CAUSAL=causal, MATCHED=matched, num_warps=cfg["BLOCK_M"] // 16, **cfg)

# Mutant hunt 2 (report-only helper): single-edit bugs in attention_fp8.py, for tests/run_hunt.py
# (a copy of tests/mutate_kernel.py that loads this dict and runs test_attention.py + tests/test_host_code.py).
BUGS = {
    # ---- batch 1 ----
    "check_inputs_v_span_unchecked": (
        "elements = max(_span(q), _span(k), _span(v), B * H * _padded(N) * D)",
        "elements = max(_span(q), _span(k), B * H * _padded(N) * D)",
        "the 2^31-element bound forgets v: a v with gaps spanning 2^31+ reaches the kernels' 32-bit offsets"),
    "tiling_dkdv_block_spans_query_tiles": (
        "b & (b - 1) == 0 for b in blocks) and q_tile % dkdv[\"BLOCK_M\"] == 0\n",
        "b & (b - 1) == 0 for b in blocks)\n",
        "a dK/dV BLOCK_M larger than the query tile is accepted when dQ's BLOCK_M is a multiple of it "
        "(one Q^T / dO^T scale read for two query tiles)"),
    "fp8_supported_refuses_ada": (
        "and torch.cuda.get_device_capability(device) >= (8, 9))",
        "and torch.cuda.get_device_capability(device) >= (9, 0))",
        "fp8_supported says no for Ada (sm_89), which the kernels support"),
    "is_hopper_takes_blackwell": (
        "torch.cuda.get_device_capability(device)[0] != 9:",
        "torch.cuda.get_device_capability(device)[0] < 9:",
        "_is_hopper true on Blackwell (sm_100/120): the sm_90a-only Gluon kernels would be launched there"),
    "gluon_head_dims_ignored": (
        "if not (D in head_dims and B * H * N * N >= min_scores",
        "if not (B * H * N * N >= min_scores",
        "HOPPER_FORWARD / HOPPER_BACKWARD ignored: () no longer turns the Gluon kernels off"),
    "gluon_q_tile_unchecked": (
        "return (tile[\"q\"] == fwd[\"BLOCK_M\"] and tile[\"q\"] % dkdv[\"BLOCK_M\"] == 0",
        "return (tile[\"q\"] % dkdv[\"BLOCK_M\"] == 0",
        "the Gluon forward (Q scale per 64 rows) taken with a query tile of 128: backward's Q^ differs from forward's"),
    "dkdv_m_end_padded": (
        "m_end = tl.cdiv(N, BLOCK_M) * BLOCK_M",
        "m_end = N_pad",
        "dK/dV kernel walks every padded query block: reads delta rows no dQ block wrote"),
    "dq_first_key_tile_scale": (
        "dq += tl.dot(ds8, k) * (amax * (sk / 448.0))[:, None]",
        "dq += tl.dot(ds8, k) * (amax * (tl.load(SK) / 448.0))[:, None]",
        "dQ's K^ scale from the first key tile for every key tile"),
    "fwd_gqa_head_div_by_kv_heads": (
        "h // (H // H_KV)        # grouped-query",
        "h // H_KV        # grouped-query",
        "forward maps query head h to kv head h // H_kv, not h // group (equal when group == H_kv)"),
    "backward_qk_scale_default": (
        "    qk_scale = sm_scale * LOG2E\n    cfg = config(D, \"dq\", shared)",
        "    qk_scale = D ** -0.5 * LOG2E\n    cfg = config(D, \"dq\", shared)",
        "the backward recomputes S with the default scale 1/sqrt(D), not the caller's sm_scale"),
    "quantize_rtz": (
        "    x8 = (x * c).to(tl.float8e4nv)\n",
        "    x8 = (x * c).to(tl.float8e4nv, fp_downcast_rounding=\"rtz\")\n",
        "the quantize kernel's row copies rounded toward zero"),
    "custom_op_forward_always_causal": (
        "    return _forward(q, k, v, causal, sm_scale, compiled=True)",
        "    return _forward(q, k, v, True, sm_scale, compiled=True)",
        "the torch.compile path's forward ignores causal=False"),
    "custom_op_backward_default_scale": (
        "dq, dk, dv = _bwd_op(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale, ctx.delta)",
        "dq, dk, dv = _bwd_op(do, q, k, v, o, lse, ctx.causal, q.shape[-1] ** -0.5, ctx.delta)",
        "the torch.compile path's backward uses the default scale, not the caller's sm_scale"),
    # ---- batch 2 ----
    "tiling_block_over_pad": (
        "all(16 <= b <= PAD and b & (b - 1) == 0 for b in blocks)",
        "all(16 <= b and b & (b - 1) == 0 for b in blocks)",
        "a block of 256 (over the 128-row padding) accepted: the quantize grid n_pad // 256 leaves rows unquantized"),
    "gluon_dq_rows_unchecked": (
        ' and config(D, "dq")["BLOCK_M"] % dkdv["BLOCK_M"] == 0)',
        ')',
        "the Gluon dK/dV kernel (query blocks of 64) taken with dQ blocks of 32: it reads delta rows no dQ block wrote"),
    "halves_batch_split_at_two_kv_heads": (
        "    if H_kv > 1:\n        return [(slice(None), slice(0, H_kv // 2))",
        "    if H_kv > 2:\n        return [(slice(None), slice(0, H_kv // 2))",
        "two kv heads split by batch, not by head (off by one): at B = 1 one half is empty, the other the whole call"),
    "quantize_grid_from_n": (
        "_launch(_quantize_kernel, (n_pad // tile, B * H, len(specs))",
        "_launch(_quantize_kernel, (_cdiv(N, tile), B * H, len(specs))",
        "quantize grid over the tiles of N, not of N_pad: padding tiles of the FP8 copies and scales left unwritten"),
    "tiling_key_tile_ignores_dkdv": (
        'k_tile = max(fwd["BLOCK_N"], dq["BLOCK_N"], dkdv["BLOCK_N"])',
        'k_tile = max(fwd["BLOCK_N"], dq["BLOCK_N"])',
        "the key scale tile ignores the dK/dV kernel's BLOCK_N: its key blocks can span two K/V scale tiles"),
    "dkdv_lse_of_piece_heads": (
        "lse_bh = LSE + b * stride_lb + h * N",
        "lse_bh = LSE + bh * N",
        "dK/dV kernel finds a head's LSE at (b * H + h) * N, not by LSE's batch stride (wrong in head halves at B > 1)"),
}

"""The host-side Python of attention_fp8.py (what is not a @triton.jit kernel): input checks and their
bounds, the backward's halves, memory layouts handed to the kernels, the custom op's fake implementations
and saved tensors, the double-backward guard on the op, the debug sums and delta_stats' figures.

Each test here was written against a bug planted in that code which test_attention.py and
tests/test_monitor.py let through, and fails with it (tests/mutate_kernel.py covers the kernels). They
run the real kernels, under the Triton interpreter on CPU, at one or two tiles per head.

    python -m pytest -q tests/test_host_code.py
"""
import math
import warnings

import pytest
import torch

pytest.importorskip("triton")
import attention_fp8 as A  # noqa: E402
from test_attention import DEVICE, ON_GPU, dequantize, make_inputs, run_kernel  # noqa: E402

D = 64
SCALE = 1.0 / math.sqrt(D)
bthd = lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)     # noqa: E731  (B, T, H, D) memory, as the GPT's
d_slowest = lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2)     # noqa: E731  D not the unit stride


def gapped(x):
    """x's values in (B, T, H, D) memory with a gap after each token's heads, as q, k, v split from one matmul."""
    B, H, T, D = x.shape
    wide = torch.zeros(B, T, 2 * H * D, dtype=x.dtype, device=x.device)
    wide[..., :H * D] = x.transpose(1, 2).reshape(B, T, H * D)
    return wide[..., :H * D].view(B, T, H, D).transpose(1, 2)


def meta(*shape):
    """A tensor with shape and strides but no memory: _check_inputs' bounds at sizes no test could allocate.
    Meta tensors pass every check but the last, which refuses their device: reaching that error means the
    shape was accepted."""
    return torch.empty(shape, device="meta", dtype=torch.bfloat16)


def test_check_inputs_bounds_are_exact():
    """The two size limits refuse what is over them and nothing under: 65,535 (batch, head) pairs are one
    launch grid's axis, and a problem whose FP8 copy of Q is one block of 128 rows short of 2^31 elements
    (2^14 - 1 batches of 2 x 1024 x 64, N already a multiple of the 128-row padding) fits the 32-bit
    offsets. An over-padding _padded (1152 rows for 1024) or a _span that counts a whole extra stride per
    dimension refuses the second."""
    accepted = "unsupported device meta"
    with pytest.raises(ValueError, match=accepted):
        A._check_inputs(meta(65535, 1, 16, 64), meta(65535, 1, 16, 64), meta(65535, 1, 16, 64), "matched")
    x = meta(2**14 - 1, 2, 1024, 64)
    assert A._padded(1024) == 1024 and A._padded(1025) == 1152 and A._padded(1) == 128
    assert A._span(x) == x.numel() == 2**31 - 2**17
    assert A._span(x[:, :, 10:20]) == (2**14 - 2) * 2 * 1024 * 64 + 1024 * 64 + 10 * 64
    with pytest.raises(ValueError, match=accepted):
        A._check_inputs(x, x, x, "matched")
    with pytest.raises(ValueError, match="32-bit offsets"):     # one more batch: 2^31 exactly
        A._check_inputs(meta(2**14, 2, 1024, 64), meta(2**14, 2, 1024, 64), meta(2**14, 2, 1024, 64), "matched")
    # each of q, k and v on its own: small in shape, but strided over more than 2^31 elements
    wide = torch.empty_strided((1, 2, 16, 64), (2**32, 2**31, 64, 1), device="meta", dtype=torch.bfloat16)
    for which in range(3):
        x = [meta(1, 2, 16, 64) for _ in range(3)]
        x[which] = wide
        with pytest.raises(ValueError, match="32-bit offsets"):
            A._check_inputs(*x, "matched")
    # the (batch, head) pairs counted are q's: grouped-query k and v have fewer, but the launches take q's
    with pytest.raises(ValueError, match="batch x heads = 32768 x 2 = 65,536 is over 65,535"):
        A._check_inputs(meta(32768, 2, 16, 64), meta(32768, 1, 16, 64), meta(32768, 1, 16, 64), "matched")
    long = 2**24 + 1        # tiles of one head go on a grid's first axis, which holds 2^31 - 1 programs
    with pytest.raises(ValueError, match=accepted):
        A._check_inputs(meta(1, 1, long, 64), meta(1, 1, long, 64), meta(1, 1, long, 64), "matched")


def test_check_inputs_refuses_what_the_kernels_cannot_take():
    """Each check on its own: a mismatch in any one of the fields, with everything else right, must be
    refused before a kernel reads memory by the wrong shape, dtype or device."""
    q = torch.randn(2, 2, 16, 64, dtype=torch.bfloat16, device=DEVICE)

    def refused(exc, match, q, k, v):
        with pytest.raises(exc, match=match):
            A.attention(q, k, v)

    refused(ValueError, "batch, seq_len and head_dim", q, q[:1], q[:1])           # batch alone differs
    q128 = torch.randn(2, 2, 16, 128, dtype=torch.bfloat16, device=DEVICE)
    refused(ValueError, "batch, seq_len and head_dim", q, q128, q128)             # head_dim alone differs
    refused(TypeError, "share one dtype", q, q, q.half())                         # v's dtype alone differs
    refused(ValueError, r"empty input .*k/v \(2, 0, 16, 64\)", q, q[:, :0], q[:, :0])  # no kv heads: empty, not H % 0
    q3 = torch.randn(2, 3, 16, 64, dtype=torch.bfloat16, device=DEVICE)
    refused(ValueError, "q's 3 heads must be a multiple of k/v's 2 heads", q3, q, q)  # named the right way round
    refused(ValueError, "empty input", q[:0], q[:0], q[:0])                       # no batch
    refused(ValueError, "empty input", q[:, :0], q[:, :1], q[:, :1])              # no query heads (0 % 1 == 0)
    refused(ValueError, "empty input", q[:, :, :0], q[:, :, :0], q[:, :, :0])     # no tokens: not a ZeroDivisionError
    refused(ValueError, "one device", q, q.to("meta"), q.to("meta"))               # k, v elsewhere than q
    refused(ValueError, "one device", q, q, q.to("meta"))                          # v alone elsewhere


@pytest.mark.skipif(ON_GPU, reason="the interpreter's rounding matters only without a GPU")
def test_an_interpreter_that_rounds_unlike_the_gpu_is_named(monkeypatch):
    """On a CPU, Triton's stock interpreter casts to e4m3 half-up and unsaturated: the kernels run, and
    every error measured against FP32 comes out about 3x a GPU's, reported as the kernel's (grad_fidelity.py
    on a CPU did). attention() warns once where the interpreter's cast is not the GPU's; with the shim the
    tests install, it stays silent."""
    import triton_shim
    q = torch.randn(1, 1, 16, D, dtype=torch.bfloat16)
    monkeypatch.setattr(A, "_INTERPRETER_ROUNDING", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A.attention(q, q, q)        # the shim (conftest.py): no warning
    monkeypatch.setattr(A, "_INTERPRETER_ROUNDING", {})
    triton_shim.uninstall()
    try:
        with pytest.warns(UserWarning, match="interpreter casts to e4m3 unlike the GPU.*triton_shim"):
            A.attention(q, q, q)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            A.attention(q, q, q)    # once: the check is not run again
    finally:
        triton_shim.install()


@pytest.mark.skipif(ON_GPU, reason="the interpreter's rounding matters only without a GPU")
def test_a_compiled_first_call_checks_the_interpreter(monkeypatch):
    """A process whose first attention() call is compiled: the rounding check's probe, traced by Dynamo,
    made torch.compile(fullgraph=True) refuse the call (a torch.Generator inside the graph). It runs in
    the op's real implementation instead, and warns there as in eager mode."""
    import triton_shim
    q = torch.randn(1, 1, 16, D, dtype=torch.bfloat16)
    monkeypatch.setattr(A, "_INTERPRETER_ROUNDING", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        torch.compile(lambda q: A.attention(q, q, q), fullgraph=True, backend="aot_eager")(q)
    assert A._INTERPRETER_ROUNDING == {"ok": True}       # it ran, and the shim (conftest.py) passed it
    monkeypatch.setattr(A, "_INTERPRETER_ROUNDING", {})
    triton_shim.uninstall()
    try:
        with pytest.warns(UserWarning, match="interpreter casts to e4m3 unlike the GPU"):
            torch.compile(lambda q: A.attention(q, q, q) * 2.0, fullgraph=True, backend="aot_eager")(q)
    finally:
        triton_shim.install()


def test_gluon_threshold_counts_scores(monkeypatch):
    """HOPPER_*_MIN_SCORES = 2^29 counts B * H * N^2 scores (2x16x4096 is the first size to take the Gluon
    kernels in an eager call). Counted as B * H * N, no eager call would ever take them: only speed would
    show it, and only on a GPU. The decision alone, with _is_hopper made true."""
    pytest.importorskip("attention_fp8_hopper")
    monkeypatch.setattr(A, "_is_hopper", lambda device: True)
    for shape, gluon in (((2, 16, 4096, 64), True), ((1, 16, 16384, 128), True), ((2, 16, 2048, 64), False)):
        for head_dims, least in ((A.HOPPER_FORWARD, A.HOPPER_FORWARD_MIN_SCORES),
                                 (A.HOPPER_BACKWARD, A.HOPPER_BACKWARD_MIN_SCORES)):
            assert A._gluon(meta(*shape), head_dims, least) == gluon, (shape, least)


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device to be refused")
def test_a_rocm_gpu_is_refused_as_such(monkeypatch):
    """An MI300 reports compute capability 9.x: "(compute capability 9.4) has no FP8 tensor cores; ... needs
    8.9 or newer" contradicted itself. A ROCm GPU is named as one."""
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(A, "_fp8_cuda", lambda device: False)
    q = torch.randn(1, 1, 16, D, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(RuntimeError, match="is a ROCm GPU; the kernels are written for NVIDIA's"):
        A.attention(q, q, q)


def test_sm_scale_may_not_be_a_bool():
    """attention(q, k, v, True, True), causal given twice, would run with sm_scale = 1.0, a softmax 8-11x too
    sharp: a bool is an int to Python, and numbers.Real takes it."""
    q = torch.randn(1, 1, 16, 64, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(TypeError, match="sm_scale must be a Python number or None, got bool True"):
        A.attention(q, q, q, True, True)


def test_fp8_supported_on_cpu_only_under_the_interpreter(monkeypatch):
    """CPU tensors run only where the kernels were built for the interpreter: a model that asks
    fp8_supported("cpu") to pick its attention must hear no when they were built for a GPU."""
    monkeypatch.setattr(A, "INTERPRETED", False)
    assert not A.fp8_supported("cpu")
    monkeypatch.setattr(A, "INTERPRETED", True)
    assert A.fp8_supported("cpu")
    assert not A.fp8_supported("meta")


@pytest.mark.parametrize("B,H_kv", [(1, 1), (2, 1), (3, 1), (1, 2), (2, 3), (1, 5), (4, 16)])
def test_halves_cover_every_head_once(B, H_kv):
    """pieces=2 splits the kv heads (the batch, with one kv head) into two slices that together cover every
    (batch, kv head) exactly once, odd counts included; only a single (batch, kv head) stays one pass."""
    q, k = meta(B, 2 * H_kv, 8, 64), meta(B, H_kv, 8, 64)
    halves = A._halves(q, k, 2)
    if B * H_kv == 1:
        assert halves == []
        return
    assert len(halves) == 2 and all(k[bs, hs].numel() > 0 for bs, hs in halves), f"an empty half in {halves}"
    seen = torch.zeros(B, H_kv, dtype=torch.int64)
    for bs, hs in halves:
        seen[bs, hs] += 1
    assert (seen == 1).all(), f"(batch, kv head) pairs covered {seen.tolist()} times by {halves}"


def test_halves_split_the_batch_of_one_kv_head_when_big():
    """With one kv head, a problem over SPLIT_BYTES is split by batch (4 x (16 + 1) heads, 140 MiB of copies)."""
    halves = A._halves(meta(4, 16, 4096, 128), meta(4, 1, 4096, 128), None)
    assert halves == [(slice(0, 2), slice(None)), (slice(2, 4), slice(None))], halves


def test_debug_sums_cover_every_head_even_where_the_backward_would_split(monkeypatch):
    """debug=True runs one pass whatever SPLIT_BYTES says: its sums are per launch, and delta_stats reads
    them for every head. With SPLIT_BYTES = 0 (halves always) they must still be those of one pass."""
    B, H, N = 2, 2, 40
    q, k, v, do = make_inputs(B, H, H, N, D, seed=83)
    o, lse = A._forward(q, k, v, True, SCALE)
    whole = A._backward(do, q, k, v, o, lse, True, SCALE, "matched", debug=True)[3]
    monkeypatch.setattr(A, "SPLIT_BYTES", 0)
    split = A._backward(do, q, k, v, o, lse, True, SCALE, "matched", debug=True)[3]
    for name, x in whole.items():
        assert split[name].shape == x.shape == (B, H, N) and torch.equal(split[name], x), name


@pytest.mark.parametrize("arm", ["matched", "stale"])
def test_gradients_whatever_the_layouts(arm):
    """Every tensor the kernels read or write goes to them with its own strides: the gradients must be
    those of contiguous inputs, and dQ, dK, dV laid out as q, k, v, with (a) k as the GPT lays it out and
    v contiguous, (b) q with D as its slowest dimension, (c) q laid out as the GPT's, so O is too, while dO
    comes contiguous (the stale arm reads O by its own strides, not dO's). The layouts are checked on
    _backward's own outputs: autograd copies a leaf's .grad into the leaf's layout, which would hide them."""
    q, k, v, do = make_inputs(2, 2, 2, 40, D, seed=85)      # B = 2: batch strides count
    want = run_kernel(q, k, v, do, True, delta=arm)
    for case, (qq, kk, vv) in {"k (B,T,H,D), v contiguous": (q, bthd(k), v),
                                "q with D slowest": (d_slowest(q), k, v),
                                "q (B,T,H,D), dO contiguous": (bthd(q), k, v),
                                # the GPT's q: a slice of c_attn's wider output, so O cannot take its strides
                                "q a slice of a wider tensor": (gapped(q), k, v)}.items():
        o, lse = A._forward(qq, kk, vv, True, SCALE)
        grads = A._backward(do, qq, kk, vv, o if arm == "stale" else None, lse, True, SCALE, arm)
        assert torch.equal(o, want["o"]), f"{case}: o differs"
        for name, x, like in zip(("dq", "dk", "dv"), grads, (qq, kk, vv)):
            assert torch.equal(x, want[name]), f"{case}: {name} differs from that of contiguous inputs"
            if like.stride(-1) == 1 and torch.empty_like(like).stride() == like.stride():  # a layout without gaps
                assert x.stride() == like.stride(), f"{case}: {name} strides {x.stride()}, its input's {like.stride()}"
        qq, kk, vv = [x.detach().clone().requires_grad_() for x in (qq, kk, vv)]
        A.attention(qq, kk, vv, causal=True, delta=arm).backward(do)     # and through autograd
        for name, x in (("dq", qq.grad), ("dk", kk.grad), ("dv", vv.grad)):
            assert torch.equal(x, want[name]), f"{case}: {name} through autograd differs from that of contiguous inputs"


@pytest.mark.parametrize("arm", ["matched", "stale"])
def test_gradients_whatever_the_layout_of_do(arm):
    """dO comes from autograd laid out as the graph above made it: with D as its slowest dimension, or
    expanded from one element (stride 0 everywhere: the gradient of o.sum()). The quantize launches take
    any strides; the stale delta alone reads dO itself, by dO's strides, which must reach it."""
    q, k, v, do = make_inputs(2, 2, 2, 40, D, seed=89)      # B = 2: batch strides count
    o, lse = A._forward(q, k, v, True, SCALE)
    for case, d in {"D slowest": d_slowest(do), "expanded": do[:, :, :1, :1].expand_as(do),
                    "with gaps": gapped(do)}.items():
        want = A._backward(d.contiguous(), q, k, v, o, lse, True, SCALE, arm)
        got = A._backward(d, q, k, v, o, lse, True, SCALE, arm)
        for name, x, y in zip(("dq", "dk", "dv"), got, want):
            assert torch.equal(x, y), f"dO {case}: {name} differs from that of a contiguous dO"


@pytest.mark.parametrize("N", [100, 40])
def test_no_kernel_reads_memory_it_did_not_write(N, monkeypatch):
    """Every buffer torch hands the kernels uninitialized (outputs, FP8 copies, scales, LSE, delta), filled
    with NaN instead: the outputs must be those of a normal run, bit for bit, at an N that leaves padding
    rows in every tile. A buffer whose padding rows no kernel writes (delta's, say) and another kernel
    reads gives whatever the allocator left there, NaN only by luck. N = 40 leaves a whole block of 64
    padding rows in the 128 (a dK/dV kernel that ran its queries to N_pad read them; at N = 100 the
    blocks end at 128 either way)."""
    q, k, v, do = make_inputs(1, 2, 1, N, D, seed=91)
    want = {arm: run_kernel(q, k, v, do, True, delta=arm) for arm in ("matched", "stale")}
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def nan_filled(x):
        return x.fill_(float("nan")) if x.is_floating_point() else x
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan_filled(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: nan_filled(real_empty_like(*a, **kw)))
    assert torch.empty(2).isnan().all() and torch.empty(2, dtype=A.FP8).float().isnan().all()
    for arm in ("matched", "stale"):
        got = run_kernel(q, k, v, do, True, delta=arm)
        for name in ("o", "dq", "dk", "dv"):
            assert torch.equal(got[name], want[arm][name]), f"{arm}: {name} read memory no kernel wrote"


def test_debug_sums_are_their_definitions():
    """The debug dict's per-row sums, each against its definition on the dequantized FP8 operands, at
    B = 2 and H = 2 so that a mix-up of batch and head in their reshapes shows:
      delta = sum_j P_ij dP_ij (matched), pdp_abs_rowsum = sum_j |P_ij dP_ij|, p_rowsum = sum_j P_ij,
      ds_rowsum = sum_j P_ij (dP_ij - delta_i)."""
    B, H, N = 2, 2, 64
    q, k, v, do = make_inputs(B, H, H, N, D, seed=87)
    o, lse = A._forward(q, k, v, True, SCALE)
    info = A._backward(do, q, k, v, o, lse, True, SCALE, "matched", debug=True)[3]
    s = (dequantize(q, "q") @ dequantize(k, "k").transpose(-1, -2)) * SCALE
    p = torch.softmax(s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=DEVICE).triu(1), float("-inf")), -1)
    pdp = p * (dequantize(do, "do") @ dequantize(v, "v").transpose(-1, -2))
    delta = pdp.sum(-1)
    want = {"delta": delta, "pdp_abs_rowsum": pdp.abs().sum(-1), "p_rowsum": p.sum(-1),
            "ds_rowsum": (pdp - p * delta[..., None]).sum(-1)}
    # As test_matched_delta_equals_definition: FP8 products in exact fp32 on the interpreter, fewer
    # accumulator bits on Hopper's tensor cores. ds_rowsum is zero up to rounding: bounded by |P dP|.
    rel = 3e-4 if ON_GPU else 1e-5
    for name, ref in want.items():
        x = info[name]
        assert x.shape == (B, H, N), f"{name}: shape {tuple(x.shape)}"
        bound = rel * (want["pdp_abs_rowsum"] if name == "ds_rowsum" else ref.abs()).max().item()
        err = (x.double() - ref).abs().max().item()
        assert err < bound, f"{name} off its definition by {err:.3e} (bound {bound:.3e})"


@pytest.mark.parametrize("causal,sm_scale", [(False, None), (True, 0.05)], ids=["full", "scale-0.05"])
def test_delta_stats_are_their_definitions(causal, sm_scale):
    """delta_stats' figures, each from its docstring's definition, for the causal flag and softmax scale it
    was given: key_grad_sum over the dK of attention()'s own backward (worst (batch, kv head)), ds_rowsum
    the largest |sum_j dS_ij| / sum_j |P_ij dP_ij|, delta_mismatch over the backward's two deltas."""
    B, H, H_kv, N = 2, 2, 1, 64
    q, k, v, do = make_inputs(B, H, H_kv, N, D, seed=89, key_offset=1.0)
    got = A.delta_stats(q, k, v, do, causal=causal, sm_scale=sm_scale)
    scale = SCALE if sm_scale is None else sm_scale
    o, lse = A._forward(q, k, v, causal, scale)
    want, deltas = {}, {}
    for arm in ("matched", "stale"):
        dk = run_kernel(q, k, v, do, causal, delta=arm, sm_scale=sm_scale)["dk"].double()
        want[f"key_grad_sum_{arm}"] = (dk.sum(2).norm(dim=-1) / dk.norm(dim=-1).sum(2)).max().item()
        info = A._backward(do, q, k, v, o, lse, causal, scale, arm, debug=True)[3]
        want[f"ds_rowsum_{arm}"] = (info["ds_rowsum"].double().abs() / info["pdp_abs_rowsum"].double()).max().item()
        deltas[arm] = info["delta"].double()
    want["delta_mismatch"] = ((deltas["stale"] - deltas["matched"]).norm() / deltas["matched"].norm()).item()
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-5), (name, got[name], want[name])
    # the figures are not degenerate: the stale arm breaks (*) where the matched one holds it
    assert got["ds_rowsum_matched"] < 1e-6 < 1e-3 < got["ds_rowsum_stale"], got


def test_custom_ops_fake_implementations_match_the_real_ones():
    """torch.compile plans buffers from the register_fake functions: their outputs must have the real
    ones' shapes, dtypes and strides (LSE fp32, dV laid out as v where k is laid out otherwise, either way).
    torch.library.opcheck compares them and checks the ops' schemas and autograd registration."""
    q, k, v, do = make_inputs(1, 2, 2, 16, D, seed=91)
    v = bthd(v)         # (B, T, H, D) memory; k contiguous
    o, lse = A._fwd_op(q, k, v, True, SCALE, "matched")
    assert lse.dtype == torch.float32
    for args in ((q, k, v, True, SCALE, "matched"), (q, bthd(k), v, False, SCALE, "stale")):
        torch.library.opcheck(A._fwd_op, args, test_utils=("test_schema", "test_faketensor",
                                                            "test_autograd_registration"))
    for kk, vv, o_saved, arm in ((k, v, None, "matched"), (k, v, o, "stale"), (bthd(k), v.contiguous(), None, "matched")):
        torch.library.opcheck(A._bwd_op, (do, q, kk, vv, o_saved, lse, True, SCALE, arm),
                              test_utils=("test_schema", "test_faketensor"))


class _Ctx:
    """What _setup_context is handed by torch.library: an object to set attributes on and save tensors to."""

    def save_for_backward(self, *tensors):
        self.saved = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors


def test_custom_op_keeps_the_output_only_for_the_stale_delta():
    """As the eager path (test_matched_backward_does_not_keep_the_output): the compiled op saves O for the
    backward only where the stale delta reads it, and the matched arm leaves it to the caller."""
    q, k, v, _ = make_inputs(1, 1, 1, 16, D, seed=93)
    o, lse = A._fwd_op(q, k, v, True, SCALE, "matched")
    for arm, kept in (("matched", False), ("stale", True)):
        ctx = _Ctx()
        A._setup_context(ctx, (q, k, v, True, SCALE, arm), (o, lse))
        assert (ctx.causal, ctx.sm_scale, ctx.delta) == (True, SCALE, arm)
        assert ctx.saved[3] is (o if kept else None), f"{arm}: O kept = {not kept}"
        assert ctx.saved[0] is q and ctx.saved[1] is k and ctx.saved[2] is v and ctx.saved[4] is lse


def test_custom_op_refuses_double_backward():
    """The custom op is callable outside torch.compile too (torch.ops.fp8_attention.fwd), where AOTAutograd's
    own refusal does not apply: its backward must refuse create_graph=True as _Attention's does, not hand
    back FP8 gradients that autograd takes for constants."""
    q, k, v, do = make_inputs(1, 1, 1, 16, D, seed=97)
    qg = q.detach().clone().requires_grad_()
    o, _ = torch.ops.fp8_attention.fwd(qg, k, v, True, SCALE, "matched")
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(o, qg, do, create_graph=True)
    (dq,) = torch.autograd.grad(o, qg, do)      # a plain backward goes through
    assert torch.isfinite(dq).all()


def test_custom_op_lse_takes_no_gradient():
    """The op also returns LSE (base 2), which its backward gives no gradient through. It was differentiable
    all the same, so a loss on it got zero gradients, silently; now it is marked as taking none."""
    q, k, v, _ = make_inputs(1, 1, 1, 16, D, seed=98)
    qg = q.detach().clone().requires_grad_()
    o, lse = torch.ops.fp8_attention.fwd(qg, k, v, True, SCALE, "matched")
    assert o.requires_grad and not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()


def test_inputs_that_are_not_dense_are_refused():
    """Nested (jagged) and sparse tensors, which SDPA takes in part, failed deep inside the checks with an
    AttributeError or NotImplementedError; now they are refused by name."""
    nested = torch.nested.nested_tensor([torch.randn(n, 2, D, dtype=torch.bfloat16) for n in (20, 30)],
                                        layout=torch.jagged).transpose(1, 2)
    with pytest.raises(ValueError, match="q must be a dense \\(strided\\) tensor, got a nested one"):
        A.attention(nested, nested, nested)
    dense = torch.randn(1, 1, 16, D, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="k must be a dense \\(strided\\) tensor, got a sparse_coo one"):
        A.attention(dense, dense.to_sparse(), dense)


def test_sm_scale_must_fit_fp32():
    """The kernels take sm_scale * log2(e) in fp32: 1e39 passed the finite check in float64, became inf in the
    kernels and made every output NaN."""
    q = torch.randn(1, 1, 16, D, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="too large for the kernels' fp32 arithmetic"):
        A.attention(q, q, q, sm_scale=1e39)
    # the bound is on sm_scale * log2(e): 3e38 fits fp32 itself (max 3.4e38) but not once multiplied
    with pytest.raises(ValueError, match="too large for the kernels' fp32 arithmetic"):
        A.attention(q, q, q, sm_scale=3e38)
    assert A._causal_and_scale(q, True, 1e30) == (True, 1e30)
    assert A._causal_and_scale(q, True, 0.0) == (True, 0.0)     # >= 0, as documented: uniform attention


@pytest.mark.parametrize("hidden,words", [
    ("attention_fp8_hopper", "need attention_fp8_hopper.py beside attention_fp8.py, on the import path;"),
    ("triton.experimental.gluon", "need Triton's Gluon API, which triton"),
])
def test_a_hopper_without_the_gluon_kernels_says_which_is_missing(monkeypatch, hidden, words):
    """attention_fp8.py copied alone (the README once said it was all you need) fell back to the slower
    kernels on an H100 with a warning that blamed Triton; it must name the file that is missing."""
    import sys
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for name in [m for m in sys.modules if m == "attention_fp8_hopper" or m.startswith("triton.experimental.gluon")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, hidden, None)    # the import fails as if it were not installed
    with pytest.warns(UserWarning, match=words):
        assert A._is_hopper.__wrapped__(torch.device("cuda")) is False

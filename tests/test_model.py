"""model.py: causality, GQA and RoPE against an independent reference, parameter count, init, optimizer
groups, generation, checkpoint loading, MFU, the attention switch, torch.compile, and a forward and
backward through each attention path this machine has (fp8 on CPU runs in Triton's interpreter)."""
import math

import pytest
import torch
import torch.nn.functional as F

import model as M
from model import GPT, GPTConfig


def tiny(**kw):
    args = dict(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_kv_head=4, n_embd=64, attention="sdpa")
    args.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**args))


@pytest.mark.parametrize("pos,qk_norm,n_kv_head", [("rope", False, 4), ("learned", True, 2), ("none", False, 1)])
def test_causal(pos, qk_norm, n_kv_head):
    m = tiny(pos=pos, qk_norm=qk_norm, n_kv_head=n_kv_head)
    idx = torch.randint(0, 64, (2, 32))
    logits, _ = m(idx, idx)
    idx2 = idx.clone()
    idx2[:, 20:] = torch.randint(0, 64, (2, 12))
    logits2, _ = m(idx2, idx2)
    assert torch.equal(logits[:, :20], logits2[:, :20]), "the future leaked into the past"
    assert not torch.allclose(logits[:, 20:], logits2[:, 20:])


def reference_attention(attn, x, T, base=10000.0):
    """CausalSelfAttention written out independently: RoPE by complex rotation of the pairs
    (x[i], x[i + hs/2]), k/v repeated per query group, a masked softmax."""
    B, _, C = x.shape
    H, Hkv, hs = attn.n_head, attn.n_kv_head, attn.head_dim
    q, k, v = attn.c_attn(x).split([H * hs, Hkv * hs, Hkv * hs], dim=2)
    q, k, v = q.view(B, T, H, hs), k.view(B, T, Hkv, hs), v.view(B, T, Hkv, hs)
    if attn.q_norm is not None:
        def rms(t, w):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
    theta = base ** (-torch.arange(0, hs, 2).double() / hs)
    rot = torch.polar(torch.ones(T, hs // 2, dtype=torch.float64), torch.arange(T).double()[:, None] * theta)

    def rope(t):  # the pair (t[i], t[i + hs/2]) as one complex number, turned by the angle pos * theta_i
        z = torch.complex(t[..., :hs // 2].double(), t[..., hs // 2:].double()) * rot[None, :, None, :]
        return torch.cat([z.real, z.imag], dim=-1).float()
    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)
    att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hs)
    att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
    y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)
    return attn.c_proj(y)


@pytest.mark.parametrize("n_kv_head,qk_norm", [(4, False), (2, True), (1, False)])
def test_attention_matches_reference(n_kv_head, qk_norm):
    m = tiny(n_kv_head=n_kv_head, qk_norm=qk_norm, n_embd=128, n_head=4)  # hs = 32
    attn = m.transformer.h[0].attn
    if qk_norm:  # non-trivial gains, so a norm that ignored them would fail
        torch.nn.init.uniform_(attn.q_norm.weight, 0.5, 1.5)
        torch.nn.init.uniform_(attn.k_norm.weight, 0.5, 1.5)
    x = torch.randn(2, 32, 128)
    with torch.no_grad():
        got = attn(x, (m.rope_cos, m.rope_sin))
        want = reference_attention(attn, x, 32)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_parameter_count_weight_tying_and_gqa():
    for pos, qk, hkv in [("learned", False, 4), ("rope", True, 1)]:
        m = tiny(pos=pos, qk_norm=qk, n_kv_head=hkv)
        assert m.transformer.wte.weight is m.lm_head.weight
        C, L, V, hs = 64, 2, 64, 16
        per_layer = 2 * C + C * (4 + 2 * hkv) * hs + C * C + 8 * C * C + (2 * hs if qk else 0)  # 2 LayerNorms, attn, mlp
        want = L * per_layer + C + V * C  # + ln_f + the tied embedding
        assert m.get_num_params() == want
        assert m.get_num_params(non_embedding=False) == want + (32 * C if pos == "learned" else 0)


def test_scaled_init_and_optimizer_groups():
    m = tiny(n_layer=8, n_embd=256)
    proj = torch.cat([b.attn.c_proj.weight.flatten() for b in m.transformer.h])
    assert abs(proj.std().item() / (0.02 / math.sqrt(16)) - 1) < 0.05
    assert abs(m.transformer.h[0].mlp.c_fc.weight.std().item() / 0.02 - 1) < 0.05
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))  # the tied matrix once


def test_generate_greedy_and_past_block_size():
    m = tiny().eval()
    start = torch.randint(0, 64, (2, 5))
    out = m.generate(start, 40, top_k=1)  # 45 tokens: beyond block_size 32, so the context is cropped
    assert out.shape == (2, 45) and torch.equal(out[:, :5], start)
    ctx = out[:, :-1][:, -32:]
    assert torch.equal(out[:, -1], m(ctx)[0][:, -1].argmax(-1)), "top_k=1 must be greedy on the cropped context"


def test_generate_sees_the_last_block_size_tokens_and_the_temperature():
    """A prompt longer than block_size is cropped to its last block_size tokens (here the first 32 would
    predict otherwise); a temperature near 0 samples the argmax, and temperature 1 does not (same seed)."""
    m = tiny().eval()
    torch.manual_seed(1)
    start = torch.randint(0, 64, (8, 40))
    with torch.no_grad():
        last, first = (m(c)[0][:, -1].argmax(-1) for c in (start[:, -32:], start[:, :32]))
    assert not torch.equal(last, first), "test setup: the two crops should predict differently"
    assert torch.equal(m.generate(start, 1, top_k=1)[:, -1], last), "the context must be the last block_size tokens"
    greedy = m.generate(start, 6, top_k=1)[:, 40:]
    torch.manual_seed(2)
    cold = m.generate(start, 6, temperature=1e-4)[:, 40:]
    torch.manual_seed(2)
    warm = m.generate(start, 6, temperature=1.0)[:, 40:]
    assert torch.equal(cold, greedy), "temperature 1e-4 must sample the argmax"
    assert not torch.equal(warm, greedy), "temperature 1 sampled the argmax 48 times out of 48"


def test_generate_temperature_zero_is_greedy_and_bad_settings_are_refused():
    m = tiny().eval()
    start = torch.randint(0, 64, (3, 7))
    assert torch.equal(m.generate(start, 5, temperature=0), m.generate(start, 5, top_k=1))
    for kw in (dict(temperature=-1.0), dict(top_k=0)):
        with pytest.raises(ValueError, match="need temperature >= 0 and top_k >= 1"):
            m.generate(start, 1, **kw)


def test_rope_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="head dim n_embd / n_head = 15 must be even"):
        tiny(n_embd=60, n_head=4)
    tiny(n_embd=60, n_head=4, n_kv_head=4, pos="learned")  # learned positions take any head dim


def test_peak_flops_matches_whole_names():
    from model import peak_flops
    assert peak_flops("NVIDIA H200") == peak_flops("NVIDIA H100 80GB HBM3") == 989.5e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12 and peak_flops("NVIDIA L4") == 121e12
    assert peak_flops("NVIDIA L40") == 181e12 and peak_flops("NVIDIA L40S") == 362e12  # not the L4's
    assert peak_flops("NVIDIA RTX A1000") is None   # not the A100's
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12


def test_load_state_strips_prefixes_and_handles_positions():
    src = tiny(pos="learned")
    sd = {("_orig_mod." if i % 2 else "module._orig_mod.") + k: v for i, (k, v) in enumerate(src.state_dict().items())}
    dst = tiny(pos="learned", block_size=16)
    torch.nn.init.zeros_(dst.lm_head.weight)
    dst.load_state(sd)  # a learned table is cropped to the shorter block_size
    assert torch.equal(dst.lm_head.weight, src.lm_head.weight)
    assert torch.equal(dst.transformer.wpe.weight, src.transformer.wpe.weight[:16])
    with pytest.raises(ValueError, match="cannot run at block_size 64.*pos=rope or none"):
        tiny(pos="learned", block_size=64).load_state(sd)
    tiny(pos="rope", block_size=64).load_state(tiny(pos="rope").state_dict())  # RoPE: nothing to extend


def test_mfu_peak_table():
    assert M.peak_flops("NVIDIA H200") == 989.5e12
    assert M.peak_flops("NVIDIA H100 80GB HBM3") == 989.5e12 and M.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert M.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12 and M.peak_flops("NVIDIA L40S") == 362e12
    assert M.peak_flops("cpu") is None and M.peak_flops("Some Future GPU") is None
    m = tiny()
    N, T = m.get_num_params(), 32
    want = (6 * N + 12 * 2 * 4 * 16 * T) * T * 10 / 0.5 / 989.5e12
    assert m.estimate_mfu(10, 0.5, "NVIDIA H200") == pytest.approx(want)
    assert m.estimate_mfu(10, 0.5, "cpu") is None


def test_resolve_attention_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert M.resolve_attention("sdpa", "cpu") == ("sdpa", None)
    path, why = M.resolve_attention("auto", "cpu")
    assert path == "sdpa" and "no CUDA GPU" in why
    with pytest.raises(RuntimeError, match="attention=fp8 cannot run here: no CUDA GPU.*--attention=sdpa"):
        M.resolve_attention("fp8", "cpu")


def test_fp8_refused_at_other_head_dims(monkeypatch):
    """The kernel takes head dims 64 and 128: elsewhere fp8 is unavailable, with the reason ('auto' then
    falls back to sdpa on a GPU and prints it), and an explicit fp8 path is refused. The CPU interpreter
    stands in for a GPU with FP8 here."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert M.fp8_unavailable("cpu", 128) is None and M.fp8_unavailable("cpu", 64) is None
    assert M.fp8_unavailable("cpu", 96) == "head dim 96 (n_embd / n_head): the fp8 kernel takes 64 or 128"
    assert M.resolve_attention("fp8", "cpu", 64) == ("fp8", None)
    with pytest.raises(RuntimeError, match="attention=fp8_stale cannot run here: head dim 32"):
        M.resolve_attention("fp8_stale", "cpu", 32)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_WHY = M.fp8_unavailable(DEVICE)  # None where the kernel runs: a GPU with FP8, or the CPU interpreter
needs_fp8 = pytest.mark.skipif(FP8_WHY is not None, reason=f"fp8 attention unavailable: {FP8_WHY}")
PATHS = ["sdpa", pytest.param("fp8", marks=needs_fp8), pytest.param("fp8_stale", marks=needs_fp8)]


def _step(attention, device):
    # head dim 64 (the kernel's smallest), T = 64, 1 layer, batch 1: 4 causal tile pairs in the interpreter;
    # 4 query heads on 2 kv heads, so a kernel that grouped heads differently from SDPA would fail
    m = tiny(attention=attention, block_size=64, n_layer=1, n_head=4, n_kv_head=2, n_embd=256,
             vocab_size=128, qk_norm=True).to(device)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 128, (1, 65), generator=g).to(device)
    _, loss = m(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in m.parameters()])


@pytest.mark.parametrize("attention", PATHS)
def test_forward_backward_each_attention_path(attention):
    loss, grad = _step(attention, DEVICE)
    assert torch.isfinite(loss) and torch.isfinite(grad).all() and grad.abs().sum() > 0
    if attention != "sdpa":  # FP8 attention: close to SDPA, not equal
        ref_loss, ref_grad = _step("sdpa", DEVICE)
        assert abs(loss.item() - ref_loss.item()) < 1e-2 * ref_loss.item(), (loss.item(), ref_loss.item())
        cos = F.cosine_similarity(grad, ref_grad, dim=0).item()
        assert cos > 0.99, f"gradient cosine similarity to SDPA {cos:.4f}"


@needs_fp8
def test_fp8_stale_has_the_same_forward():
    """The two fp8 arms differ only in the backward's delta: their losses are bit-identical, their
    gradients are not (a model that ran the matched backward for fp8_stale would void the ablation)."""
    (loss, grad), (loss_stale, grad_stale) = _step("fp8", DEVICE), _step("fp8_stale", DEVICE)
    assert torch.equal(loss, loss_stale)
    assert not torch.equal(grad, grad_stale), "fp8_stale gave the matched arm's gradients"


def test_compile_fullgraph_matches_eager():
    """torch.compile sees the whole model, attention included, with no graph break (fullgraph=True).
    On CPU this is the one inductor compile of the suite (~25 s); fp8 is checked with aot_eager below."""
    m = tiny(qk_norm=True, n_kv_head=2)
    idx = torch.randint(0, 64, (2, 33))
    _, loss = m(idx[:, :-1], idx[:, 1:])
    loss.backward()
    grad = m.lm_head.weight.grad.clone()
    m.zero_grad()
    _, loss_c = torch.compile(m, fullgraph=True)(idx[:, :-1], idx[:, 1:])
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m.lm_head.weight.grad, grad, atol=1e-5, rtol=1e-4)


@needs_fp8
def test_compile_fullgraph_fp8(monkeypatch):
    """The fp8 kernel is a torch.library custom op: dynamo traces through it without a graph break.
    On CPU the interpreter cannot be code-generated, so the check uses the aot_eager backend there."""
    import attention_fp8 as A     # the eager reference takes the kernels the compiled call takes (on Hopper, Gluon)
    monkeypatch.setattr(A, "HOPPER_FORWARD_MIN_SCORES", A.COMPILED_MIN_SCORES)
    monkeypatch.setattr(A, "HOPPER_BACKWARD_MIN_SCORES", A.COMPILED_MIN_SCORES)
    torch._dynamo.reset()
    m = tiny(attention="fp8", block_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=128).to(DEVICE)
    idx = torch.randint(0, 64, (1, 65), device=DEVICE)
    ref, _ = m(idx[:, :-1], idx[:, 1:])
    compiled = torch.compile(m, fullgraph=True, backend="inductor" if DEVICE == "cuda" else "aot_eager")
    logits, loss = compiled(idx[:, :-1], idx[:, 1:])
    loss.backward()
    torch.testing.assert_close(logits, ref, atol=1e-3, rtol=1e-3)

"""model.py: causality, GQA and RoPE against an independent reference, parameter count, init, optimizer
groups, generation, checkpoint loading, MFU, the attention switch, torch.compile, and a forward and
backward through each attention path this machine has (fp8 on CPU runs in Triton's interpreter). At the end,
settings that must take effect: rope_base, learned positions, each dropout site, bias=True, generate's
top_k, strict checkpoint loading."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import model as M
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    for branch in ("attn", "mlp"):      # the projections back into the residual stream: std 0.02 / sqrt(2 n_layer)
        proj = torch.cat([getattr(b, branch).c_proj.weight.flatten() for b in m.transformer.h])
        assert abs(proj.std().item() / (0.02 / math.sqrt(16)) - 1) < 0.05, branch
    assert abs(m.transformer.h[0].mlp.c_fc.weight.std().item() / 0.02 - 1) < 0.05
    # the embeddings at 0.02 too (PyTorch's default is N(0, 1), 50x larger), and every bias at zero
    learned = tiny(pos="learned", bias=True, n_embd=256)
    for table in (learned.transformer.wte.weight, learned.transformer.wpe.weight):
        assert abs(table.std().item() / 0.02 - 1) < 0.05
    assert all(torch.equal(mod.bias, torch.zeros_like(mod.bias)) for mod in learned.modules()
               if isinstance(mod, torch.nn.Linear) and mod.bias is not None)
    # every parameter trained, once: QK-norm's gains and the biases too
    for m in (m, tiny(qk_norm=True, bias=True, pos="learned")):
        opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
        decay, no_decay = opt.param_groups
        assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
        assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
        grouped = [id(p) for g in opt.param_groups for p in g["params"]]
        assert sorted(grouped) == sorted(id(p) for p in m.parameters()), "a parameter in no group, or in two"


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


def test_generate_with_a_temperature_near_the_float_floor_is_greedy():
    """1e-40 is a valid temperature (> 0), but logits / 1e-40 overflow to inf and softmax gave NaN, which
    torch.multinomial refused with a traceback. Less the row max first, every temperature > 0 samples."""
    m = tiny().eval()
    start = torch.randint(0, 64, (3, 7))
    for t in (1e-40, 1e-45):
        assert torch.equal(m.generate(start, 4, temperature=t), m.generate(start, 4, temperature=0)), t


def test_generate_never_draws_past_the_tokenizers_vocab():
    """vocab_size: ids from it up to the model's padded vocab are never drawn, greedy or sampled, even
    where the model favours them (here their embedding rows, tied to the output, are scaled up)."""
    m = tiny().eval()
    with torch.no_grad():
        m.transformer.wte.weight[50:] *= 20
    start = torch.randint(0, 50, (64, 3))
    assert (m.generate(start, 2, temperature=1.0)[:, 3:] >= 50).any(), "test setup: padded ids should win some draws"
    # 1e-38: with the padded ids in the row's max, every real id overflowed to -inf and softmax gave NaN
    for kw in (dict(temperature=1.0), dict(temperature=0), dict(top_k=3), dict(temperature=1e-3),
               dict(temperature=1e-38), dict(temperature=float("inf"))):     # inf: uniform over the real ids (masked first, -inf / inf was NaN)
        assert (m.generate(start, 2, vocab_size=50, **kw)[:, 3:] < 50).all(), kw


def test_generate_temperature_zero_is_greedy_and_bad_settings_are_refused():
    m = tiny().eval()
    start = torch.randint(0, 64, (3, 7))
    assert torch.equal(m.generate(start, 5, temperature=0), m.generate(start, 5, top_k=1))
    for kw in (dict(temperature=-1.0), dict(top_k=0)):
        with pytest.raises(ValueError, match="need temperature >= 0 and top_k >= 1"):
            m.generate(start, 1, **kw)
    for empty in (start[:, :0], start[0]):  # no prompt (an IndexError inside), or no batch dimension
        with pytest.raises(ValueError, match=r"generate needs token ids of shape \(batch, t >= 1\)"):
            m.generate(empty, 1)


def test_top_k_keeps_the_model_s_k_most_likely_at_any_temperature():
    """top_k picks the model's k most likely ids before the temperature divides: an infinite (or huge)
    temperature made every logit 0, a tie, and top_k then kept all ids (uniform over the vocab)."""
    m = tiny().eval()
    start = torch.randint(0, 64, (32, 5))
    greedy = m.generate(start, 1, temperature=0)
    for temperature in (float("inf"), 1e30):
        assert torch.equal(m.generate(start, 1, temperature=temperature, top_k=1), greedy), temperature
    top2 = torch.topk(m(start)[0][:, -1].float(), 2).indices
    for _ in range(4):
        drawn = m.generate(start, 1, temperature=float("inf"), top_k=2)[:, -1:]
        assert (drawn == top2).any(-1).all(), "an id outside the model's two most likely was drawn"


def test_gpt_config_has_as_many_kv_heads_as_query_heads_unless_told():
    """GPTConfig built nanoGPT's way, without n_kv_head: every query head has its own k and v. A default of
    12 gave n_head=24 grouped-query attention nobody asked for, and n_head=16 (GPT-2 medium) an error about
    n_kv_head. 0 means n_head, as train.py's setting does."""
    for n_head in (24, 16, 6):
        m = GPT(GPTConfig(block_size=8, vocab_size=64, n_layer=1, n_head=n_head, n_embd=n_head * 8))
        attn = m.transformer.h[0].attn
        assert m.config.n_kv_head == attn.n_kv_head == n_head, (n_head, m.config.n_kv_head, attn.n_kv_head)
        assert attn.c_attn.weight.shape == (3 * n_head * 8, n_head * 8)
    assert GPT(GPTConfig(block_size=8, vocab_size=64, n_layer=1, n_head=4, n_kv_head=0, n_embd=32)).config.n_kv_head == 4


def test_rope_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="head dim n_embd / n_head = 15 must be even"):
        tiny(n_embd=60, n_head=4)
    tiny(n_embd=60, n_head=4, n_kv_head=4, pos="learned")  # learned positions take any head dim


@pytest.mark.parametrize("kw,words", [
    (dict(n_embd=64, n_head=3, n_kv_head=3), "n_embd=64 must be a multiple of n_head=3"),
    (dict(n_embd=64, n_head=4, n_kv_head=3), "n_head=4 must be a multiple of n_kv_head=3"),
    (dict(n_embd=64, n_head=4, n_kv_head=-1), "n_kv_head=-1: the number of k/v heads, or 0 for as many as n_head"),
])
def test_shapes_that_do_not_divide_are_refused(kw, words):
    # a ValueError that names them, as train.py's config error does (model.shape_problem), not an assert
    with pytest.raises(ValueError, match=words):
        tiny(**kw)


def test_peak_flops_matches_whole_names():
    from model import peak_flops
    assert peak_flops("NVIDIA H200") == peak_flops("NVIDIA H100 80GB HBM3") == 989.5e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12 and peak_flops("NVIDIA L4") == 121e12
    assert peak_flops("NVIDIA H200 NVL") == 835e12 and peak_flops("NVIDIA H800 PCIe") == 756e12  # not H200's, H800's
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
    gqa = tiny(n_kv_head=2)     # fewer k/v heads: fewer parameters, but every query head still attends
    want = (6 * gqa.get_num_params() + 12 * 2 * 4 * 16 * T) * T * 10 / 0.5 / 989.5e12
    assert gqa.estimate_mfu(10, 0.5, "NVIDIA H200") == pytest.approx(want)


def test_resolve_attention_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert M.resolve_attention("sdpa", "cpu") == ("sdpa", None)
    path, why = M.resolve_attention("auto", "cpu")
    assert path == "sdpa" and "no CUDA GPU" in why
    with pytest.raises(RuntimeError, match="attention=fp8 cannot run here: no CUDA GPU.*--attention=sdpa"):
        M.resolve_attention("fp8", "cpu")


def test_gpt_refuses_unknown_settings_with_errors_that_python_O_keeps():
    """GPT checks pos, attention and the fp8 head dim with errors, not asserts: under python -O an assert
    is gone, and pos='RoPE' built a model with no positions, attention='SDPA' ran the fp8 kernel."""
    for kw, words in ((dict(pos="RoPE"), "pos='RoPE': expected rope, learned or none"),
                      (dict(attention="SDPA"), "attention='SDPA': not one of"),
                      (dict(vocab_size=None), "needs vocab_size and block_size")):
        with pytest.raises(ValueError, match=re.escape(words)):
            tiny(**kw)
    with pytest.raises(ValueError, match=r"head dims .* not n_embd/n_head=16"):
        tiny(attention="fp8")   # 64 / 4 heads
    code = ("import torch\nfrom model import GPT, GPTConfig\n"
            "try:\n    GPT(GPTConfig(block_size=8, vocab_size=8, n_layer=1, n_head=1, n_embd=8, pos='RoPE'))\n"
            "except ValueError as e:\n    print('refused:', e)\n"
            "for pos in ('none', 'rope', 'learned'):\n"     # past block_size: pos=none ran, the others failed elsewhere
            "    try:\n        GPT(GPTConfig(block_size=8, vocab_size=8, n_layer=1, n_head=1, n_embd=8, pos=pos))"
            "(torch.zeros(1, 9, dtype=torch.long))\n"
            "    except ValueError as e:\n        print('refused:', e)")
    r = subprocess.run([sys.executable, "-O", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "refused: pos='RoPE'" in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("refused: sequence of length 9 exceeds block_size 8") == 3, r.stdout + r.stderr


def test_resolve_attention_refuses_unknown_names():
    """A name that is no attention path is refused as such, not blamed on the device (and on a GPU with
    FP8 tensor cores, not handed back unchecked)."""
    for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        for name in ("flash", "FP8", "fp8-stale", ""):
            with pytest.raises(ValueError, match=f"attention={name!r}: not one of .*'fp8_stale'"):
                M.resolve_attention(name, device, 64)


def test_fp8_refused_at_other_head_dims(monkeypatch):
    """The kernel takes head dims 64 and 128: elsewhere fp8 is unavailable, with the reason ('auto' then
    falls back to sdpa on a GPU and prints it), and an explicit fp8 path is refused. The CPU interpreter
    stands in for a GPU with FP8 here."""
    import attention_fp8
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(attention_fp8, "INTERPRETED", True)
    assert M.fp8_unavailable("cpu", 128) is None and M.fp8_unavailable("cpu", 64) is None
    assert M.fp8_unavailable("cpu", 96) == "head dim 96 (n_embd / n_head): the fp8 kernel takes 64 or 128"
    assert M.resolve_attention("fp8", "cpu", 64) == ("fp8", None)
    with pytest.raises(RuntimeError, match="attention=fp8_stale cannot run here: head dim 32"):
        M.resolve_attention("fp8_stale", "cpu", 32)


def test_fp8_on_cpu_asks_the_kernels_not_the_environment(monkeypatch):
    """TRITON_INTERPRET=1 counts only where it was set when attention_fp8 was imported, which is when its
    kernels are built: set later, fp8 on a CPU was accepted, and the model's first forward failed."""
    import attention_fp8
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(attention_fp8, "INTERPRETED", False)
    assert "imported without TRITON_INTERPRET=1" in M.fp8_unavailable("cpu")
    with pytest.raises(RuntimeError, match="attention=fp8 cannot run here: no CUDA GPU"):
        M.resolve_attention("fp8", "cpu")


def test_auto_never_picks_the_interpreter_on_a_gpu(monkeypatch):
    """TRITON_INTERPRET=1 left set on a GPU machine: 'auto' must not choose kernels that run in the
    interpreter, thousands of times slower than SDPA. (A GPU with FP8 is simulated, so this runs on a CPU.)"""
    import attention_fp8
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(attention_fp8, "INTERPRETED", False)
    assert M.resolve_attention("auto", "cuda", 64) == ("fp8", None)
    monkeypatch.setattr(attention_fp8, "INTERPRETED", True)
    assert M.resolve_attention("auto", "cuda", 64) == ("sdpa", "its kernels were built for Triton's interpreter "
                                                               "(TRITON_INTERPRET=1)")


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


@needs_fp8
def test_a_layer_switched_to_fp8_after_building_runs_the_kernel(monkeypatch):
    """A model built with sdpa whose layers are switched to fp8 afterwards (an ablation in a notebook; what
    grad_fidelity.py does) runs the kernel as one built with fp8 does: it found the kernel not imported
    (TypeError: 'NoneType' object is not callable). A switch is checked as a built path is."""
    monkeypatch.setattr(M, "_fp8_attention", None)     # as in a process that has built no fp8 layer yet
    x = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    kw = dict(block_size=64, n_layer=1, n_head=4, n_kv_head=2, n_embd=256, vocab_size=128)
    switched = tiny(attention="sdpa", **kw).to(DEVICE)
    switched.transformer.h[0].attn.attention = "fp8_stale"
    got = switched(x)[0]
    assert torch.equal(got, tiny(attention="fp8_stale", **kw).to(DEVICE)(x)[0])
    for path, words in (("FP8", "attention='FP8': not one of"), ("fp8", "head dims .* not n_embd/n_head=16")):
        layer = tiny(attention="sdpa", n_head=4, n_embd=64).transformer.h[0].attn if path == "fp8" else \
            switched.transformer.h[0].attn
        with pytest.raises(ValueError, match=words):
            layer.attention = path


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
def test_fp8_stale_has_the_same_forward(monkeypatch):
    """The two fp8 arms differ only in the backward's delta: their losses are bit-identical, their
    gradients are not (a model that ran the matched backward for fp8_stale would void the ablation),
    and each arm asks the kernel for its own delta (swapped, the two would still differ)."""
    import attention_fp8 as A
    asked, attention = [], A.attention
    monkeypatch.setattr(A, "attention", lambda *a, **kw: asked.append(kw["delta"]) or attention(*a, **kw))
    (loss, grad), (loss_stale, grad_stale) = _step("fp8", DEVICE), _step("fp8_stale", DEVICE)
    assert torch.equal(loss, loss_stale)
    assert not torch.equal(grad, grad_stale), "fp8_stale gave the matched arm's gradients"
    assert asked == ["matched", "stale"], f"the fp8 and fp8_stale models asked for delta={asked}"


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


# -----------------------------------------------------------------------------------------------------
# settings that must take effect: each test below fails if the setting it names is ignored

def test_rope_base_sets_the_rotary_frequencies():
    """rope_base must reach the rotation: the cached angles are t * base^(-2i/hs) for the configured base
    (written out here, not through rope_cache), and the same weights under another base give other logits."""
    base, T, hs = 500.0, 32, 16
    m = tiny(rope_base=base)
    angles = torch.arange(T).double()[:, None] * base ** (-torch.arange(0, hs, 2).double() / hs)
    for got, want in ((m.rope_cos, angles.cos()), (m.rope_sin, angles.sin())):
        torch.testing.assert_close(got[0, :, 0].double(), want, atol=1e-6, rtol=0,
                                   msg=lambda s: f"the RoPE angles are not those of rope_base={base}: {s}")
    default = tiny()  # same seed, so the same weights; only rope_base differs
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), default.parameters()))
    idx = torch.randint(0, 64, (2, 32))
    with torch.no_grad():
        assert not torch.allclose(m(idx, idx)[0], default(idx, idx)[0], atol=1e-4), "rope_base changed nothing"


def test_learned_positions_are_added_to_the_token_embeddings():
    """pos=learned: block 0 sees wte(idx) + wpe(t) at position t (eval mode, so no dropout), and changing
    the position table changes the logits."""
    m = tiny(pos="learned").eval()
    idx = torch.randint(0, 64, (2, 20))
    seen = []
    handle = m.transformer.h[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    with torch.no_grad():
        before, _ = m(idx, idx)
        handle.remove()
        torch.testing.assert_close(seen[0], m.transformer.wte(idx) + m.transformer.wpe.weight[:20], atol=0, rtol=0,
                                   msg=lambda s: f"block 0's input is not wte(idx) + wpe(position): {s}")
        m.transformer.wpe.weight.mul_(-3.0)
        after, _ = m(idx, idx)
    assert not torch.allclose(before, after, atol=1e-4), "the learned position table does not reach the logits"


def _dropout_mask_ok(train_out, eval_out, p):
    """Dropout's signature: every element of the train-mode output is either 0 or the eval-mode element
    scaled by 1/(1-p), and both kinds occur."""
    kept = train_out != 0
    assert 0 < kept.float().mean() < 1, "train mode dropped nothing (or everything)"
    torch.testing.assert_close(train_out[kept], eval_out[kept] / (1 - p), atol=1e-5, rtol=1e-4)


def test_dropout_at_each_site_in_train_mode_only():
    """dropout drops at the three sites GPTConfig names: the embeddings (block 0's input), the attention
    output and the MLP output of every block; never in eval mode. Each site is checked on its own, so
    removing any one of them fails here."""
    p = 0.5
    m = tiny(pos="learned", dropout=p)
    ref = tiny(pos="learned", dropout=0.0)  # the same weights with no dropout
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        m.eval()
        torch.testing.assert_close(m(idx, idx)[0], ref(idx, idx)[0], atol=0, rtol=0)  # eval: no dropout
        m.train()
        # embeddings: block 0's input in train mode against wte + wpe
        seen = []
        handle = m.transformer.h[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
        torch.manual_seed(3)
        m(idx, idx)
        handle.remove()
        _dropout_mask_ok(seen[0], m.transformer.wte(idx) + m.transformer.wpe.weight[:16], p)
        x = torch.randn(2, 16, 64)
        for i, block in enumerate(m.transformer.h):
            for name, site in (("attn", lambda: block.attn(x)), ("mlp", lambda: block.mlp(x))):
                m.train()
                torch.manual_seed(4)
                train_out = site()
                m.eval()
                eval_out = site()
                assert not torch.equal(train_out, eval_out), f"block {i} {name}: no dropout in train mode"
                _dropout_mask_ok(train_out, eval_out, p)


def test_generate_top_k_samples_only_and_all_of_the_top_k():
    """top_k=5 at temperature 1: 4000 draws of the next token land only on the 5 most likely tokens, on
    each of them, at about their renormalized probabilities (a threshold at the largest logit instead of
    the 5th largest would make it greedy). top_k=None reaches beyond the top 5."""
    m = tiny().eval()
    start = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        logits = m(start)[0][0, -1]
    top = logits.topk(5).indices
    torch.manual_seed(5)
    draws = m.generate(start.repeat(4000, 1), 1, top_k=5)[:, -1]
    counts = torch.bincount(draws, minlength=64).double()
    assert counts[top].sum() == 4000, f"drew tokens outside the top 5: {sorted(set(draws.tolist()) - set(top.tolist()))}"
    assert (counts[top] > 0).all(), f"top_k=5 drew only {counts.nonzero().flatten().tolist()}"
    want = logits[top].double().softmax(-1)
    assert (counts[top] / 4000 - want).abs().max() < 0.03, (counts[top] / 4000, want)
    torch.manual_seed(5)
    assert len(set(m.generate(start.repeat(4000, 1), 1)[:, -1].tolist())) > 5, "top_k=None kept only the top 5"
    # and at temperature 0.5, probabilities of logits / 0.5 (not / 0.5 twice): logits spread wide enough to tell
    with torch.no_grad():
        spread = logits[top].max() - logits[top].min()
        m.transformer.wte.weight.mul_(0.75 / spread)     # the tied head: a top-5 spread of about 0.75
        logits = m(start)[0][0, -1]
    top = logits.topk(5).indices
    want, twice = ((logits[top].double() / t).softmax(-1) for t in (0.5, 0.25))
    assert (want - twice).abs().max() > 0.1, "test setup: the two temperatures should differ"
    torch.manual_seed(6)
    counts = torch.bincount(m.generate(start.repeat(4000, 1), 1, temperature=0.5, top_k=5)[:, -1], minlength=64)
    assert (counts[top].double() / 4000 - want).abs().max() < 0.03, (counts[top] / 4000, want)


def test_bias_true_adds_and_uses_biases():
    """bias=True: every LayerNorm and Linear (but the tied lm_head) has a bias, the count includes them, and
    each LayerNorm's bias is added to its output (so changing it changes the logits)."""
    C, L, V, hs, hkv = 64, 2, 64, 16, 2
    m = tiny(bias=True, n_kv_head=hkv)
    norms = [mod for mod in m.modules() if isinstance(mod, M.LayerNorm)]
    assert len(norms) == 2 * L + 1
    assert all(isinstance(n.bias, torch.nn.Parameter) and n.bias.shape == (C,) for n in norms), \
        "a LayerNorm of a bias=True model has no bias"
    assert all(lin.bias is not None for name, lin in m.named_modules()
               if isinstance(lin, torch.nn.Linear) and name != "lm_head"), "a Linear of a bias=True model has no bias"
    no_bias = 2 * C + C * (4 + 2 * hkv) * hs + C * C + 8 * C * C
    biases = 2 * C + (4 + 2 * hkv) * hs + C + 4 * C + C  # 2 LayerNorms, c_attn, attn c_proj, c_fc, mlp c_proj
    assert m.get_num_params() == L * (no_bias + biases) + 2 * C + V * C  # + ln_f weight and bias + wte
    x = torch.randn(3, C)
    idx = torch.randint(0, 64, (2, 16))
    for n in norms:
        with torch.no_grad():
            before = m(idx, idx)[0]
            torch.nn.init.uniform_(n.bias, -1, 1)
            torch.testing.assert_close(n(x), F.layer_norm(x, (C,), n.weight, None, 1e-5) + n.bias,
                                       msg=lambda s: f"LayerNorm does not add its bias: {s}")
            assert not torch.allclose(m(idx, idx)[0], before, atol=1e-4), "a LayerNorm bias changed nothing"


def test_load_state_refuses_missing_and_unexpected_keys():
    """A checkpoint of another architecture must not load partly: a missing key or an extra one raises
    (a learned position table into a RoPE model, a dropped LayerNorm gain, a stray tensor)."""
    sd = tiny().state_dict()
    missing = {k: v for k, v in sd.items() if k != "transformer.h.1.ln_2.weight"}
    with pytest.raises(RuntimeError, match="Missing key"):
        tiny().load_state(missing)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        tiny().load_state({**sd, "transformer.h.0.attn.stray": torch.zeros(3)})
    with pytest.raises(RuntimeError, match="Unexpected key.*wpe"):
        tiny(pos="rope").load_state(tiny(pos="learned").state_dict())
    with pytest.raises(RuntimeError, match="Missing key.*wpe"):
        tiny(pos="learned").load_state(sd)


def test_rocm_gpu_is_named_as_such(monkeypatch):
    """PyTorch calls a ROCm GPU "cuda" too: fp8 is unavailable there, and the reason says it is an AMD GPU
    rather than blaming a compute capability (an MI300X reports 9.4)."""
    import attention_fp8
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "AMD Instinct MI300X")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 4))
    assert not attention_fp8.fp8_supported("cuda")
    assert M.fp8_unavailable("cuda") == ("AMD Instinct MI300X: an AMD GPU (ROCm), and the kernel is written for "
                                         "NVIDIA's FP8 tensor cores")


@pytest.mark.parametrize("kw", [dict(), dict(pos="learned", qk_norm=True, n_kv_head=2, bias=True)])
def test_whole_forward_is_sequential_pre_norm_blocks(kw):
    """The GPT from its own parts: embeddings, then per block x + attn(ln_1(x)), then x + mlp(ln_2(x)) on
    that sum (not a parallel block that feeds both the same x), then ln_f and the tied head."""
    m = tiny(**kw)
    m.eval()
    idx = torch.randint(0, 64, (2, 32))
    with torch.no_grad():
        x = m.transformer.wte(idx)
        if m.config.pos == "learned":
            x = x + m.transformer.wpe(torch.arange(32))
        rope = (m.rope_cos[:, :32], m.rope_sin[:, :32]) if m.config.pos == "rope" else None
        for block in m.transformer.h:
            x = x + block.attn(block.ln_1(x), rope)
            x = x + block.mlp(block.ln_2(x))
        want = F.linear(m.transformer.ln_f(x), m.transformer.wte.weight)
        got, _ = m(idx, idx)
    torch.testing.assert_close(got, want)

"""train.py's delta-mismatch monitor (delta_monitor=True), on CPU through the Triton interpreter: it logs
the per-layer figures, they separate the arms as the kernel tests say, and it leaves training untouched."""
import os

import pytest

import train
from test_train import args, data_dir, metrics  # noqa: F401  (data_dir is a fixture)

pytest.importorskip("triton")
# these runs train on the CPU, where the FP8 kernel runs only under the Triton interpreter
needs_kernel = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="CPU training runs need the Triton interpreter for the FP8 kernel")


@needs_kernel
def test_delta_monitor_logs_and_leaves_training_alone(data_dir, tmp_path):  # noqa: F811
    # head dim 64 (the kernel's smallest), two layers, evaluations at iters 0, 2 and 4
    common = ["--n_embd=128", "--n_head=2", "--block_size=64", "--max_iters=4", "--eval_interval=2", "--dropout=0.1"]
    train.main(args(data_dir, tmp_path / "off", *common))
    train.main(args(data_dir, tmp_path / "on", *common, "--delta_monitor=True"))
    off, on = metrics(tmp_path / "off"), metrics(tmp_path / "on")
    assert off == on, "the monitor changed the training run"
    import json
    rows = [json.loads(line) for line in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 2, 4]
    for r in evals:
        for layer in (0, 1):
            assert r[f"ds_rowsum_matched_L{layer}"] < 1e-6 < 1e-3 < r[f"ds_rowsum_stale_L{layer}"], r
            assert r[f"key_grad_sum_matched_L{layer}"] < r[f"key_grad_sum_stale_L{layer}"], r
        assert r["delta_mismatch"] == max(r["delta_mismatch_L0"], r["delta_mismatch_L1"]) > 0


def test_delta_monitor_refuses_without_kernel(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """On a CPU without the interpreter the monitor has no kernel to run, and says why. At head dim 64 (the
    kernel's): the tiny run's head dim of 32 is refused for its own reason, which hid whether this one is
    found at all."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit, match=r"delta_monitor=True needs the FP8 kernel, which cannot run here: "
                                         r"no CUDA GPU \(device cpu\)$"):
        train.main(args(data_dir, tmp_path / "x", "--delta_monitor=True", "--n_embd=128", "--n_head=2"))


# -----------------------------------------------------------------------------------------------------
# train.delta_monitor called directly on a tiny fp8 GPT (no training run: ~3 s under the interpreter). Its
# figures are functions of the FP8 rounding alone (in exact arithmetic the stale and matched deltas agree for
# any q, k, v, dO), so an FP32 reference cannot give them; what it can give is the right inputs. So the
# reference here is delta_stats on tensors taken independently of the monitor's probe: q, k, v as the
# attention call received them, dO = dL/dy from our own autograd pass. Swapped k/v or O in place of dO give
# other figures (checked below, so the comparison has teeth), and the kernel is deterministic, so the
# per-layer figures must be equal to the last bit.

STATS = ("delta_mismatch", "ds_rowsum_matched", "ds_rowsum_stale", "key_grad_sum_matched", "key_grad_sum_stale")
N_LAYER, N_HEAD, N_KV_HEAD, HEAD_DIM = 2, 2, 1, 64  # head dim 64: the kernel's smallest; GQA as the kernel does it


@pytest.fixture(scope="module")
def monitored():
    """(the monitor's figures, the reference inputs of every layer: q, k, v, o, dO in the kernel's bf16)."""
    import contextlib

    import torch

    import model
    from model import GPT, GPTConfig
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the FP8 kernel on the CPU needs the Triton interpreter")
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=N_LAYER, n_head=N_HEAD, n_kv_head=N_KV_HEAD,
                        n_embd=N_HEAD * HEAD_DIM, attention="fp8"))
    probe = torch.randint(0, 64, (1, 17), generator=torch.Generator().manual_seed(1))
    # the reference pass, in eval mode like the monitor's: a spy on the kernel call records its inputs and
    # output; a hook on each c_proj keeps its input, which is y with its heads side by side, so dL/dy is its
    # gradient laid out again as (B, H, T, D)
    calls, proj_in = [], []
    real = model._fp8_attention

    def spy(q, k, v, **kw):
        o = real(q, k, v, **kw)
        calls.append((q.detach(), k.detach(), v.detach(), o.detach()))
        return o
    model._fp8_attention = spy
    hooks = [b.attn.c_proj.register_forward_hook(lambda mod, inp, out: proj_in.append(inp[0]))
             for b in gpt.transformer.h]
    gpt.eval()
    try:
        _, loss = gpt(probe[:, :-1], probe[:, 1:])
        grads = torch.autograd.grad(loss, proj_in)
    finally:
        model._fp8_attention = real
        for h in hooks:
            h.remove()
        gpt.train()
    refs = []
    for (q, k, v, o), g in zip(calls, grads):
        B, T, _ = g.shape
        do = g.view(B, T, N_HEAD, HEAD_DIM).transpose(1, 2).to(q.dtype)
        refs.append((q, k, v, o, do))
    assert len(refs) == N_LAYER and refs[0][1].shape == (1, N_KV_HEAD, 16, HEAD_DIM)
    return train.delta_monitor(gpt, probe, contextlib.nullcontext()), refs


def test_delta_monitor_measures_each_layers_own_q_k_v_and_do(monitored):
    from attention_fp8 import delta_stats
    out, refs = monitored
    for i, (q, k, v, o, do) in enumerate(refs):
        want = delta_stats(q, k, v, do, causal=True)
        got = {name: out[f"{name}_L{i}"] for name in STATS}
        assert got == want, f"layer {i}: the monitor's figures {got} are not those of its q, k, v, dO: {want}"
        if i == 0:  # the inputs the wiring could confuse give other figures, so the equality above can tell
            assert delta_stats(q, v, k, do, causal=True) != want, "k and v swapped give the same figures"
            assert delta_stats(q, k, v, o, causal=True) != want, "O in place of dO gives the same figures"


def test_delta_monitor_reports_the_worst_layer_as_the_max(monitored):
    out, _ = monitored
    worst_at = set()
    for name in STATS:
        per_layer = [out[f"{name}_L{i}"] for i in range(N_LAYER)]
        assert len(set(per_layer)) == N_LAYER, f"{name}: layers must differ for this test to tell max from others"
        assert out[name] == max(per_layer), f"{name}: reported {out[name]}, the layers' max is {max(per_layer)}"
        worst_at.add(per_layer.index(max(per_layer)))
    # the worst layer is the first for some figure and the last for another, so neither "first layer" nor
    # "last layer" passes for a max (nor min or mean: the layers differ)
    assert {0, N_LAYER - 1} <= worst_at, worst_at


@needs_kernel
def test_delta_stats_against_the_kernels_own_gradients():
    """delta_stats' own wiring (attention_fp8.py, host side): its key-gradient sums must be those of the dK
    that attention()'s autograd backward gives for the same q, k, v, dO in each arm (formula in FP32 here),
    and its delta mismatch must be near the FP32 reference's: |rowsum(dO * O_fp8) - rowsum(dO * O_exact)|
    over |rowsum(dO * O_exact)|. Near only, within 2x: the matched delta carries FP8 rounding the exact one
    lacks (0.028 against 0.043 here). O in place of dO inside delta_stats gives 0.007 and other dK sums;
    swapped k/v in its forward, other dK sums."""
    import torch

    import attention_fp8
    g = torch.Generator().manual_seed(0)
    B, H, H_kv, N, D = 2, 2, 1, 24, 64
    q, do = (torch.randn(B, H, N, D, generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(B, H_kv, N, D, generator=g).bfloat16() for _ in range(2))
    stats = attention_fp8.delta_stats(q, k, v, do, causal=True)
    for arm in ("matched", "stale"):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        o = attention_fp8.attention(qq, kk, vv, causal=True, delta=arm)
        o.backward(do)
        dk = kk.grad.float()  # (B, H_kv, N, D): ||sum over keys|| / sum of ||each key||, worst (batch, kv head)
        want = (dk.sum(2).norm(dim=-1) / dk.norm(dim=-1).sum(2)).max().item()
        assert stats[f"key_grad_sum_{arm}"] == want, (arm, stats[f"key_grad_sum_{arm}"], want)
    kr, vr = (x.float().repeat_interleave(H // H_kv, dim=1) for x in (k, v))
    s = (q.float() @ kr.transpose(-1, -2)) / D ** 0.5
    o_exact = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ vr
    stale, exact = ((do.float() * x.float()).sum(-1) for x in (o.detach(), o_exact))
    ref = ((stale - exact).norm() / exact.norm()).item()
    assert ref / 2 < stats["delta_mismatch"] < 2 * ref, (stats["delta_mismatch"], ref)


def test_delta_monitor_reports_nan_when_a_layer_goes_nan():
    """A non-finite layer must show in the worst-layer figures: a max seeded with 0.0 kept 0.0 against nan
    (nan > 0.0 is False), so a model gone nan read as a perfect delta. One weight set to nan in the last
    block's MLP makes the loss, and so every layer's dO, nan."""
    import contextlib

    import torch

    from model import GPT, GPTConfig
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the FP8 kernel on the CPU needs the Triton interpreter")
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=N_LAYER, n_head=N_HEAD, n_kv_head=N_KV_HEAD,
                        n_embd=N_HEAD * HEAD_DIM, attention="fp8"))
    with torch.no_grad():
        gpt.transformer.h[-1].mlp.c_fc.weight[0, 0] = float("nan")
    probe = torch.randint(0, 64, (1, 17), generator=torch.Generator().manual_seed(1))
    out = train.delta_monitor(gpt, probe, contextlib.nullcontext())
    for name in STATS:
        assert out[name] != out[name], f"{name}: reported {out[name]} for a model whose loss is nan"

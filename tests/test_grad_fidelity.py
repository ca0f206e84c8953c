"""grad_fidelity.py: the parameter groups, the error it reports, its fp32 reference, and a whole run on a
tiny checkpoint (on CPU the FP8 kernel runs under the Triton interpreter)."""
import copy
import json
import os

import pytest
import torch

import grad_fidelity
import train
from model import GPT, GPTConfig
from test_train import args, data_dir  # noqa: F401  (data_dir is a fixture)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="the FP8 kernel on the CPU needs the Triton interpreter")


def tiny_gpt(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=16, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, n_embd=32, qk_norm=True)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def test_groups_cover_every_parameter_row_once():
    gpt = tiny_gpt()
    groups = grad_fidelity.param_groups(gpt)
    for name, p in gpt.named_parameters():
        rows = torch.zeros(p.shape[0], dtype=torch.int64)
        for _, _, s in groups[name]:
            rows[s] += 1
        assert rows.eq(1).all(), f"{name}: rows counted {rows.tolist()}"
    # GQA: 4 query heads and 2 k/v heads of 8 channels, so c_attn has 32 q rows, then 16 k and 16 v rows
    (q, _, sq), (k, _, sk), (v, _, sv) = groups["transformer.h.1.attn.c_attn.weight"]
    assert (q, k, v) == ("W_q", "W_k", "W_v") and (sq, sk, sv) == (slice(0, 32), slice(32, 48), slice(48, 64))
    assert {g for parts in groups.values() for g, _, _ in parts} == set(grad_fidelity.GROUPS)
    for name, group in (("transformer.h.0.attn.c_proj.weight", "attn out"), ("transformer.h.0.mlp.c_proj.weight", "MLP"),
                        ("transformer.h.0.mlp.c_fc.weight", "MLP"), ("transformer.h.2.ln_2.weight", "norms"),
                        ("transformer.h.1.attn.k_norm.weight", "norms"), ("transformer.ln_f.weight", "norms"),
                        ("transformer.wte.weight", "embedding")):
        assert [g for g, _, _ in groups[name]] == [group], name
    assert "lm_head.weight" not in groups  # tied to wte: one parameter, both gradients in it


def test_the_two_batch_sets_are_disjoint_and_whole():
    """The 'other batches' column is the noise scale: the gradient of n other windows. Sets that shared
    windows (windows[s:s + n] instead of windows[s * n:(s + 1) * n]) would understate it."""
    windows = torch.arange(10)[:, None] * 100 + torch.arange(5)        # 10 windows of T + 1 = 5 tokens
    batches, other = grad_fidelity.batch_sets(windows, 4, 2)
    assert [len(x) for x, _ in batches] == [2, 2] and [len(x) for x, _ in other] == [2, 2]
    firsts = [x[:, 0].tolist() for x, _ in batches], [x[:, 0].tolist() for x, _ in other]
    assert firsts == ([[0, 100], [200, 300]], [[400, 500], [600, 700]]), firsts
    for x, y in batches + other:
        assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"


def test_relative_error_is_that_of_the_rows_changed():
    gpt = tiny_gpt()
    groups = grad_fidelity.param_groups(gpt)
    gen = torch.Generator().manual_seed(0)
    ref = {n: torch.randn(p.shape, generator=gen) for n, p in gpt.named_parameters()}
    grads = copy.deepcopy(ref)
    grads["transformer.h.1.attn.c_attn.weight"][32:48] *= 1.1  # W_k of layer 1, and nothing else
    err = grad_fidelity.relative_errors(grads, ref, groups)
    assert err["W_k L1"] == pytest.approx(0.1, rel=1e-6)
    k_all = torch.cat([ref[f"transformer.h.{i}.attn.c_attn.weight"][32:48] for i in range(3)])
    k1 = ref["transformer.h.1.attn.c_attn.weight"][32:48]
    assert err["W_k"] == pytest.approx(0.1 * (k1.norm() / k_all.norm()).item(), rel=1e-6)
    total = torch.cat([g.flatten() for g in ref.values()]).norm()
    assert err["all"] == pytest.approx(0.1 * (k1.norm() / total).item(), rel=1e-6)
    for key in ("W_q", "W_v", "W_q L1", "W_k L0", "W_k L2", "attn out", "MLP", "norms", "embedding"):
        assert err[key] == 0, key


def _two_batches(vocab=64, T=16):
    x = torch.randint(0, vocab, (4, T + 1), generator=torch.Generator().manual_seed(1))
    return [(x[:2, :-1], x[:2, 1:]), (x[2:, :-1], x[2:, 1:])]


def test_step_gradient_is_the_mean_of_the_micro_batches():
    """As train.py accumulates a step: (g1 + g2) / 2, not the last micro-batch's gradient / 2 (a
    zero_grad inside the loop) nor the sum."""
    gpt, cpu = tiny_gpt(), torch.device("cpu")
    b1, b2 = _two_batches()
    both = grad_fidelity.step_gradient(gpt, [b1, b2], "sdpa", "fp32", cpu)
    g1 = grad_fidelity.step_gradient(gpt, [b1], "sdpa", "fp32", cpu)
    g2 = grad_fidelity.step_gradient(gpt, [b2], "sdpa", "fp32", cpu)
    for name in both:
        torch.testing.assert_close(both[name], (g1[name] + g2[name]) / 2, rtol=1e-5, atol=1e-7, msg=name)


def test_the_reference_runs_with_tf32_off_and_math_attention():
    """Seen from inside the model's forward and backward: TF32 off for both matmul settings (train.py
    turns them on) and SDPA forced to its math backend; both restored after."""
    gpt, cpu = tiny_gpt(), torch.device("cpu")
    seen = []
    flags = lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                     torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                     torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())
    attn = gpt.transformer.h[0].attn
    attn.register_forward_hook(lambda *a: seen.append(("forward", flags())))
    attn.register_full_backward_hook(lambda *a: seen.append(("backward", flags())))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        before = flags()
        assert before == (True,) * 6, before     # PyTorch's defaults, with TF32 on as train.py has it
        grad_fidelity.reference_gradient(gpt, _two_batches(), cpu)
        # every one: a backend left off would make the next arm's "sdpa" (and later tests') run the math one
        assert flags() == before, f"TF32 or the SDPA backends were not restored: {flags()}"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    assert [k for k, _ in seen] == ["forward", "backward", "forward", "backward"], seen
    assert all(f == (False, False, True, False, False, False) for _, f in seen), seen


def test_the_noise_column_is_the_other_batches_against_the_reference():
    """'other batches' = ||g_other - g_ref|| / ||g_ref||, the reference's norm below (swapped, it is
    another figure), and each arm against the same reference."""
    gpt, cpu = tiny_gpt(), torch.device("cpu")
    x = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(2))
    batches, other = grad_fidelity.batch_sets(x, 4, 2)
    table = grad_fidelity.measure(gpt, batches, other, ["sdpa"], cpu)
    groups = grad_fidelity.param_groups(gpt)
    ref = grad_fidelity.reference_gradient(gpt, batches, cpu)
    want = grad_fidelity.relative_errors(grad_fidelity.reference_gradient(gpt, other, cpu), ref, groups)
    assert table["other batches"] == pytest.approx(want, rel=1e-9)
    swapped = grad_fidelity.relative_errors(ref, grad_fidelity.reference_gradient(gpt, other, cpu), groups)
    assert table["other batches"]["all"] != pytest.approx(swapped["all"], rel=1e-3)    # the test can tell them apart
    sdpa = grad_fidelity.relative_errors(grad_fidelity.step_gradient(gpt, batches, "sdpa", "bf16", cpu), ref, groups)
    assert table["sdpa"] == pytest.approx(sdpa, rel=1e-9)


def test_markdown_keeps_the_columns_order_and_prints_percent():
    table = {"other batches": {"W_q": 0.01234, "all": 0.5}, "fp8": {"W_q": 0.000456, "all": 0.02}}
    assert grad_fidelity.markdown(table, ["W_q", "all"]) == (
        "| parameters | other batches | fp8 |\n|---|---|---|\n| W_q | 1.23% | 0.0456% |\n| all | 50% | 2% |")


def test_json_record_and_printed_table_agree(data_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=1"))
    capsys.readouterr()
    path = tmp_path / "g.json"
    grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa", "--batches=1", "--batch_size=3",
                        f"--json={path}"])
    record = json.loads(path.read_text())
    assert (record["batches"], record["batch_size"], record["block_size"]) == (1, 3, 32), record
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| parameters |"))
    assert [c.strip() for c in lines[header].split("|")[2:-1]] == list(record["errors"]) == ["other batches", "sdpa"]
    for line in lines[header + 2:header + 2 + len(grad_fidelity.GROUPS) + 1]:
        row, *cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells == [f"{100 * record['errors'][c][row]:.3g}%" for c in record["errors"]], line


@pytest.mark.parametrize("device", ["cpu"] + ["cuda"] * torch.cuda.is_available())
def test_reference_is_fp32_attention_in_an_fp32_model(device):
    # the reference against the same model in float64: fp32 rounding only (a bf16 or TF32 step anywhere, or
    # autocast left on, would put it near 1e-3). TF32 on first, as train.py leaves it. No QK-norm: model.py's
    # RMSNorm computes in fp32 whatever the dtype
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    device = torch.device(device)
    gpt = tiny_gpt(qk_norm=False, n_embd=256).to(device)  # wide enough for TF32 to show, were it on
    x = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1)).to(device)
    batches = [(x[:1, :-1], x[:1, 1:]), (x[1:, :-1], x[1:, 1:])]
    try:
        ref = grad_fidelity.reference_gradient(gpt, batches, device)
        exact = grad_fidelity.step_gradient(copy.deepcopy(gpt).double(), batches, "sdpa", "fp32", device)
        assert torch.backends.cuda.matmul.allow_tf32, "TF32 was not restored"
        err = grad_fidelity.relative_errors(ref, exact, grad_fidelity.param_groups(gpt))
        assert 0 < err["all"] < 1e-5, err["all"]
        bf16 = grad_fidelity.step_gradient(gpt, batches, "sdpa", "bf16", device)
        assert grad_fidelity.relative_errors(bf16, exact, grad_fidelity.param_groups(gpt))["all"] > 1e-3
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


@needs_kernel
def test_run_on_a_checkpoint(data_dir, tmp_path, capsys):  # noqa: F811
    # a checkpoint with head dim 64 (the kernel's smallest), three layers, two steps trained
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--n_layer=3", "--n_embd=128", "--n_head=2", "--block_size=64", "--max_iters=2"))
    path = tmp_path / "grads.json"
    grad_fidelity.main([f"--out_dir={out}", f"--device={DEVICE}", "--batches=2", "--batch_size=2", f"--json={path}"])
    printed = capsys.readouterr().out
    assert "| W_k L2 |" in printed and "at iter 2" in printed
    table = json.loads(path.read_text())["errors"]
    assert list(table) == ["other batches", *grad_fidelity.ARMS]
    for col in table.values():
        assert all(0 < e < float("inf") for e in col.values()), col
    for arm in ("fp8/fp32", "fp8_stale/fp32", "fp8", "fp8_stale"):
        assert table[arm]["all"] < 0.3, (arm, table[arm]["all"])
    assert table["sdpa"]["all"] > 1e-3  # BF16, not the fp32 reference again
    assert table["fp8/fp32"]["all"] != table["fp8"]["all"]  # the rest of the model in fp32, not autocast
    # matched and stale differ only in the attention backward's delta. The last layer's MLP and its attention
    # output projection take their gradients before any attention backward runs, so they are equal bit for bit;
    # the last layer's W_k comes out of that attention backward, so it must differ: the setting reaches the kernel
    for rows in ("MLP L2", "attn out L2", "W_v L2"):  # dV = P^T dO has no delta in it either
        assert table["fp8/fp32"][rows] == table["fp8_stale/fp32"][rows], rows
        assert table["fp8"][rows] == table["fp8_stale"][rows], rows
    assert table["fp8/fp32"]["W_k L2"] != table["fp8_stale/fp32"]["W_k L2"]
    # there the fp32 arms' error is the FP8 forward's alone: at the percent level, neither 0 nor 100%
    assert 1e-4 < table["fp8/fp32"]["MLP L2"] < 0.2


def test_init_is_a_fresh_model_with_the_runs_seed(data_dir, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=2", "--seed=7"))
    ckpt = train.load_checkpoint(str(out / "ckpt.pt"))
    fresh = grad_fidelity.load_model(ckpt, "ckpt.pt", True, torch.device("cpu"), fp8=False)
    trained = grad_fidelity.load_model(ckpt, "ckpt.pt", False, torch.device("cpu"), fp8=False)
    torch.manual_seed(7)
    seeded = GPT(trained.config)
    for (name, p), q in zip(fresh.named_parameters(), seeded.parameters()):
        assert torch.equal(p, q), name
    assert not all(torch.equal(p, r) for p, r in zip(fresh.parameters(), trained.parameters()))
    assert not fresh.training


def test_errors_name_the_problem(data_dir, tmp_path):  # noqa: F811
    with pytest.raises(SystemExit, match="no checkpoint at"):
        grad_fidelity.main([f"--out_dir={tmp_path / 'none'}", "--device=cpu"])
    with pytest.raises(SystemExit, match="unknown arm.*fp9"):
        grad_fidelity.main([f"--out_dir={tmp_path}", "--arms=sdpa,fp9"])
    with pytest.raises(SystemExit, match="config error.*colour"):
        grad_fidelity.main(["--colour=red"])
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=1"))
    with pytest.raises(SystemExit, match="windows.*lower --batches"):
        grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa", "--batches=1000"])
    with pytest.raises(SystemExit, match="json=.*no folder"):
        grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa", f"--json={tmp_path / 'no' / 'x.json'}"])
    with pytest.raises(SystemExit, match="json=.* is a folder"):
        grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa", f"--json={tmp_path}"])
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    # a run given a relative path, measured from another folder (or its data moved): --dataset names it from here
    torch.save(dict(ckpt, config=dict(ckpt["config"], dataset="moved/away")), out / "ckpt.pt")
    with pytest.raises(SystemExit, match=r"the checkpoint's dataset moved/away: .*meta.json is missing.*--dataset=PATH"):
        grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa"])
    grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa", "--batches=1", "--batch_size=1",
                        f"--dataset={data_dir}"])
    # the dataset prepared again with another tokenizer since the run: bytes fit a GPT-2 model's embedding,
    # so nothing failed and the table measured text the model never read
    torch.save(dict(ckpt, meta=dict(ckpt["meta"], tokenizer="gpt2", vocab_size=50257)), out / "ckpt.pt")
    with pytest.raises(SystemExit, match=r"was trained on gpt2 tokens \(vocab 50257\), but .* now holds bytes tokens "
                                         r"\(vocab 257\): prepare it again"):
        grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa"])
    train.main(args(data_dir, tmp_path / "no_layers", "--max_iters=1", "--n_layer=0"))  # train.py takes it
    with pytest.raises(SystemExit, match="n_layer=0, so no attention gradient to measure"):
        grad_fidelity.main([f"--out_dir={tmp_path / 'no_layers'}", "--device=cpu", "--arms=sdpa"])
    torch.save(dict(ckpt, model_args=dict(ckpt["model_args"], n_head=0)), out / "ckpt.pt")
    with pytest.raises(SystemExit, match="must be a multiple of n_head=0"):
        grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa"])
    del ckpt["model_args"]["n_kv_head"]
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(SystemExit, match="model_args has no n_kv_head"):
        grad_fidelity.main([f"--out_dir={out}", "--device=cpu", "--arms=sdpa"])

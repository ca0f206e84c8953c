"""
How far each attention path moves the whole model's gradient from FP32: one checkpoint, one step's worth
of validation batches, every parameter.

    python grad_fidelity.py                            # out/ckpt.pt, 4 micro-batches of 16 sequences
    python grad_fidelity.py --init=True                # the same architecture at a fresh initialization
    python grad_fidelity.py --out_dir=out-ablation/fp8 --batches=8 --json=grads.json   # an arm that saved:
                                                       # ablation.py run ... without --save_checkpoint=False

The kernel tests measure the attention gradients dQ, dK, dV; this measures what reaches the weights,
where the optimizer sees it. The reference is the model in fp32 with PyTorch's math attention in fp32
(TF32 off). Then each arm computes the same step gradient (the mean over the micro-batches, as train.py
accumulates it, without clipping):
  sdpa            BF16 SDPA under bf16 autocast: what BF16 training gets
  fp8, fp8_stale  the FP8 kernel, matched or stale delta, under bf16 autocast: what train.py runs
  fp8/fp32, fp8_stale/fp32   the FP8 kernel with the rest of the model in fp32 (q, k, v rounded to bf16
                  for the kernel), so the error is the attention's alone, that rounding included
and the table gives ||g - g_fp32|| / ||g_fp32|| per parameter group: the q, k and v rows of c_attn
(W_q, W_k, W_v), the attention output projection, the MLPs, the norms, the tied embedding, and all of
them; then W_k layer by layer, where the stale delta's error would show first (its dK errs by a shared
translation of the keys, attention_fp8.py's docstring). One more column, "other batches", is the fp32
step gradient of the next batches x batch_size windows of the val split, measured against the reference
the same way: how far apart two steps' gradients are, the scale to read the precision errors against
(for independent batches it is sqrt(2) times one step's sampling noise; these windows are consecutive
text).

The model runs eagerly in eval mode (no dropout), so every arm sees the same computation but for its
attention and precision. On a Hopper GPU eager FP8 calls below 2^29 scores (B H N^2) run the Triton
kernels, as the default model's do; a compiled model runs the Gluon forward and dK/dV, the same method
with other tilings (attention_fp8.py, HOPPER_FORWARD_MIN_SCORES).
"""
import json
import os
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

import configurator
from data.common import atomic_write, load_meta
from model import GPT, GPTConfig, fp8_unavailable, shape_problem
from train import ARCH_KEYS, dataset_dir, load_checkpoint, val_windows

ARMS = {  # name: (attention path, precision of everything else)
    "sdpa": ("sdpa", "bf16"),
    "fp8": ("fp8", "bf16"),
    "fp8_stale": ("fp8_stale", "bf16"),
    "fp8/fp32": ("fp8", "fp32"),
    "fp8_stale/fp32": ("fp8_stale", "fp32"),
}
GROUPS = ("W_q", "W_k", "W_v", "attn out", "MLP", "norms", "embedding")


@dataclass
class FidelityConfig:
    out_dir: str = "out"  # reads out_dir/ckpt.pt: its weights, architecture and dataset
    init: bool = False  # the checkpoint's architecture at a fresh initialization (the run's seed) instead
    batches: int = 4  # micro-batches per step gradient
    batch_size: int = 16  # sequences per micro-batch (of the checkpoint's block_size): train.py's default step
    arms: str = ",".join(ARMS)
    device: str = "auto"
    json: str = ""  # also write the figures to this file
    dataset: str = ""  # whose val split to measure on: "" for the run's own; a name or path, as train.py takes it


def param_groups(model):
    """{parameter name: [(group, layer or None, row slice)]}: which rows of each parameter belong where.
    c_attn holds q for every head, then k and v for the n_kv_head groups (model.py), so it splits three ways."""
    cfg = model.config
    hs = cfg.n_embd // cfg.n_head
    nq, nkv = cfg.n_head * hs, cfg.n_kv_head * hs
    out = {}
    for name, _ in model.named_parameters():
        layer = int(name.split(".")[2]) if name.startswith("transformer.h.") else None
        if ".attn.c_attn." in name:
            out[name] = [("W_q", layer, slice(0, nq)), ("W_k", layer, slice(nq, nq + nkv)),
                         ("W_v", layer, slice(nq + nkv, nq + 2 * nkv))]
        elif ".attn.c_proj." in name:
            out[name] = [("attn out", layer, slice(None))]
        elif ".mlp." in name:
            out[name] = [("MLP", layer, slice(None))]
        elif ".ln_" in name or name.startswith("transformer.ln_f") or "_norm." in name:
            out[name] = [("norms", layer, slice(None))]  # LayerNorms, and QK-norm's gains
        elif name.startswith(("transformer.wte", "transformer.wpe", "lm_head")):
            out[name] = [("embedding", None, slice(None))]  # lm_head is wte (tied): named once by PyTorch
        else:
            raise ValueError(f"parameter {name}: no group for it (a new kind of layer in model.py?)")
    return out


def relative_errors(grads, ref, groups):
    """{group: ||g - ref|| / ||ref||} over each group's rows together, and per layer as 'group Li', and
    'all' over every parameter."""
    num, den = {}, {}
    for name, parts in groups.items():
        for group, layer, rows in parts:
            d = (grads[name][rows] - ref[name][rows]).double().pow(2).sum().item()
            r = ref[name][rows].double().pow(2).sum().item()
            for key in (group, "all") + ((f"{group} L{layer}",) if layer is not None else ()):
                num[key] = num.get(key, 0.0) + d
                den[key] = den.get(key, 0.0) + r
    return {k: (num[k] / den[k]) ** 0.5 if den[k] > 0 else float("nan") for k in num}


@contextmanager
def fp32_matmuls():
    """TF32 off while it lasts (train.py turns it on, and the setting is global): the reference must be
    fp32, and the fp32 arms must differ from it in their attention alone."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def step_gradient(model, batches, attention, precision, device):
    """The mean of the micro-batches' gradients, in fp32, for every parameter (by name)."""
    for block in model.transformer.h:
        block.attn.attention = attention
    model.zero_grad(set_to_none=True)
    with fp32_matmuls():  # forward and backward; under autocast the matmuls are bf16 anyway
        for x, y in batches:
            with torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext():
                _, loss = model(x, y)
            (loss / len(batches)).backward()
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}


def reference_gradient(model, batches, device):
    """fp32 throughout, the attention by PyTorch's math backend (the softmax written out in fp32)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return step_gradient(model, batches, "sdpa", "fp32", device)


def batch_sets(windows, n, batch_size):
    """Two sets of n windows each, the first n and the next n, as (inputs, targets) batches: the step's
    batches, and the 'other batches' whose gradient gives the noise scale. They share no window."""
    return [[(w[:, :-1], w[:, 1:]) for w in windows[s * n:(s + 1) * n].split(batch_size)] for s in (0, 1)]


def measure(model, batches, other_batches, arms, device):
    """{column: {group: relative error}} for the arms and the 'other batches' column."""
    groups = param_groups(model)
    ref = reference_gradient(model, batches, device)
    table = {"other batches": relative_errors(reference_gradient(model, other_batches, device), ref, groups)}
    for arm in arms:
        table[arm] = relative_errors(step_gradient(model, batches, *ARMS[arm], device), ref, groups)
    return table


def markdown(table, rows):
    cols = list(table)
    lines = ["| parameters | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(f"{100 * table[c][row]:.3g}%" for c in cols) + " |")
    return "\n".join(lines)


def load_model(ckpt, path, init, device, fp8):
    """The checkpoint's model (or its architecture freshly initialized with its run's seed, as train.py
    seeds it), in fp32 on device, eval mode. Built on an fp8 path when an arm needs the kernel, so that
    model.py imports it; each arm then sets the path of every layer."""
    model_args = ckpt["model_args"]
    missing = [k for k in ARCH_KEYS + ("block_size", "vocab_size") if not isinstance(model_args, dict) or k not in model_args]
    if missing:
        raise SystemExit(f"{path}: model_args has no {', '.join(missing)}: not a checkpoint train.py wrote")
    if model_args["n_layer"] < 1:
        raise SystemExit(f"{path}: n_layer={model_args['n_layer']}, so no attention gradient to measure")
    why = shape_problem(model_args["n_embd"], model_args["n_head"], model_args["n_kv_head"], model_args["pos"])
    if why:
        raise SystemExit(f"{path}: {why}")
    head_dim = model_args["n_embd"] // model_args["n_head"]
    if fp8 and fp8_unavailable(device, head_dim):
        raise SystemExit(f"the fp8 arms need the FP8 kernel, which cannot run here: {fp8_unavailable(device, head_dim)}"
                         " (--arms=sdpa measures BF16 alone)")
    torch.manual_seed(ckpt.get("config", {}).get("seed", 1337))
    try:
        model = GPT(GPTConfig(**dict(model_args, attention="fp8" if fp8 else "sdpa")))
        if not init:
            model.load_state(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as e:  # weights or settings this model.py does not build
        raise SystemExit(f"{path}: its model does not load here: {type(e).__name__}: {e}")
    return model.to(device).eval()


def check_settings(arms, batches, batch_size, json_path):
    """The arms named in `arms` (comma-separated), after checking them and the other settings that would
    otherwise fail only after the first measurement (also results/size_probe.py's)."""
    names = [a for a in arms.split(",") if a]
    unknown = [a for a in names if a not in ARMS]
    if unknown or not names:
        raise SystemExit(f"arms={arms!r}: unknown arm(s) {', '.join(unknown) or '(none given)'}; the arms are "
                         f"{', '.join(ARMS)}")
    if batches < 1 or batch_size < 1:
        raise SystemExit(f"batches={batches}, batch_size={batch_size}: both must be at least 1")
    if json_path and os.path.isdir(json_path):
        raise SystemExit(f"json={json_path} is a folder: name a file to write (in it, say)")
    if json_path and not os.path.isdir(os.path.dirname(os.path.abspath(json_path))):
        raise SystemExit(f"json={json_path}: no folder {os.path.dirname(os.path.abspath(json_path))} to write it in")
    return names


def main(argv=None):
    try:
        cfg = configurator.parse(FidelityConfig(), sys.argv[1:] if argv is None else argv)
        configurator.check_device(cfg.device)
    except configurator.ConfigError as e:
        raise SystemExit(f"config error: {e}")
    cfg.out_dir, cfg.json = os.path.expanduser(cfg.out_dir), os.path.expanduser(cfg.json)  # the shell leaves ~ after =
    arms = check_settings(cfg.arms, cfg.batches, cfg.batch_size, cfg.json)
    device = configurator.pick_device(cfg.device)
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if not os.path.exists(path):
        raise SystemExit(f"no checkpoint at {path}: train first (python train.py), or pass --out_dir")
    ckpt = load_checkpoint(path, ("model", "model_args", "iter_num"))
    fp8 = any(ARMS[a][0] != "sdpa" for a in arms)
    model = load_model(ckpt, path, cfg.init, device, fp8)
    run = ckpt.get("config", {})
    weights = f"initialization (seed {run.get('seed', 1337)})" if cfg.init else f"iter {ckpt['iter_num']}"
    arch = model.config

    # a relative path the run was given is relative to where it ran: --dataset names the folder from here
    data_dir = dataset_dir(cfg.dataset or run.get("dataset", "builtin"))
    T, n = arch.block_size, cfg.batches * cfg.batch_size
    try:
        meta = load_meta(data_dir)
        # the folder may have been prepared again since: tokens of another tokenizer either index past the
        # embedding or, fewer of them (bytes under a GPT-2 model), give a table of a text the model never read
        trained_on = ckpt.get("meta")   # what train.py read from meta.json when it trained
        if trained_on and (trained_on.get("tokenizer"), trained_on.get("vocab_size")) != (meta["tokenizer"],
                                                                                          meta["vocab_size"]):
            raise SystemExit(f"{path} was trained on {trained_on.get('tokenizer')} tokens (vocab "
                             f"{trained_on.get('vocab_size')}), but {data_dir} now holds {meta['tokenizer']} tokens "
                             f"(vocab {meta['vocab_size']}): prepare it again as the run had it")
        windows = val_windows(data_dir, T, 2 * n * T, meta["vocab_size"])
    except (OSError, ValueError) as e:
        whose, hint = ("dataset", "") if cfg.dataset else \
            ("the checkpoint's dataset", " (moved, or a relative path from elsewhere? --dataset=PATH names it)")
        raise SystemExit(f"{whose} {data_dir}: {e}{hint}")
    if len(windows) < 2 * n:
        raise SystemExit(f"the val split of {data_dir} has {len(windows)} windows of {T + 1} tokens; two sets of "
                         f"batches x batch_size = {n} need {2 * n} (lower --batches or --batch_size)")
    windows = windows.to(device)
    batches, other_batches = batch_sets(windows, n, cfg.batch_size)
    table = measure(model, batches, other_batches, arms, device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{path} at {weights}: {model.get_num_params() / 1e6:.1f}M parameters, {arch.n_layer} layers, "
          f"head dim {arch.n_embd // arch.n_head}; {cfg.batches} x {cfg.batch_size} x {T} validation tokens; {where}")
    print("relative error of the step gradient against fp32, ||g - g_fp32|| / ||g_fp32||:\n")
    print(markdown(table, GROUPS + ("all",)))
    print("\nW_k, layer by layer:\n")
    print(markdown(table, [f"W_k L{i}" for i in range(arch.n_layer)]))
    if cfg.json:
        record = {"checkpoint": path, "weights": weights, "device": where, "batches": cfg.batches,
                  "batch_size": cfg.batch_size, "block_size": T, "torch": torch.__version__, "errors": table}
        atomic_write(cfg.json, lambda f: json.dump(record, f, indent=1), mode="w")
        print(f"\nwrote {cfg.json}")


if __name__ == "__main__":
    configurator.run_script(main)

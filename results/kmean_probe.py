"""
Probe (not part of the trainer): why does FP8 attention's error in the weight gradient grow as the model
trains (README, "The whole model's gradient against FP32")? One suspect is a component shared by all keys:
adding one vector m to every key changes no softmax row (each row's scores move by q_i . m), but it
takes up the FP8 range of K's scale tiles, so the part of k that decides the scores gets fewer bits.

For each checkpoint given: one batch of validation windows through the model (eval, bf16 autocast, SDPA),
capturing each layer's q, k, v and dO = dL/dy; then, per layer:
  key_mean    ||mean_j k_j|| / rms_j ||k_j||, averaged over (batch, kv head): 0 for keys around the origin
  entropy     mean entropy of the attention rows, in nats (log 1024 = 6.9 for uniform rows of 1024 keys)
  o, dq, dk, dv   relative Frobenius error of the FP8 kernel (matched delta) against fp32 math attention
              on the same bf16 inputs
  the same four with the keys centred first (k - mean_j k_j per sequence and head; the gradient reaches
              k through the subtraction), which in exact arithmetic changes nothing
and, for the whole model, grad_fidelity.py's error of the step gradient against fp32 (all parameters, W_q,
W_k) with the FP8 kernel as it is and with the keys centred before it.

    python results/kmean_probe.py out/ckpt.pt [more checkpoints] [--init] [--batch=4] [--json=FILE]
(--init: also the first checkpoint's architecture at a fresh initialization, its run's seed)
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model as model_module  # noqa: E402
import grad_fidelity  # noqa: E402
from attention_fp8 import attention  # noqa: E402
from data.common import load_meta  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from train import dataset_dir, load_checkpoint, val_windows  # noqa: E402


def capture(model, windows, device):
    """Each layer's (q, k, v, dO) in bf16, from one forward and backward of the windows."""
    attns = [b.attn for b in model.transformer.h]
    for a in attns:
        a.probe = {}
    xy = windows.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        _, loss = model(xy[:, :-1], xy[:, 1:])
    dys = torch.autograd.grad(loss, [a.probe["y"] for a in attns])
    out = [tuple(a.probe[n].to(torch.bfloat16) for n in ("q", "k", "v")) + (dy.to(torch.bfloat16),)
           for a, dy in zip(attns, dys)]
    for a in attns:
        a.probe = None
    return out


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def layer_figures(q, k, v, do):
    rep = q.shape[1] // k.shape[1]
    kf = k.float()
    mean = kf.mean(dim=2)                                              # (B, Hkv, D)
    rms = kf.pow(2).sum(-1).mean(dim=2).sqrt()                          # (B, Hkv)
    out = {"key_mean": (mean.norm(dim=-1) / rms).mean().item()}

    def reference(q, k, v):  # fp32, the softmax written out (math backend), GQA by repeating k and v
        return F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(rep, 1),
                                              v.float().repeat_interleave(rep, 1), is_causal=True)
    with torch.no_grad():
        s = (q.float() @ kf.repeat_interleave(rep, 1).transpose(-1, -2)) / math.sqrt(q.shape[-1])
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        p = s.softmax(-1)
        out["entropy"] = -(p * p.clamp_min(1e-30).log()).sum(-1).mean().item()
        del s, p
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        ref = grads(reference, q, k, v, do)
    plain = grads(lambda q, k, v: attention(q, k, v, causal=True), q, k, v, do)
    centred = grads(lambda q, k, v: attention(q, (k - k.float().mean(2, keepdim=True)).to(k.dtype), v, causal=True),
                    q, k, v, do)
    for name, got in (("", plain), ("centred_", centred)):
        for i, t in enumerate(("o", "dq", "dk", "dv")):
            out[name + t] = rel(got[i], ref[i])
    return out


def centred_keys(q, k, v, **kw):
    return attention(q, (k - k.float().mean(2, keepdim=True)).to(k.dtype), v, **kw)


def model_figures(model, windows, device, batch_size):
    """grad_fidelity.py's relative errors (all, W_q, W_k) of the FP8 arm, plain and with centred keys."""
    batches = [(w[:, :-1], w[:, 1:]) for w in windows.to(device).split(batch_size)]
    groups = grad_fidelity.param_groups(model)
    ref = grad_fidelity.reference_gradient(model, batches, device)
    out = {}
    for name, fn in (("fp8", attention), ("fp8_centred", centred_keys)):
        model_module._fp8_attention = fn
        err = grad_fidelity.relative_errors(grad_fidelity.step_gradient(model, batches, "fp8", "bf16", device),
                                            ref, groups)
        out.update({f"{name} {g}": err[g] for g in ("all", "W_q", "W_k")})
    model_module._fp8_attention = attention
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpts", nargs="+")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json", default="")
    ap.add_argument("--init", action="store_true")
    ap.add_argument("--model_batches", type=int, default=4, help="micro-batches of 16 for the whole-model figures")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    device = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    record = {}
    model_module._fp8_attention = attention
    for path, init in [(a.ckpts[0], True)] * a.init + [(p, False) for p in a.ckpts]:
        ckpt = load_checkpoint(path, ("model", "model_args", "config", "iter_num"))
        args = dict(ckpt["model_args"], attention="sdpa")
        torch.manual_seed(ckpt["config"]["seed"])
        model = GPT(GPTConfig(**args))
        if init:
            ckpt["iter_num"] = "0 (fresh initialization)"
        else:
            model.load_state(ckpt["model"])
        model.to(device).eval()
        data_dir = dataset_dir(ckpt["config"]["dataset"])
        T = args["block_size"]
        n = max(a.batch, 16 * a.model_batches)
        windows = val_windows(data_dir, T, n * T, load_meta(data_dir)["vocab_size"])[:n]
        rows = [layer_figures(*t) for t in capture(model, windows[:a.batch], device)]
        whole = model_figures(model, windows[:16 * a.model_batches], device, 16) if a.model_batches else {}
        record[f"{path} iter {ckpt['iter_num']}"] = {"layers": rows, "model": whole}
        print(f"\n{path} at iter {ckpt['iter_num']}: {a.batch} x {T} validation tokens")
        cols = list(rows[0])
        print("| layer | " + " | ".join(cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for i, r in enumerate(rows):
            print(f"| {i} | " + " | ".join(f"{r[c]:.4g}" for c in cols) + " |")
        if whole:
            print("whole model, step gradient vs fp32: " + ", ".join(f"{k} {100 * v:.3g}%" for k, v in whole.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

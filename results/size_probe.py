"""
Probe (not part of the trainer): does the stale delta's error in the weight gradient grow with model size?
The paper reports a loss gap that grows from 569M to 1.67B and 5.29B parameters; training at those sizes
is out of this project's GPU time, but one step's gradient at a fresh initialization is not.

For each architecture named: the model freshly initialized (--seed, 1337 as train.py seeds it), and
grad_fidelity.py's measurement on it: the step gradient of every parameter with each attention arm against
the model in fp32 with math attention, ||g - g_fp32|| / ||g_fp32|| per parameter group, W_k layer by layer,
and the fp32 gradient of the next batches for scale. The batches are validation windows of the built-in
corpus (GPT-2 tokens: run `python data/builtin/prepare.py --max_mb=128` first).

    python results/size_probe.py --sizes=gpt2,gpt2-medium --batches=4 --batch_size=16 --json=FILE

Sizes are GPT-2's (head dim 64) plus train.py's default (6 heads of 128) and a 24-layer model with heads
of 128, or any LAYERSxHEADSxWIDTH (e.g. 12x16x1024). At a fresh initialization attention is near uniform; what training does to these errors at the
default size is in the README ("The whole model's gradient against FP32").
"""
import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grad_fidelity  # noqa: E402
from data.common import load_meta  # noqa: E402
from train import dataset_dir, val_windows  # noqa: E402

SIZES = {  # name: (n_layer, n_head, n_embd)
    "default": (6, 6, 768),        # train.py's default: 81M, head dim 128
    "gpt2": (12, 12, 768),         # 124M
    "gpt2-medium": (24, 16, 1024),  # 350M
    "medium-d128": (24, 8, 1024),   # 350M, head dim 128
    "gpt2-large": (36, 20, 1280),  # 774M
    "gpt2-xl": (48, 25, 1600),     # 1.56B
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--arms", default=",".join(grad_fidelity.ARMS))
    p.add_argument("--seed", type=int, default=1337, help="initialization seed (train.py's default 1337)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default="")
    a = p.parse_args()
    sizes, arms = a.sizes.split(","), a.arms.split(",")
    for s in sizes:
        if s not in SIZES and not re.fullmatch(r"\d+x\d+x\d+", s):
            raise SystemExit(f"unknown size {s!r}; the sizes are {', '.join(SIZES)}, or LAYERSxHEADSxWIDTH")
    device = torch.device(a.device)
    fp8 = any(grad_fidelity.ARMS[arm][0] != "sdpa" for arm in arms)

    data_dir = dataset_dir("builtin")
    meta = load_meta(data_dir)
    T, n = 1024, a.batches * a.batch_size
    windows = val_windows(data_dir, T, 2 * n * T, a.batch_size, meta["vocab_size"])
    if len(windows) < 2 * n:
        raise SystemExit(f"{data_dir}: {len(windows)} val windows, {2 * n} needed")
    windows = windows.to(device)
    sets = [[(w[:, :-1], w[:, 1:]) for w in windows[s * n:(s + 1) * n].split(a.batch_size)] for s in (0, 1)]

    records = {}
    for name in sizes:
        n_layer, n_head, n_embd = SIZES[name] if name in SIZES else map(int, name.split("x"))
        model_args = dict(n_layer=n_layer, n_head=n_head, n_kv_head=n_head, n_embd=n_embd, bias=False,
                          qk_norm=False, pos="rope", rope_base=10000.0, block_size=T, vocab_size=50304)
        ckpt = {"model_args": model_args, "config": {"seed": a.seed}}
        model = grad_fidelity.load_model(ckpt, name, True, device, fp8)
        table = grad_fidelity.measure(model, sets[0], sets[1], arms, device)
        params = model.get_num_params() / 1e6
        print(f"\n## {name}: {params:.0f}M parameters, {n_layer} layers, {n_head} heads of {n_embd // n_head}, "
              f"initialization (seed {a.seed}); {a.batches} x {a.batch_size} x {T} validation tokens; "
              f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}\n", flush=True)
        print(grad_fidelity.markdown(table, grad_fidelity.GROUPS + ("all",)))
        print("\nW_k, layer by layer:\n")
        print(grad_fidelity.markdown(table, [f"W_k L{i}" for i in range(n_layer)]), flush=True)
        records[name] = {"params_M": params, "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "errors": table}
        del model
        torch.cuda.empty_cache() if device.type == "cuda" else None
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seed": a.seed, "batches": a.batches, "batch_size": a.batch_size, "torch": torch.__version__,
                       "sizes": records}, f, indent=1)


if __name__ == "__main__":
    main()

"""
Probe (not part of the trainer): does the stale delta's error in the weight gradient grow with model size?
The paper reports a loss gap that grows from 569M to 1.67B and 5.29B parameters; training at those sizes
is out of this project's GPU time, but one step's gradient at a fresh initialization is not.

For each architecture named: the model freshly initialized (--seed, 1337 as train.py seeds it), and
grad_fidelity.py's measurement on it: the step gradient of every parameter with each attention arm against
the model in fp32 with math attention, ||g - g_fp32|| / ||g_fp32|| per parameter group, W_k layer by layer,
and the fp32 gradient of the next batches for scale. The batches are validation windows of the built-in
corpus in GPT-2 tokens (prepare.py falls back to bytes where tiktoken's GPT-2 file cannot be had, and
this probe then stops and says so).

    python data/builtin/prepare.py --max_mb=128
    python results/size_probe.py --sizes=gpt2,gpt2-medium --batches=4 --batch_size=16 --json=FILE

Sizes are GPT-2's (head dim 64) plus train.py's default (6 heads of 128) and a 24-layer model with heads
of 128, or any LAYERSxHEADSxWIDTH (e.g. 12x16x1024: 12 layers, 16 heads, n_embd 1024, head dim 64).
At a fresh initialization attention is near uniform; what training does to these errors is in the README
("The whole model's gradient against FP32").
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
import grad_fidelity  # noqa: E402
from data.common import atomic_write, load_meta  # noqa: E402
from model import fp8_unavailable, shape_problem  # noqa: E402
from train import dataset_dir, val_windows  # noqa: E402

SIZES = {  # name: (n_layer, n_head, n_embd); parameter counts as model.py builds them with GPT-2's vocab
    "default": (6, 6, 768),        # train.py's default: 81M, head dim 128
    "gpt2": (12, 12, 768),         # 124M
    "gpt2-medium": (24, 16, 1024),  # 354M
    "medium-d128": (24, 8, 1024),   # 354M, head dim 128
    "gpt2-large": (36, 20, 1280),  # 772M
    "gpt2-xl": (48, 25, 1600),     # 1.56B
}


def shape(name):
    """(n_layer, n_head, n_embd) of a size name or of LAYERSxHEADSxWIDTH; SystemExit naming what is wrong."""
    if name in SIZES:
        return SIZES[name]
    if not re.fullmatch(r"[1-9]\d*x[1-9]\d*x[1-9]\d*", name):
        raise SystemExit(f"unknown size {name!r}; the sizes are {', '.join(SIZES)}, or LAYERSxHEADSxWIDTH")
    return tuple(map(int, name.split("x")))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--arms", default=",".join(grad_fidelity.ARMS))
    p.add_argument("--seed", type=int, default=1337, help="initialization seed (train.py's default 1337)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", default="", help="rewritten after each size, so a later failure keeps the earlier ones")
    a = p.parse_args()
    sizes = [s for s in a.sizes.split(",") if s]
    arms = grad_fidelity.check_settings(a.arms, a.batches, a.batch_size, a.json)
    try:
        configurator.check_device(a.device)
    except configurator.ConfigError as e:
        raise SystemExit(f"config error: {e}")
    device = configurator.pick_device(a.device)
    fp8 = any(grad_fidelity.ARMS[x][0] != "sdpa" for x in arms)
    for name in sizes:  # every size checked before the first is measured
        n_layer, n_head, n_embd = shape(name)
        why = shape_problem(n_embd, n_head, n_head, "rope") or (fp8 and fp8_unavailable(device, n_embd // n_head))
        if why:
            raise SystemExit(f"size {name}: {why}")

    data_dir = dataset_dir("builtin")
    meta = load_meta(data_dir)
    if meta.get("tokenizer") != "gpt2":  # the sizes are GPT-2's, and so is the vocabulary they are measured with
        raise SystemExit(f"{data_dir} holds {meta.get('tokenizer')} tokens; this probe measures GPT-2 tokens: "
                         "python data/builtin/prepare.py --max_mb=128")
    T, n = 1024, a.batches * a.batch_size
    windows = val_windows(data_dir, T, 2 * n * T, meta["vocab_size"])
    if len(windows) < 2 * n:
        raise SystemExit(f"{data_dir}: {len(windows)} val windows, {2 * n} needed (lower --batches or --batch_size)")
    windows = windows.to(device)
    sets = [[(w[:, :-1], w[:, 1:]) for w in windows[s * n:(s + 1) * n].split(a.batch_size)] for s in (0, 1)]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    record = {"seed": a.seed, "batches": a.batches, "batch_size": a.batch_size, "block_size": T, "arms": arms,
              "device": where, "tokenizer": meta["tokenizer"], "torch": torch.__version__, "commit": commit, "sizes": {}}

    for name in sizes:
        n_layer, n_head, n_embd = shape(name)
        model_args = dict(n_layer=n_layer, n_head=n_head, n_kv_head=n_head, n_embd=n_embd, bias=False,
                          qk_norm=False, pos="rope", rope_base=10000.0, block_size=T,
                          vocab_size=math.ceil(meta["vocab_size"] / 64) * 64)  # as train.py pads it
        ckpt = {"model_args": model_args, "config": {"seed": a.seed}}
        model = grad_fidelity.load_model(ckpt, name, True, device, fp8)
        table = grad_fidelity.measure(model, sets[0], sets[1], arms, device)
        params = model.get_num_params() / 1e6
        print(f"\n## {name}: {params:.0f}M parameters, {n_layer} layers, {n_head} heads of {n_embd // n_head}, "
              f"initialization (seed {a.seed}); {a.batches} x {a.batch_size} x {T} validation tokens; {where}\n",
              flush=True)
        print(grad_fidelity.markdown(table, grad_fidelity.GROUPS + ("all",)))
        print("\nW_k, layer by layer:\n")
        print(grad_fidelity.markdown(table, [f"W_k L{i}" for i in range(n_layer)]), flush=True)
        record["sizes"][name] = {"params_M": params, "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd,
                                 "errors": table}
        if a.json:
            atomic_write(a.json, lambda f: json.dump(record, f, indent=1), mode="w")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""
Sample text from a checkpoint written by train.py.

    python sample.py                                  # out/ckpt.pt, 3 samples from an end-of-text token
    python sample.py --out_dir=out-shakespeare --start="ROMEO:" --num_samples=1 --max_new_tokens=300
    python sample.py --start=FILE:prompt.txt --temperature=0.7 --top_k=50
"""
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal

import torch

import configurator
from data.common import get_tokenizer
from model import GPT, GPTConfig, attention_line, resolve_attention
from train import load_checkpoint


@dataclass
class SampleConfig:
    out_dir: str = "out"
    start: str = ""  # the prompt; "" starts from the end-of-text token; FILE:path reads it from a file
    num_samples: int = 3
    max_new_tokens: int = 200
    temperature: float = 0.8  # 1.0 samples the model's distribution; lower is more conservative; 0 is greedy
    top_k: int = 200  # keep the top_k most likely tokens; 0 keeps all
    seed: int = 1337
    device: str = "auto"
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    attention: Literal["auto", "fp8", "fp8_stale", "sdpa"] = "auto"
    compile: bool = False


def main(argv=None):
    try:
        cfg = configurator.parse(SampleConfig(), sys.argv[1:] if argv is None else argv)
        configurator.check_device(cfg.device)
    except configurator.ConfigError as e:
        raise SystemExit(f"config error: {e}")
    if cfg.num_samples < 1 or cfg.max_new_tokens < 1:
        raise SystemExit(f"num_samples={cfg.num_samples}, max_new_tokens={cfg.max_new_tokens}: both must be at least 1")
    if not cfg.temperature >= 0 or cfg.top_k < 0:  # written so that nan fails too
        raise SystemExit(f"temperature={cfg.temperature}, top_k={cfg.top_k}: both must be >= 0 "
                         "(temperature 0 takes the most likely token; top_k 0 keeps all)")
    device = configurator.pick_device(cfg.device)
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    ctx = nullcontext() if dtype == "float32" else torch.autocast(device.type, dtype=torch.bfloat16)
    if not 0 <= cfg.seed < 2**32:  # the range train.py accepts: a seed that trains also samples
        raise SystemExit(f"seed={cfg.seed}: must be in [0, 2^32)")
    torch.manual_seed(cfg.seed)

    path = os.path.join(os.path.expanduser(cfg.out_dir), "ckpt.pt")  # the shell leaves a ~ after = as it is
    if not os.path.exists(path):
        raise SystemExit(f"no checkpoint at {path}: train first (python train.py), or pass --out_dir")
    ckpt = load_checkpoint(path, ("model_args", "model", "meta"))
    for key, inner in (("model_args", "n_embd"), ("model_args", "n_head"), ("meta", "tokenizer")):  # read below
        if not isinstance(ckpt[key], dict) or inner not in ckpt[key]:
            raise SystemExit(f"{path} has no {key!r} with {inner!r}: it is not a checkpoint train.py wrote")
    model_args = dict(ckpt["model_args"])
    try:  # any path runs any checkpoint
        model_args["attention"], _ = resolve_attention(cfg.attention, device, model_args["n_embd"] // model_args["n_head"])
    except RuntimeError as e:  # an fp8 path asked for where the kernel cannot run
        raise SystemExit(str(e))
    # to stderr, so that stdout holds only the samples; auto may pick another path than training used
    trained = ckpt["model_args"].get("attention", "sdpa")
    print(attention_line(model_args["attention"], dtype, device)
          + (f" (the checkpoint trained with {trained})" if trained != model_args["attention"] else ""), file=sys.stderr)
    try:
        model = GPT(GPTConfig(**model_args))
        model.load_state(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as e:  # model_args or weights this model.py does not build
        raise SystemExit(f"{path}: its model does not load here: {type(e).__name__}: {e}")
    model.eval().to(device)
    if cfg.compile:  # generate() calls self(...), i.e. forward: compile that (a compiled wrapper's generate would not)
        model.forward = torch.compile(model.forward, dynamic=True)

    try:  # no byte fallback here: the model only speaks the tokens it was trained on
        tok = get_tokenizer(ckpt["meta"]["tokenizer"], fallback=False)
    except (RuntimeError, ValueError) as e:
        raise SystemExit(f"{path} was trained on {ckpt['meta']['tokenizer']!r} tokens, which cannot be loaded here: {e}")
    start = cfg.start
    if start.startswith("FILE:"):
        if not os.path.isfile(start[5:]):
            raise SystemExit(f"--start={cfg.start}: no file {start[5:]}")
        try:
            with open(start[5:], encoding="utf-8") as f:
                start = f.read()
        except UnicodeDecodeError as e:
            raise SystemExit(f"--start={cfg.start}: the file is not UTF-8 text ({e})")
    try:  # bytes that are not UTF-8 reach sys.argv as lone surrogates, which no tokenizer encodes
        start.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SystemExit(f"--start: the prompt is not UTF-8 text ({e})")
    ids = [tok.eot] + tok.encode(start)  # training documents start with end-of-text too
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
    with ctx:
        for _ in range(cfg.num_samples):
            y = model.generate(x, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k or None,
                               vocab_size=tok.vocab_size)
            print(tok.decode(y[0, 1:].tolist()))
            print("---------------")


if __name__ == "__main__":
    configurator.run_script(main)

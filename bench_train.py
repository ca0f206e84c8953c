"""
End-to-end training throughput per attention path: the same GPT, compiled, fused AdamW, bf16 autocast,
random tokens; a few warm-up steps (compilation), then timed steps. Prints tokens/s, MFU and peak memory,
and the ratio to the first path, for each block size (tokens per step held fixed).

    python bench_train.py                                        # 124M GPT, T = 1024 and 4096, sdpa vs fp8
    python bench_train.py --attentions=sdpa_cudnn,sdpa_flash,fp8,fp8_stale --block_sizes=4096

Paths: sdpa (PyTorch's own backend choice), sdpa_cudnn / sdpa_flash (that SDPA backend forced; such an
arm profiles one step and stops if the backend's op did not run; run on an H100 with cuDNN and flash,
README), fp8, fp8_stale, auto (fp8 where it runs, else sdpa). Each path compiles afresh (~1 min
for 12 layers), so keep the list short per call.
"""
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass

import torch

import configurator
from model import ATTENTION_PATHS, GPT, GPTConfig, fp8_unavailable, resolve_attention, shape_problem

SDPA_BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION"}  # forced SDPA backends
# the aten op each backend runs, as the profiler names it: a forced arm checks that it really ran. MATH
# has none under torch.compile (decomposed into matmuls and a softmax): there, no fused op may run.
SDPA_OPS = {"CUDNN_ATTENTION": "_scaled_dot_product_cudnn_attention",
            "FLASH_ATTENTION": "_scaled_dot_product_flash_attention",
            "EFFICIENT_ATTENTION": "_scaled_dot_product_efficient_attention", "MATH": None}
PATHS = ["auto", *ATTENTION_PATHS, *SDPA_BACKENDS]  # what --attentions= may list


@dataclass
class BenchConfig:
    attentions: str = "sdpa,fp8"  # comma-separated
    block_sizes: str = "1024,4096"  # comma-separated
    tokens_per_step: int = 65536  # batch size = tokens_per_step / block_size
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 0  # 0: same as n_head
    n_embd: int = 768
    qk_norm: bool = False
    vocab_size: int = 50304
    warmup: int = 5
    steps: int = 20
    compile: bool = True
    device: str = "auto"


def peak_gib(device):
    """Peak memory allocated on device since its last reset (bench() resets it after the warm-up steps), in
    GiB; nan off CUDA, which keeps no such count."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def batch_size(tokens_per_step, block_size):
    """Whole sequences per step: tokens_per_step rounded down to a multiple of block_size (one at least)."""
    return max(1, tokens_per_step // block_size)


def resolve_arms(attentions, device, head_dim):
    """{arm: (model path, why not fp8 or None)} for every arm, before any is timed: an fp8 arm that cannot
    run here used to stop the run only at its turn, after the arms before it had compiled and run."""
    arms = {}
    for attention in attentions:
        if attention in SDPA_BACKENDS:
            if device.type != "cuda":  # cuDNN and flash are CUDA kernels: at its turn, "No viable backend"
                raise SystemExit(f"attentions: {attention} forces a CUDA backend of SDPA, and the device is "
                                 f"{device.type}; leave it out of --attentions")
            arms[attention] = ("sdpa", None)
            continue
        try:
            arms[attention] = resolve_attention(attention, device, head_dim)
        except RuntimeError:  # an fp8 path where the kernel cannot run: the user's choice, so no traceback
            raise SystemExit(f"attentions: {attention} cannot run here: {fp8_unavailable(device, head_dim)}; "
                             "leave it out of --attentions")
    return arms


def arm_label(attention, path, why):
    """The row's name: the arm, and for auto the path it took (and why not fp8, where it fell back)."""
    if attention != "auto":
        return attention
    return f"auto: {path}" + (f" ({why})" if why else "")


def bench(cfg, attention, path, block_size, device):
    """tokens/s, MFU and peak GiB of the arm `attention`, whose model runs attention path `path`."""
    backend = SDPA_BACKENDS.get(attention)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=cfg.vocab_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                          n_kv_head=cfg.n_kv_head or cfg.n_head, n_embd=cfg.n_embd, qk_norm=cfg.qk_norm,
                          attention=path)).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device.type)
    step_model = torch.compile(model) if cfg.compile else model
    batch = batch_size(cfg.tokens_per_step, block_size)
    x = torch.randint(0, cfg.vocab_size, (batch, block_size + 1), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    sdpa = ExitStack()
    if backend:  # forced at trace time, so the context covers compilation too
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa.enter_context(sdpa_kernel(getattr(SDPBackend, backend)))
        # torch.compile's on-disk AOTAutograd cache keys a graph without the SDPA backend flags: a second
        # arm of the same model (in this process or an earlier one) got the first arm's compiled graph,
        # and with it the first arm's backend, under the second's name
        if hasattr(torch._functorch.config, "enable_autograd_cache"):
            sdpa.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    # this device's, not the current one's: with --device=cuda:1 the clock stopped before GPU 1 was done
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def step():
        with autocast:
            _, loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with sdpa:
        for _ in range(cfg.warmup):
            step()
        if backend:  # one more step, untimed, to see which attention op runs
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                step()
            ran = sorted({e.name for e in prof.events() if "scaled_dot_product" in e.name})
            want = SDPA_OPS[backend]
            fused = [name for name in ran if any(op in name for op in SDPA_OPS.values() if op)]
            if (want and not any(want in name for name in ran)) or (not want and fused):
                raise SystemExit(f"{attention}: the {backend} backend did not run; the profiler saw {ran or 'no SDPA op'}")
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for _ in range(cfg.steps):
            step()
        sync()
        dt = (time.perf_counter() - t0) / cfg.steps
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    mfu = model.estimate_mfu(batch, dt, name)
    mem = peak_gib(device)
    del model, optimizer, step_model
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return batch * block_size / dt, mfu, mem


def load_config(argv):
    """The config, checked, with its two lists: (cfg, attentions, block sizes). Raises ConfigError."""
    cfg = configurator.parse(BenchConfig(), argv)
    attentions = cfg.attentions.split(",")
    unknown = [a for a in attentions if a not in PATHS]
    if unknown:  # all of them, as a config error, before any path is timed (SDPA_BACKENDS' names included)
        raise configurator.ConfigError(f"attentions={cfg.attentions!r}: unknown path(s) "
                                       f"{', '.join(map(repr, unknown))}; the paths are {', '.join(PATHS)}")
    try:
        block_sizes = [int(b) for b in cfg.block_sizes.split(",")]
    except ValueError:
        block_sizes = []
    if not block_sizes or min(block_sizes) < 1:
        raise configurator.ConfigError(f"block_sizes={cfg.block_sizes!r}: expected whole numbers >= 1, comma-separated")
    for key in ("steps", "tokens_per_step", "n_layer", "n_head", "n_embd", "vocab_size"):  # steps=0: divides by 0
        if getattr(cfg, key) < 1:
            raise configurator.ConfigError(f"{key}={getattr(cfg, key)}: must be at least 1")
    if cfg.n_kv_head < 0:
        raise configurator.ConfigError(f"n_kv_head={cfg.n_kv_head}: must be >= 0")
    if cfg.warmup < 1:  # the first step compiles (torch.compile, the Triton kernels): never timed
        raise configurator.ConfigError(f"warmup={cfg.warmup}: must be at least 1 (the first step compiles)")
    why = shape_problem(cfg.n_embd, cfg.n_head, cfg.n_kv_head)  # the model takes RoPE
    if why:
        raise configurator.ConfigError(why)
    configurator.check_device(cfg.device)
    return cfg, attentions, block_sizes


def steps_tokens(tokens_per_step, block_sizes):
    """The header's tokens per step: what each block size really runs, which a T that does not divide
    tokens_per_step rounds (65,536 at T=3072 is 21 sequences, 64,512 tokens)."""
    runs = {T: batch_size(tokens_per_step, T) * T for T in block_sizes}
    if len(set(runs.values())) == 1:
        return f"{next(iter(runs.values())):,} tokens/step"
    return "tokens/step " + ", ".join(f"{n:,} at T={T}" for T, n in runs.items())


def main(argv=None):
    try:
        cfg, attentions, block_sizes = load_config(sys.argv[1:] if argv is None else argv)
    except configurator.ConfigError as e:
        raise SystemExit(f"config error: {e}")
    if cfg.device == "auto" and not torch.cuda.is_available():
        # the default 124M model at 65k tokens per step takes minutes per step on a CPU, with nothing printed
        sys.exit("bench_train.py measures training speed on a GPU, and there is no CUDA GPU here. To run it on the "
                 "CPU anyway, ask for it with a small model, e.g. --device=cpu --compile=False --n_layer=1 "
                 "--n_embd=128 --n_head=2 --tokens_per_step=512 --block_sizes=128 --attentions=sdpa")
    device = torch.device("cuda" if cfg.device == "auto" else cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"device={cfg.device}: PyTorch sees no CUDA GPU here")
    arms = resolve_arms(attentions, device, cfg.n_embd // cfg.n_head)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} | torch {torch.__version__} | "
          f"{cfg.n_layer} layers, d={cfg.n_embd}, {cfg.n_head} heads (head dim {cfg.n_embd // cfg.n_head}) | "
          f"{steps_tokens(cfg.tokens_per_step, block_sizes)} | compile={cfg.compile} | {cfg.warmup} warm-up + {cfg.steps} "
          "timed steps", flush=True)
    print("\n| T | attention | tokens/s | vs first | MFU (bf16 peak) | peak GiB |\n|---|---|---|---|---|---|", flush=True)
    for block_size in block_sizes:  # each row as soon as it is measured: a long run shows its progress
        first = None
        for attention in attentions:
            tok_s, mfu, mem = bench(cfg, attention, arms[attention][0], block_size, device)
            first = first or tok_s
            print(f"| {block_size:>5} | {arm_label(attention, *arms[attention]):<10} | {tok_s:>12,.0f} | {tok_s / first:5.2f}x | "
                  + (f"{100 * mfu:5.1f}% |" if mfu is not None else "  n/a |")
                  + (f" {mem:6.1f} |" if mem == mem else "    n/a |"), flush=True)  # mem is nan off CUDA


if __name__ == "__main__":
    configurator.run_script(main)

"""
Train a GPT with BF16 SDPA or FP8 Delta-Matching attention, on one device or many.

    python train.py                                    # smoke test on the built-in corpus (GPU, or CPU)
    python train.py config/shakespeare.py --max_iters=2000
    torchrun --standalone --nproc_per_node=4 train.py config/ablation.py --attention=fp8_stale
    python train.py config/ablation.py --out_dir=out-ablation/fp8 --init_from=resume --block_size=4096 \
        --batch_size=4 --learning_rate=1e-4 --min_lr=1e-5 --max_iters=2500   # context extension (README)

Without a preset on a machine with no GPU, config/cpu_tiny.py is applied first. Settings are the fields of
TrainConfig; presets and --key=value overrides are checked against their types (configurator.py).
"""
import ctypes
import gc
import glob
import json
import math
import os
import pickle
import random
import signal
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import configurator
from data.common import (atomic_write, check_counts, known_prepare_command, load_meta, prepare_command, read_shard,
                         shard_paths)
from model import GPT, GPTConfig, attention_line, fp8_unavailable, peak_flops, resolve_attention, shape_problem

HERE = os.path.dirname(os.path.abspath(__file__))
CPU_PRESET = os.path.join(HERE, "config", "cpu_tiny.py")
ARCH_KEYS = ("n_layer", "n_head", "n_kv_head", "n_embd", "bias", "qk_norm", "pos", "rope_base")


@dataclass
class TrainConfig:
    # I/O. The defaults are the GPU smoke test: ~80M parameters, a few minutes on one H100/H200.
    out_dir: str = "out"
    dataset: str = "builtin"  # a folder under data/ (builtin, shakespeare, fineweb10B, ...) or a path to one
    init_from: Literal["scratch", "resume"] = "scratch"  # resume: continue from out_dir/ckpt.pt
    eval_interval: int = 250
    eval_tokens: int = 2**19  # validation budget: the same first eval_tokens of the val split at every eval
    log_interval: int = 10
    save_checkpoint: bool = True  # at every eval and at the end, never after a non-finite loss
    seed: int = 1337
    # model
    n_layer: int = 6
    n_head: int = 6  # head dim n_embd / n_head must be 64 or 128 for the fp8 kernel
    n_kv_head: int = 0  # 0: same as n_head; fewer: grouped-query attention
    n_embd: int = 768
    block_size: int = 1024
    dropout: float = 0.0
    bias: bool = False
    qk_norm: bool = False
    pos: Literal["rope", "learned", "none"] = "rope"
    rope_base: float = 10000.0
    attention: Literal["auto", "fp8", "fp8_stale", "sdpa"] = "auto"  # auto: fp8 where the GPU has FP8 tensor cores
    # optimization
    batch_size: int = 16  # sequences per micro-batch per process
    gradient_accumulation_steps: int = 4  # micro-batches per step in total; N processes do this / N each
    max_iters: int = 1000
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int = 0  # cosine decay from warmup_iters to here (0: to max_iters), then min_lr
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: no clipping
    # system
    device: str = "auto"  # auto (cuda if there is one), cpu, cuda, cuda:1, ...
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"  # auto: bf16 autocast on GPUs that have it, else fp32
    compile: bool = True
    # the delta-mismatch monitor: at each eval, per layer, on a probe batch (needs the FP8 kernel's GPU)
    delta_monitor: bool = False


def load_config(argv):
    argv = sys.argv[1:] if argv is None else list(argv)
    if all(a.startswith("-") for a in argv) and not torch.cuda.is_available():  # no preset given
        if os.environ.get("RANK", "0") == "0":  # once under torchrun, not once per process
            print("config: no GPU, so config/cpu_tiny.py first (the default model would take hours on a CPU)")
        argv = [CPU_PRESET] + argv
    cfg = configurator.parse(TrainConfig(), argv)
    for key in ("max_iters", "batch_size", "gradient_accumulation_steps", "block_size", "eval_interval",
                "log_interval", "eval_tokens"):
        if getattr(cfg, key) < 1:
            raise configurator.ConfigError(f"{key}={getattr(cfg, key)}: must be at least 1")
    configurator.check_device(cfg.device)
    for key, lo, hi in (("dropout", 0, 1), ("beta1", 0, 1), ("beta2", 0, 1)):
        if not lo <= getattr(cfg, key) < hi:
            raise configurator.ConfigError(f"{key}={getattr(cfg, key)}: must be in [{lo}, {hi})")
    for key in ("learning_rate", "min_lr", "weight_decay", "grad_clip", "warmup_iters", "lr_decay_iters"):
        if not 0 <= getattr(cfg, key) < math.inf:  # written so that nan fails too (nan < 0 is False)
            raise configurator.ConfigError(f"{key}={getattr(cfg, key)}: must be a finite number >= 0")
    if cfg.min_lr > cfg.learning_rate:  # the cosine would climb from learning_rate to min_lr
        raise configurator.ConfigError(f"min_lr={cfg.min_lr} is above learning_rate={cfg.learning_rate}: "
                                       "the schedule decays from learning_rate down to min_lr")
    if 0 < cfg.lr_decay_iters <= cfg.warmup_iters:  # warmup would end in a drop straight to min_lr
        raise configurator.ConfigError(f"lr_decay_iters={cfg.lr_decay_iters} does not end after warmup_iters="
                                       f"{cfg.warmup_iters}: the decay runs from the end of warmup to lr_decay_iters")
    if cfg.n_embd < 1 or cfg.n_layer < 0:
        raise configurator.ConfigError(f"n_embd={cfg.n_embd}, n_layer={cfg.n_layer}: a model needs n_embd >= 1 and n_layer >= 0")
    if cfg.delta_monitor and cfg.n_layer == 0:
        raise configurator.ConfigError("delta_monitor=True with n_layer=0: there is no attention layer to monitor")
    if cfg.pos == "rope" and not (cfg.rope_base > 1 and math.isfinite(cfg.rope_base)):  # base^(-2i/d) must fall
        raise configurator.ConfigError(f"rope_base={cfg.rope_base}: must be a finite number > 1")
    why = shape_problem(cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.pos)
    if why:
        raise configurator.ConfigError(why)
    if not 0 <= cfg.seed < 2**32:  # numpy's generators take no negative seed, torch's none past 2^64
        raise configurator.ConfigError(f"seed={cfg.seed}: must be in [0, 2^32)")
    if not cfg.out_dir or not cfg.dataset:
        raise configurator.ConfigError(f"{'out_dir' if not cfg.out_dir else 'dataset'} is empty")
    cfg.out_dir = os.path.expanduser(cfg.out_dir)  # --out_dir=~/x: the shell leaves a ~ after = as it is
    return cfg


def dataset_dir(dataset):
    dataset = os.path.expanduser(dataset)  # --dataset=~/x: the shell leaves a ~ after = as it is
    return dataset if os.sep in dataset or "/" in dataset else os.path.join(HERE, "data", dataset)


# -----------------------------------------------------------------------------------------------------
# data: train batches are random windows; window positions are a pure function of (seed, iteration,
# micro-batch), so resuming needs only the iteration number and replays nothing, and N processes that
# split the micro-batches between them see exactly the tokens one process would.

class TrainData:
    def __init__(self, data_dir, block_size, seed, vocab_size=2**16):  # 2^16: any uint16 token passes
        kept = [(path, s) for path in shard_paths(data_dir, "train") for s in [read_shard(path)] if len(s) > block_size]
        if not kept:
            raise ValueError(f"no train shard in {data_dir} is longer than block_size {block_size}")
        self.paths, self.shards = zip(*kept)
        self.lengths = np.array([len(s) for s in self.shards])
        self.p = self.lengths / self.lengths.sum()  # a window lands in a shard in proportion to its size
        self.block_size, self.seed, self.vocab_size = block_size, seed, vocab_size

    def batch(self, iter_num, micro, batch_size, device):
        T = self.block_size
        rng = np.random.default_rng([self.seed, iter_num, micro])
        which = rng.choice(len(self.shards), size=batch_size, p=self.p)
        starts = rng.integers(0, self.lengths[which] - T)  # window [start, start + T + 1) fits the shard
        buf = np.stack([self.shards[s][o:o + T + 1] for s, o in zip(which, starts)]).astype(np.int64)
        if buf.max() >= self.vocab_size:  # a shard of another tokenizer: the embedding would index out of range
            bad = next(s for s, row in zip(which, buf) if row.max() >= self.vocab_size)
            raise SystemExit(f"shard {self.paths[bad]} holds token {buf.max()}, past the dataset's vocab of "
                             f"{self.vocab_size} (meta.json): written with another tokenizer? re-run: "
                             f"{prepare_command(os.path.dirname(self.paths[bad]))}")
        xy = torch.from_numpy(buf)
        if device.type == "cuda":
            xy = xy.pin_memory().to(device, non_blocking=True)
        return xy[:, :-1], xy[:, 1:]  # inputs and next-token targets, (B, T) each


def val_windows(data_dir, block_size, eval_tokens, vocab_size=2**16):
    """The fixed validation set: the first eval_tokens // T consecutive windows of the val split (at least
    one; all it holds if fewer), (n, T + 1) int64. The same set for any batch size and number of processes,
    so val losses compare across them (evaluate() fills its last batch up instead of dropping windows)."""
    T = block_size
    need, parts = max(eval_tokens // T, 1) * T + 1, []  # at least one window
    for path in shard_paths(data_dir, "val"):
        parts.append(np.array(read_shard(path)[:need - sum(map(len, parts))]))
        if len(parts[-1]) and parts[-1].max() >= vocab_size:
            raise ValueError(f"shard {path} holds token {parts[-1].max()}, past the dataset's vocab of {vocab_size} "
                             f"(meta.json): written with another tokenizer? re-run: {prepare_command(data_dir)}")
        if sum(map(len, parts)) >= need:
            break
    tokens = np.concatenate(parts)
    n = max(len(tokens) - 1, 0) // T  # 0 tokens: 0 windows, not (0 - 1) // T = -1, which passed the check below
    if n == 0:
        raise ValueError(f"the val split of {data_dir} has {len(tokens)} tokens, fewer than block_size + 1")
    return torch.from_numpy(tokens[np.arange(n)[:, None] * T + np.arange(T + 1)].astype(np.int64))


def load_data(cfg, device, ddp, local_rank, say):
    """The dataset's folder, its meta.json, the train batches and the val windows; the built-in corpus
    prepares itself the first time (smaller on a CPU, to start quickly). Anything missing, short or
    corrupt stops the run with a message that names it and what to run."""
    data_dir = dataset_dir(cfg.dataset)
    if cfg.dataset == "builtin":
        if local_rank == 0 and not os.path.exists(os.path.join(data_dir, "meta.json")):
            from data.builtin.prepare import prepare
            prepare(data_dir, max_mb=256 if device.type == "cuda" else 16)
        if ddp:  # every rank, whatever it found: a rank that saw meta.json (another node's disk, or rank 0
            dist.barrier()  # just done) and went on would leave rank 0 waiting here for ever
    if not os.path.isdir(data_dir):
        data = os.path.join(HERE, "data")
        ready = sorted(d for d in os.listdir(data) if os.path.exists(os.path.join(data, d, "meta.json")))
        known = known_prepare_command(data_dir)
        if known and "data/fineweb/" in known:  # the script's 8 shards by default are less than a 10B-token run reads
            known += (" (8 train shards of 100M tokens; --train_shards=N for more: " +
                      ("99 for all of FineWeb-Edu 10B)" if "--edu" in known else
                       "103 for all of FineWeb 10B, as config/fineweb.py reads)"))
        raise SystemExit(f"dataset={cfg.dataset!r}: no folder {data_dir}; " + (f"run: {known}" if known else
                         f"a name is a prepared folder under data/ (here: {', '.join(ready) or 'none yet'}; builtin "
                         "prepares itself, README, Datasets, says how to prepare the others), or give a path"))
    try:  # a missing, short or corrupt file: the message names it and what to re-run (data/common.py)
        meta = load_meta(data_dir)
        check_counts(data_dir, meta)
        train_data = TrainData(data_dir, cfg.block_size, cfg.seed, meta["vocab_size"])
        val = val_windows(data_dir, cfg.block_size, cfg.eval_tokens, meta["vocab_size"])
    except (OSError, ValueError) as e:
        raise SystemExit(f"dataset={cfg.dataset!r}: {e}")
    if len(val) < cfg.eval_tokens // cfg.block_size:
        say(f"val: the val split holds {len(val)} windows of block_size + 1 tokens ({len(val) * cfg.block_size:,} "
            f"tokens to predict), fewer than eval_tokens={cfg.eval_tokens:,} asks for: all of them are used")
    return data_dir, meta, train_data, val


@torch.no_grad()
def evaluate(model, windows, batch_size, rank, world, device, ctx):
    """Mean loss per token over the fixed val windows; each rank takes every world-th window and the sums
    are reduced, so all ranks return the same figure. Every batch has batch_size windows (one shape for a
    compiled model): a rank's last batch is filled up with windows whose targets are all -1, which the
    loss ignores and the count leaves out. Returns a dict of metrics for the log; the training loop adds
    the delta monitor's figures (delta_monitor=True) to it, and all land in one JSONL line."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of token losses, token count)
    mine = windows[rank::world]
    for i in range(0, len(mine), batch_size):
        x, y = mine[i:i + batch_size, :-1], mine[i:i + batch_size, 1:]
        count = y.numel()
        if len(x) < batch_size:
            fill = batch_size - len(x)
            x = torch.cat([x, x.new_zeros(fill, x.size(1))])
            y = torch.cat([y, y.new_full((fill, y.size(1)), -1)])
        with ctx:
            _, loss = model(x.to(device), y.to(device))
        total[0] += loss.double() * count
        total[1] += count
    if world > 1:
        dist.all_reduce(total)
    model.train()
    return {"val_loss": (total[0] / total[1]).item()}


def delta_monitor(raw_model, probe, ctx):
    """What the stale delta would get wrong in this model now. One forward and backward of the probe
    batch (gradients taken with autograd.grad, so the training gradients are untouched) captures each
    layer's attention inputs q, k, v and output gradient dO; attention_fp8.delta_stats runs the FP8
    forward and both backward arms on them. Per layer and worst over layers:
      delta_mismatch = |delta_stale - delta_matched| / |delta_matched|
      key_grad_sum_{matched,stale} = ||sum_j dK_j|| / sum_j ||dK_j||  (0 for the exact gradient)."""
    from attention_fp8 import delta_stats
    attns = [block.attn for block in raw_model.transformer.h]
    for a in attns:
        a.probe = {}
    raw_model.eval()  # no dropout: the probe must not draw from the training run's random numbers
    try:
        with ctx:
            _, loss = raw_model(probe[:, :-1], probe[:, 1:])
        dys = torch.autograd.grad(loss, [a.probe["y"] for a in attns])
        out = {}
        for i, (a, dy) in enumerate(zip(attns, dys)):
            dt = dy.dtype if dy.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
            q, k, v = (a.probe[n].to(dt) for n in ("q", "k", "v"))
            for name, value in delta_stats(q, k, v, dy.to(dt), causal=True).items():
                out[f"{name}_L{i}"] = value
                worst = out.get(name, 0.0)
                out[name] = worst if math.isnan(worst) or value <= worst else value  # max, but a nan stays
        return out
    finally:
        for a in attns:
            a.probe = None
        raw_model.train()


def get_lr(it, cfg):
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:  # linear warmup
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def rng_state(device):
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def set_aside(path):
    """Move a finished run's file out of the way, under its last-modified time: metrics.jsonl ->
    metrics.20261206-203958.jsonl (-1, -2, ... where that name is taken). Returns the new path."""
    stem, ext = os.path.splitext(path)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(path)))
    kept, i = f"{stem}.{stamp}{ext}", 0
    while os.path.exists(kept):
        i += 1
        kept = f"{stem}.{stamp}-{i}{ext}"
    os.replace(path, kept)
    return kept


def log_run_id(path):
    """The run id in a log's first row (its start), or None: no log, or one from before run ids."""
    try:
        with open(path) as f:
            return json.loads(f.readline()).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def prepare_log(log_path, cfg, ckpt_path, ckpt_run_id, say):
    """One log per run: a resumed run continues its log, a new one keeps an earlier run's under another
    name. A run's id is in its checkpoint and in its log's start rows, so a resume finds its own log:
    a new run stopped before its first save leaves its log beside an earlier run's checkpoint."""
    for tmp in killed_saves(ckpt_path):     # not removed here: another run may be saving into this out_dir
        say(f"out_dir: {tmp} ({os.path.getsize(tmp) / 2**20:,.0f} MiB) is what a killed save left, incomplete: "
            "delete it")
    if cfg.init_from == "scratch" and os.path.exists(log_path):
        say(f"out_dir: an earlier run's log moved to {set_aside(log_path)}")
    if cfg.init_from == "scratch" and os.path.exists(ckpt_path):
        say(f"out_dir: {ckpt_path} is an earlier run's; " + (
            "this run replaces it at its first save (--init_from=resume continues it instead)"
            if cfg.save_checkpoint else "this run saves none (save_checkpoint=False), so it stays"))
    if ckpt_run_id and log_run_id(log_path) not in (None, ckpt_run_id):
        say(f"out_dir: {log_path} is another run's, which saved no checkpoint: moved to {set_aside(log_path)}")
        set_aside_logs = glob.glob(os.path.join(glob.escape(cfg.out_dir), "metrics.*.jsonl"))
        own = [p for p in set_aside_logs if log_run_id(p) == ckpt_run_id]
        if own:
            os.replace(own[0], log_path)
            say(f"out_dir: the checkpoint's own log, {own[0]}, continues as {log_path}")


RESUME_KEYS = ("model", "optimizer", "model_args", "iter_num", "best_val_loss", "rng")
DATA_IDENTITY = ("tokenizer", "source", "train_tokens", "val_tokens")  # meta.json keys: other ones, other data


def _numpy_reconstruct(name):
    """numpy's array rebuilding function under `name`, the module path another numpy pickles it by: numpy
    1.x writes numpy.core.multiarray._reconstruct, numpy 2.x numpy._core.multiarray._reconstruct, so a
    checkpoint moves between machines with either. torch's allowlist matches module and qualname."""
    reconstruct = np.zeros(1).__reduce__()[0]

    def rebuild(*args):
        return reconstruct(*args)
    rebuild.__module__, rebuild.__qualname__ = name.rsplit(".", 1)
    return rebuild


# torch.load(weights_only=True) rebuilds tensors and plain containers only, so a checkpoint from elsewhere
# cannot run code when loaded. Ours also hold numpy's RNG state, one uint32 array: numpy's own array
# rebuilding is allowed for it (under either major version's name), and nothing else.
NUMPY_ARRAY_GLOBALS = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
NUMPY_ARRAY_GLOBALS += [_numpy_reconstruct(f"{m}.multiarray._reconstruct") for m in ("numpy.core", "numpy._core")
                        if f"{m}.multiarray" != NUMPY_ARRAY_GLOBALS[0].__module__]


def _load_error(e):
    """torch.load's error in one line: for a weights-only refusal, its reason, not the advice around it
    (torch follows the reason, on the same line, with how to allowlist what it refused: not our advice)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:")[1].strip()
            return (rest or (lines[i + 1] if i + 1 < len(lines) else "")).split(" Please use")[0]
        if "GLOBAL" in line or "Can only build" in line:
            return line.split(" Please use")[0]
    return lines[0] if lines else ""


def killed_saves(path):
    """The temporary files of saves to path that never finished (atomic_write's; a process killed by the
    OOM killer or kill -9 cannot remove its own), each as large as the part written."""
    return sorted(glob.glob(glob.escape(path) + ".tmp[0-9]*"))


def load_checkpoint(path, keys=RESUME_KEYS):
    """A checkpoint save_checkpoint wrote, with the keys its reader needs, or an error that names the
    file and what is wrong with it (sample.py reads them too)."""
    if not os.path.exists(path):
        raise SystemExit(f"no checkpoint at {path}" + "".join(f"; {p} is what a killed save left, incomplete"
                                                              for p in killed_saves(path)))
    try:
        with torch.serialization.safe_globals(NUMPY_ARRAY_GLOBALS):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, not a torch file, pickled code or classes: torch raises any of these
        why = _load_error(e)
        if isinstance(e, pickle.UnpicklingError) and ("GLOBAL" in why or "Can only build" in why):
            raise SystemExit(f"{path} holds objects other than tensors, numbers and strings ({why}): refused, "
                             "since loading them could run code; it is not a checkpoint train.py wrote")
        raise SystemExit(f"{path} cannot be read as a checkpoint (truncated or damaged, or not one train.py "
                         f"wrote): {type(e).__name__}: {why}")
    missing = [k for k in keys if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise SystemExit(f"{path} has no {', '.join(map(repr, missing))}: it is not a checkpoint train.py wrote")
    return ckpt


def save_checkpoint(path, ckpt):
    """torch.save to a temporary file beside path, then rename: a crash mid-save keeps the previous one."""
    try:
        atomic_write(path, lambda f: torch.save(ckpt, f))
    except (OSError, RuntimeError) as e:
        # a full disk reaches us as torch's RuntimeError ("unexpected pos ...") raised while handling the OSError
        cause = e if isinstance(e, OSError) else e.__context__
        if not isinstance(cause, OSError):
            raise
        raise SystemExit(f"cannot save {path}: {cause.strerror or cause}; "
                         + ("the checkpoint saved there before is kept" if os.path.exists(path) else "nothing saved"))


def check_writable(folder):
    """Now, not after minutes of data preparation and compilation: a folder we can make but not write into
    (a read-only mount, another user's) would otherwise fail at the log's first line or the first save."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise SystemExit(f"out_dir={folder!r}: cannot write into that folder ({e.strerror})")


# -----------------------------------------------------------------------------------------------------

class Terminated(SystemExit):
    """SIGTERM, raised in the main thread so that the finally blocks run, as for Ctrl-C's KeyboardInterrupt."""


def _exit_on_sigterm(signum, frame):
    raise Terminated(128 + signum)  # 143, the exit status a shell gives a process SIGTERM ended


def keep_freed_memory():
    """On a CPU under glibc, keep freed buffers in the heap for the next step rather than give them back.

    glibc maps every buffer above its mmap threshold (32 MB at the most) straight from the kernel and
    unmaps it when freed, so each step maps its logits afresh (8 x 128 x 50304 floats, 206 MB, and as
    many again for their gradient and softmax) and faults in every page: 69M page faults and 252 s of
    system time in the default CPU run on a 2-core machine. Without mmap, and with the heap's top kept,
    a step reuses the memory the last one freed: that run took 4 min 11 s against 6 min 36 s, with the
    same losses and 2.7 GB of peak memory against 1.9 (results/session55/train_cpu_default*.txt). A
    MALLOC_* setting of the user's own is left alone; elsewhere (macOS, musl) this does nothing."""
    if not sys.platform.startswith("linux") or any(k.startswith("MALLOC_") for k in os.environ):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def main(argv=None):
    try:
        cfg = load_config(argv)
    except configurator.ConfigError as e:
        raise SystemExit(f"config error: {e}")

    # one process, or one of N under torchrun (RANK is set); NCCL between GPUs, gloo between CPU processes
    ddp = "RANK" in os.environ
    rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else (0, 0, 1)
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"device={cfg.device}: PyTorch sees no CUDA GPU here; use --device=cpu (or auto)")
    if ddp and device.startswith("cuda:"):
        raise SystemExit(f"device={cfg.device}: under torchrun use --device=cuda (or auto); each process takes the "
                         "GPU of its LOCAL_RANK (choose GPUs with CUDA_VISIBLE_DEVICES)")
    device = torch.device(f"cuda:{local_rank}" if ddp and device == "cuda" else device)
    if ddp:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # device_id binds NCCL to this GPU now; without it every barrier warns that it guesses the device
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    master = rank == 0
    say = tqdm.write if master else (lambda *a, **k: None)
    # SIGTERM (torchrun, SLURM, docker stop) stops the run the way Ctrl-C does, through the finally blocks:
    # a checkpoint being written then removes its temporary file (the last whole ckpt.pt stays either way)
    main_thread = threading.current_thread() is threading.main_thread()
    on_term = signal.getsignal(signal.SIGTERM) if main_thread else None
    if main_thread:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        train(cfg, device, ddp, rank, local_rank, world, master, say)
        if ddp:  # finish together: gloo can abort a process that tears down while another still works
            dist.barrier()
    except (KeyboardInterrupt, Terminated) as e:  # one line, where the run stands; then as before (run_script:
        if master:                                 # Ctrl-C ends the script with status 130, no traceback)
            ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
            tqdm.write(f"stopped by {'Ctrl-C' if isinstance(e, KeyboardInterrupt) else 'SIGTERM'}; " + (
                f"{ckpt_path} holds the last checkpoint saved there: --init_from=resume goes on from it"
                if os.path.exists(ckpt_path) else f"no checkpoint in {cfg.out_dir}"), file=sys.stderr)
        raise
    finally:
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
        if ddp:
            # the DDP wrapper sits in reference cycles that hold the process group; collect them now, or the
            # group is torn down during interpreter exit, where gloo sometimes aborts (SIGABRT)
            gc.collect()
            dist.destroy_process_group()


def train(cfg, device, ddp, rank, local_rank, world, master, say):
    if cfg.gradient_accumulation_steps % world:
        raise SystemExit(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be a multiple of "
                         f"the {world} processes (each does an equal share of the micro-batches); e.g. "
                         f"--gradient_accumulation_steps={world} --batch_size=N keeps {world} x N x block_size "
                         "tokens per step")
    accum = cfg.gradient_accumulation_steps // world  # micro-batches per process per step
    if device.type == "cpu":
        keep_freed_memory()
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    ctx = nullcontext() if dtype == "float32" else torch.autocast(device.type, dtype=torch.bfloat16)
    try:  # now, not after minutes of data preparation and compilation
        os.makedirs(cfg.out_dir, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"out_dir={cfg.out_dir!r}: cannot make that folder ({e.strerror})")
    check_writable(cfg.out_dir)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    ckpt = None
    if cfg.init_from == "resume":  # first: the checkpoint's architecture (head dim) decides the attention path
        if not os.path.exists(ckpt_path) and not killed_saves(ckpt_path):
            raise SystemExit(f"init_from=resume: no checkpoint at {ckpt_path} (resume continues a run saved in "
                             "out_dir; leave it out to start a new run)")
        ckpt = load_checkpoint(ckpt_path)
        args = ckpt["model_args"]
        missing = [k for k in ARCH_KEYS + ("vocab_size", "block_size") if not isinstance(args, dict) or k not in args]
        if missing:
            raise SystemExit(f"{ckpt_path}: its model_args has no {', '.join(map(repr, missing))}: it is not a "
                             "checkpoint this train.py wrote")
    ckpt_run_id = ckpt.get("run_id") if ckpt else None  # (none in checkpoints from before run ids)
    arch = ckpt["model_args"] if ckpt else vars(cfg)
    head_dim = arch["n_embd"] // arch["n_head"]
    try:
        attention, why_not_fp8 = resolve_attention(cfg.attention, device, head_dim)
    except RuntimeError as e:  # an fp8 path asked for where the kernel cannot run
        raise SystemExit(str(e))
    if cfg.delta_monitor and fp8_unavailable(device, head_dim):
        raise SystemExit("delta_monitor=True needs the FP8 kernel, which cannot run here: "
                         f"{fp8_unavailable(device, head_dim)}")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    say(attention_line(attention, dtype, device)
        + (f" x {world}" if world > 1 else "") + (f" (fp8 unavailable: {why_not_fp8})" if why_not_fp8 else ""))

    data_dir, meta, train_data, val = load_data(cfg, device, ddp, local_rank, say)
    vocab_size = math.ceil(meta["vocab_size"] / 64) * 64  # GPT-2's 50257 -> 50304: faster matmuls

    # model
    model_args = {k: getattr(cfg, k) for k in ARCH_KEYS}
    model_args.update(n_kv_head=cfg.n_kv_head or cfg.n_head, block_size=cfg.block_size, vocab_size=vocab_size,
                      dropout=cfg.dropout, attention=attention)
    iter_num, best_val_loss = 0, float("inf")
    remeasured = []  # settings that change what val loss measures, where this resume changes them
    if ckpt:
        changed = [k for k in ARCH_KEYS if ckpt["model_args"][k] != model_args[k]]
        if changed:  # this command's values (flags, presets, defaults) cannot change a trained model's shape
            was, now = ckpt["model_args"], model_args
            say("resume: architecture from the checkpoint: " + ", ".join(f"{k}={was[k]}" for k in changed)
                + f" (this command's {', '.join(f'{k}={now[k]}' for k in changed)} ignored)")
        # the rest is this command's: say where it differs from the resumed run's, which continues exactly
        # only with the same data and schedule (context extension changes some on purpose)
        before = ckpt.get("config", {})
        changed = [f"{k}={v!r} (was {before[k]!r})" for k, v in asdict(cfg).items()
                   if k not in ARCH_KEYS + ("init_from",) and k in before and before[k] != v
                   # the same folder by another name (relative here, absolute there) is no change
                   and not (k == "out_dir" and os.path.realpath(before[k]) == os.path.realpath(v))]
        if changed:
            say(f"resume: settings that differ from the checkpoint's run: {', '.join(changed)}")
        # a changed schedule moves the learning rate at once; with lr_decay_iters=0 a raised max_iters alone
        # does, taking a run that ended at min_lr back up the cosine
        schedule = ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "max_iters")
        if all(k in before for k in schedule):
            lr_now = get_lr(ckpt["iter_num"], cfg)
            lr_was = get_lr(ckpt["iter_num"], replace(cfg, **{k: before[k] for k in schedule}))
            if not math.isclose(lr_now, lr_was, rel_tol=1e-6):
                keep = (f"; the cosine follows max_iters where lr_decay_iters=0: --lr_decay_iters={before['max_iters']} "
                        "keeps the checkpoint's run's" if before["lr_decay_iters"] == cfg.lr_decay_iters == 0 else "")
                say(f"resume: learning rate {lr_now:.3g} at iter {ckpt['iter_num']} on this command's schedule, "
                    f"where the checkpoint's run had {lr_was:.3g}{keep}")
        model_args.update({k: ckpt["model_args"][k] for k in ARCH_KEYS})
        cfg = replace(cfg, **{k: ckpt["model_args"][k] for k in ARCH_KEYS})  # the log records what runs
        if ckpt["model_args"]["vocab_size"] != vocab_size:
            raise SystemExit(f"the checkpoint's vocab is {ckpt['model_args']['vocab_size']}, the dataset's "
                             f"{vocab_size} ({meta['tokenizer']} tokenizer): resume on the data it was trained on")
        if model_args["pos"] == "learned" and ckpt["model_args"]["block_size"] != cfg.block_size:
            raise SystemExit(f"block_size={cfg.block_size}: the checkpoint's model has pos=learned, whose position "
                             f"table is saved with block_size={ckpt['model_args']['block_size']} rows (a larger one has "
                             "no trained rows for the new positions); resume with that block_size. Context extension "
                             "needs pos=rope or pos=none")
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
        # val loss is the mean over eval_tokens of the dataset's val split in windows of block_size: where
        # this resume changes one (context extension does), the checkpoint's best is another measure's, so
        # the run starts a new best and evaluates at once, a baseline for the new setting
        remeasured = [k for k in ("dataset", "block_size", "eval_tokens")
                      if k in before and before[k] != getattr(cfg, k)]
        # the same dataset name prepared again (at another size, from other files: README, Datasets)
        remade = [k for k in DATA_IDENTITY if k in ckpt.get("meta", {}) and ckpt["meta"][k] != meta.get(k)]
        if remade and "dataset" not in remeasured:
            say(f"resume: {data_dir} was prepared again since the checkpoint: "
                + ", ".join(f"{k} {meta.get(k)!r} (was {ckpt['meta'][k]!r})" for k in remade))
            remeasured.append("the dataset's contents")
        if remeasured:
            best_val_loss = float("inf")
            say(f"resume: {', '.join(remeasured)} changed, so val loss measures something else now: evaluated "
                f"at iter {iter_num}, and the best val loss starts anew (was {ckpt['best_val_loss']:.4f})")
    model = GPT(GPTConfig(**model_args))
    if ckpt:
        try:
            model.load_state(ckpt["model"])
        except RuntimeError as e:  # weights this model.py does not build (another version's, or damaged)
            raise SystemExit(f"{ckpt_path}: its model does not load here: {e}")
    model.to(device)
    raw_model = model  # the uncompiled, unwrapped module: clean state_dict keys, estimate_mfu
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device.type)
    if ckpt:
        # the moments and step counts come from the checkpoint; weight decay and betas from this run's settings
        # (load_state_dict would restore the saved ones; lr is set at every step)
        settings = [{k: g[k] for k in ("weight_decay", "betas")} for g in optimizer.param_groups]
        optimizer.load_state_dict(ckpt["optimizer"])
        for group, setting in zip(optimizer.param_groups, settings):
            group.update(setting)
        if len(ckpt["rng"]) == world:
            set_rng_state(ckpt["rng"][rank], device)
        else:
            say(f"resume: the checkpoint has RNG states for {len(ckpt['rng'])} processes, not {world}; reseeding")
            torch.manual_seed(cfg.seed + rank + iter_num)
        del ckpt
    else:
        torch.manual_seed(cfg.seed + rank)  # dropout differs between ranks
    if cfg.compile:
        model = torch.compile(model)
    eval_model = model  # evaluation bypasses DDP: it needs no gradient sync
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)

    say(f"model: {raw_model.get_num_params() / 1e6:.2f}M parameters | "
        + " ".join(f"{k}={model_args[k]}" for k in ("n_layer", "n_embd", "n_head", "n_kv_head", "pos", "qk_norm"))
        + f" | block_size={cfg.block_size} | compile={cfg.compile}")
    say(f"data: {data_dir} ({meta['tokenizer']} tokens, {meta['train_tokens']:,} train); {tokens_per_iter:,} "
        f"tokens per step = {world} x {accum} x {cfg.batch_size} x {cfg.block_size}")
    passes = (cfg.max_iters - iter_num) * tokens_per_iter / meta["train_tokens"]
    if passes > 1:  # e.g. FineWeb prepared with its default 8 shards for config/fineweb.py's 10B tokens
        say(f"data: {cfg.max_iters - iter_num:,} steps read {passes:.1f}x the train split's tokens (a dataset "
            "prepared larger repeats less)")
    if meta.get("fallback_for"):  # data preparation fell back to bytes; nothing else would tell the user again
        say(f"data: byte-level tokens, since the {meta['fallback_for']} tokenizer could not be loaded when this data "
            f"was prepared; once it can (README, Troubleshooting), re-run: {prepare_command(data_dir)}")
    if peak_flops(device_name) is None:
        say(f"MFU: n/a (unknown peak for {device_name})")

    log_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    run_id = ckpt_run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
    if master:
        prepare_log(log_path, cfg, ckpt_path, ckpt_run_id, say)

    def log(**row):  # appended and closed line by line: a run that stops anywhere leaves a whole log
        if master:
            try:
                with open(log_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            except OSError as e:  # e.g. the disk filled up since the start
                raise SystemExit(f"cannot write {log_path}: {e.strerror or e}")

    log(event="start", run=run_id, attention=attention, device=device_name, world=world, torch=torch.__version__,
        params=raw_model.get_num_params(), config=asdict(cfg))
    if iter_num >= cfg.max_iters:
        say(f"checkpoint is at iter {iter_num}, max_iters={cfg.max_iters}: nothing to do (raise max_iters"
            + (f"; with lr_decay_iters=0 the cosine then stretches to the new max_iters and the learning rate rises "
               f"again: add --lr_decay_iters={iter_num} to go on at min_lr)" if cfg.lr_decay_iters == 0 else ")"))
        return

    start_iter, t_train, n_timed = iter_num, 0.0, 0
    good_ckpt = cfg.init_from == "resume"  # ckpt_path holds this run's weights (resumed, or saved since)

    def diverged(what, figures):  # a non-finite figure: stop before it reaches the weights or the checkpoint
        saved = f"the last good checkpoint is {ckpt_path}" if good_ckpt else "this run saved no checkpoint"
        return SystemExit(f"stopping: non-finite {what} at iter {iter_num} ({figures}, lr {lr:.3g}); {saved}. "
                          "Try a lower learning_rate or longer warmup_iters.")
    bar = tqdm(total=cfg.max_iters, initial=iter_num, unit="it", disable=None if master else True, dynamic_ncols=True)
    while True:
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # evaluate and checkpoint; right after a resume only where what val loss measures changed (the
        # weights are the saved ones)
        just_resumed = cfg.init_from == "resume" and iter_num == start_iter
        due = iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters
        if (due and not just_resumed) or (just_resumed and remeasured):
            metrics = evaluate(eval_model, val, cfg.batch_size, rank, world, device, ctx)
            if cfg.delta_monitor and master:
                metrics.update(delta_monitor(raw_model, val[:min(4, cfg.batch_size)].to(device), ctx))
                say(f"iter {iter_num} | delta monitor (worst layer): mismatch {metrics['delta_mismatch']:.2e} | "
                    f"key-grad sum matched {metrics['key_grad_sum_matched']:.2e} "
                    f"stale {metrics['key_grad_sum_stale']:.2e}")
            if not math.isfinite(metrics["val_loss"]):  # every rank has the same figure: all stop here, unsaved
                raise diverged("val loss", f"{metrics['val_loss']}, not saved")
            best_val_loss = min(best_val_loss, metrics["val_loss"])
            note = ""
            # nothing worth keeping at step 0, nor right after a resume (the saved weights; a save would only
            # put this command's settings and a best of the new measure over the checkpoint's, for a
            # resume that may yet be stopped as a mistake)
            if cfg.save_checkpoint and iter_num > 0 and not just_resumed:
                rngs = [rng_state(device)] if not ddp else [None] * world
                if ddp:  # every rank's RNG state, so a resumed run draws the same dropout masks
                    dist.all_gather_object(rngs, rng_state(device))
                if master:
                    save_checkpoint(ckpt_path, {
                        "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                        "model_args": model_args, "config": asdict(cfg), "iter_num": iter_num,
                        "best_val_loss": best_val_loss, "rng": rngs, "meta": meta, "run_id": run_id})
                    note = f" | saved {ckpt_path}"
                good_ckpt = True
            say(f"iter {iter_num} | val loss {metrics['val_loss']:.4f} (best {best_val_loss:.4f}){note}")
            log(iter=iter_num, **metrics)
        if iter_num == cfg.max_iters:
            break

        # one optimizer step: accum micro-batches; rank r takes global micro-batches r*accum .. r*accum+accum-1
        t0 = time.time()
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            if ddp:  # all-reduce the gradients only after the last micro-batch
                model.require_backward_grad_sync = micro == accum - 1
            x, y = train_data.batch(iter_num, rank * accum + micro, cfg.batch_size, device)
            with ctx:
                _, loss = model(x, y)
            loss = loss / accum
            loss_sum += loss.detach()
            loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        log_now = iter_num % cfg.log_interval == 0 or iter_num + 1 == cfg.max_iters
        if ddp and log_now:
            dist.all_reduce(loss_sum)
            loss_sum /= world
        # one sync per step. The gradient norm is global (after DDP's all-reduce), so every rank sees a
        # non-finite one and stops at the same step, before the optimizer can spoil the weights.
        loss_value, norm_value = torch.stack([loss_sum, grad_norm.to(loss_sum.dtype)]).tolist()
        if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
            raise diverged("loss" if not math.isfinite(loss_value) else "gradient norm",
                           f"loss {loss_value}, grad norm {norm_value}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dt = time.time() - t0
        if iter_num > start_iter:  # the first step includes compilation and warm-up
            t_train, n_timed = t_train + dt, n_timed + 1
        if log_now:
            row = dict(iter=iter_num, loss=loss_value, lr=lr, grad_norm=norm_value)
            line = f"iter {iter_num} | loss {loss_value:.4f} | lr {lr:.2e} | norm {norm_value:.2f}"
            if n_timed:
                row["tok_per_s"] = tokens_per_iter * n_timed / t_train
                line += f" | {row['tok_per_s']:,.0f} tok/s"
                mfu = raw_model.estimate_mfu(accum * cfg.batch_size * n_timed, t_train, device_name)
                if mfu is not None:
                    row["mfu"] = mfu
                    line += f" | mfu {100 * mfu:.1f}%"
                t_train, n_timed = 0.0, 0
            say(line)
            log(**row)
        iter_num += 1
        bar.update(1)
    bar.close()


if __name__ == "__main__":
    configurator.run_script(main)

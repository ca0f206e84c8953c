"""
A GPT language model for the Delta-Matching FP8 attention experiments, nanoGPT-style, in one file.

Read top to bottom: the attention switch, norms and RoPE, CausalSelfAttention, MLP, Block, GPTConfig, GPT.
The attention path is one setting, GPTConfig.attention:
  "sdpa"       PyTorch scaled_dot_product_attention in the autocast dtype (BF16 on GPU, fp32 on CPU)
  "fp8"        attention_fp8.attention: block-scaled FP8 in all 7 attention matmuls, delta matched to the
               P and dP the backward uses (attention_fp8.py's docstring teaches the method)
  "fp8_stale"  the same kernel with FlashAttention's stale delta = rowsum(dO * O): the paper's ablation
resolve_attention("auto", device, head_dim) gives "fp8" where the GPU has FP8 tensor cores and the kernel
takes the head dim (64 or 128), and "sdpa" elsewhere.
The paper's knobs: qk_norm, pos ("rope", "learned" as in GPT-2, or "none" = NoPE), n_kv_head (GQA).
"""
import inspect
import math
import os
import re
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION_PATHS = {
    "fp8": "fp8 Delta-Matching (block-scaled e4m3, matched delta)",
    "fp8_stale": "fp8 stale delta (ablation: FlashAttention's delta = rowsum(dO*O))",
    "sdpa": "sdpa (PyTorch scaled_dot_product_attention)",
}
# attention_fp8.attention, imported only when an fp8 path is built: importing it imports triton, which a
# CPU-only install may lack, and fixes at import whether its kernels run in the interpreter
_fp8_attention = None


def attention_line(attention, dtype, device):
    """The start-up line of train.py and sample.py: which attention path runs, in what precision, where."""
    device = torch.device(device)
    where = f"cuda {torch.cuda.get_device_name(device)}" if device.type == "cuda" else device.type
    return f"attention: {ATTENTION_PATHS[attention]} | {'bf16 autocast' if dtype == 'bfloat16' else 'fp32'} | {where}"


def fp8_unavailable(device, head_dim=None):
    """Why the FP8 kernel cannot run on `device` (at this head dim, if given), or None when it can."""
    device = torch.device(device)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"no CUDA GPU (device {device.type})"  # on CPU the kernel runs only in Triton's interpreter
    try:
        import attention_fp8
    except Exception as e:  # attention_fp8.py not on the path, or triton missing or broken
        return f"attention_fp8 does not import ({type(e).__name__}: {e})"
    if not attention_fp8.fp8_supported(device):
        if device.type != "cuda":  # TRITON_INTERPRET=1 set only after attention_fp8 was imported
            return (f"no CUDA GPU (device {device.type}), and attention_fp8 was imported without TRITON_INTERPRET=1, "
                    "which alone runs its kernels on a CPU")
        name, cap = torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
        if torch.version.hip is not None:
            return f"{name}: an AMD GPU (ROCm), and the kernel is written for NVIDIA's FP8 tensor cores"
        return f"{name} (compute capability {cap[0]}.{cap[1]}) has no FP8 tensor cores (needs 8.9+)"
    if head_dim is not None and head_dim not in attention_fp8.HEAD_DIMS:
        return (f"head dim {head_dim} (n_embd / n_head): the fp8 kernel takes "
                f"{' or '.join(map(str, attention_fp8.HEAD_DIMS))}")
    return None


def resolve_attention(requested, device, head_dim=None):
    """The attention path for GPTConfig.attention. requested: "auto", "sdpa", "fp8" or "fp8_stale".
    'auto' -> 'fp8' where the GPU has FP8 tensor cores and the kernel takes the head dim (n_embd /
    n_head), else 'sdpa'. Returns (path, why not fp8 or None). An fp8 path asked for by name that
    cannot run here raises RuntimeError; a name not in that list raises ValueError."""
    if requested not in ("auto", *ATTENTION_PATHS):
        raise ValueError(f"attention={requested!r}: not one of {['auto', *ATTENTION_PATHS]}")
    if requested == "sdpa":
        return "sdpa", None
    if requested == "auto":
        # never the CPU interpreter by choice: it is for tests, thousands of times slower than SDPA
        why = fp8_unavailable(device, head_dim) if torch.device(device).type == "cuda" else "no CUDA GPU"
        if not why:
            import attention_fp8  # imported by fp8_unavailable already
            if attention_fp8.INTERPRETED:  # TRITON_INTERPRET=1 on a GPU machine
                why = "its kernels were built for Triton's interpreter (TRITON_INTERPRET=1)"
        return ("sdpa", why) if why else ("fp8", None)
    why = fp8_unavailable(device, head_dim)
    if why:
        raise RuntimeError(f"attention={requested} cannot run here: {why}. Use --attention=sdpa (or auto)")
    return requested, None


def shape_problem(n_embd, n_head, n_kv_head=0, pos="rope"):
    """What is wrong with these attention dimensions, or None. n_kv_head 0 means n_head. train.py and
    bench_train.py turn the answer into a config error, GPT into a ValueError."""
    if n_head < 1 or n_embd % n_head:
        return f"n_embd={n_embd} must be a multiple of n_head={n_head} (head dim n_embd / n_head)"
    if n_kv_head < 0 or (n_kv_head and n_head % n_kv_head):
        return f"n_head={n_head} must be a multiple of n_kv_head={n_kv_head} (0: n_head)"
    if pos == "rope" and (n_embd // n_head) % 2:
        return (f"pos=rope turns pairs of channels: head dim n_embd / n_head = {n_embd // n_head} must be even "
                "(or pos=learned / none)")
    return None


# -----------------------------------------------------------------------------------------------------

class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class RMSNorm(nn.Module):
    """For QK-norm: RMS-normalize each head's q and k; the learned gain sets the attention temperature."""

    def __init__(self, ndim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x):  # in fp32: a bf16 input with an fp32 weight would take a slow unfused path
        return F.rms_norm(x.float(), self.weight.shape, self.weight, 1e-6).type_as(x)


def rope_cache(seq_len, head_dim, base):
    """cos, sin of shape (1, T, 1, hs/2): channel pair i turns by angle t * base^(-2i/hs) at position t."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, hs/2)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]


def apply_rope(x, cos, sin):
    """Rotate the pairs (x[i], x[i + hs/2]) of x (B, T, nh, hs); in fp32, then back to x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()  # GPT has checked the shapes (shape_problem)
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        # q for every head, k and v for the n_kv_head groups (GQA), in one matmul
        self.c_attn = nn.Linear(config.n_embd, (config.n_head + 2 * config.n_kv_head) * self.head_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.q_norm = RMSNorm(self.head_dim) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim) if config.qk_norm else None
        self.resid_dropout = nn.Dropout(config.dropout)
        self.attention = config.attention
        self.probe = None  # a dict while train.py's delta monitor probes this layer

    @property
    def attention(self):
        return self._attention

    @attention.setter
    def attention(self, path):
        # checked at every assignment, so that a layer switched after the model was built (grad_fidelity.py
        # switches them) is checked as a built one is, and finds the kernel imported
        if path != "sdpa":
            # errors, not asserts: python -O drops asserts, and a typo would then run the fp8 kernel
            if path not in ATTENTION_PATHS:
                raise ValueError(f"attention={path!r}: not one of {list(ATTENTION_PATHS)}")
            import attention_fp8
            if self.head_dim not in attention_fp8.HEAD_DIMS:
                raise ValueError(f"the fp8 kernel takes head dims {attention_fp8.HEAD_DIMS}, "
                                 f"not n_embd/n_head={self.head_dim}")
            global _fp8_attention
            _fp8_attention = attention_fp8.attention
        self._attention = path

    def forward(self, x, rope=None):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
        hs = self.head_dim
        q, k, v = self.c_attn(x).split([self.n_head * hs, self.n_kv_head * hs, self.n_kv_head * hs], dim=2)
        q = q.view(B, T, self.n_head, hs)  # (B, T, nh, hs)
        k = k.view(B, T, self.n_kv_head, hs)  # (B, T, nkv, hs)
        v = v.view(B, T, self.n_kv_head, hs)  # (B, T, nkv, hs)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh|nkv, T, hs)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        else:
            # the kernel takes bf16/fp16 only (and does GQA itself); an fp32 run rounds to bf16 around it
            dtype = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
            y = _fp8_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True,
                               delta="stale" if self.attention == "fp8_stale" else "matched").to(q.dtype)
        if self.probe is not None:  # the delta monitor (train.py) needs this layer's inputs and dL/dy
            self.probe.update(q=q.detach(), k=k.detach(), v=v.detach(), y=y)
        # (B, T, C): heads side by side again. No copy on the GPU: cuDNN/flash SDPA and the fp8 kernel
        # return y in q's memory layout, which is (B, T, H, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, rope=None):
        x = x + self.attn(self.ln_1(x), rope)
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 0  # 0: n_head; fewer: grouped-query attention, n_head / n_kv_head query heads per k/v head
    n_embd: int = 768
    dropout: float = 0.0  # on embeddings and residual branches; none on attention weights (the fp8 kernel has none)
    bias: bool = False  # bias in Linears and LayerNorms, like GPT-2; False is a bit better and faster
    qk_norm: bool = False  # RMSNorm on each head's q and k before attention
    pos: str = "rope"  # "rope", "learned" (GPT-2's position table) or "none" (NoPE)
    rope_base: float = 10000.0
    attention: str = "sdpa"  # "sdpa", "fp8", "fp8_stale"; see resolve_attention for "auto"


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        if config.vocab_size is None or config.block_size is None:
            raise ValueError("GPTConfig needs vocab_size and block_size")
        # errors, not asserts: under python -O, pos='RoPE' built a model with no positions
        if config.pos not in ("rope", "learned", "none"):
            raise ValueError(f"pos={config.pos!r}: expected rope, learned or none")
        if config.n_kv_head < 0:
            raise ValueError(f"n_kv_head={config.n_kv_head}: the number of k/v heads, or 0 for as many as n_head")
        why = shape_problem(config.n_embd, config.n_head, config.n_kv_head, config.pos)
        if why:
            raise ValueError(why)
        # 0 is n_head, as in train.py (a default of 12 gave GPTConfig(n_head=24) grouped-query attention unasked,
        # and GPTConfig(n_head=16) an error about a setting nobody set)
        config = replace(config, n_kv_head=config.n_kv_head or config.n_head)
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        if config.pos == "learned":
            self.transformer.wpe = nn.Embedding(config.block_size, config.n_embd)
        if config.pos == "rope":  # not in the state dict: recomputed for whatever block_size a run uses
            cos, sin = rope_cache(config.block_size, config.n_embd // config.n_head, config.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the input embedding and the output projection share one matrix
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # scaled init of the residual projections, per the GPT-2 paper: the residual stream sums 2*n_layer of them
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def get_num_params(self, non_embedding=True):
        """Parameter count. non_embedding drops the position table; the token embedding stays in because,
        tied to lm_head, it does the work of the output layer."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding and self.config.pos == "learned":
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """idx: (b, t) token ids, t <= block_size; targets: (b, t) next-token ids (-1 ignored) or None.
        Returns (logits, loss): logits (b, t, vocab_size) and the mean cross-entropy over the targets,
        or without targets the last position's logits (b, 1, vocab_size) and None."""
        b, t = idx.size()
        if t > self.config.block_size:  # an error, not an assert: under python -O, rope and learned positions
            # failed with a shape or index error, and pos=none ran past what the model was trained on
            raise ValueError(f"sequence of length {t} exceeds block_size {self.config.block_size}")
        x = self.transformer.wte(idx)  # (b, t, n_embd)
        if self.config.pos == "learned":
            x = x + self.transformer.wpe(torch.arange(t, device=idx.device))  # (t, n_embd) broadcast over b
        x = self.transformer.drop(x)
        rope = (self.rope_cos[:, :t], self.rope_sin[:, :t]) if self.config.pos == "rope" else None
        for block in self.transformer.h:
            x = block(x, rope)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)  # (b, t, vocab_size)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        else:  # inference: only the last position's logits are needed
            logits = self.lm_head(x[:, [-1], :])  # (b, 1, vocab_size); the list index keeps the time dim
            loss = None
        return logits, loss

    def load_state(self, state_dict):
        """Load weights saved by train.py, tolerating the key prefixes torch.compile ('_orig_mod.') and DDP
        ('module.') add. A learned position table is cropped to a shorter block_size; a block_size longer
        than the checkpoint's table is refused (ValueError): there are no trained rows for the new
        positions (RoPE and NoPE extend freely). Mismatched keys or shapes raise RuntimeError, on one line."""
        sd = {}
        for k, v in state_dict.items():
            while k.startswith(("_orig_mod.", "module.")):
                k = k.split(".", 1)[1]
            sd[k] = v
        wpe = sd.get("transformer.wpe.weight")
        if wpe is not None and self.config.pos == "learned":
            if wpe.size(0) < self.config.block_size:
                raise ValueError(f"the checkpoint has learned positions for {wpe.size(0)} tokens; it cannot run at "
                                 f"block_size {self.config.block_size}. Context extension needs pos=rope or none")
            sd["transformer.wpe.weight"] = wpe[: self.config.block_size]
        try:
            self.load_state_dict(sd)
        except RuntimeError as e:  # on one line: its callers name the checkpoint and end on this message
            raise RuntimeError(" ".join(str(e).split())) from None

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # weight decay on the matrices (matmul weights, embeddings); none on gains and biases
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        # fused AdamW: one kernel for the whole update on CUDA
        fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if fused else {}))

    def flops_per_token(self):
        """Training FLOPs per token (forward + backward), as in the PaLM paper appendix B and nanoGPT:
        6 per parameter, plus 12 * L * H * hs * T for the attention scores and weighted sum. Causal
        attention is counted in full (not halved), like nanoGPT, so figures stay comparable to it."""
        cfg = self.config
        return 6 * self.get_num_params() + 12 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * cfg.block_size

    def estimate_mfu(self, fwdbwd_per_iter, dt, device_name):
        """Model FLOPs utilization of one device as a fraction of its BF16 dense peak; None for an unknown
        device. fwdbwd_per_iter: sequences of block_size tokens this device runs forward and backward per
        iteration (all its micro-batches); dt: seconds per iteration; device_name:
        torch.cuda.get_device_name(). The fp8 attention paths are measured against the BF16 peak too:
        the linear layers, which do most of the FLOPs, run in BF16, and one scale keeps the attention
        paths comparable."""
        peak = peak_flops(device_name)
        if peak is None:
            return None
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, vocab_size=None):
        """Extend idx (b, t) by max_new_tokens tokens sampled one at a time; the context is cropped to
        block_size. temperature 0 takes the argmax. vocab_size: the tokenizer's; the ids above it, up to
        the model's vocab (padded to a multiple of 64), are in no training document and are never drawn.
        Call model.eval() first."""
        if not temperature >= 0 or (top_k is not None and top_k < 1):  # nan fails too
            raise ValueError(f"temperature={temperature}, top_k={top_k}: need temperature >= 0 and top_k >= 1")
        if idx.dim() != 2 or idx.size(1) == 0:  # no last position to predict from (an IndexError, deep inside)
            raise ValueError(f"generate needs token ids of shape (batch, t >= 1), got {tuple(idx.shape)}; "
                             "start from the end-of-text token for no prompt, as sample.py does")
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :].float()
            if vocab_size is not None:     # the padding ids are never drawn, nor do they set the row's max
                logits = logits[:, :vocab_size]
            if top_k is not None:   # the k most likely, chosen before a large temperature rounds them into ties
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                dropped = logits < kth
            if temperature > 0:
                # less the row's max first: then no temperature, however small, overflows to inf (NaN after softmax)
                logits = (logits - logits.max(-1, keepdim=True).values) / temperature
            if temperature == 0:  # the limit of temperature -> 0: the most likely token
                idx_next = logits.argmax(-1, keepdim=True)
            else:
                if top_k is not None:
                    logits[dropped] = -float("Inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


# BF16 dense tensor-core peak FLOP/s per GPU, from the vendor data sheets (sparsity not counted). Matched as
# whole words of torch.cuda.get_device_name() ("L4" is not "L40", "A100" not "RTX A1000"), first match wins:
# keep the more specific names first.
PEAK_BF16_FLOPS = [
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989.5e12), ("H200 NVL", 835e12), ("H200", 989.5e12),
    ("H800 PCIe", 756e12), ("H800", 989.5e12),
    ("GH200", 989.5e12), ("B200", 2250e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12),
    ("L40", 181e12), ("L4", 121e12), ("RTX 4090", 165.2e12), ("RTX 3090", 71e12), ("RTX 6000 Ada", 364e12),
    ("A6000", 154.8e12),
]


def peak_flops(device_name):
    for key, flops in PEAK_BF16_FLOPS:
        if re.search(rf"(?<!\w){re.escape(key)}(?!\w)", device_name):
            return flops
    return None

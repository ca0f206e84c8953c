"""bench_train.py's figures on CPU: tokens/s and MFU from a clock that a step of the model advances by a set
time (so the formulas are checked exactly, with no real timing), and the printed table's ratios."""
import types

import pytest
import torch

import bench_train
import model as model_module
from model import GPT, GPTConfig

STEP_S = 0.5    # seconds one training step takes on the fake clock


@pytest.fixture
def clocked(monkeypatch):
    """bench_train's clock reads a counter that every forward pass of the GPT advances by STEP_S (the first
    by 20 x STEP_S)."""
    clock = types.SimpleNamespace(now=1000.0, forwards=0)

    class ClockedGPT(GPT):
        def forward(self, *args, **kw):
            # the first forward costs 20 steps' time, as a compilation would: a mean that took in the warmup
            # comes out wrong
            clock.now += STEP_S * (20 if clock.forwards == 0 else 1)
            clock.forwards += 1
            return super().forward(*args, **kw)
    monkeypatch.setattr(bench_train, "GPT", ClockedGPT)
    monkeypatch.setattr(bench_train, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(model_module, "peak_flops", lambda name: 1e12)   # an MFU on CPU too
    return clock


def test_bench_tokens_per_second_and_mfu(clocked):
    """tokens/s = the tokens a step really trains (batch x block_size, batch = tokens_per_step // block_size,
    at least 1) over the mean time of the timed steps only; MFU from that batch of sequences per step.
    100 tokens asked for at block size 32: 3 sequences, 96 tokens per step."""
    block_size, tokens_per_step, batch = 32, 100, 3
    cfg = bench_train.BenchConfig(n_layer=1, n_head=2, n_embd=128, vocab_size=256, tokens_per_step=tokens_per_step,
                                  warmup=1, steps=2, compile=False, device="cpu")
    tok_s, mfu, mem = bench_train.bench(cfg, "sdpa", "sdpa", block_size, torch.device("cpu"))
    assert clocked.forwards == cfg.warmup + cfg.steps
    assert tok_s == pytest.approx(batch * block_size / STEP_S, rel=1e-12)
    ref = GPT(GPTConfig(block_size=block_size, vocab_size=256, n_layer=1, n_head=2, n_kv_head=2, n_embd=128))
    flops_per_step = (6 * ref.get_num_params() + 12 * 1 * 2 * 64 * block_size) * block_size * batch
    assert mfu == pytest.approx(flops_per_step / STEP_S / 1e12, rel=1e-12)
    assert mem != mem   # nan: no peak memory off CUDA


def test_model_settings_reach_the_model(clocked, monkeypatch):
    """--n_kv_head and --qk_norm must build the model they name (the README's GQA and QK-norm rows)."""
    built = []

    class RecordedGPT(bench_train.GPT):
        def __init__(self, config):
            built.append(config)
            super().__init__(config)
    monkeypatch.setattr(bench_train, "GPT", RecordedGPT)
    cfg = bench_train.BenchConfig(n_layer=1, n_head=4, n_kv_head=2, qk_norm=True, n_embd=256, vocab_size=256,
                                  tokens_per_step=32, warmup=1, steps=1, compile=False, device="cpu")
    bench_train.bench(cfg, "sdpa", "sdpa", 32, torch.device("cpu"))
    assert [(c.n_head, c.n_kv_head, c.qk_norm, c.n_layer, c.n_embd) for c in built] == [(4, 2, True, 1, 256)], built


def test_main_table_ratios(monkeypatch, capsys):
    """The table: per block size, each path's tokens/s over the first path's at that block size; MFU in
    percent; n/a where the peak FLOP/s or the peak memory is unknown. (The second arm is auto, which
    resolves on any machine, to sdpa on a CPU: main() checks every arm before the first runs.)"""
    figures = {(1024, "sdpa"): (500_000.0, 0.40, 42.9), (1024, "auto"): (400_000.0, 0.32, 40.0),
               (4096, "sdpa"): (250_000.0, 0.30, 43.0),
               (4096, "auto"): (200_000.0, None, float("nan"))}  # nan: peak memory, as off CUDA
    monkeypatch.setattr(bench_train, "bench", lambda cfg, attention, path, block_size, device: figures[block_size, attention])
    bench_train.main(["--device=cpu", "--attentions=sdpa,auto", "--block_sizes=1024,4096"])
    auto = bench_train.arm_label("auto", *bench_train.resolve_arms(["auto"], torch.device("cpu"), 64)["auto"])
    out = capsys.readouterr().out
    assert out.count("| T |") == 1, out  # one header, above the rows, printed once
    table = out.split("|---|---|---|---|---|---|\n")[1].splitlines()
    assert [[c.strip() for c in row.split("|")[1:-1]] for row in table] == [
        ["1024", "sdpa", "500,000", "1.00x", "40.0%", "42.9"],
        ["1024", auto, "400,000", "0.80x", "32.0%", "40.0"],
        ["4096", "sdpa", "250,000", "1.00x", "30.0%", "43.0"],
        ["4096", auto, "200,000", "0.80x", "n/a", "n/a"]]


@pytest.mark.parametrize("args,header", [
    ([], "| 65,536 tokens/step |"),
    (["--block_sizes=1024,3072"], "| tokens/step 65,536 at T=1024, 64,512 at T=3072 |"),
    (["--tokens_per_step=100", "--block_sizes=64"], "| 64 tokens/step |"),
    (["--tokens_per_step=32", "--block_sizes=64"], "| 64 tokens/step |"),     # below one sequence: one runs
])
def test_header_gives_the_tokens_each_step_runs(monkeypatch, capsys, args, header):
    """The header printed the tokens asked for (65,536) where a block size that does not divide them ran
    fewer (21 x 3072 = 64,512), or more (one whole sequence past a tokens_per_step below block_size)."""
    monkeypatch.setattr(bench_train, "bench", lambda cfg, attention, path, block_size, device: (1.0, None, float("nan")))
    bench_train.main(["--device=cpu", "--attentions=sdpa", *args])
    assert header in capsys.readouterr().out.splitlines()[0]


def test_peak_gib(monkeypatch):
    """The table's peak memory column is in GiB (2**30 bytes), of the CUDA device; nan on CPU."""
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30 + 2**29)
    assert bench_train.peak_gib(torch.device("cuda")) == 3.5
    assert bench_train.peak_gib(torch.device("cpu")) != bench_train.peak_gib(torch.device("cpu"))


@pytest.mark.parametrize("arg,message", [
    ("--lerning=1", "unknown config key 'lerning'"),
    ("--block_sizes=abc", "block_sizes='abc': expected whole numbers >= 1"),
    ("--block_sizes=1024,", "block_sizes='1024,': expected whole numbers >= 1"),
    ("--block_sizes=0", "block_sizes='0': expected whole numbers >= 1"),
    ("--block_sizes=1024,-1", "block_sizes='1024,-1': expected whole numbers >= 1"),
    ("--steps=0", "steps=0: must be at least 1"),
    ("--warmup=0", "warmup=0: must be at least 1 (the first step compiles)"),   # compilation timed as training
    ("--device=gpu", "device='gpu': expected auto, cpu, cuda or cuda:N"),
    ("--attentions=sdpa,bogus", "unknown path(s) 'bogus'; the paths are auto, fp8, fp8_stale, sdpa, sdpa_cudnn,"),
    ("--n_head=5", "n_embd=768 must be a multiple of n_head=5"),
    ("--n_kv_head=5", "n_head=12 must be a multiple of n_kv_head=5"),
    ("--n_head=0", "n_head=0: must be at least 1"),
    ("--n_embd=180", "pos=rope turns pairs of channels: head dim n_embd / n_head = 15 must be even"),
])
def test_bad_arguments_are_config_errors(monkeypatch, arg, message):
    """A bad argument ends bench_train.py with one `config error:` line naming it, before any path is timed."""
    monkeypatch.setattr(bench_train, "bench", lambda *a: pytest.fail("bench() ran on a bad argument"))
    with pytest.raises(SystemExit) as e:
        bench_train.main(["--device=cpu", arg])
    assert str(e.value).startswith("config error: ") and message in str(e.value), str(e.value)


def test_fp8_where_it_cannot_run_is_refused_before_any_arm_runs(monkeypatch):
    """An fp8 arm that cannot run here (head dim 16) stops the run before the first arm is timed (it
    stopped at its own turn, after the arms before it had compiled and run), in a clean exit that names
    this script's option (the trainer's advice, --attention=sdpa, is an unknown key here)."""
    monkeypatch.setattr(bench_train, "bench", lambda *a: pytest.fail("an arm ran before the refusal"))
    with pytest.raises(SystemExit) as e:
        bench_train.main(["--device=cpu", "--attentions=sdpa,fp8", "--n_embd=32", "--n_head=2", "--block_sizes=16"])
    # on a CPU under the interpreter the head dim is why; on a GPU machine, the CPU itself
    why = model_module.fp8_unavailable(torch.device("cpu"), 16)
    assert why and str(e.value) == f"attentions: fp8 cannot run here: {why}; leave it out of --attentions", str(e.value)


@pytest.mark.parametrize("forced", ["sdpa_cudnn", "sdpa_flash"])
def test_a_forced_cuda_backend_on_the_cpu_is_refused_before_any_arm_runs(monkeypatch, forced):
    """sdpa_cudnn and sdpa_flash are CUDA kernels: on the CPU the arms before them ran and were timed, then
    the forced one died in a traceback ("No viable backend for scaled_dot_product_attention")."""
    monkeypatch.setattr(bench_train, "bench", lambda *a: pytest.fail("an arm ran before the refusal"))
    with pytest.raises(SystemExit, match=f"attentions: {forced} forces a CUDA backend of SDPA, and the device is cpu"):
        bench_train.main(["--device=cpu", f"--attentions=sdpa,{forced}", "--block_sizes=64"])


def test_an_auto_row_names_the_path_it_ran(monkeypatch, capsys):
    """auto is fp8 where it runs, else sdpa: its row says which, and why not fp8 (on a CPU: sdpa, for
    want of a GPU), and bench() builds the model with that path."""
    ran = []
    monkeypatch.setattr(bench_train, "bench", lambda cfg, attention, path, block_size, device:
                        ran.append((attention, path)) or (1.0, None, float("nan")))
    bench_train.main(["--device=cpu", "--attentions=auto,sdpa", "--block_sizes=64"])
    rows = capsys.readouterr().out.split("|---|---|---|---|---|---|\n")[1].splitlines()
    assert [row.split("|")[2].strip() for row in rows] == ["auto: sdpa (no CUDA GPU)", "sdpa"], rows
    assert ran == [("auto", "sdpa"), ("sdpa", "sdpa")]


def test_forced_sdpa_backends_run_and_are_checked(monkeypatch):
    """A forced arm must run its backend. Compiled, the second of two arms of the same model got the first
    one's graph from torch.compile's AOTAutograd cache, whose key ignores the SDPA backend flags, and
    so the first one's backend under its own name. Here MATH, then FLASH_ATTENTION (both run on a CPU);
    each arm profiles a step and stops if its op did not run."""
    monkeypatch.setattr(bench_train, "SDPA_BACKENDS", {"sdpa_math": "MATH", "sdpa_flash": "FLASH_ATTENTION"})
    cfg = bench_train.BenchConfig(n_layer=1, n_head=2, n_embd=64, vocab_size=128, tokens_per_step=64, warmup=1,
                                  steps=1, compile=True, device="cpu")
    for arm in ("sdpa_math", "sdpa_flash"):
        tok_s, _, _ = bench_train.bench(cfg, arm, "sdpa", 32, torch.device("cpu"))
        assert tok_s > 0
    # and the check can fail: an arm whose op never shows
    monkeypatch.setattr(bench_train, "SDPA_OPS", {**bench_train.SDPA_OPS, "FLASH_ATTENTION": "_no_such_op"})
    cfg.compile = False
    with pytest.raises(SystemExit, match=r"sdpa_flash: the FLASH_ATTENTION backend did not run; the profiler saw \[.*flash"):
        bench_train.bench(cfg, "sdpa_flash", "sdpa", 32, torch.device("cpu"))

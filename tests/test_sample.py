"""sample.py against model.generate: what it prints is what generate gives on the checkpoint's weights with
the options it was asked for (--temperature, --top_k, 0 meaning all tokens), and --seed decides the draws.

The checkpoint is written here the way train.py writes one (train.save_checkpoint, with the model_args,
model and meta keys sample.py reads): a 1-layer byte-level GPT whose weights are scaled up so that its
next-token distribution is far from a fresh model's near-uniform one, yet broad (about 11% of the mass
outside the 200 most likely of its 320 tokens, so the default top_k=200 and top_k=0 draw differently).
sample.py's tokenizer is wrapped to print token ids, so outputs compare exactly, padded ids included."""
import dataclasses
import os
import sys

import pytest
import torch

import sample
import train
from data.common import get_tokenizer
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEP = "---------------"
START = "ab"


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    # trained with dropout, as train.py records it in model_args: sampling must run in eval mode, or every
    # comparison below with the eval-mode generate() fails
    config = GPTConfig(block_size=16, vocab_size=320, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, dropout=0.5,
                       attention="sdpa")
    torch.manual_seed(0)
    m = GPT(config)
    with torch.no_grad():  # sharpen: the block's matrices x30, the tied embedding (listed once, as wte) x8
        for p in m.parameters():
            p.mul_(8 if p is m.lm_head.weight else 30 if p.dim() == 2 else 1)
    out = str(tmp_path_factory.mktemp("ckpt"))
    train.save_checkpoint(os.path.join(out, "ckpt.pt"), {
        "model": m.state_dict(), "model_args": dataclasses.asdict(config), "meta": {"tokenizer": "bytes"}})
    return out


def loaded(out_dir):
    """The checkpoint's model, loaded here independently of sample.py."""
    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=False)
    m = GPT(GPTConfig(**ckpt["model_args"]))
    m.load_state(ckpt["model"])
    return m.eval()


def run(monkeypatch, capsys, out_dir, *opts):
    """sample.main with its tokenizer's decode printing ids. Returns the printed samples (lists of ids,
    the prompt's end-of-text token dropped as sample.py drops it) and, for each generate() call, the RNG
    state and the prompt it started from, so a test can replay that call."""
    def ids_tokenizer(name, fallback=True):
        tok = get_tokenizer(name, fallback)
        tok.decode = lambda ids: " ".join(map(str, ids))
        return tok
    calls = []
    real_generate = GPT.generate

    def recording_generate(self, idx, *args, **kw):
        calls.append((torch.get_rng_state(), idx.clone()))
        return real_generate(self, idx, *args, **kw)
    monkeypatch.setattr(sample, "get_tokenizer", ids_tokenizer)
    monkeypatch.setattr(GPT, "generate", recording_generate)
    capsys.readouterr()
    sample.main([f"--out_dir={out_dir}", "--device=cpu", "--dtype=float32", f"--start={START}", *opts])
    blocks = capsys.readouterr().out.split(SEP + "\n")
    assert blocks[-1] == "", "sample.py printed something after its last separator"
    monkeypatch.setattr(GPT, "generate", real_generate)
    return [list(map(int, b.split())) for b in blocks[:-1]], calls


BYTES_VOCAB = 257  # the checkpoint's tokenizer's; its model's vocab is padded to 320


def replay(model, calls, max_new_tokens, temperature, top_k):
    """What generate gives on `model` with these settings from each recorded call's RNG state and prompt."""
    out = []
    for rng, idx in calls:
        torch.set_rng_state(rng)
        out.append(model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k,
                                  vocab_size=BYTES_VOCAB)[0, 1:].tolist())
    return out


def test_greedy_sample_is_generate_on_the_checkpoints_weights(ckpt_dir, monkeypatch, capsys):
    """--temperature=0 needs no RNG: the output must be the loaded checkpoint's greedy continuation.
    A model that skipped the checkpoint (a fresh init) continues otherwise, as checked first."""
    want = loaded(ckpt_dir).generate(torch.tensor([[256, 97, 98]]), 24, temperature=0,
                                     vocab_size=BYTES_VOCAB)[0, 1:].tolist()
    torch.manual_seed(1337)  # sample.py's default seed, before it builds the model
    fresh = GPT(GPTConfig(**torch.load(os.path.join(ckpt_dir, "ckpt.pt"), weights_only=False)["model_args"]))
    assert fresh.eval().generate(torch.tensor([[256, 97, 98]]), 24, temperature=0,
                                 vocab_size=BYTES_VOCAB)[0, 1:].tolist() != want, \
        "test setup: a fresh model should continue differently from the checkpoint"
    samples, _ = run(monkeypatch, capsys, ckpt_dir, "--temperature=0", "--num_samples=2", "--max_new_tokens=24")
    assert samples == [want, want], "temperature 0 must give the checkpoint's greedy continuation"
    # a temperature near 0 that is not 0 goes through the sampling path and must agree
    samples, _ = run(monkeypatch, capsys, ckpt_dir, "--temperature=1e-4", "--num_samples=1", "--max_new_tokens=24")
    assert samples == [want], "--temperature=1e-4 must sample the argmax"


@pytest.mark.parametrize("temperature,top_k", [(1.5, 0), (0.5, 3), (1.0, 200)])
def test_sample_is_generate_with_the_options_given(ckpt_dir, monkeypatch, capsys, temperature, top_k):
    """Each printed sample equals generate() replayed from the same RNG state on the checkpoint's weights
    with the temperature and top_k asked for (--top_k=0: no top-k). The same replay with the other settings
    differs, so the comparison can tell them apart."""
    opts = (f"--temperature={temperature}", f"--top_k={top_k}", "--num_samples=2", "--max_new_tokens=30")
    samples, calls = run(monkeypatch, capsys, ckpt_dir, *opts)
    assert len(samples) == len(calls) == 2 and all(len(s) == 2 + 30 for s in samples)
    m = loaded(ckpt_dir)
    assert samples == replay(m, calls, 30, temperature, top_k or None), \
        f"sample.py --temperature={temperature} --top_k={top_k} did not print generate()'s tokens on the checkpoint"
    others = [(0.8, top_k or None), (temperature, 200 if top_k != 200 else None), (temperature, 1)]
    for t, k in others:  # the default temperature; the default top_k (or none); greedy
        assert replay(m, calls, 30, t, k) != samples, f"test setup: temperature={t}, top_k={k} drew the same"


def test_padding_ids_are_never_drawn(ckpt_dir, monkeypatch, capsys):
    """The model's vocab is padded past the tokenizer's (320 vs 257 here). No document holds those ids, so
    a trained model rarely picks them, but an untrained one does: sample.py drew them, and decode dropped
    them from the text while they stayed in the context. Here they hold about a fifth of the mass."""
    with torch.no_grad():
        logits = loaded(ckpt_dir)(torch.tensor([[256, 97, 98]]))[0][0, -1]
    assert logits.softmax(-1)[BYTES_VOCAB:].sum() > 0.05, "test setup: padded ids should carry some mass"
    samples, _ = run(monkeypatch, capsys, ckpt_dir, "--temperature=1.0", "--num_samples=4", "--max_new_tokens=30")
    drawn = [i for s in samples for i in s[2:]]
    assert len(drawn) == 120 and max(drawn) < BYTES_VOCAB, f"drew ids past the tokenizer's vocab: {sorted(set(drawn))}"


@pytest.mark.parametrize("opt,message", [("--seed=18446744073709551616", r"seed=18446744073709551616: must be in"),
                                         ("--seed=-1", r"seed=-1: must be in"),
                                         ("--start=\udcff\udcfe", r"--start: the prompt is not UTF-8 text")])
def test_bad_seed_and_undecodable_prompt_are_refused(ckpt_dir, opt, message):
    """A seed torch cannot take, and a prompt of bytes that are not UTF-8 (they reach sys.argv as lone
    surrogates), get a message instead of a traceback from inside torch or the tokenizer."""
    with pytest.raises(SystemExit, match=message):
        sample.main([f"--out_dir={ckpt_dir}", "--device=cpu", opt])


def test_seed_decides_the_draws(ckpt_dir, monkeypatch, capsys):
    """The same --seed prints the same samples; another seed prints other samples."""
    opts = ("--temperature=1.0", "--num_samples=2", "--max_new_tokens=30")
    a, _ = run(monkeypatch, capsys, ckpt_dir, "--seed=5", *opts)
    torch.manual_seed(99)  # whatever state the process is in, --seed resets it
    b, _ = run(monkeypatch, capsys, ckpt_dir, "--seed=5", *opts)
    c, _ = run(monkeypatch, capsys, ckpt_dir, "--seed=6", *opts)
    assert a == b, "the same --seed gave different samples"
    assert a != c, "--seed=5 and --seed=6 gave the same samples"
    assert a[0] != a[1], "the two samples of one run should differ (the RNG runs on between them)"


def test_says_which_attention_path_runs_on_stderr(ckpt_dir, tmp_path, capsys):
    """One line on stderr (stdout holds only the samples) names the attention path and precision, and
    says so when it is not the one the checkpoint trained with (auto picks by GPU, not by checkpoint)."""
    opts = ["--device=cpu", "--dtype=float32", "--temperature=0", "--num_samples=1", "--max_new_tokens=2"]
    capsys.readouterr()
    sample.main([f"--out_dir={ckpt_dir}", *opts])
    out, err = capsys.readouterr()
    assert err == "attention: sdpa (PyTorch scaled_dot_product_attention) | fp32 | cpu\n", err
    assert "attention:" not in out
    ckpt = torch.load(os.path.join(ckpt_dir, "ckpt.pt"), weights_only=False)
    ckpt["model_args"]["attention"] = "fp8"
    os.makedirs(tmp_path / "fp8")
    torch.save(ckpt, tmp_path / "fp8" / "ckpt.pt")
    sample.main([f"--out_dir={tmp_path / 'fp8'}", *opts, "--attention=sdpa"])
    assert capsys.readouterr().err.endswith("| fp32 | cpu (the checkpoint trained with fp8)\n")


def test_reader_that_stops_early_gets_no_traceback(ckpt_dir):
    """python sample.py | head: the pipe closes while samples are still printed. That ended in a
    BrokenPipeError traceback; now it stops quietly with status 1, as Python's docs advise."""
    import subprocess
    cmd = [sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={ckpt_dir}", "--device=cpu",
           "--dtype=float32", "--num_samples=100000", "--max_new_tokens=2"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdout.readline()
        p.stdout.close()            # as head does after its lines
        err = p.stderr.read().decode()
        p.wait(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 1 and "Traceback" not in err, (p.returncode, err[-2000:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where PyTorch sees no GPU")
def test_cuda_device_without_a_gpu_says_so(ckpt_dir):
    with pytest.raises(SystemExit, match="device=cuda: PyTorch sees no CUDA GPU here; use --device=cpu"):
        sample.main([f"--out_dir={ckpt_dir}", "--device=cuda"])


def test_bad_device_is_a_config_error(ckpt_dir):
    """--device=gpu is refused as train.py refuses it, naming the key, not with torch's traceback."""
    with pytest.raises(SystemExit, match=r"config error: device='gpu': expected auto, cpu, cuda or cuda:N"):
        sample.main([f"--out_dir={ckpt_dir}", "--device=gpu"])


@pytest.mark.parametrize("opt", ["--num_samples=0", "--max_new_tokens=-1", "--temperature=-1", "--temperature=nan",
                                 "--top_k=-5"])
def test_bad_counts_and_sampling_options_are_refused(ckpt_dir, opt):
    """A count below 1 or a negative temperature or top_k names itself; sample.py printed an empty sample
    for --max_new_tokens=-1 before."""
    with pytest.raises(SystemExit, match=opt[2:].split("=")[0] + "=" + opt.split("=")[1]):
        sample.main([f"--out_dir={ckpt_dir}", "--device=cpu", opt])


def test_gpt2_checkpoint_without_its_tokenizer_is_refused_without_a_byte_fallback(ckpt_dir, tmp_path, monkeypatch,
                                                                                  capsys):
    """A checkpoint trained on GPT-2 tokens, on a machine where tiktoken cannot load: one line naming the
    file and what to do, and no talk of byte-level tokens (data preparation's fallback) on the way."""
    ckpt = torch.load(os.path.join(ckpt_dir, "ckpt.pt"), weights_only=False)
    ckpt["meta"] = {"tokenizer": "gpt2"}
    torch.save(ckpt, tmp_path / "ckpt.pt")
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken raises ImportError
    with pytest.raises(SystemExit) as e:
        sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--num_samples=1", "--max_new_tokens=2"])
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'ckpt.pt'} was trained on 'gpt2' tokens, which cannot be loaded here: "), msg
    assert "TIKTOKEN_CACHE_DIR" in msg and "\n" not in msg, msg
    assert "byte-level" not in capsys.readouterr().out


@pytest.mark.parametrize("damage,message", [
    ("garbage", " cannot be read as a checkpoint (truncated or damaged, or not one train.py wrote): "),
    ("truncated", " cannot be read as a checkpoint (truncated or damaged, or not one train.py wrote): "),
    ("no meta", " has no 'meta'"),
    ("no model_args", " has no 'model_args'"),
    ("no tokenizer", " has no 'meta' with 'tokenizer'"),
    ("no head count", " has no 'model_args' with 'n_head'"),
    ("another model.py's model_args", ": its model does not load here: TypeError"),
    ("a weight missing", ": its model does not load here: RuntimeError"),    # not random weights, silently
    ("an architecture model.py refuses", ": its model does not load here: ValueError: n_head="),
])
def test_damaged_checkpoint_is_refused_naming_the_file(ckpt_dir, tmp_path, damage, message):
    """A ckpt.pt that is not what train.py writes ends sample.py with one line naming the file and what is
    wrong, not a traceback from torch.load or a KeyError."""
    path = tmp_path / "ckpt.pt"
    with open(os.path.join(ckpt_dir, "ckpt.pt"), "rb") as f:
        good = f.read()
    if damage == "garbage":
        path.write_bytes(b"garbage")
    elif damage == "truncated":
        path.write_bytes(good[:len(good) // 2])
    else:
        ckpt = torch.load(os.path.join(ckpt_dir, "ckpt.pt"), weights_only=False)
        if damage == "no tokenizer":
            ckpt["meta"] = {}
        elif damage == "no head count":
            del ckpt["model_args"]["n_head"]
        elif damage.startswith("another"):
            ckpt["model_args"]["n_expert"] = 8
        elif damage == "an architecture model.py refuses":
            ckpt["model_args"]["n_kv_head"] = ckpt["model_args"]["n_head"] + 1
        elif damage == "a weight missing":
            del ckpt["model"]["transformer.h.0.ln_1.weight"]
        else:
            del ckpt[damage[3:]]
        torch.save(ckpt, path)
    with pytest.raises(SystemExit) as e:
        sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--num_samples=1", "--max_new_tokens=2"])
    assert str(e.value).startswith(f"{path}{message}") and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("script", ["train.py", "sample.py", "bench_train.py", "grad_fidelity.py"])
def test_help_to_a_reader_that_stops_early_gets_no_traceback(script):
    """`python bench_train.py --help | head`: with the pipe closed before the help is written, every script
    stops quietly with Python's status for a broken pipe (bench_train.py and grad_fidelity.py ended in a
    BrokenPipeError traceback)."""
    import subprocess
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, script), "--help"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdout.close()            # before the help is written: the write meets a closed pipe
        err = p.stderr.read().decode()
        p.wait(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 1 and "Traceback" not in err and "Exception ignored" not in err, (p.returncode, err[-2000:])

"""train.py and sample.py on CPU: config errors, a run whose loss falls, exact resume, DDP (2 gloo processes)
against 1 process with the same global batch, a non-finite loss, context extension, sampling."""
import collections
import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest
import torch

import configurator
import train
from model import GPT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(os.path.dirname(ROOT), "shared", "datasets", "tinyshakespeare.txt")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Byte-level shards of Tiny Shakespeare (or, without it, some stdlib source) in a temporary folder."""
    from data.text.prepare import prepare
    src = SHAKESPEARE if os.path.exists(SHAKESPEARE) else os.path.join(os.path.dirname(os.__file__), "json")
    out = str(tmp_path_factory.mktemp("data") / "tiny")
    prepare(src, out, tokenizer="bytes")
    return out


def args(data_dir, out_dir, *extra):
    return [f"--dataset={data_dir}", f"--out_dir={out_dir}", "--device=cpu", "--dtype=float32", "--compile=False",
            "--attention=sdpa", "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=32", "--batch_size=4",
            "--gradient_accumulation_steps=2", "--eval_tokens=1024", "--log_interval=1", "--eval_interval=1000",
            "--learning_rate=3e-3", "--min_lr=3e-4", "--warmup_iters=2", *extra]


def log_rows(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def metrics(out_dir):
    rows = log_rows(out_dir)
    losses = {r["iter"]: r["loss"] for r in rows if "loss" in r}
    vals = {r["iter"]: r["val_loss"] for r in rows if "val_loss" in r}
    return losses, vals


def coded_shards(folder, train=(), val=()):
    """Shards of the given lengths whose tokens say where they sit: token = base + 1000 * shard + position
    (base 0 for train, 30000 for val), so a window names its split, shard and start."""
    from data.common import write_shard
    os.makedirs(folder, exist_ok=True)
    for split, base, lengths in (("train", 0, train), ("val", 30000, val)):
        for i, n in enumerate(lengths):
            write_shard(os.path.join(folder, f"coded_{split}_{i:06d}.bin"), base + 1000 * i + np.arange(n))
    return str(folder)


# -----------------------------------------------------------------------------------------------------
# configuration

def test_config_presets_overrides_and_types(tmp_path):
    preset = tmp_path / "p.py"
    preset.write_text("n_layer = 3\nlearning_rate = 1  # an int is fine for a float\nimport math\n")
    cfg = configurator.parse(train.TrainConfig(), [str(preset), "--n_layer=5", "--compile=false", "--pos=none",
                                                   "--min_lr=1e-5"])
    assert (cfg.n_layer, cfg.learning_rate, cfg.compile, cfg.pos, cfg.min_lr) == (5, 1.0, False, "none", 1e-5)
    assert isinstance(cfg.learning_rate, float)


def test_preset_imports_are_not_settings(tmp_path, monkeypatch):
    """README: a preset may import. A constant it imports (math's pi) is no setting, as a module or a
    function is not; a star import, which binds names nobody wrote, is refused naming its line."""
    preset = tmp_path / "p.py"
    preset.write_text("from math import pi, tau as _t\nimport os.path\nwarmup_iters = int(pi * 10)\n"
                      "def f():\n    from math import e\n    return e\n")
    cfg = configurator.parse(train.TrainConfig(), [str(preset)])
    assert cfg.warmup_iters == 31
    preset.write_text("n_layer = 3\nfrom math import *\n")
    with pytest.raises(configurator.ConfigError, match=re.escape(f"config file {preset}, line 2: `from math import *`")):
        configurator.parse(train.TrainConfig(), [str(preset)])
    # a setting imported from another preset would stay at its default, imported names being no settings,
    # even where the preset then assigns it: refused, naming the settings and the way to build on a preset
    base = tmp_path / "base.py"
    base.write_text("block_size = 64\nn_layer = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))   # importable: the import itself is not what fails
    for text in ("from base import block_size, n_layer\nmax_iters = 5\n", "from base import block_size\n"
                 "block_size = block_size * 2\n"):
        preset.write_text(text)
        with pytest.raises(configurator.ConfigError, match=re.escape(f"config file {preset} imports block_size") +
                           ".*give both, left to right"):
            configurator.parse(train.TrainConfig(), [str(preset)])


def test_a_gpu_index_past_the_machine_is_a_config_error(monkeypatch):
    """--device=cuda:5 on a machine of one GPU: a config error naming the GPUs there, not a traceback from
    torch.cuda.get_device_name later. (torch's count is faked: a machine with GPUs is the point.)"""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    configurator.check_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(configurator.ConfigError, match=re.escape("device=cuda:2: this machine has 2 CUDA GPUs: cuda:0 to cuda:1")):
        configurator.check_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(configurator.ConfigError, match=re.escape("device=cuda:5: this machine has 1 CUDA GPU: cuda:0")):
        configurator.check_device("cuda:5")


@pytest.mark.parametrize("argv,words", [
    (["--lerning_rate=1e-3"], "unknown config key 'lerning_rate' (--lerning_rate=1e-3); did you mean 'learning_rate'"),
    (["--max_iters=ten"], "max_iters='ten' (--max_iters=ten): expected a value of type int"),
    (["--max_iters=1.5"], "max_iters='1.5'"),
    (["--compile=maybe"], "compile='maybe' (--compile=maybe): expected a value of type bool"),
    (["--attention=fp16"], "attention='fp16' (--attention=fp16): expected one of 'auto', 'fp8', 'fp8_stale'"),
    (["--n_layer", "4"], "--n_layer: write overrides as --key=value"),
    (["no_such_file.py"], "config file no_such_file.py not found"),
])
def test_config_errors_name_the_key(argv, words):
    with pytest.raises(configurator.ConfigError) as e:
        configurator.parse(train.TrainConfig(), argv)
    assert words in str(e.value)


def test_preset_with_a_syntax_error_names_file_and_line(tmp_path):
    preset = tmp_path / "p.py"
    preset.write_text("n_layer = 3\nlearning_rate = = 1e-3\n")
    with pytest.raises(configurator.ConfigError, match=re.escape(f"config file {preset}, line 2: invalid syntax")):
        configurator.parse(train.TrainConfig(), [str(preset)])


def test_preset_errors_name_the_key_and_file(tmp_path):
    bad_key, bad_type = tmp_path / "k.py", tmp_path / "t.py"
    bad_key.write_text("n_layers = 4\n")
    bad_type.write_text("batch_size = '16'\n")
    with pytest.raises(configurator.ConfigError, match=re.escape(f"unknown config key 'n_layers' ({bad_key}); did")):
        configurator.parse(train.TrainConfig(), [str(bad_key)])
    with pytest.raises(configurator.ConfigError, match=re.escape(f"batch_size='16' ({bad_type}): expected a value")):
        configurator.parse(train.TrainConfig(), [str(bad_type)])
    with pytest.raises(SystemExit, match="config error: max_iters=0: must be at least 1"):
        train.main(["--max_iters=0"])


@pytest.mark.parametrize("line,words", [
    ("max_iters = True", "max_iters=True ({}): expected a value of type int"),
    ("learning_rate = False", "learning_rate=False ({}): expected a value of type float"),
    ("compile = 1", "compile=1 ({}): expected a value of type bool"),
    ("warmup_iters = 29.9", "warmup_iters=29.9 ({}): expected a value of type int"),   # not 29, silently
])
def test_preset_bools_and_numbers_do_not_stand_in_for_each_other(tmp_path, line, words):
    """In a preset, True is a bool and 1 an int, as Python has them: a bool for a number (or the reverse) is a
    slip, not a setting. (bool is a subclass of int, so an isinstance(value, int) check alone lets True in.)"""
    preset = tmp_path / "p.py"
    preset.write_text(line + "\n")
    with pytest.raises(configurator.ConfigError, match=re.escape(words.format(preset))):
        configurator.parse(train.TrainConfig(), [str(preset)])


def test_each_preset_sets_only_what_it_names(tmp_path):
    """Presets and --key=value apply left to right, each preset on its own: a later preset must not bring
    an earlier one's values back over an override given between them."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("learning_rate = 1e-3\n")
    b.write_text("max_iters = 5\n")
    cfg = configurator.parse(train.TrainConfig(), [str(a), "--learning_rate=1e-4", str(b)])
    assert (cfg.learning_rate, cfg.max_iters) == (1e-4, 5)


def test_command_line_bools_and_ints():
    """On the command line everything is text: 1/0, true/false, yes/no spell a bool; an int key takes digits only."""
    for text, want in (("1", True), ("0", False), ("YES", True), ("no", False)):
        cfg = configurator.parse(train.TrainConfig(), [f"--compile={text}"])
        assert cfg.compile is want, f"--compile={text} gave {cfg.compile!r}"
    cfg = configurator.parse(train.TrainConfig(), ["--max_iters=7"])
    assert type(cfg.max_iters) is int and cfg.max_iters == 7
    for bad in ("True", "false"):
        with pytest.raises(configurator.ConfigError, match=re.escape(f"max_iters={bad!r} (--max_iters={bad}): expected")):
            configurator.parse(train.TrainConfig(), [f"--max_iters={bad}"])


def test_arch_keys_are_every_model_setting_a_checkpoint_fixes():
    """ARCH_KEYS are the GPTConfig fields that shape the weights or what they compute: a run takes them from
    the command line and a resumed run from the checkpoint. A field missing here is silently left at
    GPTConfig's default (and a resume could change it). The other fields are set per run in train.py."""
    from dataclasses import fields
    from model import GPTConfig
    per_run = {"block_size", "vocab_size", "dropout", "attention"}  # context extension; the data's; training; device
    assert set(train.ARCH_KEYS) == {f.name for f in fields(GPTConfig)} - per_run
    assert len(set(train.ARCH_KEYS)) == len(train.ARCH_KEYS)


@pytest.mark.parametrize("argv,words", [
    (["--n_embd=128", "--n_head=3"], "config error: n_embd=128 must be a multiple of n_head=3"),
    (["--n_head=4", "--n_kv_head=3"], "config error: n_head=4 must be a multiple of n_kv_head=3"),
    (["--n_embd=120", "--n_head=8"], "config error: pos=rope turns pairs of channels: head dim n_embd / n_head = 15"),
    (["--device=gpu"], "config error: device='gpu': expected auto, cpu, cuda or cuda:N"),
    (["--dropout=1.5"], "config error: dropout=1.5: must be in [0, 1)"),
    (["--beta2=1.5"], "config error: beta2=1.5: must be in [0, 1)"),
    (["--learning_rate=-1e-3"], "config error: learning_rate=-0.001: must be a finite number >= 0"),
    (["--min_lr=inf"], "config error: min_lr=inf: must be a finite number >= 0"),
    (["--learning_rate=1e-3", "--min_lr=1e-2"], "config error: min_lr=0.01 is above learning_rate=0.001"),
    (["--warmup_iters=10", "--lr_decay_iters=5"], "config error: lr_decay_iters=5 does not end after warmup_iters=10"),
    (["--warmup_iters=10", "--lr_decay_iters=10"], "config error: lr_decay_iters=10 does not end after warmup_iters=10"),
])
def test_model_shape_errors_are_config_errors(argv, words):
    with pytest.raises(SystemExit, match=re.escape(words)):
        train.main(argv)


@pytest.mark.parametrize("value", ["1.0", "-0.1"])
def test_beta1_outside_0_1_is_a_config_error(value):
    """beta1 = 1 freezes Adam's first moment at zero; a negative one flips its sign. load_config, not main: a
    run the check let through would go on to prepare the built-in data before AdamW objected."""
    with pytest.raises(configurator.ConfigError, match=re.escape(f"beta1={float(value)}: must be in [0, 1)")):
        train.load_config([f"--beta1={value}"])



@pytest.mark.parametrize("key", ["grad_clip", "learning_rate", "weight_decay"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_nan_and_inf_are_config_errors(key, value):
    """nan < 0 is False, so a check written as `x < 0` let nan through: grad_clip=nan switched clipping off
    silently, learning_rate=nan failed later as a non-finite loss. learning_rate=inf gave nan weights whose
    first eval saved over the last good checkpoint."""
    with pytest.raises(configurator.ConfigError, match=re.escape(f"{key}={value}: must be a finite number >= 0")):
        train.load_config([f"--{key}={value}"])

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_device_without_a_gpu_says_so():
    import sample
    for main in (train.main, sample.main):
        with pytest.raises(SystemExit, match="device=cuda: PyTorch sees no CUDA GPU here; use --device=cpu"):
            main(["--device=cuda"])


def test_data_errors_stop_with_a_message(data_dir, tmp_path):
    """No traceback for a dataset that is not there or a corrupt shard: a message that names the file."""
    with pytest.raises(SystemExit, match=r"dataset='no_such_dataset': no folder .*no_such_dataset; a name is"):
        train.main(args(data_dir, tmp_path / "a", "--dataset=no_such_dataset"))
    # FineWeb's folders are written by data/fineweb/prepare.py, not by a script inside them: name it, and
    # say that its default of 8 shards is less than config/fineweb.py reads
    more = re.escape(" (8 train shards of 100M tokens; --train_shards=N for more: ")
    for name, command in (
            ("fineweb10B", f"data/fineweb/prepare.py{more}103 for all of FineWeb 10B, as config/fineweb.py reads\\)$"),
            ("finewebedu10B", f"data/fineweb/prepare.py --edu{more}99 for all of FineWeb-Edu 10B\\)$")):
        if not os.path.exists(os.path.join(train.HERE, "data", name)):
            with pytest.raises(SystemExit, match=f"dataset='{name}': no folder .*{name}; run: python .*{command}"):
                train.main(args(data_dir, tmp_path / "a", f"--dataset={name}"))
    broken = tmp_path / "broken"
    shutil.copytree(data_dir, broken)
    shard = sorted(broken.glob("*_train_*.bin"))[0]
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(SystemExit, match=re.escape(f"{shard} is") + ".*truncated or corrupt"):
        train.main(args(str(broken), tmp_path / "b"))


def test_byte_tokens_from_a_tokenizer_fallback_are_pointed_out(data_dir, tmp_path, monkeypatch, capsys):
    """Data prepared while GPT-2's BPE could not load (tiktoken unimportable here) falls back to byte
    tokens with one notice, which a later run would not repeat: meta.json records the fallback, and
    train.py says so and names the command to re-run. Bytes asked for (data_dir) are not flagged."""
    from data.text.prepare import prepare
    fell_back = str(tmp_path / "fell_back")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "tiktoken", None)
        prepare(os.path.join(os.path.dirname(os.__file__), "json"), fell_back)
    meta = json.loads(open(os.path.join(fell_back, "meta.json")).read())
    assert meta["tokenizer"] == "bytes" and meta["fallback_for"] == "gpt2", meta
    for folder, flagged in ((data_dir, False), (fell_back, True)):
        capsys.readouterr()
        train.main(args(folder, tmp_path / f"out{flagged}", "--max_iters=1", "--save_checkpoint=False"))
        hint = [line for line in capsys.readouterr().out.splitlines() if "could not be loaded" in line]
        assert hint == ([f"data: byte-level tokens, since the gpt2 tokenizer could not be loaded when this data was "
                         f"prepared; once it can (README, Troubleshooting), re-run: {meta['prepare']}"] if flagged else [])


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_setting_with_its_value_so_far(flag, capsys):
    """--help prints each TrainConfig field with its type, its value after the arguments before it (here a
    preset and an override) and the comment beside it in the dataclass, then exits 0."""
    with pytest.raises(SystemExit) as e:
        train.load_config([os.path.join(ROOT, "config", "shakespeare.py"), "--n_layer=3", flag, "--n_layer=9"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    fields = [f.name for f in dataclasses.fields(train.TrainConfig)]
    listed = re.findall(r"^  --(\w+)=", out, re.M)
    assert listed == fields, (listed, fields)
    assert re.search(r"^  --n_layer=3 +int$", out, re.M), out
    assert re.search(r"^  --dataset=shakespeare +str +a folder under data/", out, re.M), out
    assert re.search(r"^  --attention=auto +auto\|fp8\|fp8_stale\|sdpa +auto: fp8 where", out, re.M), out


def test_help_without_source_still_lists_the_settings(monkeypatch, capsys):
    """Where Python has the code but not its source (a .pyc-only install, a frozen app), --help lists the
    settings and their values without the comments, rather than stopping in inspect's OSError."""
    def no_source(obj):
        raise OSError("could not get source code")
    monkeypatch.setattr(configurator.inspect, "getsource", no_source)
    with pytest.raises(SystemExit) as e:
        train.load_config(["--n_layer=3", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert re.findall(r"^  --(\w+)=", out, re.M) == [f.name for f in dataclasses.fields(train.TrainConfig)]
    assert re.search(r"^  --n_layer=3 +int$", out, re.M), out


def test_short_help_shows_what_would_run(capsys, monkeypatch):
    """-h and --help list the same values: without a GPU both show config/cpu_tiny.py's (the preset a
    plain run takes); -h once counted as a preset argument, and showed TrainConfig's defaults instead.
    With a GPU, or with a preset given, cpu_tiny.py is not applied."""
    def helps(gpu, *argv):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
        outs = []
        for flag in ("--help", "-h"):
            with pytest.raises(SystemExit):
                train.load_config([*argv, flag])
            outs.append(capsys.readouterr().out)
        assert outs[0] == outs[1]
        return outs[0]
    tiny = "config: no GPU, so config/cpu_tiny.py first"
    out = helps(False)
    assert out.startswith(tiny) and re.search(r"^  --n_layer=4 +int", out, re.M), out[:400]
    for out in (helps(True), helps(False, os.path.join(ROOT, "config", "shakespeare.py"))):
        assert tiny not in out and not re.search(r"^  --n_layer=4 +int", out, re.M), out[:400]
    monkeypatch.setenv("RANK", "1")   # under torchrun the preset applies in every process, the line prints once
    out = helps(False)
    assert tiny not in out and re.search(r"^  --n_layer=4 +int", out, re.M), out[:400]


def test_presets_parse():
    for name in sorted(os.listdir(os.path.join(ROOT, "config"))):
        if name.endswith(".py"):
            configurator.parse(train.TrainConfig(), [os.path.join(ROOT, "config", name)])


# -----------------------------------------------------------------------------------------------------
# training

def test_loss_falls_and_run_leaves_checkpoint_and_log(data_dir, tmp_path, capsys):
    out = str(tmp_path / "run")
    train.main(args(data_dir, out, "--max_iters=40", "--eval_interval=20"))
    printed = capsys.readouterr().out
    assert "attention: sdpa (PyTorch scaled_dot_product_attention) | fp32 | cpu" in printed
    losses, vals = metrics(out)
    assert sorted(losses) == list(range(40)) and sorted(vals) == [0, 20, 40]
    first, last = sum(losses[i] for i in range(3)) / 3, sum(losses[i] for i in range(37, 40)) / 3
    assert first > 5.0 and last < first - 1.5, (first, last)  # ln(320) = 5.8 at the start for byte tokens
    assert vals[40] < vals[0] - 1.5
    rows = log_rows(out)
    assert rows[0]["event"] == "start" and rows[0]["attention"] == "sdpa"
    assert {"iter", "loss", "lr", "grad_norm", "tok_per_s"} <= set(rows[-2])  # mfu: n/a on a CPU
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    assert ckpt["iter_num"] == 40 and ckpt["best_val_loss"] == pytest.approx(vals[40])
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


@pytest.mark.parametrize("argv,words", [
    (["--seed=-1"], "seed=-1: must be in [0, 2^32)"),
    ([f"--seed={2**64}"], "seed=18446744073709551616: must be in [0, 2^32)"),
    (["--out_dir="], "out_dir is empty"),
    (["--dataset="], "dataset is empty"),
    (["--rope_base=0"], "rope_base=0.0: must be a finite number > 1"),
    (["--n_embd=0"], "n_embd=0, n_layer=2: a model needs n_embd >= 1"),
    (["--n_layer=0", "--delta_monitor=True"], "delta_monitor=True with n_layer=0: there is no attention layer"),
])
def test_seed_out_dir_and_dataset_errors(data_dir, tmp_path, argv, words):
    with pytest.raises(SystemExit, match=re.escape(f"config error: {words}")):
        train.main(args(data_dir, tmp_path / "a", *argv))


def test_out_dir_that_cannot_be_a_folder_stops_before_the_work(data_dir, tmp_path, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    monkeypatch.setattr(train, "TrainData", None)       # reached only after the check: would raise TypeError
    for out_dir in (a_file, a_file / "sub"):
        with pytest.raises(SystemExit, match=re.escape(f"out_dir={str(out_dir)!r}: cannot make that folder")):
            train.main(args(data_dir, out_dir))


def test_resume_with_no_checkpoint_says_what_resume_needs(data_dir, tmp_path):
    with pytest.raises(SystemExit, match=re.escape(f"init_from=resume: no checkpoint at {tmp_path / 'new' / 'ckpt.pt'} "
                                                   "(resume continues a run saved in out_dir; leave it out to start a "
                                                   "new run)")):
        train.main(args(data_dir, tmp_path / "new", "--init_from=resume"))


def test_out_dir_that_cannot_be_written_stops_before_the_work(data_dir, tmp_path, monkeypatch):
    """A folder that exists but takes no files (a read-only mount; permissions, which root ignores, so the
    test makes the file system say no) is named at once, not at the log's first line or the first save."""
    def refuse(*a, dir=None, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), dir)
    monkeypatch.setattr(train.tempfile, "TemporaryFile", refuse)
    monkeypatch.setattr(train, "TrainData", None)       # reached only after the check: would raise TypeError
    out = tmp_path / "ro"
    with pytest.raises(SystemExit, match=re.escape(f"out_dir={str(out)!r}: cannot write into that folder "
                                                   "(Read-only file system)")):
        train.main(args(data_dir, out))


def test_a_tilde_in_out_dir_is_the_home_folder(data_dir, tmp_path, monkeypatch, capsys):
    """--out_dir=~/x: no shell expands a ~ after =, so train.py and sample.py do (a folder named ~ in the
    working directory is what a user would then delete with rm -rf ~...)."""
    import sample
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    train.main(args(data_dir, "~/run", "--max_iters=2", "--eval_interval=2"))
    assert os.path.isfile(tmp_path / "home" / "run" / "ckpt.pt") and not os.path.exists(tmp_path / "~")
    capsys.readouterr()
    sample.main(["--out_dir=~/run", "--device=cpu", "--dtype=float32", "--num_samples=1", "--max_new_tokens=4"])
    assert capsys.readouterr().out


def test_unreadable_or_foreign_checkpoints_are_named(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2"))
    ckpt = out / "ckpt.pt"
    good = ckpt.read_bytes()
    for content in (b"garbage", good[:len(good) // 2]):
        ckpt.write_bytes(content)
        with pytest.raises(SystemExit, match=re.escape(f"{ckpt} cannot be read as a checkpoint (truncated or damaged")):
            train.main(args(data_dir, out, "--max_iters=4", "--init_from=resume"))
    torch.save({"model": {}, "iter_num": 2}, ckpt)
    with pytest.raises(SystemExit, match=re.escape(f"{ckpt} has no 'optimizer', 'model_args', 'best_val_loss', 'rng': "
                                                   "it is not a checkpoint train.py wrote")):
        train.main(args(data_dir, out, "--max_iters=4", "--init_from=resume"))


def test_resume_names_the_settings_that_differ(data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--dropout=0.1"))
    capsys.readouterr()
    train.main(args(data_dir, out, "--max_iters=3", "--init_from=resume"))
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("resume: settings that differ"))
    assert line == ("resume: settings that differ from the checkpoint's run: eval_interval=1000 (was 2), "
                    "dropout=0.0 (was 0.1), max_iters=3 (was 2)")
    # the run's folder named relative to here, where the run named it in full (ablation.py does): no change
    monkeypatch.chdir(tmp_path)
    train.main(args(data_dir, "run", "--max_iters=4", "--eval_interval=1000", "--init_from=resume"))
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("resume: settings that differ"))
    assert line == "resume: settings that differ from the checkpoint's run: max_iters=4 (was 3)"


def test_resume_says_when_its_schedule_moves_the_learning_rate(data_dir, tmp_path, capsys):
    """A run that ended at min_lr, resumed with max_iters raised: with lr_decay_iters=0 the cosine follows
    max_iters, so the learning rate went back up the curve (here from 3e-4 to about 1.7e-3) with no word
    but the changed max_iters. The finished run's 'nothing to do' and the resume say how to stay at min_lr."""
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=4", "--eval_interval=4"))
    capsys.readouterr()
    train.main(args(data_dir, out, "--max_iters=4", "--eval_interval=4", "--init_from=resume"))
    assert ("nothing to do (raise max_iters; with lr_decay_iters=0 the cosine then stretches to the new max_iters and "
            "the learning rate rises again: add --lr_decay_iters=4 to go on at min_lr)") in capsys.readouterr().out
    train.main(args(data_dir, out, "--max_iters=8", "--eval_interval=8", "--init_from=resume"))
    lr_now = train.get_lr(4, train.TrainConfig(max_iters=8, learning_rate=3e-3, min_lr=3e-4, warmup_iters=2))
    assert f"resume: learning rate {lr_now:.3g} at iter 4 on this command's schedule, where the checkpoint's run " \
           f"had 0.0003; the cosine follows max_iters where lr_decay_iters=0: --lr_decay_iters=4 keeps the " \
           f"checkpoint's run's" in capsys.readouterr().out
    assert lr_now > 1e-3
    out2 = tmp_path / "kept"
    train.main(args(data_dir, out2, "--max_iters=4", "--eval_interval=4"))
    capsys.readouterr()
    train.main(args(data_dir, out2, "--max_iters=8", "--eval_interval=8", "--lr_decay_iters=4", "--init_from=resume"))
    assert "resume: learning rate" not in capsys.readouterr().out
    assert {r["iter"]: r["lr"] for r in log_rows(out2) if "lr" in r}[4] == pytest.approx(3e-4)


def test_resume_on_a_dataset_prepared_again_evaluates_anew(data_dir, tmp_path, capsys):
    """The same dataset name prepared again (README, Datasets: at full size on the GPU machine after a CPU
    run): its val split is other text, so the checkpoint's best val loss is another measure's. The resume
    said nothing and carried that best over."""
    from data.text.prepare import prepare
    data = tmp_path / os.path.basename(data_dir)     # the shards' names are the folder's
    shutil.copytree(data_dir, data)
    out = tmp_path / "run"
    train.main(args(str(data), out, "--max_iters=2", "--eval_interval=2"))
    text = tmp_path / "other.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(4000)))
    prepare(str(text), str(data), tokenizer="bytes")
    capsys.readouterr()
    train.main(args(str(data), out, "--max_iters=3", "--eval_interval=1000", "--init_from=resume"))
    said = capsys.readouterr().out
    assert f"resume: {data} was prepared again since the checkpoint: source" in said, said
    assert "resume: the dataset's contents changed, so val loss measures something else now: evaluated at iter 2" \
        in said, said
    assert 2 in metrics(out)[1], "no evaluation at the resume's first step"


def test_checkpoint_whose_model_args_lack_a_key_is_named(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    del ckpt["model_args"]["qk_norm"]
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(SystemExit, match=re.escape(f"{out / 'ckpt.pt'}: its model_args has no 'qk_norm': it is not a "
                                                   "checkpoint this train.py wrote")):
        train.main(args(data_dir, out, "--max_iters=4", "--init_from=resume"))


def test_what_a_killed_save_left_is_pointed_out(data_dir, tmp_path, capsys):
    """A save killed midway (OOM killer, kill -9) leaves its temporary file, which its own process could not
    remove: as large as the part written (about 1 GB at the default model), and nothing said so."""
    out = tmp_path / "run"
    out.mkdir()
    left = out / "ckpt.pt.tmp4242"
    left.write_bytes(b"\0" * 2**20)
    with pytest.raises(SystemExit, match=re.escape(f"no checkpoint at {out / 'ckpt.pt'}; {left} is what a killed "
                                                   "save left, incomplete")):
        train.main(args(data_dir, out, "--max_iters=2", "--init_from=resume"))
    capsys.readouterr()
    train.main(args(data_dir, out, "--max_iters=1", "--save_checkpoint=False"))
    assert f"out_dir: {left} (1 MiB) is what a killed save left, incomplete: delete it" in capsys.readouterr().out


def test_tokens_past_the_vocab_are_named_with_their_shard(tmp_path):
    """A shard of another tokenizer in the folder (a re-prepared or renamed dataset): its tokens would
    index past the embedding, an IndexError (a device-side assert on a GPU) instead of a message."""
    d = coded_shards(tmp_path / "d", train=(900,), val=(100,))   # tokens up to 899; val 30000 on, of which 65 are read
    data = train.TrainData(d, block_size=8, seed=1337, vocab_size=500)
    with pytest.raises(SystemExit, match=r"coded_train_000000\.bin holds token \d+, past the dataset's vocab of 500"):
        for i in range(20):
            data.batch(i, 0, 4, torch.device("cpu"))
    x, y = train.TrainData(d, block_size=8, seed=1337, vocab_size=900).batch(0, 0, 4, torch.device("cpu"))
    assert x.shape == (4, 8) and int(torch.cat([x, y]).max()) < 900     # all the shard's tokens fit this vocab
    with pytest.raises(ValueError, match=r"coded_val_000000\.bin holds token 30064, past the dataset's vocab of 30000"):
        train.val_windows(d, 8, 64, vocab_size=30000)


def test_resume_continues_the_loss_curve_exactly(data_dir, tmp_path):
    """8 steps straight, against 4 steps + save + resume + 4 steps. Dropout is on, so the RNG states must be
    restored too; the data windows are a function of the step, so nothing is replayed."""
    common = ("--dropout=0.1", "--lr_decay_iters=8", "--eval_interval=4")
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    train.main(args(data_dir, straight, "--max_iters=8", *common))
    train.main(args(data_dir, split, "--max_iters=4", *common))
    train.main(args(data_dir, split, "--max_iters=8", "--init_from=resume", *common))
    (a, va), (b, vb) = metrics(straight), metrics(split)
    assert sorted(b) == list(range(8))
    for i in range(8):
        assert abs(a[i] - b[i]) <= 1e-6, f"iter {i}: straight {a[i]} vs resumed {b[i]}"
    assert va[8] == pytest.approx(vb[8], abs=1e-6) and sorted(vb) == [0, 4, 8]
    # no second evaluation at iter 4 on resuming (metrics() keys by iter, so count the rows)
    assert [r["iter"] for r in log_rows(split) if "val_loss" in r] == [0, 4, 8]


@pytest.mark.parametrize("accum", [4, 6])
def test_ddp_two_processes_match_one(data_dir, tmp_path, accum):
    """2 gloo processes x accum/2 micro-batches == 1 process x accum micro-batches: the same windows and the
    same averaged gradient, up to the order of float additions. Rank r must take global micro-batches
    r * accum/2 + micro. At accum=4 each process does as many micro-batches as there are processes, so
    rank * world + micro numbers them the same way; accum=6 (3 each) tells the two apart: the wrong one
    repeats micro-batch 2 and leaves out 5."""
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    # 39 val windows: trimmed to a multiple of batch_size * world once, 36 in one process and 32 in two
    a = args(data_dir, one, "--max_iters=3", f"--gradient_accumulation_steps={accum}", "--eval_interval=3",
             "--eval_tokens=1248")
    train.main(a)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py")] + [x.replace(one, two) for x in a]
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the step's tokens are every rank's: tok/s and the data-passes warning are computed from them
    assert "cpu x 2" in r.stdout and f"{accum * 4 * 32:,} tokens per step = 2 x {accum // 2} x 4 x 32" in r.stdout, \
        r.stdout
    (l1, v1), (l2, v2) = metrics(one), metrics(two)
    assert sorted(l2) == [0, 1, 2] and sorted(v2) == [0, 3]
    for i in range(3):
        assert l2[i] == pytest.approx(l1[i], rel=1e-5), (i, l1[i], l2[i])
    for i in (0, 3):
        assert v2[i] == pytest.approx(v1[i], rel=1e-5), (i, v1[i], v2[i])
    # dropout must differ between ranks (the same masks on every rank would be one mask per global batch, not
    # one per sequence), so each rank seeds its own torch RNG; the checkpoint keeps every rank's state
    rngs = torch.load(os.path.join(two, "ckpt.pt"), weights_only=False)["rng"]
    assert len(rngs) == 2 and not torch.equal(rngs[0]["torch"], rngs[1]["torch"]), "both ranks have one RNG state"


def test_every_rank_waits_at_the_builtin_corpus_whatever_it_found(data_dir, monkeypatch):
    """Rank 0 prepares the built-in corpus and then waits at a barrier; a rank that finds meta.json already
    there (its node prepared it earlier, or rank 0 just finished) must enter that barrier too, or rank 0
    waits for ever. Here rank 1 sees a prepared folder: it must still call the barrier, once."""
    barriers = []
    monkeypatch.setattr(train.dist, "barrier", lambda: barriers.append(1))
    monkeypatch.setattr(train, "dataset_dir", lambda name: data_dir)
    cfg = dataclasses.replace(train.TrainConfig(), dataset="builtin", block_size=32, eval_tokens=256)
    train.load_data(cfg, torch.device("cpu"), True, 1, lambda *a, **k: None)
    assert barriers == [1], f"rank 1 entered {len(barriers)} barriers where rank 0 enters 1"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL needs a GPU")
def test_ddp_nccl_on_one_gpu(data_dir, tmp_path):
    """train.py under torchrun on a GPU: NCCL, the DDP wrapper, one process (NCCL takes one GPU per
    process, so this is the most one GPU can check). The process group is bound to the rank's GPU, so
    the barriers do not warn that they guess the device (they did, on an H100, before device_id)."""
    out = str(tmp_path / "ddp")
    a = [x for x in args(data_dir, out, "--max_iters=4", "--eval_interval=2") if x not in ("--device=cpu",)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           os.path.join(ROOT, "train.py"), "--device=cuda"] + a
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| cuda " in r.stdout and "256 tokens per step = 1 x 2 x 4 x 32" in r.stdout, r.stdout
    assert "using the device under current context" not in r.stderr, r.stderr[-3000:]
    losses, vals = metrics(out)
    assert sorted(losses) == [0, 1, 2, 3] and sorted(vals) == [0, 2, 4]


def test_training_windows_are_a_function_of_step_and_micro_batch(data_dir):
    """TrainData.batch draws the same windows for the same (seed, step, micro-batch), which exact resume
    and DDP rely on, and other windows for any other step or micro-batch: a run whose windows ignore the
    step would train on one batch over and over, and its loss would still fall."""
    data = train.TrainData(data_dir, block_size=32, seed=1337)
    cpu = torch.device("cpu")
    x, y = data.batch(5, 1, 4, cpu)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1]), "y must be x shifted by one token"
    assert torch.equal(x, data.batch(5, 1, 4, cpu)[0]), "the same step and micro-batch must give the same windows"
    others = {"step": data.batch(6, 1, 4, cpu)[0], "micro-batch": data.batch(5, 2, 4, cpu)[0],
              "seed": train.TrainData(data_dir, block_size=32, seed=1338).batch(5, 1, 4, cpu)[0]}
    for what, other in others.items():
        assert not torch.equal(x, other), f"another {what} gave the same windows"


def test_training_windows_land_in_shards_in_proportion_to_their_length(tmp_path):
    """A shard 9 times longer than another holds 90% of the windows. Drawing shards uniformly would sample the
    short shard's tokens 9 times as often as the long one's (50% of the windows). 3200 windows: the share's
    standard deviation is 0.005, the tolerance 0.03; the seed is fixed, so the count is too."""
    data = train.TrainData(coded_shards(tmp_path / "d", train=(900, 100)), block_size=8, seed=1337)
    firsts = torch.cat([data.batch(it, 0, 16, torch.device("cpu"))[0][:, 0] for it in range(200)])
    share = (firsts // 1000 == 0).double().mean().item()
    assert share == pytest.approx(0.9, abs=0.03), f"{share:.3f} of the windows come from the shard of 90% of the tokens"


def test_training_windows_reach_every_start_and_stay_inside_the_shard(tmp_path):
    """Shards of length T, T+1, T+2 and T+5 (T = 8): a window needs T+1 tokens, so the first shard holds none
    (and must be left out, not drawn from), the others hold 1, 2 and 5 windows. Every window must be T+1
    consecutive tokens of one shard, and every start, the last ones included, must come up."""
    T, lengths = 8, (8, 9, 10, 13)
    data = train.TrainData(coded_shards(tmp_path / "d", train=lengths), block_size=T, seed=1337)
    seen = set()
    for it in range(100):
        x, y = data.batch(it, 0, 16, torch.device("cpu"))
        for w in torch.cat([x, y[:, -1:]], dim=1).tolist():
            shard, start = divmod(w[0], 1000)
            assert w == [1000 * shard + start + i for i in range(T + 1)], f"not one shard's consecutive tokens: {w}"
            assert start + T + 1 <= lengths[shard], f"window {start}..{start + T} runs past shard {shard} of {lengths[shard]}"
            seen.add((shard, start))
    assert seen == {(1, 0), (2, 0), (2, 1)} | {(3, s) for s in range(5)}, sorted(seen)


def test_val_windows_are_the_start_of_the_val_split(data_dir, tmp_path):
    """The validation windows are consecutive (T+1)-token windows from the start of the val split, overlapping
    by one token (each window's last token is the next one's first input) and running on into the next val shard;
    the train split must not leak in."""
    from data.common import read_shard, shard_paths
    d = coded_shards(tmp_path / "d", train=(500,), val=(50, 100))
    tokens = np.concatenate([30000 + np.arange(50), 31000 + np.arange(100)])  # the val split, in order
    windows = train.val_windows(d, 8, 64)
    want = torch.from_numpy(tokens[np.arange(8)[:, None] * 8 + np.arange(9)].astype(np.int64))
    assert torch.equal(windows, want), windows
    assert train.val_windows(d, 8, 10_000).shape == (149 // 8, 9), "a val split shorter than eval_tokens: all of it"
    val = read_shard(shard_paths(data_dir, "val")[0])
    first = train.val_windows(data_dir, 32, 1024)[0]
    assert first.tolist() == val[:33].tolist(), "the first val window must be the val split's first 33 tokens"


def test_learning_rate_schedule():
    """Linear warmup to learning_rate, cosine down to min_lr at lr_decay_iters (max_iters if 0), then flat."""
    cfg = train.TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=110, lr_decay_iters=0)
    expect = {0: 1e-3 / 11, 9: 1e-3 * 10 / 11, 10: 1e-3, 60: (1e-3 + 1e-4) / 2, 110: 1e-4, 500: 1e-4}
    for it, lr in expect.items():
        assert train.get_lr(it, cfg) == pytest.approx(lr, rel=1e-12), f"lr at iter {it}: {train.get_lr(it, cfg)}, not {lr}"
    after = [train.get_lr(it, cfg) for it in range(10, 111)]
    assert all(a >= b for a, b in zip(after, after[1:])), "the cosine part must not rise"
    cfg.lr_decay_iters = 60
    assert train.get_lr(35, cfg) == pytest.approx((1e-3 + 1e-4) / 2) and train.get_lr(60, cfg) == pytest.approx(1e-4)


def test_evaluate_is_the_mean_loss_per_token():
    """evaluate() averages over every token of every val window, whatever the batch size (5 windows in
    batches of 1, 2, 3, 5 and 7: the last batch is filled up with ignored windows, so the model sees one
    batch shape), in eval mode (dropout 0.5 here: in training mode the loss would differ) and without
    autograd, and leaves the model in training mode. The val set was once trimmed to a multiple of
    batch_size * world size, so runs that differed in either evaluated other windows."""
    from contextlib import nullcontext
    from model import GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, dropout=0.5))
    windows = torch.randint(0, 64, (5, 17))
    model.eval()
    with torch.no_grad():
        logits, _ = model(windows[:, :-1], windows[:, 1:])
        want = torch.nn.functional.cross_entropy(logits.reshape(-1, 64).double(), windows[:, 1:].reshape(-1)).item()
    model.train()
    shapes, grad_modes = [], []
    model.register_forward_pre_hook(lambda module, inputs: shapes.append(tuple(inputs[0].shape)))
    model.register_forward_pre_hook(lambda module, inputs: grad_modes.append(torch.is_grad_enabled()))
    for batch_size in (1, 2, 3, 5, 7):
        shapes.clear()
        got = train.evaluate(model, windows, batch_size, 0, 1, torch.device("cpu"), nullcontext())["val_loss"]
        assert model.training, "evaluate() must hand the model back in training mode"
        assert got == pytest.approx(want, rel=1e-5), f"batch_size={batch_size}: val loss {got}, the mean over all tokens is {want}"
        assert set(shapes) == {(batch_size, 16)}, f"batch_size={batch_size}: the model saw batches of {shapes}"
    # without autograd: a graph kept per val batch is activation memory the training step then lacks
    assert not any(grad_modes), "evaluate() ran the model with gradients enabled"


def test_grad_norm_is_that_of_the_mean_loss_over_the_step(data_dir, tmp_path, monkeypatch):
    """The step's gradient is that of the mean loss over its micro-batches: the logged grad_norm (clipping
    off) equals the norm of that gradient, computed here apart from the trainer from the same initial
    weights and windows. Micro-batch losses not divided by their number would give a gradient 3 times
    too large (and clip at a third of grad_clip); the logged loss alone would not show it."""
    from model import GPTConfig
    built = []

    def gpt(config):    # the trainer's model, and a copy of its weights before the first step
        model = GPT(config)
        built.append((config, {k: v.clone() for k, v in model.state_dict().items()}))
        return model
    monkeypatch.setattr(train, "GPT", gpt)
    out = tmp_path / "g"
    train.main(args(data_dir, out, "--max_iters=1", "--grad_clip=0", "--save_checkpoint=False",
                    "--gradient_accumulation_steps=3"))
    row = next(r for r in log_rows(out) if "grad_norm" in r)
    (config, weights), = built
    model = GPT(config)
    model.load_state_dict(weights)
    data = train.TrainData(data_dir, config.block_size, seed=1337, vocab_size=config.vocab_size)
    loss = sum(model(*data.batch(0, micro, 4, torch.device("cpu")))[1] for micro in range(3)) / 3
    loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
    assert row["loss"] == pytest.approx(loss.item(), rel=1e-5), (row["loss"], loss.item())
    assert row["grad_norm"] == pytest.approx(norm, rel=1e-4), f"logged grad norm {row['grad_norm']}, the mean loss's {norm}"

    # clipping on: the step's gradient is scaled to grad_clip exactly (not accum x grad_clip), and the log
    # keeps the norm before clipping (a flat line at grad_clip would hide the curve)
    clipped = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **k):
        params = list(params)
        before = real_clip(params, max_norm, *a, **k)
        clipped.append((max_norm, torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item()))
        return before
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    out = tmp_path / "c"
    train.main(args(data_dir, out, "--max_iters=1", f"--grad_clip={norm / 4}", "--save_checkpoint=False",
                    "--gradient_accumulation_steps=3"))
    row = next(r for r in log_rows(out) if "grad_norm" in r)
    assert row["grad_norm"] == pytest.approx(norm, rel=1e-4), "the log must keep the norm before clipping"
    assert len(clipped) == 1 and clipped[0] == (norm / 4, pytest.approx(norm / 4, rel=1e-4)), clipped


def test_tok_per_s_final_step_and_autocast_dtype(data_dir, tmp_path, monkeypatch):
    """With a clock where every step takes 0.25 s: tok/s is the step's tokens (2 x 4 x 32) over 0.25 s in
    every logged row, whatever log_interval steps it averages; the last step is logged though it is off
    the interval; and under --dtype=bfloat16 the matmuls run in bf16 (autocast), not fp16."""
    ticks = iter(range(10**6))

    def clock():    # the two reads of a step: its start, then 0.25 s later
        n = next(ticks)
        return 100 * (n // 2) + (n % 2) / 4
    monkeypatch.setattr(train.time, "time", clock)     # time.time itself: tqdm and the rest hold their own binding
    dtypes = []

    def gpt(config):
        model = GPT(config)
        model.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
        return model
    monkeypatch.setattr(train, "GPT", gpt)
    out = tmp_path / "t"
    train.main(args(data_dir, out, "--max_iters=8", "--log_interval=3", "--dtype=bfloat16", "--save_checkpoint=False"))
    rows = [r for r in log_rows(out) if "loss" in r]
    assert [r["iter"] for r in rows] == [0, 3, 6, 7], "the last step must be logged too"
    assert "tok_per_s" not in rows[0]     # the first step compiles and warms up: not timed
    assert [r["tok_per_s"] for r in rows[1:]] == [pytest.approx(2 * 4 * 32 / 0.25)] * 3, rows
    assert dtypes and set(dtypes) == {torch.bfloat16}, set(dtypes)


def test_resume_of_a_checkpoint_missing_a_weight_is_refused_in_one_line(data_dir, tmp_path):
    out = tmp_path / "r"
    train.main(args(data_dir, out, "--max_iters=1"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    del ckpt["model"]["transformer.h.0.ln_1.weight"]
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(SystemExit) as e:
        train.main(args(data_dir, out, "--max_iters=2", "--init_from=resume"))
    assert str(e.value).startswith(f"{out / 'ckpt.pt'}: its model does not load here: Error(s) in loading")
    assert "transformer.h.0.ln_1.weight" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_resume_restores_the_cuda_rng_on_a_gpu(monkeypatch):
    """Dropout on a GPU draws from the CUDA generator: an exact resume there must restore it (the CPU tests
    cannot see it, so the call is checked)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: calls.append((state, device)))
    cuda_state = torch.ByteTensor([1, 2, 3])
    # saved: the state of the run's own GPU (a checkpoint without it could restore nothing)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: cuda_state if device == torch.device("cuda", 1)
                        else pytest.fail(f"the CUDA RNG state of {device} saved, not cuda:1's"))
    state = train.rng_state(torch.device("cuda", 1))
    assert state["cuda"] is cuda_state and "cuda" not in train.rng_state(torch.device("cpu"))
    train.set_rng_state(state, torch.device("cuda", 1))
    assert calls == [(cuda_state, torch.device("cuda", 1))], calls
    calls.clear()
    train.set_rng_state(state, torch.device("cpu"))
    assert calls == []


def test_every_model_setting_reaches_the_model(data_dir, tmp_path, monkeypatch):
    """Each model setting given on the command line is the one the GPT is built with: none is dropped on
    the way and left at GPTConfig's default (test_arch_keys_are_every_model_setting_a_checkpoint_fixes
    checks the list of them, this the values)."""
    from dataclasses import asdict
    built = []
    monkeypatch.setattr(train, "GPT", lambda config: built.append(config) or GPT(config))
    given = dict(n_layer=1, n_head=4, n_kv_head=2, n_embd=32, bias=True, qk_norm=True, pos="rope", rope_base=777.0,
                 dropout=0.25, block_size=16)
    a = args(data_dir, tmp_path / "s", "--max_iters=1", "--save_checkpoint=False")
    train.main(a + [f"--{k}={v}" for k, v in given.items()])
    got = asdict(built[0])
    assert {k: got[k] for k in given} == given
    built.clear()
    train.main(a + ["--pos=learned", "--n_kv_head=1"])
    assert (built[0].pos, built[0].n_kv_head) == ("learned", 1)


def test_grad_clip_takes_effect(data_dir, tmp_path):
    """grad_clip bounds the gradient the optimizer sees: clipped to 1e-6, three steps end elsewhere than
    unclipped ones (AdamW undoes a constant rescale of the gradient, but not one below its eps)."""
    losses = {}
    for clip in ("0", "1e-6"):
        out = tmp_path / f"clip{clip}"
        train.main(args(data_dir, out, "--max_iters=3", f"--grad_clip={clip}", "--save_checkpoint=False"))
        losses[clip] = metrics(out)[0]
    assert losses["0"][0] == losses["1e-6"][0], "the first loss comes before any step"
    assert losses["0"][2] != losses["1e-6"][2], f"grad_clip changed nothing: {losses}"


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "nan")
    calls = {"n": 0}
    forward = GPT.forward

    def poisoned(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] > 2 * 3:  # 2 micro-batches per step: iter 3 is the first bad one
                loss = loss * float("nan")
        return logits, loss
    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(SystemExit) as e:
        train.main(args(data_dir, out, "--max_iters=10", "--eval_interval=2"))
    msg = str(e.value)
    assert "non-finite loss at iter 3" in msg and os.path.join(out, "ckpt.pt") in msg, msg
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    assert ckpt["iter_num"] == 2 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_nonfinite_val_loss_stops_before_saving(data_dir, tmp_path, monkeypatch):
    """Weights whose training loss was still finite can give a nan val loss (a blow-up in the step just
    before an eval): the eval must not save them over the last good checkpoint."""
    out = str(tmp_path / "valnan")
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2"))
    good = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    forward = GPT.forward

    def poisoned(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        return logits, loss if self.training else loss * float("nan")
    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(SystemExit) as e:
        train.main(args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--init_from=resume"))
    msg = str(e.value)
    assert "non-finite val loss at iter 4 (nan, not saved" in msg and os.path.join(out, "ckpt.pt") in msg, msg
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    assert ckpt["iter_num"] == 2 and all(torch.equal(ckpt["model"][k], v) for k, v in good["model"].items())


def test_new_run_in_a_used_out_dir_keeps_the_old_log_and_names_only_its_own_checkpoint(data_dir, tmp_path,
                                                                                      monkeypatch):
    out = tmp_path / "again"
    train.main(args(data_dir, out, "--max_iters=2"))          # an earlier run: its log, its ckpt.pt
    forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, targets=None: (lambda lo: (
        lo[0], lo[1] * float("nan") if self.training else lo[1]))(forward(self, idx, targets)))
    with pytest.raises(SystemExit, match="non-finite loss at iter 0 .*; this run saved no checkpoint"):
        train.main(args(data_dir, out, "--max_iters=4"))
    kept = list(out.glob("metrics.*.jsonl"))
    assert len(kept) == 1 and '"iter": 2' in kept[0].read_text(), "the earlier run's log must be kept"
    # The checkpoint is still the earlier run's, and so is the log a resume continues: its own, moved back,
    # not the log of the run that saved nothing (which once took the resumed run's rows).
    monkeypatch.undo()
    train.main(args(data_dir, out, "--max_iters=3", "--init_from=resume"))
    run_id = torch.load(out / "ckpt.pt", weights_only=False)["run_id"]
    rows = log_rows(out)
    assert [r["run"] for r in rows if r.get("event") == "start"] == [run_id, run_id], rows
    assert sorted(r["iter"] for r in rows if "loss" in r) == [0, 1, 2], rows
    kept = list(out.glob("metrics.*.jsonl"))
    assert len(kept) == 1 and train.log_run_id(kept[0]) not in (None, run_id), "the failed run's log, kept aside"


@pytest.mark.parametrize("sig, status, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_sigterm_stops_the_run_like_ctrl_c(data_dir, tmp_path, sig, status, name):
    """SIGTERM (torchrun, SLURM, docker stop) once killed the trainer on the spot; a checkpoint being written
    then left its temporary file behind for good. Now it exits with 143 through the finally blocks: whenever it
    lands, no temporary file stays and ckpt.pt is whole. (A save every step makes a save a likely place.)
    Either signal ends with one line that says where the run stands, not a traceback."""
    out = tmp_path / "term"
    cmd = [sys.executable, "-c", "import sys, configurator, train; configurator.run_script(lambda: train.main(sys.argv[1:]))",
           *args(data_dir, out, "--max_iters=100000", "--eval_interval=1", "--eval_tokens=32")]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # a save line worded otherwise would keep the loop below reading a run of 100,000 steps: stop it, and fail
    watchdog = threading.Timer(300, p.kill)
    watchdog.start()
    try:
        printed = []
        for line in p.stdout:
            printed.append(line)
            if "saved" in line and "iter 3 " in line:
                break
        p.send_signal(sig)
        printed.append(p.communicate(timeout=120)[0])
    finally:
        watchdog.cancel()
        p.kill()
    assert p.returncode == status, "".join(printed)[-3000:]
    assert f"stopped by {name}; {out / 'ckpt.pt'} holds the last checkpoint saved there" in printed[-1], printed[-1]
    assert "Traceback" not in printed[-1], printed[-1]
    assert not [f for f in os.listdir(out) if ".tmp" in f], os.listdir(out)
    assert torch.load(out / "ckpt.pt", weights_only=False)["iter_num"] >= 3


def test_a_run_longer_than_its_data_says_so(tmp_path, capsys):
    """FineWeb prepared with its default 8 shards holds 800M tokens, and config/fineweb.py reads 10B: the
    run repeated the data 12.5 times without a word. 10 steps of 256 tokens over 1,801 train tokens: 1.4x."""
    from data.text.prepare import prepare
    text = tmp_path / "one.txt"
    text.write_text("abcdefghij" * 200)
    prepare(str(text), str(tmp_path / "small"), tokenizer="bytes")
    train.main(args(str(tmp_path / "small"), tmp_path / "o", "--max_iters=10", "--eval_tokens=64"))
    assert "data: 10 steps read 1.4x the train split's tokens" in capsys.readouterr().out
    train.main(args(str(tmp_path / "small"), tmp_path / "o2", "--max_iters=7", "--eval_tokens=64"))
    assert "train split's tokens" not in capsys.readouterr().out, "1,792 tokens of 1,801: less than one pass"


def test_a_new_run_says_what_becomes_of_an_earlier_checkpoint(data_dir, tmp_path, capsys):
    """A new run in a folder with a checkpoint replaces it at its first save, and says so; one that saves
    none (save_checkpoint=False) keeps it, and must not say it replaces it."""
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2"))
    ckpt = (out / "ckpt.pt").read_bytes()
    capsys.readouterr()
    train.main(args(data_dir, out, "--max_iters=1", "--save_checkpoint=False"))
    said = capsys.readouterr().out
    assert "is an earlier run's; this run saves none (save_checkpoint=False), so it stays" in said, said
    assert (out / "ckpt.pt").read_bytes() == ckpt
    train.main(args(data_dir, out, "--max_iters=1"))
    assert "is an earlier run's; this run replaces it at its first save" in capsys.readouterr().out


def test_set_aside_never_overwrites(tmp_path):
    """Logs moved aside are named by their last-modified second; two in the same second both stay."""
    path = tmp_path / "metrics.jsonl"
    kept = []
    for text in ("first", "second", "third"):
        path.write_text(text)
        os.utime(path, (1_700_000_000, 1_700_000_000))
        kept.append(train.set_aside(str(path)))
    assert [open(k).read() for k in kept] == ["first", "second", "third"] and not path.exists(), kept


def test_resume_takes_the_checkpoints_head_dim_and_this_runs_optimizer_settings(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "hd")
    train.main(args(data_dir, out, "--max_iters=2", "--n_embd=96", "--n_head=1"))   # head dim 96
    # the command line says head dim 64; the checkpoint's, 96, decides the path (fp8 takes 64 and 128): a message,
    # not an assertion in the model. (Why fp8 cannot run depends on the machine: on a GPU machine the kernels are
    # not built for the interpreter, so device=cpu is refused before the head dim is looked at.)
    head_dims, resolve = [], train.resolve_attention
    monkeypatch.setattr(train, "resolve_attention", lambda a, d, hd: head_dims.append(hd) or resolve(a, d, hd))
    with pytest.raises(SystemExit, match="attention=fp8 cannot run here: "):
        train.main(args(data_dir, out, "--max_iters=3", "--init_from=resume", "--attention=fp8", "--n_embd=128"))
    assert head_dims == [96], head_dims
    seen, step = [], torch.optim.AdamW.step

    def recording_step(self, *a, **kw):
        seen.append([(g["weight_decay"], g["betas"]) for g in self.param_groups])
        return step(self, *a, **kw)
    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    train.main(args(data_dir, out, "--max_iters=3", "--init_from=resume", "--weight_decay=0.5", "--beta2=0.99"))
    assert seen and seen[0] == [(0.5, (0.9, 0.99)), (0.0, (0.9, 0.99))], seen


def test_resume_takes_the_checkpoints_rope_base(data_dir, tmp_path, monkeypatch, capsys):
    """rope_base sets the rotation frequencies the weights were trained with. It is not in the state dict (the
    cos/sin tables are rebuilt from it), so a run must record it and a resumed run build the model with the
    checkpoint's, whatever the command line says."""
    out = str(tmp_path / "rb")
    train.main(args(data_dir, out, "--max_iters=2", "--rope_base=500"))
    assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)["model_args"]["rope_base"] == 500
    built = []
    monkeypatch.setattr(train, "GPT", lambda config: built.append(config) or GPT(config))
    capsys.readouterr()
    train.main(args(data_dir, out, "--max_iters=3", "--init_from=resume", "--rope_base=20000"))
    assert "resume: architecture from the checkpoint: rope_base=500.0 (this command's rope_base=20000.0 ignored)" \
        in capsys.readouterr().out
    assert [c.rope_base for c in built] == [500], [c.rope_base for c in built]
    # and the log and the next checkpoint record the architecture that ran, not the command line's
    start = [r for r in log_rows(out) if r.get("event") == "start"][-1]
    assert start["config"]["rope_base"] == 500, start["config"]
    assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)["config"]["rope_base"] == 500


def test_every_param_group_gets_the_scheduled_lr(data_dir, tmp_path, monkeypatch):
    """The optimizer has two groups (with and without weight decay); the schedule must set both, at every
    step. (Warmup from 3e-3 / 3: a group left alone keeps the 3e-3 it was made with.)"""
    seen, step = [], torch.optim.AdamW.step

    def recording_step(self, *a, **kw):
        seen.append([g["lr"] for g in self.param_groups])
        return step(self, *a, **kw)
    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    argv = args(data_dir, tmp_path / "lr", "--max_iters=5", "--lr_decay_iters=4", "--save_checkpoint=False")
    train.main(argv)
    cfg = configurator.parse(train.TrainConfig(), argv)
    want = [[train.get_lr(it, cfg)] * 2 for it in range(5)]
    assert seen == want, f"param group lrs per step {seen}, the schedule says {want}"


def test_resume_keeps_the_best_val_loss_from_before(data_dir, tmp_path, capsys):
    """best_val_loss is the best over the whole run, resumes included: after a resume whose evals are worse,
    the checkpoint must still carry the earlier best, not the best since the resume. The saved best is set
    to 0.25 (lower than any val loss 4 steps reach) to stand for a better earlier eval."""
    out = tmp_path / "best"
    path = out / "ckpt.pt"
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2"))
    ckpt = torch.load(path, weights_only=False)
    ckpt["best_val_loss"] = 0.25
    torch.save(ckpt, path)
    capsys.readouterr()
    train.main(args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--init_from=resume"))
    val4, best = metrics(out)[1][4], torch.load(path, weights_only=False)["best_val_loss"]
    assert val4 > 0.25 and best == 0.25, f"val loss {val4} at iter 4: the checkpoint's best is {best}, not 0.25"
    assert f"iter 4 | val loss {val4:.4f} (best 0.2500)" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["oserror", "torch"])
def test_a_failed_checkpoint_save_keeps_the_previous_checkpoint(data_dir, tmp_path, monkeypatch, how):
    """A save that dies halfway (disk full, a kill) must leave the previous checkpoint whole: the file is written
    beside ckpt.pt and renamed over it only once complete. Here torch.save writes half a file and fails, as an
    OSError or, as torch reports a failed write, a RuntimeError ("unexpected pos ...") raised while handling
    it; either way the run ends with one line that names the file and the cause."""
    out = tmp_path / "torn"
    path = out / "ckpt.pt"
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2"))
    before = path.read_bytes()

    def torn_save(obj, f, *a, **kw):
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as fh:
                fh.write(before[:len(before) // 2])
        else:
            f.write(before[:len(before) // 2])
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            if how == "oserror":
                raise
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 21568 vs 21462")
    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(SystemExit, match=re.escape(f"cannot save {path}: No space left on device; the checkpoint "
                                                   "saved there before is kept")):
        train.main(args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--init_from=resume"))
    monkeypatch.undo()
    assert path.read_bytes() == before, "the failed save changed the previous checkpoint"
    assert torch.load(path, weights_only=False)["iter_num"] == 2
    assert sorted(os.listdir(out)) == ["ckpt.pt", "metrics.jsonl"], "the half-written file must be cleaned up"


def test_eval_tokens_below_block_size_takes_one_window(data_dir):
    assert train.val_windows(data_dir, 32, 16).shape == (1, 33)


def test_context_extension_resume(data_dir, tmp_path, capsys):
    """A resume with a longer block evaluates at once, on windows of the new length, and starts a new best
    val loss: the checkpoint's best was measured on shorter windows. The saved best is set to 0.25 (lower
    than any val loss these steps reach), so carrying it over would show."""
    rope, learned = str(tmp_path / "rope"), str(tmp_path / "learned")
    train.main(args(data_dir, rope, "--max_iters=2"))
    ckpt = torch.load(os.path.join(rope, "ckpt.pt"), weights_only=False)
    ckpt["best_val_loss"] = 0.25
    torch.save(ckpt, os.path.join(rope, "ckpt.pt"))
    val2_short = metrics(rope)[1][2]
    capsys.readouterr()
    train.main(args(data_dir, rope, "--max_iters=4", "--init_from=resume", "--block_size=64", "--learning_rate=1e-3"))
    out = capsys.readouterr().out
    assert "resume: block_size changed, so val loss measures something else now: evaluated at iter 2" in out
    ckpt = torch.load(os.path.join(rope, "ckpt.pt"), weights_only=False)
    assert ckpt["model_args"]["block_size"] == 64
    evals = [(r["iter"], r["val_loss"]) for r in log_rows(rope) if "val_loss" in r]
    assert [i for i, _ in evals] == [0, 2, 2, 4] and evals[1][1] == val2_short, \
        f"evals {evals}: expected iters 0 and 2 before the resume, 2 again (the new block size) and 4 after it"
    assert evals[2][1] != val2_short, "the eval at the resumed step must use windows of the new block size"
    assert ckpt["best_val_loss"] == min(v for _, v in evals[2:]), \
        f"best {ckpt['best_val_loss']}: not the best since the resume (the saved 0.25 carried over?)"
    train.main(args(data_dir, learned, "--max_iters=2", "--pos=learned"))
    for block_size in (64, 16):  # a larger table has untrained rows, a smaller one would drop trained rows
        with pytest.raises(SystemExit, match=f"block_size={block_size}: the checkpoint's model has pos=learned, whose "
                           "position table is saved with block_size=32 rows"):
            train.main(args(data_dir, learned, "--max_iters=4", "--init_from=resume", f"--block_size={block_size}"))


def test_resume_that_evaluates_at_once_saves_nothing_before_its_first_step(data_dir, tmp_path, monkeypatch):
    """A resume whose block size (or dataset) differs evaluates before training, as the new measure's
    baseline. It saved there too: the same weights under this command's settings, and the checkpoint's best
    val loss replaced, so a resume started by mistake (a preset left out) and stopped at once had already
    rewritten the checkpoint."""
    out = tmp_path / "run"
    train.main(args(data_dir, out, "--max_iters=2", "--eval_interval=2"))
    before = (out / "ckpt.pt").read_bytes()

    def stopped(*a, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(train.TrainData, "batch", stopped)
    with pytest.raises(KeyboardInterrupt):
        train.main(args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--init_from=resume", "--block_size=64"))
    assert [r["iter"] for r in log_rows(out) if "val_loss" in r] == [0, 2, 2], "no evaluation at the resume"
    assert (out / "ckpt.pt").read_bytes() == before, "the resume rewrote the checkpoint before its first step"


def test_sample_from_checkpoint(data_dir, tmp_path, capsys):
    import sample
    out = str(tmp_path / "s")
    train.main(args(data_dir, out, "--max_iters=2"))
    capsys.readouterr()
    sample.main([f"--out_dir={out}", "--device=cpu", "--num_samples=2", "--max_new_tokens=20", "--start=ROMEO:"])
    text = capsys.readouterr().out
    assert text.count("---------------") == 2 and text.startswith("ROMEO:")
    with pytest.raises(SystemExit, match="no checkpoint at"):
        sample.main([f"--out_dir={tmp_path / 'none'}"])
    with pytest.raises(SystemExit, match="--start=FILE:nope.txt: no file nope.txt"):
        sample.main([f"--out_dir={out}", "--device=cpu", "--start=FILE:nope.txt"])
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf\xe9\n")
    with pytest.raises(SystemExit, match="the file is not UTF-8 text"):
        sample.main([f"--out_dir={out}", "--device=cpu", f"--start=FILE:{latin1}"])
    for bad in ("--temperature=-1", "--top_k=-5"):
        with pytest.raises(SystemExit, match="both must be >= 0"):
            sample.main([f"--out_dir={out}", "--device=cpu", bad])


def test_sample_compile_compiles_what_generate_calls(data_dir, tmp_path, capsys, monkeypatch):
    """--compile=True must compile the forward that generate() runs (compiling the module and calling its
    generate would run the uncompiled model). aot_eager: the same graph capture, no C++ compiler needed."""
    import sample
    out = str(tmp_path / "s")
    train.main(args(data_dir, out, "--max_iters=1"))
    compiled = []
    real_compile = torch.compile

    def compile_and_count(fn, **kw):
        def backend(gm, inputs):
            compiled.append(gm)
            return gm.forward
        return real_compile(fn, **{**kw, "backend": backend})
    monkeypatch.setattr(torch, "compile", compile_and_count)
    torch._dynamo.reset()
    sample.main([f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=3", "--compile=True"])
    assert compiled, "sample.py --compile=True compiled nothing that generate() ran"


def test_bench_train_runs(capsys):
    import bench_train
    bench_train.main(["--device=cpu", "--compile=False", "--n_layer=1", "--n_embd=128", "--n_head=2",
                      "--vocab_size=256", "--block_sizes=32,64", "--attentions=sdpa", "--tokens_per_step=128",
                      "--warmup=1", "--steps=1"])
    table = capsys.readouterr().out.split("|---|---|---|---|---|---|\n")[1].splitlines()
    assert [row.split("|")[1:3] for row in table] == [["    32 ", " sdpa       "], ["    64 ", " sdpa       "]]


def test_bench_train_without_a_gpu_says_so(monkeypatch):
    """With device=auto and no GPU, bench_train.py stops at once and says how to run on the CPU, instead of
    spending minutes per step on the default 124M model with nothing printed."""
    import bench_train
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA GPU here.*--device=cpu"):
        bench_train.main([])


@pytest.mark.parametrize("source,words", [
    (b"n_layer = 2\nn_layer = foo\n", "line 2: NameError: name 'foo' is not defined"),
    (b"n_layer = 6 // 0\n", "line 1: ZeroDivisionError"),
    (b'out_dir = "caf\xe9"\n', "is not UTF-8 text (byte 14)"),
])
def test_preset_that_fails_to_run_is_a_config_error_naming_file_and_line(tmp_path, source, words):
    """A preset is Python: a name error in it, or bytes that are not UTF-8, gave a raw traceback where a
    syntax error already gave 'config error: config file F, line N'."""
    preset = tmp_path / "p.py"
    preset.write_bytes(source)
    with pytest.raises(configurator.ConfigError, match=re.escape(f"config file {preset}") + ".*" + re.escape(words)):
        configurator.parse(train.TrainConfig(), [str(preset)])


def test_preset_may_import_and_define_helpers(tmp_path):
    """What a preset imports or defines to compute its settings is no setting: `from math import sqrt`
    was reported as the unknown config key 'sqrt'."""
    preset = tmp_path / "p.py"
    preset.write_text("import math\nfrom math import sqrt\nfrom collections import OrderedDict\n"
                      "def heads(width):\n    return width // 64\nn_layer = int(sqrt(16))\nn_head = heads(256)\n")
    cfg = configurator.parse(train.TrainConfig(), [str(preset)])
    assert (cfg.n_layer, cfg.n_head) == (4, 4)
    # a helper value is a setting unless its name starts with _: the error says so
    preset.write_text("_layers = 4\nn_layer = _layers\nwidth = 256\nn_embd = width\n")
    with pytest.raises(configurator.ConfigError, match=re.escape(f"unknown config key 'width' ({preset})") +
                       ".*a preset's own helper values need names that start with _"):
        configurator.parse(train.TrainConfig(), [str(preset)])


def test_checkpoint_loads_under_either_numpy_major_version(tmp_path):
    """numpy 1.x pickles its array rebuilding as numpy.core.multiarray._reconstruct, numpy 2.x as
    numpy._core.multiarray._reconstruct: a checkpoint's numpy RNG state written under either loads under the
    other (the allowlist named only the installed numpy's, and refused the file as one that could run code)."""
    state = np.random.RandomState(7).get_state()
    path = tmp_path / "ckpt.pt"
    torch.save({k: {"numpy": state} if k == "rng" else {} for k in train.RESUME_KEYS}, path)
    with zipfile.ZipFile(path) as z:
        members = {i: z.read(i) for i in z.infolist()}
    (pkl,) = [i for i in members if i.filename.endswith("/data.pkl")]
    mine = train.NUMPY_ARRAY_GLOBALS[0].__module__.encode()
    assert mine in members[pkl], "the pickle names numpy's rebuilding function otherwise than expected"
    for other in (b"numpy.core.multiarray", b"numpy._core.multiarray"):
        members[pkl] = members[pkl].replace(mine, other)      # protocol 2: GLOBAL names are text lines
        mine = other
        with zipfile.ZipFile(path, "w") as z:
            for info, data in members.items():
                z.writestr(info, data)
        loaded = train.load_checkpoint(str(path))["rng"]["numpy"]
        assert loaded[0] == state[0] and np.array_equal(loaded[1], state[1]) and loaded[2:] == state[2:], other


def test_checkpoint_that_would_run_code_is_refused_unrun(tmp_path):
    """Checkpoints load with torch.load(weights_only=True), numpy's array rebuilding allowed for the RNG
    state: a file from elsewhere whose pickle calls a function (here os.makedirs) is refused before it runs.
    With weights_only=False, as before, loading it made the folder."""
    class Payload:
        def __reduce__(self):
            return os.makedirs, (str(tmp_path / "ran"),)
    path = tmp_path / "ckpt.pt"
    torch.save({k: Payload() if k == "model" else {} for k in train.RESUME_KEYS}, path)
    with pytest.raises(SystemExit, match=re.escape(str(path)) + " holds objects other than tensors.*refused") as e:
        train.load_checkpoint(str(path))
    assert not (tmp_path / "ran").exists(), "loading the checkpoint ran the code in it"
    assert "os.makedirs" in str(e.value), str(e.value)
    # a function whose module torch does not block outright: its reason comes with advice, on the same
    # line, to allowlist the very function refused, which the message must leave out
    torch.save({"model": collections.OrderedDict(), "x": print}, path)
    with pytest.raises(SystemExit, match=re.escape(str(path)) + " holds objects other than tensors.*refused") as e:
        train.load_checkpoint(str(path))
    assert "GLOBAL print" in str(e.value) and "safe_globals" not in str(e.value), str(e.value)


# A step's large buffers (the default CPU run's 206 MB logits) are freed and allocated again every step. glibc
# returns buffers over its mmap threshold to the kernel at once, so every page of them faults again next time.
# The script trains for a step on the CPU (or not), then counts the page faults of steps that allocate a buffer
# of the logits' size and touch it end to end.
_REUSE = """
import json, os, resource, sys, torch
sys.path.insert(0, os.getcwd())
import train
if sys.argv[1] != "no training":
    train.main(json.loads(sys.argv[1]))
def faults_of_a_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(8 * 128 * 50304)
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
for _ in range(8):  # the first steps lay the heap out (seen: up to the fifth faulted, under pytest)
    faults_of_a_step()
print(sum(faults_of_a_step() for _ in range(4)))   # four steps after them
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux) only")
def test_cpu_training_reuses_the_memory_the_last_step_freed(data_dir, tmp_path):
    def faults(arm, **env):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, **env}
        run = subprocess.run([sys.executable, "-c", _REUSE, arm], cwd=ROOT, env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return int(run.stdout.splitlines()[-1])
    trained = json.dumps(args(data_dir, tmp_path, "--max_iters=1", "--save_checkpoint=False"))
    pages = 8 * 128 * 50304 * 4 // 4096   # per step
    assert faults(trained) < pages // 20, f"page faults in four steps, each of which frees a buffer of {pages} pages"
    # a MALLOC_* setting of the user's own decides instead: then a step faults as it would without training
    user, untouched = faults(trained, MALLOC_MMAP_THRESHOLD_="1048576"), faults("no training")
    assert user >= untouched // 2, f"{user} page faults against {untouched}: MALLOC_MMAP_THRESHOLD_ was overridden"

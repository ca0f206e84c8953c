"""Token shards, their corruption errors, the tokenizer and its offline fallback, the prepare scripts."""
import json
import os

import numpy as np
import pytest

from data import common
from data.common import MAGIC, ShardWriter, get_tokenizer, load_meta, read_shard, shard_paths, write_shard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
TIKTOKEN_CACHE = os.path.join(SHARED, "tiktoken_cache")
SHAKESPEARE = os.path.join(SHARED, "datasets", "tinyshakespeare.txt")


def test_shard_round_trip(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 2**16, size=10_001).astype(np.uint16)
    tokens[:2] = 0, 65535
    path = str(tmp_path / "x_train_000000.bin")
    write_shard(path, tokens)
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert list(header[:3]) == [MAGIC, 1, len(tokens)] and not header[3:].any()
    assert os.path.getsize(path) == 1024 + 2 * len(tokens)
    back = read_shard(path)
    assert back.dtype == np.uint16 and np.array_equal(back, tokens)
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f], "a temporary file was left behind"
    write_shard(path, [5, 6, 7])  # python ints: checked and converted
    assert read_shard(path).tolist() == [5, 6, 7]


def _corrupt(path, how):
    raw = bytearray(open(path, "rb").read())
    if how == "magic":
        raw[0:4] = np.int32(12345).tobytes()
    elif how == "version":
        raw[4:8] = np.int32(2).tobytes()
    elif how == "truncated":
        raw = raw[:-2]
    elif how == "longer":
        raw += b"\0\0"
    elif how == "header_only":
        raw = raw[:100]
    open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize("how,words", [("magic", "magic 12345"), ("version", "version 2"),
                                       ("truncated", "truncated or corrupt"), ("longer", "truncated or corrupt"),
                                       ("header_only", "shorter than its 1024-byte header")])
def test_corrupt_shard_errors_name_file_and_command(tmp_path, how, words):
    path = str(tmp_path / "d_val_000000.bin")
    write_shard(path, np.arange(100, dtype=np.uint16))
    common.write_meta(str(tmp_path), prepare="python data/d/prepare.py --input=x")
    _corrupt(path, how)
    with pytest.raises(ValueError) as e:
        read_shard(path)
    msg = str(e.value)
    assert path in msg and words in msg and "python data/d/prepare.py --input=x" in msg, msg


def test_missing_data_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.*run: "):
        read_shard(str(tmp_path / "nope_train_000000.bin"))
    with pytest.raises(FileNotFoundError, match=r"no train shards \(\*_train_\*\.bin\) in .*run: "):
        shard_paths(str(tmp_path), "train")
    with pytest.raises(FileNotFoundError, match="meta.json is missing"):
        load_meta(str(tmp_path))
    # in a folder with a prepare.py and no meta.json yet (data/<name>/ before its first run), the hint is that
    # script (a tmp copy: the repository's data/shakespeare/ has a meta.json once the user prepared it)
    folder = tmp_path / "shakespeare"
    folder.mkdir()
    (folder / "prepare.py").write_text(open(os.path.join(ROOT, "data", "shakespeare", "prepare.py")).read())
    assert common.prepare_command(str(folder)).endswith(os.path.join("shakespeare", "prepare.py"))


def test_shard_writer_splits_documents_and_removes_stale_shards(tmp_path):
    docs = [np.arange(i * 10, i * 10 + 7, dtype=np.uint16) for i in range(4)]  # 28 tokens
    w = ShardWriter(str(tmp_path), "t", "train", shard_tokens=10)
    for d in docs:
        w.add(d)
    assert w.close() == 28
    paths = shard_paths(str(tmp_path), "train")
    assert [len(read_shard(p)) for p in paths] == [10, 10, 8]  # documents straddle shards, as in llm.c
    assert np.array_equal(np.concatenate([read_shard(p) for p in paths]), np.concatenate(docs))
    w = ShardWriter(str(tmp_path), "t", "train", shard_tokens=10)  # a re-run that makes fewer shards
    w.add(docs[0])
    w.close()
    assert len(shard_paths(str(tmp_path), "train")) == 1


def test_gpt2_tokenizer_from_offline_cache(monkeypatch):
    if not os.path.isdir(TIKTOKEN_CACHE):
        pytest.skip(f"{TIKTOKEN_CACHE} not found (the offline GPT-2 ranks)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", TIKTOKEN_CACHE)
    tok = get_tokenizer("gpt2")
    assert (tok.name, tok.vocab_size, tok.eot) == ("gpt2", 50257, 50256)
    assert tok.encode("hello world") == [31373, 995]
    assert tok.decode(tok.encode("def f(x):\n    return x")) == "def f(x):\n    return x"


def test_tokenizer_falls_back_to_bytes_with_one_line_notice(monkeypatch, capsys):
    import tiktoken

    def offline(name):
        raise ConnectionError(f"no network for {name}")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    tok = get_tokenizer("gpt2")
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "byte-level" in out and "TIKTOKEN_CACHE_DIR" in out, out
    assert (tok.name, tok.vocab_size, tok.eot) == ("bytes", 257, 256)
    text = "naïve café ✓"
    assert tok.encode(text) == list(text.encode("utf-8")) and tok.decode(tok.encode(text)) == text
    assert tok.decode([104, 105, 256, 300]) == "hi"  # eot and padded-vocab ids decode to nothing


def _documents(path, eot):
    """A shard's documents: split at the end-of-text tokens that lead each one."""
    t = read_shard(path)
    starts = np.flatnonzero(t == eot)
    assert starts[0] == 0, "a shard must start with an end-of-text token"
    return starts


def test_builtin_corpus_is_deterministic_and_split_by_file(tmp_path):
    from data.builtin.prepare import prepare
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    prepare(a, max_mb=0.3, site_packages=False, tokenizer="bytes")
    prepare(b, max_mb=0.3, site_packages=False, tokenizer="bytes")
    meta = load_meta(a)
    assert meta["tokenizer"] == "bytes" and meta["vocab_size"] == 257 and meta["val_files"] >= 4
    for split in ("train", "val"):
        (pa,), (pb,) = shard_paths(a, split), shard_paths(b, split)
        assert open(pa, "rb").read() == open(pb, "rb").read(), "the same machine must give the same shards"
        assert len(read_shard(pa)) == meta[f"{split}_tokens"]
        # byte tokens never equal 256, so the EOT count is the document count: one before every file
        assert len(_documents(pa, 256)) == meta[f"{split}_files"]


def test_text_prepare_folder_and_file(tmp_path):
    from data.text.prepare import prepare
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(5):
        (folder / f"f{i}.txt").write_text(f"document {i} " * (i + 1))
    (folder / "skip.bin").write_text("not text")
    out = str(tmp_path / "out")
    counts = prepare(str(folder), out, tokenizer="bytes")
    meta = load_meta(out)
    assert meta["prepare"].startswith("python data/text/prepare.py")
    total = sum(len(f"document {i} " * (i + 1)) for i in range(5)) + 5  # + one EOT per document
    assert counts["train_tokens"] + counts["val_tokens"] == total
    assert len(_documents(shard_paths(out, "val")[0], 256)) == 1  # 1% of 5 files, at least one
    single = tmp_path / "one.txt"
    single.write_text("abcdefghij" * 10)
    counts = prepare(str(single), str(tmp_path / "one"), tokenizer="bytes")
    assert (counts["train_tokens"], counts["val_tokens"]) == (91, 11)  # 90/10 by characters, + EOT each


def test_shakespeare_prepare_from_local_file(tmp_path):
    if not os.path.exists(SHAKESPEARE):
        pytest.skip(f"{SHAKESPEARE} not found")
    from data.shakespeare.prepare import prepare
    out = str(tmp_path / "shakespeare")
    counts = prepare(SHAKESPEARE, out, tokenizer="bytes")
    n = len(open(SHAKESPEARE, encoding="utf-8").read())  # the file is ASCII: one byte per character
    assert counts == {"val_tokens": n - int(0.9 * n) + 1, "train_tokens": int(0.9 * n) + 1}
    assert read_shard(shard_paths(out, "train")[0])[:6].tolist() == [256] + list(b"First")
    assert SHAKESPEARE in load_meta(out)["prepare"]


def test_fineweb_prepare_keeps_intact_files_and_replaces_corrupt_ones(tmp_path, monkeypatch):
    from data.fineweb import prepare as fw
    out = str(tmp_path / "fw")
    os.makedirs(out)
    write_shard(os.path.join(out, "fineweb_val_000000.bin"), np.arange(50, dtype=np.uint16))
    open(os.path.join(out, "fineweb_train_000001.bin"), "wb").write(b"half a download")
    fetched = []

    def fake_download(url, path):
        fetched.append(os.path.basename(url))
        write_shard(path, np.arange(70, dtype=np.uint16))
    monkeypatch.setattr(fw, "download", fake_download)
    fw.prepare("fineweb10B", train_shards=2, out_dir=out)
    assert fetched == ["fineweb_train_000001.bin", "fineweb_train_000002.bin"]  # the val file was kept
    meta = load_meta(out)
    assert (meta["val_tokens"], meta["train_tokens"], meta["tokenizer"]) == (50, 140, "gpt2")
    fetched.clear()
    fw.prepare("fineweb10B", train_shards=2, out_dir=out)  # re-running downloads nothing
    assert fetched == []
    assert json.load(open(os.path.join(out, "meta.json")))["source"].endswith("kjj0/fineweb10B-gpt2")


def test_names_that_look_like_splits_and_odd_folders(tmp_path, monkeypatch):
    """A dataset called my_train_set keeps its val shard out of training; [ ] in a folder name are
    letters, not a glob pattern; --out_dir=. names the folder it is (not '.', which made hidden shards);
    hidden files and dangling links in an input folder (editor locks) are skipped."""
    from data.text.prepare import prepare
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"f{i}.txt").write_text(f"document {i} " * 20)
    os.symlink(str(tmp_path / "gone"), str(docs / ".#f0.txt"))
    for name in ("my_train_set", "code_val_v2", "books[1]"):
        out = tmp_path / name
        prepare(str(docs), str(out), tokenizer="bytes")
        (train,), (val,) = shard_paths(str(out), "train"), shard_paths(str(out), "val")
        assert os.path.basename(train) == f"{name}_train_000000.bin" and os.path.basename(val) == f"{name}_val_000000.bin"
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    prepare(str(docs), ".", tokenizer="bytes")
    assert [os.path.basename(p) for p in shard_paths(str(here), "train")] == ["here_train_000000.bin"]
    with pytest.raises(SystemExit, match="cannot read .*gone"):
        common.read_text(str(tmp_path / "gone"))


def test_meta_records_the_command_that_remakes_the_dataset(tmp_path):
    from data.builtin.prepare import prepare as builtin
    from data.text.prepare import prepare as text
    out = tmp_path / "bi"
    builtin(str(out), max_mb=0.3, site_packages=False, tokenizer="bytes")
    assert load_meta(str(out))["prepare"] == (f"python data/builtin/prepare.py --out_dir={out} --max_mb=0.3 "
                                              "--no_site_packages --tokenizer=bytes")
    one = tmp_path / "one.txt"
    one.write_text("abcdefghij" * 10)
    text(str(one), str(tmp_path / "t"), tokenizer="bytes", exts=(".txt",))
    assert load_meta(str(tmp_path / "t"))["prepare"] == (f"python data/text/prepare.py --input={one} "
                                                        f"--out_dir={tmp_path / 't'} --tokenizer=bytes --ext=.txt")


class _Response:
    """What urllib.request.urlopen returns, cut short: the server promised `size` bytes and sent `sent`."""

    def __init__(self, size, sent):
        self.headers, self.data = {"Content-Length": str(size)}, b"x" * sent

    def read(self, n=-1):
        chunk, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
        return chunk

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_fineweb_download_cut_short_leaves_no_shard(tmp_path, monkeypatch):
    from data.fineweb import prepare as fw
    monkeypatch.setattr(fw.urllib.request, "urlopen", lambda url, timeout: _Response(3024, 1500))
    out = str(tmp_path / "fw")
    with pytest.raises(SystemExit, match="connection closed after 1,500 of 3,024 bytes.*re-run to continue"):
        fw.prepare("fineweb10B", train_shards=1, out_dir=out)
    assert os.listdir(out) == [], "a cut download must not be renamed to the shard's name"


def test_fineweb_counts_train_shards_kept_from_an_earlier_run(tmp_path, monkeypatch, capsys):
    from data.fineweb import prepare as fw
    monkeypatch.setattr(fw, "download", lambda url, path: write_shard(path, np.arange(70, dtype=np.uint16)))
    out = str(tmp_path / "fw")
    fw.prepare("fineweb10B", train_shards=3, out_dir=out)
    fw.prepare("fineweb10B", train_shards=1, out_dir=out)
    assert load_meta(out)["train_tokens"] == 210 == sum(len(read_shard(p)) for p in shard_paths(out, "train"))
    assert "2 more train shards from an earlier run are kept" in capsys.readouterr().out

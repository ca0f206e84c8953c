"""Token shards, their corruption errors, the tokenizer and its offline fallback, the prepare scripts."""
import json
import os
import pathlib
import re

import numpy as np
import pytest

from data import common
from data.common import MAGIC, ShardWriter, get_tokenizer, load_meta, read_shard, shard_paths, write_shard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
# GPT-2's ranks offline: the project's shared copy beside the clone, else the folder tiktoken is told to use
TIKTOKEN_CACHE = os.path.join(SHARED, "tiktoken_cache")
if not os.path.isdir(TIKTOKEN_CACHE) and os.environ.get("TIKTOKEN_CACHE_DIR"):
    TIKTOKEN_CACHE = os.environ["TIKTOKEN_CACHE_DIR"]
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
    for bad in ([1, 65536, 2], [-1, 3]):    # past uint16 they would wrap around (65536 -> 0) silently
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 65535\] to fit uint16"):
            write_shard(path, bad)
    assert read_shard(path).tolist() == [5, 6, 7], "a refused write touched the shard"
    with pytest.raises(ValueError, match="token ids must be integers, got an array of float64"):
        write_shard(path, np.array([5.0, 1.7]))    # astype would have written 5, 1
    assert read_shard(path).tolist() == [5, 6, 7]


def _corrupt(path, how):
    raw = bytearray(pathlib.Path(path).read_bytes())
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
    with open(path, "wb") as f:
        f.write(bytes(raw))


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
    (folder / "prepare.py").write_text(pathlib.Path(ROOT, "data", "shakespeare", "prepare.py").read_text())
    assert common.prepare_command(str(folder)).endswith(os.path.join("shakespeare", "prepare.py"))


@pytest.mark.parametrize("text,words", [
    ("{'vocab_size': 256", "is not valid JSON"),
    ("{}", "lacks tokenizer, vocab_size, train_tokens: not written by a prepare script"),
    ("[1, 2]", "lacks tokenizer, vocab_size, train_tokens"),
    ('{"tokenizer": "bytes", "vocab_size": 257}', "lacks train_tokens"),
    # edited by hand: numpy's _UFuncNoLoopError, a TypeError or a format-string error, far from the file
    ('{"tokenizer": "bytes", "vocab_size": "257", "train_tokens": 9}', "has vocab_size='257' (expected a whole number"),
    ('{"tokenizer": "bytes", "vocab_size": null, "train_tokens": 9}', "has vocab_size=None"),
    ('{"tokenizer": "bytes", "vocab_size": 70000, "train_tokens": 9}', "has vocab_size=70000"),
    ('{"tokenizer": "bytes", "vocab_size": 257, "train_tokens": "4501"}', "has train_tokens='4501' (expected a whole"),
    ('{"tokenizer": "bytes", "vocab_size": 257, "train_tokens": 9, "val_tokens": true}', "has val_tokens=True"),
    ('{"tokenizer": "GPT2", "vocab_size": 257, "train_tokens": 9}', "has tokenizer='GPT2' (expected 'gpt2' or 'bytes')"),
])
def test_a_broken_meta_json_is_named(tmp_path, text, words):
    (tmp_path / "meta.json").write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'meta.json'} ") + ".*" + re.escape(words) + ".*re-run: "):
        load_meta(str(tmp_path))


def test_prepare_into_a_file_says_so(tmp_path):
    from data.text.prepare import prepare
    (tmp_path / "in.txt").write_text("some text\n" * 50)
    (tmp_path / "a_file").write_text("")
    for out in (tmp_path / "a_file", tmp_path / "a_file" / "sub"):
        with pytest.raises(SystemExit, match=re.escape(f"out_dir {out}: cannot make that folder")):
            prepare(str(tmp_path / "in.txt"), str(out), tokenizer="bytes")


def test_shard_writer_splits_documents_and_removes_stale_shards(tmp_path, monkeypatch):
    docs = [np.arange(i * 10, i * 10 + 7, dtype=np.uint16) for i in range(4)]  # 28 tokens
    w = ShardWriter(str(tmp_path), "t", "train", shard_tokens=10)
    for d in docs:
        w.add(d)
    assert w.close() == 28
    paths = shard_paths(str(tmp_path), "train")
    assert [len(read_shard(p)) for p in paths] == [10, 10, 8]  # documents straddle shards, as in llm.c
    assert np.array_equal(np.concatenate([read_shard(p) for p in paths]), np.concatenate(docs))
    # in shard order whatever order the folder lists them in (os.listdir's is arbitrary)
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: sorted(listdir(path), reverse=True))
    assert shard_paths(str(tmp_path), "train") == paths
    monkeypatch.undo()
    w = ShardWriter(str(tmp_path), "t", "train", shard_tokens=10)  # a re-run that makes fewer shards
    w.add(docs[0])
    w.close()
    assert len(shard_paths(str(tmp_path), "train")) == 1
    # the same with a name that means something else as a regular expression ([1] is a character class)
    for n_docs in (4, 1):
        w = ShardWriter(str(tmp_path), "t[1]", "val", shard_tokens=10)
        for d in docs[:n_docs]:
            w.add(d)
        w.close()
    assert [os.path.basename(p) for p in shard_paths(str(tmp_path), "val")] == ["t[1]_val_000000.bin"]


def test_token_counts_sum_over_every_shard_of_a_split(tmp_path):
    """check_counts adds up all of a split's shards: a dataset of several shards per split (FineWeb's are
    100M tokens each) must pass, and one shard too many or too few must not."""
    docs = [np.arange(i * 10, i * 10 + 7, dtype=np.uint16) for i in range(4)]  # 28 tokens
    for split, n_docs in (("train", 4), ("val", 2)):
        w = ShardWriter(str(tmp_path), "m", split, shard_tokens=10)
        for d in docs[:n_docs]:
            w.add(d)
        w.close()
    assert [len(shard_paths(str(tmp_path), s)) for s in ("train", "val")] == [3, 2]
    common.check_counts(str(tmp_path), {"train_tokens": 28, "val_tokens": 14})
    os.remove(tmp_path / "m_train_000001.bin")
    with pytest.raises(ValueError, match="meta.json counts 28 train tokens but the train shards hold 18"):
        common.check_counts(str(tmp_path), {"train_tokens": 28, "val_tokens": 14})


def test_hidden_copies_of_shards_are_not_shards(tmp_path):
    """macOS leaves ._<name> beside each file copied to a foreign disk (AppleDouble, not a shard): a
    dataset copied from a Mac must train, not stop on the first of them as a corrupt shard."""
    write_shard(str(tmp_path / "x_train_000000.bin"), np.arange(50, dtype=np.uint16))
    (tmp_path / "._x_train_000000.bin").write_bytes(b"\0\5\x16\x07" + b"\0" * 60)
    assert [os.path.basename(p) for p in shard_paths(str(tmp_path), "train")] == ["x_train_000000.bin"]


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
        assert pathlib.Path(pa).read_bytes() == pathlib.Path(pb).read_bytes(), "the same machine must give the same shards"
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


def test_text_prepare_says_how_to_train_on_it(tmp_path, capsys):
    """--out_dir is a path from where the script runs, --dataset a name under the repository's data/ (or a
    path): the last line gives the one train.py takes, quoted for the shell."""
    from data.text.prepare import prepare
    single = tmp_path / "one.txt"
    single.write_text("abcdefghij" * 10)
    out = tmp_path / "my books"
    prepare(str(single), str(out), tokenizer="bytes")
    assert capsys.readouterr().out.splitlines()[-1] == f"train on it: python train.py --dataset='{out}'"


def test_atomic_write_syncs_before_it_renames(tmp_path, monkeypatch):
    """The bytes reach the disk before the rename makes them the file: after a power cut, the old file or
    the whole new one, never an empty file under the final name."""
    calls, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append("replace") or replace(a, b))
    common.atomic_write(str(tmp_path / "f.bin"), lambda f: f.write(b"data"))
    # then the folder, whose entry the rename changed (POSIX; Windows has no O_DIRECTORY)
    assert calls == ["fsync", "replace"] + (["fsync"] if hasattr(os, "O_DIRECTORY") else [])
    assert (tmp_path / "f.bin").read_bytes() == b"data"


def test_a_preparation_cut_short_leaves_no_meta_json(tmp_path):
    """meta.json marks a complete dataset: a re-preparation that stops partway must not leave the old one
    beside its new, half-written shards (the trainer would take them for a dataset)."""
    from data.text.prepare import prepare
    text = tmp_path / "one.txt"
    text.write_text("abcdefghij" * 100)
    out = str(tmp_path / "d")
    prepare(str(text), out, tokenizer="bytes")
    assert os.path.exists(os.path.join(out, "meta.json"))

    def texts():
        yield "the first document"
        raise RuntimeError("the source went away")
    with pytest.raises(RuntimeError, match="went away"):
        common.write_dataset(out, "d", {"val": texts(), "train": []}, get_tokenizer("bytes"), "source", "command")
    assert not os.path.exists(os.path.join(out, "meta.json"))


def test_shakespeare_prepare_from_local_file(tmp_path):
    if not os.path.exists(SHAKESPEARE):
        pytest.skip(f"{SHAKESPEARE} not found")
    from data.shakespeare.prepare import prepare
    out = str(tmp_path / "shakespeare")
    counts = prepare(SHAKESPEARE, out, tokenizer="bytes")
    n = len(pathlib.Path(SHAKESPEARE).read_text(encoding="utf-8"))  # the file is ASCII: one byte per character
    assert counts == {"val_tokens": n - int(0.9 * n) + 1, "train_tokens": int(0.9 * n) + 1}
    assert read_shard(shard_paths(out, "train")[0])[:6].tolist() == [256] + list(b"First")
    assert SHAKESPEARE in load_meta(out)["prepare"]


def test_shakespeare_download_path(tmp_path, monkeypatch):
    """The default command downloads input.txt once, then prepares from it; a failed download leaves no
    input.txt (a half-written one would be taken as the corpus by every later run). The URL is a file://
    one, which urllib serves like any other, so this runs offline."""
    from data.shakespeare import prepare as sp
    corpus = tmp_path / "source.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40, encoding="utf-8")
    out = tmp_path / "shakespeare"
    monkeypatch.setattr(sp, "URL", (tmp_path / "missing.txt").as_uri())
    with pytest.raises(SystemExit, match="could not download .*missing.txt.*--input="):
        sp.prepare(out_dir=str(out), tokenizer="bytes")
    assert os.listdir(out) == [], "a failed download left files behind"
    monkeypatch.setattr(sp, "URL", corpus.as_uri())
    counts = sp.prepare(out_dir=str(out), tokenizer="bytes")
    assert (out / "input.txt").read_bytes() == corpus.read_bytes()
    n = len(corpus.read_bytes())
    assert counts == {"val_tokens": n - int(0.9 * n) + 1, "train_tokens": int(0.9 * n) + 1}
    monkeypatch.setattr(sp, "URL", (tmp_path / "missing.txt").as_uri())  # present: not fetched again
    assert sp.prepare(out_dir=str(out), tokenizer="bytes") == counts


def test_fineweb_prepare_keeps_intact_files_and_replaces_corrupt_ones(tmp_path, monkeypatch):
    from data.fineweb import prepare as fw
    out = str(tmp_path / "fw")
    os.makedirs(out)
    write_shard(os.path.join(out, "fineweb_val_000000.bin"), np.arange(50, dtype=np.uint16))
    pathlib.Path(out, "fineweb_train_000001.bin").write_bytes(b"half a download")
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
    assert json.loads(pathlib.Path(out, "meta.json").read_text())["source"].endswith("kjj0/fineweb10B-gpt2")


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


def test_fineweb_rerun_cut_short_leaves_no_meta_json(tmp_path, monkeypatch):
    """A re-run for more shards that stops partway must not leave the earlier run's meta.json, whose counts
    would make the trainer call the new, good shards another preparation's and say to delete them."""
    from data.fineweb import prepare as fw
    monkeypatch.setattr(fw, "download", lambda url, path: write_shard(path, np.arange(70, dtype=np.uint16)))
    out = str(tmp_path / "fw")
    fw.prepare("fineweb10B", train_shards=1, out_dir=out)
    assert load_meta(out)["train_tokens"] == 70

    def download(url, path):
        if url.endswith("_000003.bin"):
            raise OSError("the network went away")
        write_shard(path, np.arange(70, dtype=np.uint16))
    monkeypatch.setattr(fw, "download", download)
    with pytest.raises(SystemExit, match="the files already here are kept, re-run to continue"):
        fw.prepare("fineweb10B", train_shards=3, out_dir=out)
    assert not os.path.exists(os.path.join(out, "meta.json"))
    monkeypatch.setattr(fw, "download", lambda url, path: write_shard(path, np.arange(70, dtype=np.uint16)))
    fw.prepare("fineweb10B", train_shards=3, out_dir=out)       # re-run, as the message says
    assert load_meta(out)["train_tokens"] == 3 * 70


def test_fineweb_asks_for_no_more_shards_than_exist_and_records_edu(tmp_path, monkeypatch):
    """--train_shards past what the dataset has (103 for FineWeb, 99 for FineWeb-Edu) fetches what there is,
    not names that do not exist; and FineWeb-Edu's meta.json remakes FineWeb-Edu, not FineWeb."""
    from data.fineweb import prepare as fw
    fetched = []
    monkeypatch.setattr(fw, "download", lambda url, path: fetched.append(os.path.basename(url))
                        or write_shard(path, np.arange(3, dtype=np.uint16)))
    fw.prepare("finewebedu10B", train_shards=200, out_dir=str(tmp_path / "edu"))
    assert len(fetched) == 1 + 99 and fetched[-1] == "finewebedu_train_000099.bin", fetched[-3:]
    assert " --edu" in load_meta(str(tmp_path / "edu"))["prepare"], load_meta(str(tmp_path / "edu"))["prepare"]


def test_fineweb_counts_train_shards_kept_from_an_earlier_run(tmp_path, monkeypatch, capsys):
    from data.fineweb import prepare as fw
    monkeypatch.setattr(fw, "download", lambda url, path: write_shard(path, np.arange(70, dtype=np.uint16)))
    out = str(tmp_path / "fw")
    fw.prepare("fineweb10B", train_shards=3, out_dir=out)
    fw.prepare("fineweb10B", train_shards=1, out_dir=out)
    assert load_meta(out)["train_tokens"] == 210 == sum(len(read_shard(p)) for p in shard_paths(out, "train"))
    assert "2 more train shards from an earlier run are kept" in capsys.readouterr().out


def _document_bytes(path, eot):
    """A shard's documents as bytes (byte-level tokens), each without its leading end-of-text token."""
    t = read_shard(path).tolist()
    starts = [i for i, x in enumerate(t) if x == eot] + [len(t)]
    assert starts[0] == 0, "a shard must start with an end-of-text token"
    return [bytes(t[a + 1:b]) for a, b in zip(starts, starts[1:])]


def test_builtin_val_and_train_hold_disjoint_files(tmp_path):
    """The built-in split is by file: val is the first files in hash order, train the rest, no file in both.
    The earlier test counts documents against meta.json, which counts the same lists, so a split that puts one
    file in both ([:n_val] and [n_val - 1:]) passed it; here the documents are checked against the files."""
    from data.builtin.prepare import prepare, source_files
    out = str(tmp_path / "bi")
    cap = 0.3  # MB: 14 stdlib files on CPython 3.11, at least 5 anywhere (4 val + 1 train, or prepare refuses)
    prepare(out, max_mb=cap, site_packages=False, tokenizer="bytes")
    meta = load_meta(out)
    (val,), (train,) = shard_paths(out, "val"), shard_paths(out, "train")
    val_docs, train_docs = _document_bytes(val, 256), _document_bytes(train, 256)
    files = [full for _, full in source_files(site_packages=False)]
    n = len(val_docs) + len(train_docs)
    texts = [common.read_text(f).encode("utf-8") for f in files[:n]]
    # by content: a val text shows up in train only as often as distinct files hold that same text (two
    # empty __init__.py are two files); one file in both splits breaks this
    for t in set(val_docs) & set(train_docs):
        assert val_docs.count(t) + train_docs.count(t) <= texts.count(t), \
            f"a val document ({len(t)} bytes: {t[:60]!r}...) is also in train"
    # by position: val is the first val_files of the hash order, train the files after it, each once
    assert len(val_docs) == meta["val_files"] >= 4
    assert val_docs == texts[:len(val_docs)], "val is not the first files of the hash order"
    assert train_docs == texts[len(val_docs):], "train is not the files after val, each once"
    # and together they are the first `cap` MB of that order
    sizes = [os.path.getsize(f) for f in files[:n]]
    assert sum(sizes[:-1]) < cap * 1e6 <= sum(sizes), f"{n} documents are not the first {cap} MB of files"


def test_text_prepare_skips_hidden_folders(tmp_path):
    """Files under hidden folders (.git, .venv, an editor's .cache), at any depth, are no documents; files in
    ordinary subfolders are. The earlier test only had a hidden file at the top level."""
    from data.text.prepare import prepare
    docs = tmp_path / "docs"
    (docs / "sub" / ".cache").mkdir(parents=True)
    (docs / ".git" / "logs").mkdir(parents=True)
    visible = {"a.txt": "alpha " * 30, "b.md": "beta " * 30, "c.txt": "gamma " * 30, "sub/d.txt": "delta " * 30}
    for name, text in visible.items():
        (docs / name).write_text(text)
    for name in (".git/description.txt", ".git/logs/HEAD.md", "sub/.cache/e.txt", ".notes.txt", "sub/._d.txt"):
        (docs / name).write_text(f"HIDDEN {name} " * 10)
    out = str(tmp_path / "out")
    counts = prepare(str(docs), out, tokenizer="bytes")
    text = b"".join(bytes(t for t in read_shard(p).tolist() if t < 256)  # without the end-of-text tokens
                    for s in ("val", "train") for p in shard_paths(out, s))
    assert b"HIDDEN" not in text, "a file under a hidden folder was tokenized"
    assert counts["val_tokens"] + counts["train_tokens"] == sum(len(t) + 1 for t in visible.values())
    assert "(4 files, 1 of them val)" in load_meta(out)["source"]


def test_text_folder_val_is_one_percent_of_the_files(tmp_path):
    """250 files: 2 of them val (1%), by the hash order of their names, not the first two by name."""
    from data.text.prepare import prepare
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(250):
        (docs / f"f{i:03d}.txt").write_text(f"doc {i:03d}.")
    prepare(str(docs), str(tmp_path / "out"), tokenizer="bytes")
    assert "(250 files, 2 of them val)" in load_meta(str(tmp_path / "out"))["source"]
    val = _document_bytes(shard_paths(str(tmp_path / "out"), "val")[0], 256)
    assert len(val) == 2 and val != [b"doc 000.", b"doc 001."], val


def test_an_empty_split_still_gets_its_shard(tmp_path):
    """ShardWriter.close writes a shard even when nothing was added (`or self.index == 0`): every split that
    meta.json counts has its file, so a loader finds the split and can say how many tokens it holds. Without
    the file it says 'no val shards ...; run: <prepare command>', and re-running that changes nothing."""
    w = ShardWriter(str(tmp_path), "e", "val")
    assert w.close() == 0
    assert os.listdir(tmp_path) == ["e_val_000000.bin"] and len(read_shard(str(tmp_path / "e_val_000000.bin"))) == 0
    # a dataset whose val split has no documents: its shard is written, empty, in place of an earlier run's
    out = str(tmp_path / "d")
    _empty_val_dataset(out)
    assert {k: load_meta(out)[k] for k in ("val_tokens", "train_tokens")} == {"val_tokens": 0, "train_tokens": 19}
    assert sorted(os.listdir(out)) == ["d_train_000000.bin", "d_val_000000.bin", "meta.json"]
    (val,) = shard_paths(out, "val")
    assert len(read_shard(val)) == 0
    # the smallest inputs the prepare scripts take never leave a split empty: each document brings its
    # end-of-text token, so a file of one character gives the end-of-text token alone to train (an empty
    # file is refused: test_text_prepare_refuses_an_empty_file_and_reads_endings_without_case)
    from data.text.prepare import prepare
    (tmp_path / "one.txt").write_text("a")
    assert prepare(str(tmp_path / "one.txt"), str(tmp_path / "tiny"), tokenizer="bytes") == \
        {"val_tokens": 2, "train_tokens": 1}
    assert [len(read_shard(p)) for s in ("val", "train") for p in shard_paths(str(tmp_path / "tiny"), s)] == [2, 1]


def _empty_val_dataset(out):
    """Byte-level shards in `out` whose val split has no documents, over an earlier run whose val had one."""
    tok = get_tokenizer("bytes")
    common.write_dataset(out, "d", {"val": ["old val text"], "train": ["old train text"]}, tok, "t", "python x")
    return common.write_dataset(out, "d", {"val": [], "train": ["some training text"]}, tok, "t", "python x")


def test_trainer_refuses_an_empty_val_split(tmp_path):
    """What the empty shard above is for: the trainer stops with an error naming the split and its size."""
    import train
    out = str(tmp_path / "d")
    _empty_val_dataset(out)
    with pytest.raises(ValueError, match=r"the val split of .* has 0 tokens, fewer than block_size \+ 1"):
        train.val_windows(out, block_size=8, eval_tokens=64)


def test_trainer_refuses_shards_of_two_preparations_in_one_folder(tmp_path):
    """The builtin corpus, then a text file, prepared into one folder: the text run names its shards after
    the folder and leaves the builtin_* shards, which the loader would read as well. The counts in
    meta.json then disagree with the shards, and the trainer says which shards it found."""
    import train
    from data.text.prepare import prepare
    out = tmp_path / "mixed"
    text = tmp_path / "one.txt"
    text.write_text("abcdefghij" * 200)
    prepare(str(text), str(out), tokenizer="bytes")
    common.check_counts(str(out), load_meta(str(out)))  # one preparation: the counts agree
    write_shard(str(out / "builtin_val_000000.bin"), np.arange(300, dtype=np.uint16))   # the val split alone
    with pytest.raises(ValueError, match=r"meta.json counts 201 val tokens but the val shards hold 501 "
                                         r"\(builtin_val_\*.bin: 300, mixed_val_\*.bin: 201\)"):
        common.check_counts(str(out), load_meta(str(out)))
    write_shard(str(out / "builtin_train_000000.bin"), np.arange(500, dtype=np.uint16))
    with pytest.raises(SystemExit, match=r"meta.json counts 1,801 train tokens but the train shards hold 2,301 "
                                         r"\(builtin_train_\*.bin: 500, mixed_train_\*.bin: 1,801\)"):
        train.main([f"--dataset={out}", f"--out_dir={tmp_path / 'o'}", "--device=cpu", "--max_iters=1"])


def test_builtin_corpus_skips_dangling_and_unreadable_files(tmp_path, monkeypatch):
    """`python train.py`'s first run walks the installation's .py files: a dangling link among them (a
    package removed by hand) must not stop it."""
    import sysconfig
    from data.builtin import prepare as builtin
    lib = tmp_path / "lib"
    lib.mkdir()
    for i in range(6):
        (lib / f"m{i}.py").write_text(f"x = {i}\n" * 50)
    os.symlink(str(tmp_path / "gone.py"), str(lib / "broken.py"))
    paths = dict(sysconfig.get_paths(), stdlib=str(lib))
    monkeypatch.setattr(sysconfig, "get_paths", lambda: paths)
    assert sorted(os.path.basename(f) for _, f in builtin.source_files(site_packages=False)) == \
        [f"m{i}.py" for i in range(6)]
    # a file this user may not read (root reads everything, so os.access stands in for the permission)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: not path.endswith("m5.py") and access(path, mode))
    assert sorted(os.path.basename(f) for _, f in builtin.source_files(site_packages=False)) == \
        [f"m{i}.py" for i in range(5)]


def test_builtin_corpus_takes_packages_once_and_one_percent_for_val(tmp_path, monkeypatch):
    """Where site-packages lies inside the standard library (pyenv, most Linux Pythons), the stdlib walk must
    skip it: with packages on they are walked as their own root, once; with them off, not at all. And the
    val split is 1% of the files (at least 4): 5 of 500."""
    import sysconfig
    from data.builtin import prepare as builtin
    lib = tmp_path / "lib"
    (lib / "site-packages" / "pkg").mkdir(parents=True)
    for i in range(490):
        (lib / f"m{i:03d}.py").write_text(f"x = {i}\n")
    for i in range(10):
        (lib / "site-packages" / "pkg" / f"p{i}.py").write_text(f"y = {i}\n")
    paths = dict(sysconfig.get_paths(), stdlib=str(lib), purelib=str(lib / "site-packages"),
                 platlib=str(lib / "site-packages"))
    monkeypatch.setattr(sysconfig, "get_paths", lambda: paths)
    names = [rel for rel, _ in builtin.source_files(site_packages=True)]
    assert len(names) == len(set(names)) == 500 and sum(n.startswith("site-packages/") for n in names) == 10
    assert not [n for n, _ in builtin.source_files(site_packages=False) if "site-packages" in n]
    builtin.prepare(str(tmp_path / "out"), tokenizer="bytes")
    meta = load_meta(str(tmp_path / "out"))
    assert (meta["val_files"], meta["train_files"]) == (5, 495), meta


def test_text_dataset_hint_names_its_input_argument():
    """`python data/text/prepare.py` alone stops on its missing --input: the hint must give it."""
    data = os.path.join(common.REPO, "data")
    assert common.known_prepare_command(os.path.join(data, "text")).endswith(" --input=PATH (a text file or a folder of them)")
    assert "--input" not in common.known_prepare_command(os.path.join(data, "shakespeare"))


def test_fineweb_hint_names_the_dataset_its_script_writes():
    """data/fineweb/prepare.py writes data/fineweb10B (or finewebedu10B), not data/fineweb: the hint for
    --dataset=fineweb told users to rerun the download and left them at the same error."""
    data = os.path.join(common.REPO, "data")
    hint = common.known_prepare_command(os.path.join(data, "fineweb"))
    assert hint.startswith("python data/fineweb/prepare.py") and "--dataset=fineweb10B" in hint, hint
    assert common.known_prepare_command(os.path.join(data, "fineweb10B")) == "python data/fineweb/prepare.py"


def test_a_dataset_folder_named_with_a_leading_dot_can_be_trained_on(tmp_path):
    """Shards are named after their folder, and shard_paths passes over hidden names: a folder called
    .corpus got .corpus_train_000000.bin, which no run found (its error said to run the same prepare)."""
    from data.text.prepare import prepare
    src = tmp_path / "in.txt"
    src.write_text("some text to tokenize " * 20)
    out = str(tmp_path / ".corpus")
    counts = prepare(str(src), out, tokenizer="bytes")
    for split in ("train", "val"):
        assert sum(len(read_shard(p)) for p in shard_paths(out, split)) == counts[f"{split}_tokens"]
    common.check_counts(out, load_meta(out))


def test_text_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    """A Latin-1 corpus was read with errors='replace' and trained on U+FFFD for every accent, silently."""
    from data.text.prepare import prepare
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.txt").write_text("plain ascii " * 20)
    (docs / "latin1.txt").write_bytes("Le caf\u00e9 est tr\u00e8s bon. ".encode("latin-1") * 20)
    with pytest.raises(SystemExit, match=r"latin1\.txt is not UTF-8 text \(byte 6: b'\\xe9 es'\)"):
        prepare(str(docs), str(tmp_path / "out"), tokenizer="bytes")
    assert not os.path.exists(tmp_path / "out" / "meta.json"), "a stopped preparation must not look complete"


def test_a_rerun_that_meets_a_bad_file_keeps_the_dataset_it_had(tmp_path):
    """A re-run of a folder that now holds a Latin-1 file stopped partway: it had already deleted meta.json
    and rewritten a shard, so the working dataset was lost along with the command that made it."""
    from data.text.prepare import prepare
    docs, out = tmp_path / "docs", tmp_path / "out"
    docs.mkdir()
    for i in range(3):
        (docs / f"f{i}.txt").write_text(f"document {i} " * 20)
    prepare(str(docs), str(out), tokenizer="bytes")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (docs / "zz_latin1.txt").write_bytes("caf\u00e9 ".encode("latin-1") * 20)
    with pytest.raises(SystemExit, match=r"zz_latin1\.txt is not UTF-8 text"):
        prepare(str(docs), str(out), tokenizer="bytes")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "the earlier dataset was changed"


def test_the_remake_command_quotes_paths_with_spaces(tmp_path):
    """Errors hand the user meta.json's command to paste: a path with a space must come back quoted."""
    import shlex
    from data.text.prepare import prepare
    src = tmp_path / "My Notes" / "a b.txt"
    src.parent.mkdir()
    src.write_text("abcdefghij" * 10)
    out = tmp_path / "out dir"
    prepare(str(src), str(out), tokenizer="bytes")
    command = load_meta(str(out))["prepare"]
    assert shlex.split(command) == ["python", "data/text/prepare.py", f"--input={src}", f"--out_dir={out}",
                                    "--tokenizer=bytes"], command


@pytest.mark.parametrize("n", [0, -3])
def test_fineweb_refuses_fewer_than_one_train_shard(tmp_path, monkeypatch, n):
    """--train_shards=0 (or below) wrote a meta.json for a folder with no train data, and the trainer's
    error then told the user to run the same command again."""
    from data.fineweb import prepare as fw
    monkeypatch.setattr(fw, "download", lambda url, path: pytest.fail(f"downloaded {url}"))
    with pytest.raises(SystemExit, match=rf"--train_shards={n}: need 1 or more \(each is 100M tokens; 103 exist\)"):
        fw.prepare("fineweb10B", train_shards=n, out_dir=str(tmp_path / "fw"))
    assert not os.path.exists(tmp_path / "fw" / "meta.json")


def test_a_text_folder_of_one_file_is_refused(tmp_path):
    """A folder needs a file for val and one for train: one file would make an empty train split, and the
    trainer's error would come only after the preparation said it was done."""
    from data.text.prepare import prepare
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "only.txt").write_text("some text " * 60)
    with pytest.raises(SystemExit, match=r"holds 1 files ending in .*: need 2 or more .*or pass a single file"):
        prepare(str(docs), str(tmp_path / "out"), tokenizer="bytes")
    assert not os.path.exists(tmp_path / "out" / "meta.json")


def test_shakespeare_records_a_relative_input_as_absolute(tmp_path, monkeypatch):
    """The remake command in meta.json is pasted from anywhere: --input=tiny.txt, given relative to the
    folder the preparation ran in, would not be found from another."""
    from data.shakespeare.prepare import prepare
    (tmp_path / "tiny.txt").write_text("To be, or not to be. " * 20)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sh"
    prepare("tiny.txt", str(out), tokenizer="bytes")
    assert f"--input={tmp_path / 'tiny.txt'}" in load_meta(str(out))["prepare"]


def test_file_names_that_are_not_utf8_still_sort(tmp_path):
    """Linux hands such names to Python as lone surrogates, which str.encode() refuses: preparing a folder
    holding one stopped with a traceback. UTF-8 names hash as before, so existing datasets keep their order."""
    import hashlib
    assert common.path_order("dir/caf\u00e9.txt") == hashlib.sha1("dir/caf\u00e9.txt".encode()).hexdigest()
    odd = os.fsdecode(b"caf\xe9.txt")
    assert common.path_order(odd) == hashlib.sha1(b"caf\xe9.txt").hexdigest()
    from data.text.prepare import prepare
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in (b"caf\xe9.txt", b"b.txt", b"c.txt"):
        with open(os.path.join(os.fsencode(docs), name), "wb") as f:
            f.write(b"hello world " * 50)
    counts = prepare(str(docs), str(tmp_path / "out"), tokenizer="bytes")
    assert counts["train_tokens"] + counts["val_tokens"] == 3 * (12 * 50 + 1)


def test_a_long_document_is_encoded_in_pieces_to_the_same_tokens(monkeypatch):
    """A single-file dataset is one document per split; tiktoken's list of Python ints for all of it took
    about 65 bytes a token (372 MB for a 31 MB file). tokenize() encodes such a document in pieces cut
    before a newline that a non-space character follows, where GPT-2's pre-tokenizer splits anyway: the
    tokens must be exactly the whole text's, at cuts of every kind (prose, code, blank lines, indents,
    trailing spaces). A book whose paragraphs end in blank lines must be cut too: a cut that also wanted a
    non-space character before the newline found none there and encoded the whole book at once."""
    if not os.path.isdir(TIKTOKEN_CACHE):
        pytest.skip(f"{TIKTOKEN_CACHE} not found (the offline GPT-2 ranks)")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", TIKTOKEN_CACHE)
    tok = get_tokenizer("gpt2")
    text = "".join(pathlib.Path(ROOT, f).read_text() for f in ("README.md", "train.py", "model.py"))
    text += "  \n\n x\n \ny\n\t\nz\r\nw\n" * 50 + "end"     # whitespace before the newline, after it, or both
    spans = list(common._pieces(text, 2000))
    assert len(spans) > 50 and spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a == b for (_, a), (b, _) in zip(spans, spans[1:]))
    for _, b in spans[:-1]:
        assert text[b] == "\n" and not text[b + 1].isspace(), repr(text[b - 2:b + 2])
    book = "A paragraph of prose, and its last line ends in a space. \n\n" * 200
    assert len(list(common._pieces(book, 2000))) > 4, "blank-line paragraphs: no cut found"
    text += book
    whole = np.array([tok.eot] + tok.encode(text), dtype=np.uint16)
    for threads in (1, 3):
        (pieces,) = common.tokenize([text], tok, num_threads=threads, piece_chars=2000)
        assert np.array_equal(pieces, whole), threads
    # short documents around a long one keep their order and their own end-of-text tokens
    docs = list(common.tokenize(["ab", text, "cd", "ef"], tok, piece_chars=2000))
    assert [len(d) for d in docs] == [len(tok.encode(t)) + 1 for t in ("ab", text, "cd", "ef")]
    assert np.array_equal(docs[1], whole) and docs[3].tolist() == [tok.eot] + tok.encode("ef")


def test_text_prepare_refuses_an_empty_file_and_reads_endings_without_case(tmp_path):
    from data.text.prepare import prepare
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n")
    with pytest.raises(SystemExit, match="empty.txt holds no text"):
        prepare(str(empty), str(tmp_path / "out"), tokenizer="bytes")
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("A.TXT", "b.Md", "c.txt", "footxt", "d.py"):
        (folder / name).write_text(f"text of {name}\n")
    out = str(tmp_path / "docs_out")
    counts = prepare(str(folder), out, tokenizer="bytes", exts=("txt", ".MD"))  # no dot, other case
    # A.TXT, b.Md and c.txt: their bytes and an end-of-text token each; not footxt (no dot), nor d.py
    want = sum(len(f"text of {n}\n") + 1 for n in ("A.TXT", "b.Md", "c.txt"))
    assert counts["train_tokens"] + counts["val_tokens"] == want


def test_a_tilde_in_a_path_setting_is_the_home_folder(tmp_path, monkeypatch):
    """`--out_dir=~/books`: the shell leaves a ~ after `=` as it is, so the script must expand it. Unexpanded, it
    wrote ./~/books under the current folder (a folder that `rm -rf ~` would then be typed to remove), and
    `train.py --dataset=~/books` read it only from there."""
    import subprocess
    import sys
    import train
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir(), here.mkdir()
    src = home / "in.txt"
    src.write_text("some text to tokenize, and more of it. " * 40)
    env = dict(os.environ, HOME=str(home))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "data", "text", "prepare.py"), "--input=~/in.txt",
                        "--out_dir=~/books", "--tokenizer=bytes"], cwd=here, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (home / "books" / "meta.json").exists() and not (here / "~").exists(), os.listdir(here)
    monkeypatch.setenv("HOME", str(home))
    assert train.dataset_dir("~/books") == str(home / "books")


def test_a_preparation_removes_what_killed_writes_left(tmp_path, capsys):
    """atomic_write's NAME.tmpPID stays behind when its process is killed mid-write (kill -9, the OOM killer),
    up to a whole shard each (200 MB of FineWeb), and no later run touched it. The next preparation into the
    folder removes those whose process is gone, and leaves a living process's file alone."""
    import subprocess
    import sys
    from data.text.prepare import prepare
    src = tmp_path / "in.txt"
    src.write_text("some text to tokenize, and more of it. " * 40)
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = out / f"out_train_000000.bin.tmp{int(dead.stdout)}"
    left.write_bytes(b"x" * 1000)
    alive = out / f"notes.txt.tmp{os.getpid()}"
    alive.write_text("{")
    prepare(str(src), str(out), tokenizer="bytes")
    assert not left.exists() and alive.exists(), sorted(os.listdir(out))
    assert f"removed {left.name}, left by a write that was killed" in capsys.readouterr().out


def test_a_byte_order_mark_is_not_text(tmp_path):
    """A file saved with a UTF-8 byte-order mark (Notepad does) gives the tokens of the same file without it:
    read as plain utf-8, U+FEFF became three tokens at the head of the document."""
    from data.text.prepare import prepare
    text = "Some text to tokenize, and more of it. " * 40
    counts = {}
    for name, data in (("plain", text.encode()), ("bom", b"\xef\xbb\xbf" + text.encode())):
        (tmp_path / f"{name}.txt").write_bytes(data)
        prepare(str(tmp_path / f"{name}.txt"), str(tmp_path / name), tokenizer="bytes")
        shards = {s: np.concatenate([read_shard(p) for p in shard_paths(str(tmp_path / name), s)]) for s in ("train", "val")}
        counts[name] = {s: x.tolist() for s, x in shards.items()}
    assert counts["bom"] == counts["plain"]

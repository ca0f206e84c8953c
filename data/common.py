"""
Token shards, the tokenizer and the helpers every data/<name>/prepare.py shares.

Shard format (llm.c): a header of 256 int32 (magic 20240520, version 1, token count, rest zero), then the
tokens as uint16. Every document starts with the end-of-text token. Files are named
<name>_val_000000.bin / <name>_train_000000.bin ... next to a meta.json that records the tokenizer and
the token counts; train.py reads the model's vocab size from it.

Tokenizer: GPT-2 through tiktoken. tiktoken downloads its BPE file on first use; offline, point
TIKTOKEN_CACHE_DIR at a folder that holds it. If neither works we fall back, with a one-line notice, to
byte-level tokens (0..255, end-of-text 256), so every machine can still train.
"""
import hashlib
import json
import os
import re
import shlex

import numpy as np

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
HEADER_BYTES = HEADER_INTS * 4
SHARD_TOKENS = 100_000_000  # llm.c's shard size: 200 MB of uint16
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -----------------------------------------------------------------------------------------------------
# tokenizer

class Tokenizer:
    """The two tokenizers behind one face: name, vocab_size, eot, encode(str) -> list, decode(list).
    fallback_for: the tokenizer asked for, where bytes stand in for one that could not load."""

    def __init__(self, name, enc=None, fallback_for=None):
        self.name, self.enc, self.fallback_for = name, enc, fallback_for
        if enc is not None:  # gpt2
            self.vocab_size, self.eot = enc.n_vocab, enc.eot_token  # 50257, 50256
        else:  # bytes
            self.vocab_size, self.eot = 257, 256

    def encode(self, text):
        return self.enc.encode_ordinary(text) if self.enc else list(text.encode("utf-8"))

    def encode_batch(self, texts, num_threads=8):
        if self.enc:  # tiktoken releases the GIL, so threads do help
            return self.enc.encode_ordinary_batch(texts, num_threads=num_threads)
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids):
        ids = [i for i in ids if i < self.vocab_size]  # the model's padded vocab can emit unused ids
        if self.enc:
            return self.enc.decode(ids)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def get_tokenizer(name="gpt2", fallback=True):
    """'gpt2' -> tiktoken GPT-2, or when it cannot load: the byte tokenizer with a notice (fallback, for
    data preparation) or a RuntimeError (not fallback, for a checkpoint that needs GPT-2's); 'bytes'."""
    if name == "bytes":
        return Tokenizer("bytes")
    if name != "gpt2":
        raise ValueError(f"unknown tokenizer {name!r}: expected 'gpt2' or 'bytes'")
    errors = []
    try:
        import tiktoken
        # r50k_base first: it has GPT-2's exact ranks, regex and <|endoftext|>, and it is one file, the one
        # an offline TIKTOKEN_CACHE_DIR holds. 'gpt2' needs two other files, so trying it first would make
        # a network attempt on every offline machine.
        for enc_name in ("r50k_base", "gpt2"):
            try:
                return Tokenizer("gpt2", tiktoken.get_encoding(enc_name))
            except Exception as e:
                errors.append(f"{enc_name}: {type(e).__name__}")
    except ImportError as e:
        errors.append(f"tiktoken: {e}")
    why = (f"GPT-2 BPE unavailable ({'; '.join(errors)}); set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's "
           "r50k_base file, or go online (README, Troubleshooting: offline tokenizer)")
    if not fallback:
        raise RuntimeError(why)
    print(f"tokenizer: {why}; using byte-level tokens for now")
    return Tokenizer("bytes", fallback_for=name)


def read_text(path, errors="strict"):
    """A file's text as UTF-8. Strict by default: a Latin-1 corpus read leniently would train on U+FFFD
    wherever it had an accent, with no word said. errors="replace" is for corpora where a stray byte
    does no harm (the built-in one: Python sources). A byte-order mark (Windows editors write one) is not
    text: utf-8-sig drops it, where utf-8 made it three tokens at the head of the document."""
    try:
        with open(path, encoding="utf-8-sig", errors=errors) as f:
            return f.read()
    except OSError as e:  # a file that went away, a dangling link, no permission: name it, no traceback
        raise SystemExit(f"cannot read {path}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        raise SystemExit(f"{path} is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 4]!r}); convert "
                         f"it first, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8, or leave it out")


def path_order(relpath):
    """Sort key for a deterministic shuffle of files: a hash of the relative path, the same on every OS.
    os.fsencode: a name that is not UTF-8 comes back as the bytes it is on disk (UTF-8 names: the same)."""
    return hashlib.sha1(os.fsencode(relpath.replace(os.sep, "/"))).hexdigest()


PIECE_CHARS = 1 << 20
# A newline before a non-space character: GPT-2's pre-tokenizer starts a piece there, whatever comes before
# it. In a run of whitespace before a non-space character, the last one always starts a piece of its own
# (\s+(?!\S) stops one short of it), and a newline, unlike a space, never joins the word after it. So a text
# cut before such a newline encodes to the same tokens in parts. Blank lines between paragraphs and
# trailing spaces leave such a newline at every paragraph; a cut that wanted a non-space before the newline
# too found none in a book of "\n\n" paragraphs and encoded all of it at once.
# (Python's \S is non-space for tiktoken's regex too: Python counts a few more characters as space.)
_CUT = re.compile(r"\n(?=\S)")


def _pieces(text, size=PIECE_CHARS):
    """(start, end) of pieces of text of about size characters or more, each ending where a _CUT starts."""
    start = 0
    while len(text) - start > size:
        cut = _CUT.search(text, start + size)
        if cut is None:
            break
        yield start, cut.start()
        start = cut.start()
    yield start, len(text)


def tokenize(texts, tok, num_threads=8, piece_chars=PIECE_CHARS):
    """Documents -> one uint16 array per document, each led by the end-of-text token (llm.c). A document
    longer than piece_chars (a whole book given as one file) is encoded in pieces, num_threads at a time:
    the same tokens, but never a Python int per token of all of it (about 65 bytes each)."""
    if tok.vocab_size > 2**16:     # an error, not an assert: python -O would drop it and wrap the ids
        raise ValueError(f"uint16 shards need a vocab of at most 65,536 tokens; this tokenizer has {tok.vocab_size:,}")
    texts, i = list(texts), 0
    while i < len(texts):
        if len(texts[i]) > piece_chars:
            text, parts = texts[i], [np.array([tok.eot], dtype=np.uint16)]
            spans = list(_pieces(text, piece_chars))
            for j in range(0, len(spans), num_threads):
                group = [text[a:b] for a, b in spans[j:j + num_threads]]
                parts += [np.array(ids, dtype=np.uint16) for ids in tok.encode_batch(group, num_threads)]
            yield np.concatenate(parts)
            i += 1
        else:   # a run of short documents, encoded together (tiktoken's threads)
            j = i
            while j < len(texts) and len(texts[j]) <= piece_chars:
                j += 1
            for ids in tok.encode_batch(texts[i:j], num_threads=num_threads):
                yield np.array([tok.eot] + ids, dtype=np.uint16)
            i = j


# -----------------------------------------------------------------------------------------------------
# shards

def atomic_write(path, write_fn, mode="wb"):
    """Write through a temporary file in the same folder, then rename: a crash never leaves half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: after a power cut, the old file or the whole new one
        os.replace(tmp, path)
        if hasattr(os, "O_DIRECTORY"):  # the rename itself on disk too: it is an entry in the folder (POSIX)
            fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def remove_killed_writes(folder):
    """Delete what atomic_write left in folder where its process was killed mid-write (kill -9, the OOM
    killer, a power cut): NAME.tmpPID files whose process is gone. Each can be a whole shard (200 MB of
    FineWeb), and no later run would otherwise touch them."""
    for entry in os.listdir(folder):
        m = re.fullmatch(r".+\.tmp(\d+)", entry)
        if not m or not os.path.isfile(os.path.join(folder, entry)):
            continue
        try:
            os.kill(int(m[1]), 0)   # signal 0: only asks whether the process exists
            continue                # it does: perhaps writing this file now
        except ProcessLookupError:
            pass
        except (OverflowError, OSError):  # another user's process (PermissionError), or no such pid possible
            continue
        os.remove(os.path.join(folder, entry))
        print(f"{folder}: removed {entry}, left by a write that was killed")


def write_shard(path, tokens):
    tokens = np.asarray(tokens)
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):  # astype would cut 1.7 to 1 silently
        raise ValueError(f"shard {path}: token ids must be integers, got an array of {tokens.dtype}")
    if tokens.dtype != np.uint16:
        # an error, not an assert: python -O would drop it, and astype would wrap 65536 to 0 silently
        if tokens.size and not (tokens.min() >= 0 and tokens.max() < 2**16):
            raise ValueError(f"shard {path}: token ids must lie in [0, 65535] to fit uint16, got "
                             f"{tokens.min()} to {tokens.max()}")
        tokens = tokens.astype(np.uint16)
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = MAGIC, VERSION, len(tokens)

    def write(f):
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    atomic_write(path, write)


def command_line(script, **options):
    """`python <script> --key=value ...` for the options given a value (None: left out; True: a bare flag): the
    command that remakes a dataset with its non-default settings, which meta.json keeps for error messages.
    Values are shell-quoted: the errors hand this line to the user to paste, spaces in a path and all."""
    flags = [f"--{k}" if v is True else f"--{k}={shlex.quote(str(v))}" for k, v in options.items()
             if v is not None and v is not False]
    return " ".join(["python", script, *flags])


def prepare_command(data_dir):
    """What to run to (re)make the shards in data_dir, for error messages."""
    try:
        with open(os.path.join(data_dir, "meta.json")) as f:
            return json.load(f)["prepare"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return known_prepare_command(data_dir) or "the data/<dataset>/prepare.py that wrote these shards (see README, Datasets)"


def known_prepare_command(data_dir):
    """The command that makes data_dir when it is one of the folders our scripts write under data/, else None."""
    script = os.path.join(data_dir, "prepare.py")
    if os.path.abspath(data_dir) == os.path.join(REPO, "data", "fineweb"):  # its script fills other folders
        return f"python {os.path.relpath(script)}, then train with --dataset=fineweb10B (--edu: finewebedu10B)"
    if os.path.exists(script):  # builtin, shakespeare: the script sits in the folder it fills
        # data/text takes its source as an argument: without it the hint would only give a usage error
        text = os.path.abspath(data_dir) == os.path.join(REPO, "data", "text")
        return f"python {os.path.relpath(script)}" + (" --input=PATH (a text file or a folder of them)" if text else "")
    name, data = os.path.basename(os.path.normpath(data_dir)), os.path.join(REPO, "data")
    if os.path.dirname(os.path.abspath(data_dir)) == data and name in ("fineweb10B", "finewebedu10B"):
        script = os.path.relpath(os.path.join(data, "fineweb", "prepare.py"))
        return f"python {script}" + (" --edu" if name == "finewebedu10B" else "")
    return None


def read_shard(path):
    """Check magic, version and size, then memory-map the tokens: a uint16 array of the shard's length."""
    hint = prepare_command(os.path.dirname(os.path.abspath(path)))
    if not os.path.exists(path):
        raise FileNotFoundError(f"shard {path} is missing; run: {hint}")
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"shard {path} is {size} bytes, shorter than its 1024-byte header; re-run: {hint}")
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ValueError(f"shard {path} has magic {header[0]}, expected {MAGIC} (not an llm.c token shard?); "
                         f"re-run: {hint}")
    if header[1] != VERSION:
        raise ValueError(f"shard {path} has version {header[1]}, expected {VERSION} (uint16 tokens); "
                         f"re-run: {hint}")
    ntok = int(header[2])
    if size != HEADER_BYTES + 2 * ntok:
        raise ValueError(f"shard {path} is {size} bytes but its header promises {ntok} tokens "
                         f"({HEADER_BYTES + 2 * ntok} bytes): truncated or corrupt; re-run: {hint}")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_BYTES, shape=(ntok,))


# greedy: a name may itself hold "_train_"; not hidden files (macOS copies leave ._<name> beside each file)
SHARD_NAME = re.compile(r"([^.].*)_(train|val)_(\d{6})\.bin")


def shard_paths(data_dir, split):
    """The split's shards, <name>_<split>_NNNNNN.bin, in order. Matched by name, not by a glob pattern, so
    that a dataset named my_train_set keeps its val shards out of training, and [ ] in a path are letters."""
    names = os.listdir(data_dir) if os.path.isdir(data_dir) else []
    paths = sorted(os.path.join(data_dir, f) for f in names if (m := SHARD_NAME.fullmatch(f)) and m[2] == split)
    if not paths:
        raise FileNotFoundError(f"no {split} shards (*_{split}_*.bin) in {data_dir}; run: "
                                f"{prepare_command(data_dir)}")
    return paths


def check_counts(data_dir, meta):
    """The shards in data_dir hold the tokens meta.json counts, split by split: a folder that two
    preparations wrote into (another dataset's shards under another name) would otherwise train on both
    while the counts said one."""
    for split in ("train", "val"):
        if f"{split}_tokens" not in meta:
            continue
        by_name = {}
        for path in shard_paths(data_dir, split):
            name = SHARD_NAME.fullmatch(os.path.basename(path))[1]
            by_name[name] = by_name.get(name, 0) + len(read_shard(path))
        if sum(by_name.values()) != meta[f"{split}_tokens"]:
            found = ", ".join(f"{name}_{split}_*.bin: {n:,}" for name, n in sorted(by_name.items()))
            raise ValueError(f"{data_dir}: meta.json counts {meta[f'{split}_tokens']:,} {split} tokens but the "
                             f"{split} shards hold {sum(by_name.values()):,} ({found}). Shards of another "
                             f"preparation in the same folder? Delete those not written by: {prepare_command(data_dir)}")


def load_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing (data not prepared, or preparation was interrupted); "
                                f"run: {prepare_command(data_dir)}")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-run: {prepare_command(data_dir)}")
    missing = [k for k in ("tokenizer", "vocab_size", "train_tokens") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: not written by a prepare script; re-run: "
                         f"{prepare_command(data_dir)}")
    # a value of the wrong type (a file edited by hand) would fail far from here, in numpy or in a format string
    def whole(x, low, high=None):
        return isinstance(x, int) and not isinstance(x, bool) and x >= low and (high is None or x <= high)
    wrong = [f"tokenizer={meta['tokenizer']!r} (expected 'gpt2' or 'bytes')"] if meta["tokenizer"] not in ("gpt2", "bytes") else []
    wrong += [f"vocab_size={meta['vocab_size']!r} (expected a whole number from 1 to 65,536: uint16 shards)"] \
        if not whole(meta["vocab_size"], 1, 2**16) else []
    wrong += [f"{k}={meta[k]!r} (expected a whole number of tokens)" for k in ("train_tokens", "val_tokens")
              if k in meta and not whole(meta[k], 0)]
    if wrong:
        raise ValueError(f"{path} has {'; '.join(wrong)}: not as a prepare script writes it; re-run: "
                         f"{prepare_command(data_dir)}")
    return meta


class ShardWriter:
    """Stream documents into <name>_<split>_%06d.bin shards of shard_tokens each; returns token count."""

    def __init__(self, out_dir, name, split, shard_tokens=SHARD_TOKENS):
        # no leading dot: shard_paths passes over hidden names (SHARD_NAME), so a folder called .corpus
        # would get shards that no run could find
        name = name.lstrip(".") or "data"
        self.out_dir, self.name, self.split, self.shard_tokens = out_dir, name, split, shard_tokens
        self.buf, self.nbuf, self.index, self.total = [], 0, 0, 0
        os.makedirs(out_dir, exist_ok=True)

    def add(self, doc):
        while len(doc):  # a document may straddle two shards, as in llm.c
            take = doc[: self.shard_tokens - self.nbuf]
            self.buf.append(take)
            self.nbuf += len(take)
            doc = doc[len(take):]
            if self.nbuf == self.shard_tokens:
                self._flush()

    def _flush(self):
        path = os.path.join(self.out_dir, f"{self.name}_{self.split}_{self.index:06d}.bin")
        write_shard(path, np.concatenate(self.buf) if self.buf else np.zeros(0, np.uint16))
        self.total += self.nbuf
        self.buf, self.nbuf, self.index = [], 0, self.index + 1

    def close(self):
        if self.nbuf or self.index == 0:
            self._flush()
        # a re-run that makes fewer shards must not leave old ones behind for the loader to find
        pattern = re.compile(rf"{re.escape(self.name)}_{self.split}_(\d+)\.bin$")
        for f in os.listdir(self.out_dir):
            m = pattern.match(f)
            if m and int(m.group(1)) >= self.index:
                os.remove(os.path.join(self.out_dir, f))
        return self.total


def write_meta(out_dir, **info):
    atomic_write(os.path.join(out_dir, "meta.json"), lambda f: json.dump(info, f, indent=1), mode="w")


def write_dataset(out_dir, name, splits, tok, source, prepare, num_threads=8, progress=None, **extra):
    """splits: {'val': texts, 'train': texts} (iterables of str). Writes the shards, then meta.json last,
    so a meta.json on disk means a complete dataset. prepare: the command that remakes it (for errors).
    progress(n) is called after each n documents."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:  # a file in the way, or no permission: say so before any tokenizing
        raise SystemExit(f"out_dir {out_dir}: cannot make that folder ({e.strerror})")
    if os.path.exists(os.path.join(out_dir, "meta.json")):
        os.remove(os.path.join(out_dir, "meta.json"))  # incomplete until rewritten below
    remove_killed_writes(out_dir)
    counts = {}
    for split, texts in splits.items():
        w = ShardWriter(out_dir, name, split)
        batch = []

        def flush():
            for doc in tokenize(batch, tok, num_threads):
                w.add(doc)
            if progress:
                progress(len(batch))
            batch.clear()
        for t in texts:
            batch.append(t)
            if len(batch) == 256:
                flush()
        flush()
        counts[f"{split}_tokens"] = w.close()
    fallback = {"fallback_for": tok.fallback_for} if tok.fallback_for else {}  # train.py says so on every run
    write_meta(out_dir, tokenizer=tok.name, vocab_size=tok.vocab_size, eot=tok.eot, source=source,
               prepare=prepare, **fallback, **counts, **extra)
    return counts

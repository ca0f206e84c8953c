"""
The built-in corpus: the Python source files this Python installation already carries (its standard
library, then its installed packages), tokenized into llm.c shards. No network, and every machine has it.

Deterministic: files are ordered by a hash of their relative path (a fixed shuffle); with a size cap the
first max_mb of that order is kept, and the first 1% of it (at least 4 files) is the validation split.

    python data/builtin/prepare.py                  # stdlib + site-packages, up to 256 MB of source
    python data/builtin/prepare.py --max_mb=16      # what train.py does by itself on a CPU-only machine
"""
import argparse
import os
import sys
import sysconfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tqdm import tqdm  # noqa: E402

from data.common import command_line, get_tokenizer, path_order, read_text, write_dataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}


def source_files(site_packages=True):
    """[(relative path, full path)] of the installation's .py files, in hash order."""
    paths = sysconfig.get_paths()
    roots = {"stdlib": paths["stdlib"]}
    if site_packages:
        roots["site-packages"] = paths["purelib"]
        if paths["platlib"] != paths["purelib"]:
            roots["platlib"] = paths["platlib"]
    files = []
    for label, root in roots.items():
        for d, dirs, names in os.walk(root):
            # skip test suites (big, repetitive) and, inside the stdlib, the packages walked separately
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")]
            for n in names:
                full = os.path.join(d, n)
                # a dangling link or a file we may not read is skipped: the corpus is whatever the
                # installation holds, and one odd file must not stop `python train.py`'s first run
                if n.endswith(".py") and os.path.isfile(full) and os.access(full, os.R_OK):
                    files.append((label + "/" + os.path.relpath(full, root).replace(os.sep, "/"), full))
    files.sort(key=lambda f: path_order(f[0]))
    return files


def read_lenient(path):
    """Python sources are UTF-8 unless they declare another coding (PEP 263), which a few old ones do;
    their odd byte in a comment becomes U+FFFD here rather than stopping `python train.py`'s first run."""
    return read_text(path, errors="replace")


def prepare(out_dir=HERE, max_mb=256.0, site_packages=True, tokenizer="gpt2"):
    tok = get_tokenizer(tokenizer)
    files, total = [], 0
    for rel, full in source_files(site_packages):
        if total >= max_mb * 1e6:
            break
        files.append(full)
        total += os.path.getsize(full)
    n_val = max(4, len(files) // 100)
    val, train = files[:n_val], files[n_val:]
    if not train:
        raise SystemExit(f"only {len(files)} source files found: too few for a train/val split")
    source = (f"python {sys.version.split()[0]} {'stdlib + site-packages' if site_packages else 'stdlib'} "
              f".py files, {len(files)} files, {total / 1e6:.1f} MB (cap {max_mb} MB)")
    print(f"builtin corpus: {source} -> {out_dir}")
    with tqdm(total=len(files), unit="file", desc="tokenizing", disable=None) as bar:
        counts = write_dataset(out_dir, "builtin", {"val": map(read_lenient, val), "train": map(read_lenient, train)},
                               tok, source, command_line(
                                   "data/builtin/prepare.py",
                                   out_dir=os.path.abspath(out_dir) if os.path.abspath(out_dir) != HERE else None,
                                   max_mb=f"{max_mb:g}" if max_mb != 256.0 else None,
                                   no_site_packages=not site_packages,
                                   tokenizer=tokenizer if tokenizer != "gpt2" else None),
                               num_threads=os.cpu_count() or 1,
                               progress=bar.update,
                               val_files=len(val), train_files=len(train))
    print(f"builtin corpus: {counts['train_tokens']:,} train and {counts['val_tokens']:,} val tokens "
          f"({tok.name} tokenizer)")
    return counts


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", type=os.path.expanduser, default=HERE)
    p.add_argument("--max_mb", type=float, default=256.0, help="cap on source text, in MB")
    p.add_argument("--no_site_packages", action="store_true", help="the standard library only")
    p.add_argument("--tokenizer", default="gpt2", choices=["gpt2", "bytes"])
    a = p.parse_args()
    prepare(a.out_dir, a.max_mb, not a.no_site_packages, a.tokenizer)

"""
Any local text: one file, or a folder of files, tokenized into llm.c shards.

- A file is one document: the first 90% of its characters are train, the last 10% val (as nanoGPT does).
- A folder: every file with one of --ext is a document; files are ordered by a hash of their relative
  path, and the first 1% of that order (at least one file) is val. Deterministic, safe to re-run.

    python data/text/prepare.py --input=notes.txt                      # -> data/text/
    python data/text/prepare.py --input=~/books --out_dir=data/books   # then train.py --dataset=books
"""
import argparse
import os
import shlex
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tqdm import tqdm  # noqa: E402

from data.common import command_line, get_tokenizer, path_order, read_text, write_dataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


DEFAULT_EXTS = (".txt", ".md", ".rst", ".py")


def prepare(input_path, out_dir=HERE, tokenizer="gpt2", exts=DEFAULT_EXTS, command=None):
    input_path = os.path.abspath(os.path.expanduser(input_path))
    out_dir = os.path.abspath(out_dir)
    command = command or command_line("data/text/prepare.py", input=input_path, out_dir=out_dir,
                                      tokenizer=tokenizer if tokenizer != "gpt2" else None,
                                      ext=",".join(exts) if tuple(exts) != DEFAULT_EXTS else None)
    # endings compared without case (NOTES.TXT is a .txt), each with its dot (txt: not footxt)
    ends = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in exts)
    name = os.path.basename(out_dir)  # absolute first: --out_dir=. names the folder, not "."
    tok = get_tokenizer(tokenizer)
    if os.path.isfile(input_path):
        text = read_text(input_path)
        if not text.strip():
            raise SystemExit(f"{input_path} holds no text ({len(text)} characters, all of them space)")
        cut = int(0.9 * len(text))
        splits, n_docs = {"val": [text[cut:]], "train": [text[:cut]]}, 2
        source = f"{input_path} ({len(text):,} characters; last 10% is val)"
    elif os.path.isdir(input_path):
        files = []
        for d, dirs, names in os.walk(input_path):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            # hidden files (editor locks such as .#notes.txt, often dangling links) and non-files are skipped
            files += [os.path.relpath(os.path.join(d, n), input_path) for n in names
                      if n.lower().endswith(ends) and not n.startswith(".") and os.path.isfile(os.path.join(d, n))]
        if len(files) < 2:
            raise SystemExit(f"{input_path} holds {len(files)} files ending in {ends}: need 2 or more for "
                             "a train/val split (or pass a single file)")
        files.sort(key=path_order)
        n_val = max(1, len(files) // 100)
        full = [os.path.join(input_path, f) for f in files]
        # every file must read as UTF-8 before the first shard is overwritten: one found bad halfway would
        # leave a re-run's folder half old dataset, half new, with its meta.json gone
        for path in tqdm(full, unit="file", desc="checking UTF-8", disable=None):
            read_text(path)
        splits, n_docs = {"val": map(read_text, full[:n_val]), "train": map(read_text, full[n_val:])}, len(full)
        source = f"{input_path} ({len(files)} files, {n_val} of them val)"
    else:
        raise SystemExit(f"--input {input_path} does not exist")
    with tqdm(total=n_docs, unit="doc", desc="tokenizing", disable=None) as bar:
        counts = write_dataset(out_dir, name, splits, tok, source, command, num_threads=os.cpu_count() or 1,
                               progress=bar.update)
    print(f"{out_dir}: {counts['train_tokens']:,} train and {counts['val_tokens']:,} val tokens ({tok.name})")
    # train.py takes a bare name from the repository's data/ folder, whatever folder it runs in
    in_data = os.path.dirname(out_dir) == os.path.dirname(HERE)
    print(f"train on it: python train.py --dataset={name if in_data else shlex.quote(out_dir)}")
    return counts


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="a text file or a folder of text files")
    p.add_argument("--out_dir", type=os.path.expanduser, default=HERE,
                   help="where the shards go; train with --dataset=<that folder>")
    p.add_argument("--tokenizer", default="gpt2", choices=["gpt2", "bytes"])
    p.add_argument("--ext", default=".txt,.md,.rst,.py", help="file endings to read from a folder")
    a = p.parse_args()
    prepare(a.input, a.out_dir, a.tokenizer, tuple(a.ext.split(",")))

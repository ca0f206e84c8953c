"""
FineWeb / FineWeb-Edu, already tokenized with GPT-2 into llm.c shards (the files modded-nanogpt uses):
100M tokens per shard, shard 0 is val. Files already present and intact are skipped, so re-running
resumes an interrupted download; each file is written to a temporary name, then renamed.

    python data/fineweb/prepare.py                    # val + 8 train shards (900M tokens) -> data/fineweb10B
    python data/fineweb/prepare.py --train_shards=103 # all of FineWeb 10B
    python data/fineweb/prepare.py --edu              # FineWeb-Edu 10B (99 train shards) -> data/finewebedu10B
then: python train.py --dataset=fineweb10B ...
"""
import argparse
import http.client
import os
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tqdm import tqdm  # noqa: E402

from data.common import atomic_write, command_line, read_shard, remove_killed_writes, shard_paths, write_meta  # noqa: E402

DATA = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = {  # name: (Hugging Face dataset, file prefix, train shards available)
    "fineweb10B": ("kjj0/fineweb10B-gpt2", "fineweb", 103),
    "finewebedu10B": ("kjj0/finewebedu10B-gpt2", "finewebedu", 99),
}


def download(url, path):
    with urllib.request.urlopen(url, timeout=60) as r, tqdm(total=int(r.headers.get("Content-Length", 0)),
                                                            unit="B", unit_scale=True, desc=os.path.basename(path),
                                                            disable=None) as bar:
        def write(f):
            got, want = 0, int(r.headers.get("Content-Length", -1))
            while chunk := r.read(1 << 20):
                f.write(chunk)
                got += len(chunk)
                bar.update(len(chunk))
            if want >= 0 and got != want:  # a dropped connection ends the reads early, without an error
                raise OSError(f"connection closed after {got:,} of {want:,} bytes")
        atomic_write(path, write)  # an error above leaves no file under the shard's name


def prepare(name="fineweb10B", train_shards=8, out_dir=None):
    repo, prefix, available = SOURCES[name]
    if train_shards < 1:  # train.py needs train shards; a val-only folder would be recorded as a dataset
        raise SystemExit(f"--train_shards={train_shards}: need 1 or more (each is 100M tokens; {available} exist)")
    out_dir = out_dir or os.path.join(DATA, name)
    os.makedirs(out_dir, exist_ok=True)
    meta = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta):  # an earlier run's counts: incomplete until rewritten below (a download may stop)
        os.remove(meta)
    remove_killed_writes(out_dir)
    files = [f"{prefix}_val_000000.bin"]
    files += [f"{prefix}_train_{i:06d}.bin" for i in range(1, min(train_shards, available) + 1)]
    counts = {"val_tokens": 0, "train_tokens": 0}
    for fname in files:
        path = os.path.join(out_dir, fname)
        try:
            tokens = read_shard(path)  # present and intact: keep it
        except (OSError, ValueError):
            url = f"https://huggingface.co/datasets/{repo}/resolve/main/{fname}"
            try:
                download(url, path)
                tokens = read_shard(path)
            except (OSError, ValueError, http.client.HTTPException) as e:
                raise SystemExit(f"could not download {url} ({e}); the files already here are kept, re-run to "
                                 "continue")
        counts["val_tokens" if "_val_" in fname else "train_tokens"] += len(tokens)
    # train shards beyond the ones asked for (an earlier run asked for more) are kept, and the loader reads
    # every shard in the folder, so they are counted too
    present = shard_paths(out_dir, "train")
    extra = sorted(set(present) - {os.path.join(out_dir, f) for f in files})
    for path in extra:
        counts["train_tokens"] += len(read_shard(path))
    if extra:
        print(f"{out_dir}: {len(extra)} more train shards from an earlier run are kept and will be trained on "
              "(delete them to train on fewer)")
    command = command_line("data/fineweb/prepare.py", train_shards=train_shards, edu="edu" in name,
                           out_dir=os.path.abspath(out_dir) if os.path.abspath(out_dir) != os.path.join(DATA, name)
                           else None)
    write_meta(out_dir, tokenizer="gpt2", vocab_size=50257, eot=50256, source=f"huggingface.co/datasets/{repo}",
               prepare=command, **counts)
    print(f"{out_dir}: {counts['train_tokens']:,} train and {counts['val_tokens']:,} val tokens")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--edu", action="store_true", help="FineWeb-Edu instead of FineWeb")
    p.add_argument("--train_shards", type=int, default=8, help="how many 100M-token train shards")
    p.add_argument("--out_dir", type=os.path.expanduser, default=None)
    a = p.parse_args()
    prepare("finewebedu10B" if a.edu else "fineweb10B", a.train_shards, a.out_dir)

"""
Tiny Shakespeare (1.1 MB): downloaded once to data/shakespeare/input.txt, or taken from --input.
The first 90% of the characters are train, the last 10% val (nanoGPT's split).

    python data/shakespeare/prepare.py                                   # download
    python data/shakespeare/prepare.py --input=path/to/tinyshakespeare.txt   # offline, from a copy
    python data/shakespeare/prepare.py --tokenizer=bytes                 # byte-level, like shakespeare_char
"""
import argparse
import http.client
import os
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import atomic_write, command_line  # noqa: E402
from data.text.prepare import prepare as prepare_text  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def prepare(input_path=None, out_dir=HERE, tokenizer="gpt2"):
    command = command_line("data/shakespeare/prepare.py", input=input_path and os.path.abspath(input_path),
                           out_dir=os.path.abspath(out_dir) if os.path.abspath(out_dir) != HERE else None,
                           tokenizer=tokenizer if tokenizer != "gpt2" else None)
    if input_path is None:
        input_path = os.path.join(out_dir, "input.txt")
        if not os.path.exists(input_path):
            print(f"downloading {URL}")
            os.makedirs(out_dir, exist_ok=True)
            try:
                with urllib.request.urlopen(URL, timeout=60) as r:
                    data = r.read()
            except (OSError, http.client.HTTPException) as e:  # IncompleteRead: the connection dropped
                raise SystemExit(f"could not download {URL} ({e}); offline, pass a local copy: "
                                 "python data/shakespeare/prepare.py --input=path/to/tinyshakespeare.txt")
            atomic_write(input_path, lambda f: f.write(data))
    return prepare_text(input_path, out_dir, tokenizer, command=command)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", type=os.path.expanduser, default=None, help="a local copy of the text (skips the download)")
    p.add_argument("--out_dir", type=os.path.expanduser, default=HERE)
    p.add_argument("--tokenizer", default="gpt2", choices=["gpt2", "bytes"])
    a = p.parse_args()
    prepare(a.input, a.out_dir, a.tokenizer)

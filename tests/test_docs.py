"""The README, SPEED.md and TESTING.md against the repository: every log, script and preset they cite
exists, the README's file list names every source file, and CI runs the README's test command. A fork
that moves a results file or adds a script without saying so fails here, not in a reader's hands."""
import fnmatch
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "SPEED.md", "TESTING.md")


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def cited_paths(text):
    """Repository paths written in backticks: `results/x.txt`, `tests/y.py`, `results/ci_session*.txt`."""
    return {m.rstrip(".,;:") for m in re.findall(r"`((?:results|tests|config|data)/[^`\s]*)`", text)}


def is_output(path, ignored=read(".gitignore").split()):
    """Whether .gitignore covers the path: a file a run makes (data/builtin/meta.json), not one shipped."""
    parts = path.rstrip("/").split("/")
    for pattern in ignored:
        folders_only = pattern.endswith("/")     # out*/ : a folder of that name, not a file
        pattern = pattern.strip("/")
        if "/" in pattern:
            if fnmatch.fnmatch(path, pattern.replace("**/", "*")):
                return True
        elif any(fnmatch.fnmatch(part, pattern) for part in (parts[:-1] if folders_only else parts)):
            return True
    return False


def test_cited_paths_exist():
    missing = []
    for doc in DOCS:
        for path in sorted(p for p in cited_paths(read(doc)) if not is_output(p)):
            found = glob.glob(os.path.join(ROOT, path)) if "*" in path else os.path.exists(os.path.join(ROOT, path))
            if not found:
                missing.append(f"{doc}: {path}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_cited_paths_are_found():
    """The pattern above must see what the docs cite, or the test before checks nothing."""
    paths = cited_paths("see `results/a.txt`, `tests/b.py`; and `results/ci_*.txt`. not results/c.txt")
    assert paths == {"results/a.txt", "tests/b.py", "results/ci_*.txt"}
    assert len(cited_paths(read("README.md"))) > 50
    assert is_output("data/builtin/meta.json") and is_output("data/x/y_train_000000.bin")
    assert not is_output("data/builtin/prepare.py") and not is_output("results/session55/train_cpu_default.txt")
    assert is_output("out/ckpt.pt") and is_output("out_sdpa/metrics.jsonl") and not is_output("results/output.txt")


def test_readme_lists_every_source_file():
    readme = read("README.md")
    listing = readme[readme.index("\n## Files\n"):]
    listed = set(re.findall(r"^    (\S+)", listing, re.M))
    files = [os.path.relpath(p, ROOT) for pattern in ("*.py", "*.md", "tests/*.py", "config/*.py", "data/**/*.py")
             for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)]
    unlisted = sorted(f for f in files if f not in listed)
    assert files and not unlisted, f"not in the README's Files section: {unlisted}"


def test_ci_runs_the_readme_test_command():
    readme = read("README.md")
    setup = readme[readme.index("## Set up and run"):readme.index("\n## ", readme.index("## Set up and run") + 1)]
    commands = re.findall(r"^    (pip install .*)$", setup, re.M)
    assert len(commands) == 2 and commands[0].endswith("python train.py"), commands
    test_command = commands[1]
    ci = [line for line in read(".ci/run").splitlines() if line and not line.startswith("#")]
    assert ci[-1] == test_command, (ci[-1], test_command)

"""
Typed configuration for train.py, sample.py and bench_train.py: a dataclass of defaults, then the
command line applied left to right. A preset is a small Python file of assignments (`n_layer = 6`);
`--key=value` sets one field. An unknown key, or a value that does not fit the field's type, is an error
that names the key (nanoGPT's configurator accepts typos silently; this one does not).

    python train.py config/shakespeare.py --batch_size=32 --compile=False
    python train.py config/shakespeare.py --help     # every setting, its type and its value at that point
"""
import ast
import dataclasses
import difflib
import inspect
import os
import re
import sys
import traceback
import types
import typing


class ConfigError(ValueError):
    pass


def _imported_names(source, path):
    """The names a preset's import statements bind (`from math import pi`: pi). A star import binds names
    no one wrote down, any of which would be taken for a setting: refused."""
    names, nodes = set(), list(ast.parse(source, path).body)
    while nodes:    # the module's own statements, not the bodies of its functions and classes
        node = nodes.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        nodes.extend(ast.iter_child_nodes(node))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    raise ConfigError(f"config file {path}, line {node.lineno}: `from {node.module} import *` "
                                      "would make every name it brings a setting; import names one by one, and to "
                                      "build on another preset, give both: SCRIPT.py config/a.py mine.py")
                names.add(alias.asname or alias.name.split(".")[0])
    return names


def run_script(main):
    """A script's `if __name__ == "__main__"`: main(), and where the reader stops early (`python train.py
    --help | head`) a quiet end with Python's status for a broken pipe, not a BrokenPipeError traceback;
    Ctrl-C ends it with the shell's status for SIGINT (130), not a KeyboardInterrupt traceback."""
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # and none at exit, when stdout is flushed
        sys.exit(1)


def check_device(device):
    """The device settings the scripts share: auto, cpu, cuda, cuda:N (torch.device would raise a traceback)."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ConfigError(f"device={device!r}: expected auto, cpu, cuda or cuda:N")
    if device.startswith("cuda:"):
        import torch
        n = torch.cuda.device_count()
        if n and int(device[5:]) >= n:   # no GPU at all: each script says so in its own words
            raise ConfigError(f"device={device}: this machine has {n} CUDA GPU"
                              + (": cuda:0" if n == 1 else f"s: cuda:0 to cuda:{n - 1}"))


def pick_device(device):
    """The torch.device of a checked device setting (auto: the GPU if PyTorch sees one). A cuda device where
    PyTorch sees none stops here with a message rather than deep in a traceback. (train.py picks its own:
    under torchrun each process takes the GPU of its LOCAL_RANK.)"""
    import torch  # here, so that the config module itself needs no torch
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"device={device}: PyTorch sees no CUDA GPU here; use --device=cpu (or auto)")
    return torch.device(device)


def _convert(key, value, typ, where):
    """value (a str from the command line, or a Python value from a preset) as the field's type."""
    choices = typing.get_args(typ) if typing.get_origin(typ) is typing.Literal else None
    from_cli = isinstance(value, str) and where.startswith("--")
    if choices is not None:
        if value in choices:
            return value
        raise ConfigError(f"{key}={value!r} ({where}): expected one of {', '.join(map(repr, choices))}")
    if typ is bool:
        if from_cli and value.lower() in ("true", "1", "yes"):
            return True
        if from_cli and value.lower() in ("false", "0", "no"):
            return False
        if isinstance(value, bool):
            return value
    elif typ is int:
        try:
            if from_cli:
                return int(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        except ValueError:
            pass
    elif typ is float:
        try:
            if from_cli:
                return float(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        except ValueError:
            pass
    elif typ is str:
        if isinstance(value, str):
            return value
    else:
        raise ConfigError(f"{key}: the configurator does not handle fields of type {typ}")
    raise ConfigError(f"{key}={value!r} ({where}): expected a value of type {typ.__name__}")


def _set(cfg, key, value, where, hints):
    if key not in hints:
        close = difflib.get_close_matches(key, list(hints), n=1)
        helper = "" if where.startswith("--") else "; a preset's own helper values need names that start with _"
        raise ConfigError(f"unknown config key {key!r} ({where})" + (f"; did you mean {close[0]!r}?" if close else "")
                          + helper)
    setattr(cfg, key, _convert(key, value, hints[key], where))


def usage(cfg, hints):
    """--help: each field, its type, its value so far (defaults, then the arguments before --help) and the
    comment written beside it in the dataclass, so the dataclass stays the one place settings are described."""
    comments = {}
    try:
        source = inspect.getsource(type(cfg))
    except (OSError, TypeError):    # no source beside the code (frozen, .pyc only): the settings without comments
        source = ""
    for line in source.splitlines():
        m = re.match(r"\s*(\w+)\s*:[^#]*#\s*(.*)", line)
        if m:
            comments[m[1]] = m[2]
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0].endswith(".py") else "SCRIPT.py"
    rows = [(f"--{key}={getattr(cfg, key)}",
             "|".join(map(str, typing.get_args(typ))) if typing.get_origin(typ) is typing.Literal else typ.__name__,
             comments.get(key, "")) for key, typ in hints.items()]
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    return "\n".join([f"usage: python {script} [preset.py ...] [--key=value ...]   (applied left to right)",
                      "settings (type, and what the code says of it):"]
                     + [f"  {a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows])


def parse(cfg, argv):
    """Apply presets and --key=value overrides from argv to the dataclass instance cfg; returns cfg.
    -h or --help prints the settings as they stand at that point and exits."""
    hints = typing.get_type_hints(type(cfg))
    hints = {f.name: hints[f.name] for f in dataclasses.fields(cfg)}
    for arg in argv:
        if arg in ("-h", "--help"):
            print(usage(cfg, hints))
            raise SystemExit(0)
        if arg.startswith("--"):
            if "=" not in arg:
                raise ConfigError(f"{arg}: write overrides as --key=value")
            key, value = arg[2:].split("=", 1)
            _set(cfg, key, value, arg, hints)
        else:
            if not os.path.isfile(arg):
                raise ConfigError(f"config file {arg} not found (arguments are preset files or --key=value)")
            namespace = {}
            try:
                with open(arg, encoding="utf-8") as f:
                    source = f.read()
            except UnicodeDecodeError as e:
                raise ConfigError(f"config file {arg} is not UTF-8 text (byte {e.start})")
            try:
                code = compile(source, arg, "exec")
            except SyntaxError as e:
                raise ConfigError(f"config file {arg}, line {e.lineno}: {e.msg}")
            imported = _imported_names(source, arg)
            settings = sorted(imported & hints.keys())
            if settings:  # an imported name is never taken for a setting, so it would stay at its default silently
                raise ConfigError(f"config file {arg} imports {', '.join(settings)}: imported names are not settings, "
                                  "so this would leave them at their defaults; to build on another preset, give "
                                  "both, left to right: SCRIPT.py config/a.py mine.py")
            try:
                exec(code, namespace)
            except Exception as e:  # a preset is Python: name its line, as for a syntax error
                line = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == arg]
                raise ConfigError(f"config file {arg}, line {line[-1] if line else '?'}: {type(e).__name__}: {e}")
            for key, value in namespace.items():
                # settings only: not what the preset imported (modules, functions, constants such as math's
                # pi) or defined, nor its _private names (a helper value must start with _: any other name
                # is a setting)
                if (not key.startswith("_") and key not in imported and not isinstance(value, types.ModuleType)
                        and not callable(value)):
                    _set(cfg, key, value, arg, hints)
    return cfg

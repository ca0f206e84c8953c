"""ablation.py: the table from train.py's metrics.jsonl, and its refusals (no training here)."""
import json
import os
import subprocess
import sys
import types

import pytest

import ablation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(out, arm, rows):
    os.makedirs(out / arm)
    (out / arm / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_table_from_metrics_with_resumed_and_unfinished_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(ablation, "OUT", str(tmp_path))
    # sdpa: resumed at step 10, so steps 10 and the eval at 10 appear twice; the last row written counts
    _write(tmp_path, "sdpa", [{"iter": 0, "loss": 6.0, "tok_per_s": 100}, {"iter": 0, "val_loss": 6.5},
                              {"iter": 10, "loss": 9.0, "tok_per_s": 100}, {"iter": 10, "val_loss": 9.5},
                              {"iter": 10, "loss": 4.0, "tok_per_s": 300}, {"iter": 10, "val_loss": 4.5}])
    _write(tmp_path, "fp8", [{"iter": 0, "loss": 6.0}])          # stopped before its first evaluation
    _write(tmp_path, "fp8_stale", [{"iter": 0, "val_loss": 6.5}])  # stopped before its first logged step
    runs = {arm: r for arm in ablation.ARMS if (r := ablation.load(arm)) is not None}
    assert list(runs) == ["sdpa", "fp8"]
    lines = ablation.table(runs).splitlines()
    assert lines[2] == "| sdpa | 4.0000 | 4.5000 | 4.5000 | 300 |", lines[2]
    assert lines[3] == "| fp8 | 6.0000 | - | - | - |", lines[3]


@pytest.mark.parametrize("arms,message", [("fp8,bf16", "unknown arm(s) 'bf16'"), ("", "unknown arm(s) ''"),
                                          ("fp8,sdpa,fp8", "--arms names fp8 twice")])
def test_unknown_or_repeated_arm_is_refused_before_any_run(arms, message):
    """An arm named twice trained twice, the second run moving the first one's log aside; --arms= named nothing."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "ablation.py"), "run", f"--arms={arms}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and message in r.stderr and "$ " not in r.stdout, (r.stdout, r.stderr)


def test_the_last_arms_option_applies():
    """Arguments apply left to right, as train.py's do: of two --arms=, the second decides (here two unknown
    names, so that the refusal says which was read and nothing trains)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "ablation.py"), "run", "--arms=first", "--arms=second"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unknown arm(s) 'second'" in r.stderr and "'first'" not in r.stderr, r.stderr


def test_table_tail_and_median(tmp_path, monkeypatch):
    """Train loss: the mean over the last 10% of steps; tok/s: the median of the second half's figures
    (logged in any order of size)."""
    monkeypatch.setattr(ablation, "OUT", str(tmp_path))
    rows = []
    for i in range(21):
        rows.append({"iter": i, "loss": float(i), "tok_per_s": 9e9 if i < 10 else 1000 + (i * 7 % 11) * 10})
        if i % 10 == 0:
            rows.append({"iter": i, "val_loss": {0: 12.0, 10: 9.0, 20: 9.5}[i]})
    _write(tmp_path, "sdpa", rows)
    line = ablation.table({"sdpa": ablation.load("sdpa")}).splitlines()[2]
    # last 10% of 20 steps: 18, 19, 20; second half's tok/s: 1000..1100 by 10, median 1050
    assert line == "| sdpa | 19.0000 | 9.5000 | 9.0000 | 1,050 |", line


def _trailing_mean(xs, k):
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def test_plot_series(tmp_path, monkeypatch, capsys):
    """ablation.py plot, with a stand-in for matplotlib that records each series: the loss curves per arm, the
    arms' train and val loss minus the BF16 arm's at the same step, and the delta monitor's figures each
    under its own label."""
    class Ax:
        def __init__(self):
            self.series = {}

        def plot(self, x, y, *fmt, label=None, **kw):
            self.series[label] = (list(x), list(y))
        semilogy = plot

        def __getattr__(self, name):     # set, axhline, legend
            return lambda *a, **k: None
    axes = [Ax(), Ax(), Ax()]
    saved = []
    fig = types.SimpleNamespace(tight_layout=lambda: None,
                                savefig=lambda f, dpi=None, format=None: saved.append((f.name, format)))
    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda *a, **k: (fig, axes)
    mpl = types.ModuleType("matplotlib")
    mpl.use, mpl.pyplot = (lambda backend: None), pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    monkeypatch.setattr(ablation, "OUT", str(tmp_path))

    iters = list(range(10))
    base = [5.0 - 0.1 * i for i in iters]
    arms = {"sdpa": (base, [6.0, 5.5, 5.1]),
            "fp8_stale": ([b - 0.02 * i for i, b in enumerate(base)], [5.9, 5.3, 4.8]),
            "fp8": ([b + 0.01 * i for i, b in enumerate(base)], [6.1, 5.7, 5.4]),
            "sdpa_seed2": ([b + 0.05 for b in base], [6.3, 5.6, 5.3]),
            "fp8_seed2": ([b + 0.03 * i for i, b in enumerate(base)], [6.2, 5.8, 5.6])}   # not a default arm
    monitor = {"fp8_stale": (1e-2, 2e-2, 3e-3), "fp8": (1.1e-2, 2.5e-2, 2e-3), "sdpa": (1.2e-2, 3e-2, 1e-3),
               "sdpa_seed2": (1.4e-2, 3.1e-2, 1.1e-3), "fp8_seed2": (1.3e-2, 2.6e-2, 4e-3)}
    for arm, (loss, val) in arms.items():
        mismatch, stale, matched = monitor[arm]
        rows = [{"iter": i, "loss": x} for i, x in zip(iters, loss)]
        rows += [{"iter": i, "val_loss": x, "delta_mismatch": mismatch * (n + 1), "key_grad_sum_stale": stale * (n + 1),
                  "key_grad_sum_matched": matched * (n + 1)} for n, (i, x) in enumerate(zip((0, 5, 9), val))]
        _write(tmp_path, arm, rows)
    ablation.plot()
    assert len(saved) == 1 and saved[0][0].startswith(str(tmp_path / "ablation.png.tmp")) and saved[0][1] == "png"
    assert os.path.exists(tmp_path / "ablation.png"), "written through a temporary file, then renamed"
    loss_ax, diff_ax, mon_ax = (ax.series for ax in axes)
    assert set(loss_ax) == set(arms) and set(diff_ax) == {f"{a}: {s}" for a in ("fp8_stale", "fp8", "sdpa_seed2",
                                                                                 "fp8_seed2")
                                                         for s in ("train (smoothed)", "val")}
    for arm, (loss, val) in arms.items():
        assert loss_ax[arm] == (iters, pytest.approx(_trailing_mean(loss, 3))), arm
        mismatch, stale, matched = monitor[arm]
        assert mon_ax[f"{arm}: delta mismatch"] == ([0, 5, 9], pytest.approx([mismatch, 2 * mismatch, 3 * mismatch]))
        assert mon_ax[f"{arm}: key-grad sum, stale"] == ([0, 5, 9], pytest.approx([stale, 2 * stale, 3 * stale]))
        assert mon_ax[f"{arm}: key-grad sum, matched"] == ([0, 5, 9], pytest.approx([matched, 2 * matched, 3 * matched]))
        if arm != "sdpa":     # against the BF16 arm of its own seed (sdpa_seed2 for fp8_seed2); sdpa_seed2 against sdpa
            b_loss, b_val = arms["sdpa_seed2" if arm == "fp8_seed2" else "sdpa"]
            want = _trailing_mean([x - b for x, b in zip(loss, b_loss)], 5)
            assert diff_ax[f"{arm}: train (smoothed)"] == (iters, pytest.approx(want)), arm
            assert diff_ax[f"{arm}: val"] == ([0, 5, 9], pytest.approx([x - b for x, b in zip(val, b_val)])), arm
    out = capsys.readouterr().out
    assert "| fp8 |" in out and "| fp8_seed2 |" in out


def test_run_commands(monkeypatch):
    """Each arm's train.py command, read as train.py reads it: the preset first, the monitor on, the caller's
    overrides, then the arm's attention, seed and out_dir (its own folder). The BF16 noise arm has a seed of
    its own; the others share one."""
    import configurator
    import train
    cmds = []
    monkeypatch.setattr(ablation.subprocess, "run", lambda cmd: (cmds.append(cmd), types.SimpleNamespace(returncode=0))[1])
    arms = ["sdpa", "sdpa_seed2", "fp8_stale", "fp8"]
    ablation.run(["--max_iters=7"], arms)
    assert len(cmds) == len(arms)
    for cmd in cmds:
        assert cmd[:2] == [sys.executable, os.path.join(ROOT, "train.py")], cmd
    cfgs = {arm: configurator.parse(train.TrainConfig(), cmd[2:]) for arm, cmd in zip(arms, cmds)}
    want = {"sdpa": "sdpa", "sdpa_seed2": "sdpa", "fp8_stale": "fp8_stale", "fp8": "fp8"}
    for arm, cfg in cfgs.items():
        assert cfg.out_dir == os.path.join(ablation.OUT, arm) and cfg.attention == want[arm], (arm, cfg)
        assert cfg.delta_monitor and cfg.max_iters == 7 and cfg.n_layer == 12 and not cfg.qk_norm, (arm, cfg)
    assert cfgs["sdpa"].seed == cfgs["fp8_stale"].seed == cfgs["fp8"].seed != cfgs["sdpa_seed2"].seed


def test_a_failed_arm_does_not_stop_the_others(monkeypatch, capsys):
    """The second of three arms fails (a stale arm diverging is an outcome the ablation looks for): the
    third still runs, and the run ends in an error naming the failed arm. It stopped at the first failure."""
    codes = iter([0, 3, 0])
    ran = []

    def fake_run(cmd):
        ran.append(cmd[-1])
        return types.SimpleNamespace(returncode=next(codes))
    monkeypatch.setattr(ablation.subprocess, "run", fake_run)
    with pytest.raises(SystemExit, match=r"^arms whose train.py failed: fp8_stale \(status 3\); the others ran$"):
        ablation.run([], ["sdpa", "fp8_stale", "fp8"])
    assert [os.path.basename(r.split("=", 1)[1]) for r in ran] == ["sdpa", "fp8_stale", "fp8"]
    assert "arm fp8_stale: train.py exited with status 3 (its output is above); the other arms go on" in \
        capsys.readouterr().out


def test_table_median_of_an_even_count(tmp_path, monkeypatch):
    """tok/s: of an even number of figures, the median is the mean of the middle two (not the upper one)."""
    monkeypatch.setattr(ablation, "OUT", str(tmp_path))
    _write(tmp_path, "sdpa", [{"iter": i, "loss": 1.0, "tok_per_s": t} for i, t in enumerate((9e9, 9e9, 9e9, 400, 200, 100, 300))])
    assert ablation.table({"sdpa": ablation.load("sdpa")}).splitlines()[2].endswith("| 250 |")


@pytest.mark.parametrize("override", ["--attention=sdpa", "--seed=5", "--out_dir=/tmp/ab"])
def test_override_of_what_each_arm_sets_is_refused_before_any_run(monkeypatch, override):
    """The arms differ in attention and seed and each writes its own folder: an override of one of these would
    make them one run (or one folder, each arm overwriting the last), so it is refused, saying why."""
    cmds = []
    monkeypatch.setattr(ablation.subprocess, "run", lambda cmd: (cmds.append(cmd), types.SimpleNamespace(returncode=0))[1])
    with pytest.raises(SystemExit) as e:
        ablation.run(["--max_iters=7", override], ["sdpa", "fp8"])
    assert cmds == [], "an arm was started"
    assert str(e.value).startswith(f"{override}: each arm sets its own attention, seed and out_dir"), str(e.value)
    assert "--arms=" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_preset_override_keeps_each_arms_folder_and_seed(monkeypatch):
    """A preset among the overrides sets out_dir (config/shakespeare.py: out-shakespeare) and may set a seed:
    the arm's own settings come after it, so every arm still trains with its seed into its own folder."""
    import configurator
    import train
    cmds = []
    monkeypatch.setattr(ablation.subprocess, "run", lambda cmd: (cmds.append(cmd), types.SimpleNamespace(returncode=0))[1])
    ablation.run([os.path.join(ROOT, "config", "shakespeare.py"), "--max_iters=7"], ["sdpa", "sdpa_seed2"])
    cfgs = [configurator.parse(train.TrainConfig(), cmd[2:]) for cmd in cmds]
    assert [c.out_dir for c in cfgs] == [os.path.join(ablation.OUT, "sdpa"), os.path.join(ablation.OUT, "sdpa_seed2")]
    assert [c.seed for c in cfgs] == [ablation.ARMS["sdpa"][1], ablation.ARMS["sdpa_seed2"][1]]
    assert all(c.max_iters == 7 and c.attention == "sdpa" for c in cfgs)


def test_each_arm_trains_the_path_its_name_says():
    """An arm's name is its attention path, then _seedN for another seed: "fp8_stale_seed2" must train
    fp8_stale (given fp8 it would put the matched arm in the stale arm's seed-to-seed spread), and no two
    arms may share a path and a seed."""
    for name, (path, seed) in ablation.ARMS.items():
        assert path == name.split("_seed")[0], f"arm {name} trains {path}"
        assert ("_seed" in name) == (seed != 1337), f"arm {name} has seed {seed}"
    assert len(set(ablation.ARMS.values())) == len(ablation.ARMS)
    # and every arm of one seed suffix has that suffix's seed: a seed-3 comparison between paths must not
    # also compare seeds
    seeds = {}
    for name, (path, seed) in ablation.ARMS.items():
        seeds.setdefault(name[len(path):], set()).add(seed)
    assert all(len(s) == 1 for s in seeds.values()), seeds
    assert len({s.pop() for s in seeds.values()}) == len(seeds), "two suffixes share a seed"


def test_plot_refuses_arms_of_other_settings_and_marks_unfinished_ones(tmp_path, monkeypatch, capsys):
    """An arm left in OUT by an earlier ablation (another width, learning rate, length) was tabulated and
    plotted beside the new ones; an arm killed or diverged partway was listed as if finished."""
    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda backend: None
    mpl.pyplot = types.ModuleType("matplotlib.pyplot")
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", mpl.pyplot)
    monkeypatch.setattr(ablation, "OUT", str(tmp_path))

    def arm(name, last, **config):
        cfg = {"n_embd": 64, "learning_rate": 1e-3, "max_iters": 10, "seed": 1, "attention": name, "out_dir": name,
               "init_from": "scratch", **config}
        rows = [{"event": "start", "config": cfg}] + [{"iter": i, "loss": 5.0 - i / 10} for i in range(last + 1)]
        _write(tmp_path, name, rows + [{"iter": i, "val_loss": 5.0} for i in range(0, last + 1, 5)])
    arm("sdpa", 10)
    arm("fp8", 10, init_from="resume")
    arm("fp8_stale", 10, n_embd=128, learning_rate=3e-3)
    with pytest.raises(SystemExit, match=r"arms trained with other settings than sdpa's: fp8_stale: "
                                         r"learning_rate=0.003 \(sdpa: 0.001\), n_embd=128 \(sdpa: 64\)"):
        ablation.plot()
    configs = {a: ablation.run_config(a) for a in ("sdpa", "fp8")}
    configs["fp8"]["max_iters"] = 2000
    lines = ablation.table({a: ablation.load(a) for a in ("sdpa", "fp8")}, configs).splitlines()
    assert lines[2].startswith("| sdpa | ") and lines[3].startswith("| fp8 (stopped at iter 10 of 2000) | "), lines


def test_a_damaged_log_line_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(ablation, "OUT", str(tmp_path))
    _write(tmp_path, "sdpa", [{"iter": 0, "loss": 5.0}])
    with open(tmp_path / "sdpa" / "metrics.jsonl", "a") as f:
        f.write('{"iter": 150, "val_lo\n')
    with pytest.raises(SystemExit, match=r"sdpa/metrics.jsonl, line 2: not a JSON row .*damaged log"):
        ablation.load("sdpa")

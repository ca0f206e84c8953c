"""
The stale-delta ablation: one model, data and seed trained with BF16 SDPA, FP8 with the stale delta and
FP8 with Delta-Matching (plus other seeds, to measure run-to-run noise), then a plot and a table.

    python ablation.py run  [--arms=a,b,...] [train.py overrides...]   # one after another, out-ablation/<arm>/
    python ablation.py plot                          # out-ablation/ablation.png and a markdown table

`run` starts `python train.py config/ablation.py --delta_monitor=True <your overrides> --attention=<path>
--seed=<seed> --out_dir=out-ablation/<arm>` per arm, so every figure comes from train.py's own metrics.jsonl:
train loss and gradient norm every log_interval steps, val loss, and at each evaluation the delta-mismatch monitor. The
arm's settings come last, so a preset among your overrides (config/*.py set out_dir) leaves each arm its own
folder and seed; --attention=, --seed= and --out_dir= overrides are refused.
The arms are sdpa, fp8_stale and fp8 at seed 1337, each at seed 2024 (`*_seed2`: another
initialization and data order) and at seed 7 (`*_seed3`, a third where two disagree); `run` trains sdpa, sdpa_seed2, fp8_stale and fp8 unless --arms= names
others. At the lengths a single GPU trains in minutes the seeds move the loss as much as the attention
does (README, "Training results"), so a claim about the arms wants two seeds of each (--arms=).
An arm whose train.py fails (diverges, say) does not stop the others; `run` then exits naming it, and
`plot` marks an arm that did not reach its max_iters. `plot` refuses arms trained with other settings
(an earlier ablation's, left in out-ablation/), and draws each arm's loss against BF16 of its own seed.
`plot` needs matplotlib (not a dependency of the trainer: `pip install matplotlib` where you plot).
"""
import json
import os
import statistics
import subprocess
import sys

from data.common import atomic_write

ROOT = os.path.dirname(os.path.abspath(__file__))
ARMS = {  # name: (attention path, seed)
    "sdpa": ("sdpa", 1337),
    "sdpa_seed2": ("sdpa", 2024),
    "fp8_stale": ("fp8_stale", 1337),
    "fp8": ("fp8", 1337),
    "fp8_stale_seed2": ("fp8_stale", 2024),   # the FP8 arms' own seed-to-seed spread
    "fp8_seed2": ("fp8", 2024),
    "sdpa_seed3": ("sdpa", 7),                # a third seed, where two disagree
    "fp8_stale_seed3": ("fp8_stale", 7),
    "fp8_seed3": ("fp8", 7),
}
DEFAULT_ARMS = ["sdpa", "sdpa_seed2", "fp8_stale", "fp8"]   # what `run` trains without --arms=
ARM_KEYS = ("attention", "seed", "out_dir")   # what `run` sets per arm, so no override may set them
OUT = os.path.join(ROOT, "out-ablation")


def run(overrides, arms):
    clash = [a for a in overrides if a.startswith("--") and a[2:].split("=", 1)[0] in ARM_KEYS]
    if clash:  # it would give every arm the same attention or seed, or one folder that each arm overwrites
        sys.exit(f"{' '.join(clash)}: each arm sets its own attention, seed and out_dir (out-ablation/<arm>, where "
                 f"`plot` reads it); choose arms with --arms= instead (the arms: {', '.join(ARMS)}), and move "
                 "out-ablation/ aside first to keep an earlier ablation")
    failed = []
    for arm in arms:
        attention, seed = ARMS[arm]
        cmd = [sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, "config", "ablation.py"),
               "--delta_monitor=True", *overrides,
               f"--attention={attention}", f"--seed={seed}", f"--out_dir={os.path.join(OUT, arm)}"]
        print("$", " ".join(cmd), flush=True)
        # an arm that stops (a stale arm diverging is one outcome the ablation looks for) does not stop
        # the others; `plot` marks it as stopped
        code = subprocess.run(cmd).returncode
        if code:
            failed.append(f"{arm} (status {code})")
            print(f"arm {arm}: train.py exited with status {code} (its output is above); the other arms go on",
                  flush=True)
    if failed:
        sys.exit(f"arms whose train.py failed: {', '.join(failed)}; the others ran")


def _rows(arm):
    """The rows of arm's metrics.jsonl (None where there is none), or an exit naming a line that is not one."""
    path = os.path.join(OUT, arm, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}, line {n}: not a JSON row ({e}); a damaged log, or one still being written")
    return rows


def load(arm):
    rows = _rows(arm)
    if not rows or not any("loss" in r for r in rows):
        return None     # started, but stopped before its first logged step
    # a resumed run appends: keep the last row written for each (iter, kind)
    train = {r["iter"]: r for r in rows if "loss" in r}
    evals = {r["iter"]: r for r in rows if "val_loss" in r}
    return [train[i] for i in sorted(train)], [evals[i] for i in sorted(evals)]


def run_config(arm):
    """The settings of arm's run as its last start row records them (a resume writes one more), or None."""
    starts = [r["config"] for r in _rows(arm) or [] if r.get("event") == "start" and "config" in r]
    return starts[-1] if starts else None


def baseline(arm):
    """What arm's loss is plotted against: the BF16 arm of its own seed (sdpa_seed2 for fp8_seed2), since
    another seed's differs by its initialization and data order, as much as the attention paths differ at
    these lengths; a BF16 arm of another seed against sdpa, which draws that seed-to-seed gap itself."""
    if arm.startswith("sdpa") or "_seed" not in arm:
        return "sdpa"
    return "sdpa" + arm[arm.index("_seed"):]


def smooth(xs, k):
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


def table(runs, configs=None):
    """Markdown: final train loss (the mean of the losses logged in the last 10% of steps: train.py logs
    one step's loss every log_interval steps, so 2 to 11 of them in runs of 150 to 1000 steps), final and
    best val loss, tok/s. With configs ({arm: run_config(arm)}), an arm whose last evaluation is not at its
    max_iters (stopped, killed, or diverged: train.py always evaluates at max_iters) says so by its name."""
    rows = ["| arm | train loss, logged in the last 10% of steps | final val loss | best val loss | tok/s (median, 2nd half) |",
            "|---|---|---|---|---|"]
    for arm, (train, evals) in runs.items():
        end = (configs or {}).get(arm, {}).get("max_iters")
        if end is not None and not (evals and evals[-1]["iter"] >= end):
            arm = f"{arm} (stopped at iter {train[-1]['iter']} of {end})"
        last_iter = train[-1]["iter"]
        tail = [r["loss"] for r in train if r["iter"] >= 0.9 * last_iter]
        toks = [r["tok_per_s"] for r in train if "tok_per_s" in r and r["iter"] >= last_iter / 2]
        val = (f"{evals[-1]['val_loss']:.4f} | {min(r['val_loss'] for r in evals):.4f}" if evals
               else "- | -")  # a run stopped before its first evaluation
        tok = f"{statistics.median(toks):,.0f}" if toks else "-"   # of an even count, the mean of the middle two
        rows.append(f"| {arm} | {sum(tail) / len(tail):.4f} | {val} | {tok} |")
    return "\n".join(rows)


def plot():
    try:
        import matplotlib
    except ImportError:
        sys.exit("ablation.py plot needs matplotlib, which the trainer does not: pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {arm: r for arm in ARMS if (r := load(arm)) is not None}
    if not any(arm.startswith("sdpa") for arm in runs):
        sys.exit(f"no BF16 baseline under {OUT} (sdpa, or sdpa_seedN): run `python ablation.py run` first")
    # arms trained with other settings (an earlier ablation's left in OUT) would be compared as if alike
    configs = {arm: run_config(arm) or {} for arm in runs}
    first = next(iter(runs))
    differ = {arm: [k for k in sorted(set(c) | set(configs[first])) if k not in ARM_KEYS + ("init_from",)
                    and c.get(k) != configs[first].get(k)] for arm, c in configs.items()}
    if any(differ.values()):
        sys.exit(f"arms trained with other settings than {first}'s: " + "; ".join(
            f"{arm}: " + ", ".join(f"{k}={configs[arm].get(k)!r} ({first}: {configs[first].get(k)!r})" for k in keys)
            for arm, keys in differ.items() if keys) + f". Move the odd ones out of {OUT}.")
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
    for n, (arm, (train, evals)) in enumerate(runs.items()):
        color = f"C{n}"
        ax[0].plot([r["iter"] for r in train], smooth([r["loss"] for r in train], 3), color=color, label=arm)
        base = baseline(arm)
        if arm != base and base not in runs:
            print(f"{arm}: no {base} (BF16 at its seed) under {OUT}, so not in the difference panel")
        elif arm != base:
            base_train = {r["iter"]: r["loss"] for r in runs[base][0]}
            base_val = {r["iter"]: r["val_loss"] for r in runs[base][1]}
            common = [r for r in train if r["iter"] in base_train]
            ax[1].plot([r["iter"] for r in common],
                       smooth([r["loss"] - base_train[r["iter"]] for r in common], 5), color=color,
                       label=f"{arm}: train (smoothed)")
            ve = [r for r in evals if r["iter"] in base_val]
            ax[1].plot([r["iter"] for r in ve], [r["val_loss"] - base_val[r["iter"]] for r in ve], "o--",
                       color=color, label=f"{arm}: val")
        mon = [r for r in evals if "delta_mismatch" in r]
        if mon:
            it = [r["iter"] for r in mon]
            ax[2].semilogy(it, [r["delta_mismatch"] for r in mon], "o-", color=color, label=f"{arm}: delta mismatch")
            ax[2].semilogy(it, [r["key_grad_sum_stale"] for r in mon], "x--", color=color, label=f"{arm}: key-grad sum, stale")
            ax[2].semilogy(it, [r["key_grad_sum_matched"] for r in mon], "+:", color=color, label=f"{arm}: key-grad sum, matched")
    lowest = min(r["loss"] for train, _ in runs.values() for r in train)   # longer runs go below 2
    ax[0].set(title="train loss", xlabel="step", ylabel="loss", ylim=(min(2, lowest - 0.1), 6))
    ax[1].axhline(0, color="k", lw=0.5)
    ax[1].set(title="loss minus BF16 SDPA of the same seed (sdpa_seedN: minus sdpa)", xlabel="step",
              ylabel="loss difference")
    ax[2].set(title="delta monitor, worst layer, on each arm's own model", xlabel="step")
    ax[0].legend(fontsize=8)
    ax[1].legend(fontsize=7)
    ax[2].legend(fontsize=6, ncol=2, loc="upper right")
    fig.tight_layout()
    path = os.path.join(OUT, "ablation.png")
    atomic_write(path, lambda f: fig.savefig(f, dpi=100, format="png"))
    print(f"wrote {path}\n")
    print(table(runs, configs))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "plot"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        extra = [a for a in sys.argv[2:] if not a.startswith("--arms=")]
        given = [a.split("=", 1)[1].split(",") for a in sys.argv[2:] if a.startswith("--arms=")]
        arms = given[-1] if given else DEFAULT_ARMS     # the last one, as arguments apply left to right
        unknown = [repr(a) for a in arms if a not in ARMS]
        if unknown:
            sys.exit(f"unknown arm(s) {', '.join(unknown)}; the arms are {', '.join(ARMS)}")
        twice = sorted({a for a in arms if arms.count(a) > 1})
        if twice:  # the second run would train the arm again and move the first one's log aside
            sys.exit(f"--arms names {', '.join(twice)} twice")
        run(extra, arms)
    else:
        plot()

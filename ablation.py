"""
The stale-delta ablation: one model, data and seed trained with BF16 SDPA, FP8 with the stale delta and
FP8 with Delta-Matching (plus a second BF16 seed, to measure run-to-run noise), then a plot and a table.

    python ablation.py run  [train.py overrides...]   # the arms one after another, out-ablation/<arm>/
    python ablation.py plot                          # out-ablation/ablation.png and a markdown table

`run` starts `python train.py config/ablation.py --attention=<arm> --out_dir=out-ablation/<arm>
--delta_monitor=True <your overrides>` per arm, so every figure comes from train.py's own metrics.jsonl:
per-step train loss and gradient norm, val loss, and at each evaluation the delta-mismatch monitor.
`plot` needs matplotlib (not a dependency of the trainer: `pip install matplotlib` where you plot).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
ARMS = {  # name: (attention path, seed)
    "sdpa": ("sdpa", 1337),
    "sdpa_seed2": ("sdpa", 2024),
    "fp8_stale": ("fp8_stale", 1337),
    "fp8": ("fp8", 1337),
}
OUT = os.path.join(ROOT, "out-ablation")


def run(overrides, arms):
    for arm in arms:
        attention, seed = ARMS[arm]
        cmd = [sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, "config", "ablation.py"),
               f"--attention={attention}", f"--seed={seed}", f"--out_dir={os.path.join(OUT, arm)}",
               "--delta_monitor=True", *overrides]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def load(arm):
    path = os.path.join(OUT, arm, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    # a resumed run appends: keep the last row written for each (iter, kind)
    train = {r["iter"]: r for r in rows if "loss" in r}
    evals = {r["iter"]: r for r in rows if "val_loss" in r}
    return [train[i] for i in sorted(train)], [evals[i] for i in sorted(evals)]


def smooth(xs, k=20):
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


def plot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {arm: r for arm in ARMS if (r := load(arm)) is not None}
    if "sdpa" not in runs:
        sys.exit(f"no BF16 baseline under {OUT}/sdpa: run `python ablation.py run` first")
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    base_train = {r["iter"]: r["loss"] for r in runs["sdpa"][0]}
    base_val = {r["iter"]: r["val_loss"] for r in runs["sdpa"][1]}
    for arm, (train, evals) in runs.items():
        it = [r["iter"] for r in train]
        ax[0].plot(it, smooth([r["loss"] for r in train]), label=arm)
        common = [r for r in train if r["iter"] in base_train]
        if arm != "sdpa":
            ax[1].plot([r["iter"] for r in common],
                       smooth([r["loss"] - base_train[r["iter"]] for r in common], 50), label=f"{arm} - sdpa (train)")
            ve = [r for r in evals if r["iter"] in base_val]
            ax[1].plot([r["iter"] for r in ve], [r["val_loss"] - base_val[r["iter"]] for r in ve], "o--",
                       label=f"{arm} - sdpa (val)")
        mon = [r for r in evals if "delta_mismatch" in r]
        if mon:
            ax[2].semilogy([r["iter"] for r in mon], [r["delta_mismatch"] for r in mon], "o-",
                           label=f"{arm}: |delta_stale - delta_matched| / |delta_matched|")
            ax[2].semilogy([r["iter"] for r in mon], [r["key_grad_sum_stale"] for r in mon], "x:",
                           label=f"{arm}: key-grad sum, stale")
            ax[2].semilogy([r["iter"] for r in mon], [r["key_grad_sum_matched"] for r in mon], "+:",
                           label=f"{arm}: key-grad sum, matched")
    ax[0].set(title="train loss (smoothed)", xlabel="iter", ylabel="loss")
    ax[1].axhline(0, color="k", lw=0.5)
    ax[1].set(title="difference to BF16 SDPA (seed 1337)", xlabel="iter", ylabel="loss difference")
    ax[2].set(title="delta-mismatch monitor (worst layer)", xlabel="iter")
    for a in ax:
        a.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(OUT, "ablation.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}\n")
    print("| arm | final train loss (mean of last 50 steps) | final val loss | best val loss | tok/s (median) |")
    print("|---|---|---|---|---|")
    for arm, (train, evals) in runs.items():
        last = [r["loss"] for r in train[-50:]]
        toks = sorted(r.get("tok_per_s", 0.0) for r in train[len(train) // 2:])
        print(f"| {arm} | {sum(last) / len(last):.4f} | {evals[-1]['val_loss']:.4f} | "
              f"{min(r['val_loss'] for r in evals):.4f} | {toks[len(toks) // 2]:,.0f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "plot"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        extra = [a for a in sys.argv[2:] if not a.startswith("--arms=")]
        arms = next((a.split("=", 1)[1].split(",") for a in sys.argv[2:] if a.startswith("--arms=")), list(ARMS))
        run(extra, arms)
    else:
        plot()

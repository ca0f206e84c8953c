"""train.py's delta-mismatch monitor (delta_monitor=True), on CPU through the Triton interpreter: it logs
the per-layer figures, they separate the arms as the kernel tests say, and it leaves training untouched."""
import os

import pytest

import train
from test_train import args, data_dir, metrics  # noqa: F401  (data_dir is a fixture)

pytest.importorskip("triton")
# these runs train on the CPU, where the FP8 kernel runs only under the Triton interpreter
needs_kernel = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="CPU training runs need the Triton interpreter for the FP8 kernel")


@needs_kernel
def test_delta_monitor_logs_and_leaves_training_alone(data_dir, tmp_path):  # noqa: F811
    # head dim 64 (the kernel's smallest), two layers, evaluations at iters 0, 2 and 4
    common = ["--n_embd=128", "--n_head=2", "--block_size=64", "--max_iters=4", "--eval_interval=2", "--dropout=0.1"]
    train.main(args(data_dir, tmp_path / "off", *common))
    train.main(args(data_dir, tmp_path / "on", *common, "--delta_monitor=True"))
    off, on = metrics(tmp_path / "off"), metrics(tmp_path / "on")
    assert off == on, "the monitor changed the training run"
    import json
    rows = [json.loads(line) for line in open(tmp_path / "on" / "metrics.jsonl")]
    evals = [r for r in rows if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 2, 4]
    for r in evals:
        for layer in (0, 1):
            assert r[f"ds_rowsum_matched_L{layer}"] < 1e-6 < 1e-3 < r[f"ds_rowsum_stale_L{layer}"], r
            assert r[f"key_grad_sum_matched_L{layer}"] < r[f"key_grad_sum_stale_L{layer}"], r
        assert r["delta_mismatch"] == max(r["delta_mismatch_L0"], r["delta_mismatch_L1"]) > 0


def test_delta_monitor_refuses_without_kernel(data_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit, match="delta_monitor=True needs the FP8 kernel"):
        train.main(args(data_dir, tmp_path / "x", "--delta_monitor=True"))

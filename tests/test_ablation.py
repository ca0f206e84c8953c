"""ablation.py: the table from train.py's metrics.jsonl, and its refusals (no training here)."""
import json
import os
import subprocess
import sys

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


def test_unknown_arm_is_refused_before_any_run():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "ablation.py"), "run", "--arms=fp8,bf16"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unknown arm(s) bf16" in r.stderr and "$ " not in r.stdout, (r.stdout, r.stderr)
